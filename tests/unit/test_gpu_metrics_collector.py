"""roles/metrics/files/gpubox-gpu-metrics end to end, as a subprocess: the kernel log read, or said unreadable
(issue 34), and every way the collector can fail ending in one line, never a traceback.

Real: the collector, its library, the files and state it writes, the commands it cannot run (a missing path, a file
without the execute bit, a command that hangs, one that fails), /sys (no one may create a file there), promtool on
the alert rules. Simulated, as everywhere in the suite, only the GPU side: nvidia-smi is the replay tool
(harness/fakegpu/nvidia-smi) and a readable kernel log is a replay journalctl that serves a file the test
writes, with cursors, the way `journalctl -k -b -o short-unix --show-cursor -q` does (this machine's own journal
has no kernel log to read: a container).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / "roles" / "metrics" / "files" / "gpubox-gpu-metrics"
LIB = ROOT / "plugins" / "module_utils"
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
REPLAY = ROOT / "harness" / "fakegpu" / "nvidia-smi"
ALERTS = ROOT / "roles" / "metrics" / "files" / "prometheus" / "gpubox-alerts.yml"

BOOT_LINES = [
    "1764681600.000001 box kernel: Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103) #49~22.04.1-Ubuntu",
    "1764681612.500000 box kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.261.03",
]
XID_79 = (
    "1764682000.250000 box kernel: NVRM: Xid (PCI:0000:21:00): 79, pid=2211, name=python3, GPU has fallen off the bus."
)
FAILED = "Failed to open journal: Input/output error"
NO_JOURNAL = "missing-journalctl"  # a path that does not exist


class Box:
    """One box's collector: its files in a temporary directory, the replayed GPUs and kernel log."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.state = path / "state"
        self.state.mkdir()
        self.kernel_log = path / "kernel.log"
        self.kernel_log.write_text("\n".join(BOOT_LINES) + "\n")
        self.nvidia_smi = self.script(
            "nvidia-smi",
            f"#!/bin/sh\nGPUBOX_SIM_BOX=rtx3090x2-nvlink GPUBOX_SIM_FIXTURES={FIXTURES} "
            f'GPUBOX_SIM_STATE_DIR=/nonexistent exec {sys.executable} {REPLAY} "$@"\n',
        )
        self.journalctl = self.script(
            "journalctl",
            f"#!{sys.executable}\n"
            + textwrap.dedent(f"""\
                import sys
                want = ["-k", "-b", "-o", "short-unix", "--no-pager", "--show-cursor", "-q"]
                if sys.argv[1:8] != want or len(sys.argv) > 9:
                    sys.exit(f"replay journalctl: unexpected arguments {{sys.argv[1:]}}")
                try:
                    lines = open({str(self.kernel_log)!r}).read().splitlines()
                except OSError:
                    sys.exit(1)  # as journalctl -q without a journal: exit 1, nothing said
                after = [a.split("i=")[-1] for a in sys.argv[8:] if a.startswith("--after-cursor=")]
                new = lines[int(after[0]) if after else 0:]
                for line in new:
                    print(line)
                if new:
                    print(f"-- cursor: s=replay;i={{len(lines)}}")
                """),
        )

    def script(self, name: str, text: str, mode: int = 0o755) -> Path:
        path = self.path / name
        path.write_text(text)
        path.chmod(mode)
        return path

    def argv(self, *extra: str, journalctl: str | Path | None = None, **paths: str) -> list[str]:
        files = {
            "out": str(self.path / "gpubox_gpu.prom"),
            "health": str(self.path / "health.json"),
            "unhealthy": str(self.path / "unhealthy"),
            "state-dir": str(self.state),
            "lib": str(LIB),
            "nvidia-smi": str(self.nvidia_smi),
            **{k.replace("_", "-"): v for k, v in paths.items()},
        }
        journal = self.journalctl if journalctl is None else journalctl
        opts = [x for k, v in files.items() for x in (f"--{k}", v)]
        return [sys.executable, str(COLLECTOR), *opts, "--expected", "2", "--journalctl", str(journal), *extra]

    def run(self, *extra: str, journalctl: str | Path | None = None, **paths: str) -> Run:
        if journalctl == NO_JOURNAL:
            journalctl = self.path / NO_JOURNAL
        started = time.time()
        proc = subprocess.run(
            self.argv(*extra, journalctl=journalctl, **paths), capture_output=True, text=True, check=False, timeout=60
        )
        return Run(self, proc, started, time.time())


class Run:
    def __init__(self, box: Box, proc: subprocess.CompletedProcess[str], started: float, ended: float) -> None:
        self.box, self.rc, self.stderr, self.started, self.ended = box, proc.returncode, proc.stderr, started, ended
        assert "Traceback" not in proc.stderr, proc.stderr
        health = box.path / "health.json"
        self.health = json.loads(health.read_text()) if health.exists() else None
        prom = box.path / "gpubox_gpu.prom"
        self.metrics = prom.read_text().splitlines() if prom.exists() else []
        self.marker = (box.path / "unhealthy").read_text() if (box.path / "unhealthy").exists() else None

    def value(self, name: str) -> float | None:
        found = [line.rsplit(" ", 1)[1] for line in self.metrics if line.split("{")[0].split(" ")[0] == name]
        assert len(found) <= 1, found
        return float(found[0]) if found else None

    def one_line(self) -> str:
        lines = self.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpubox-gpu-metrics: "), self.stderr
        return lines[0]


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


def test_a_readable_kernel_log_says_so_and_counts_its_xids(box: Box) -> None:
    first = box.run()
    assert first.rc == 0 and first.stderr == "", first.stderr
    assert first.value("gpubox_gpu_kernel_log_readable") == 1 and first.value("gpubox_gpu_xid_events") == 0
    assert first.value("gpubox_gpu_kernel_log_unreadable_since_seconds") is None
    assert first.health["healthy"] and first.health["problems"] == [] and first.health["kernel_log_readable"]
    assert first.health["summary"] == "healthy" and first.marker is None
    with box.kernel_log.open("a") as fh:
        fh.write(XID_79 + "\n")
    second = box.run()  # reads on from the saved cursor: the new line only
    assert second.value("gpubox_gpu_kernel_log_readable") == 1 and second.value("gpubox_gpu_xid_events") == 1
    assert not second.health["healthy"] and second.health["problems"] == ["Xid 79 on 0000:21:00"]
    assert second.marker == "Xid 79 on 0000:21:00\n"
    assert box.run().value("gpubox_gpu_xid_events") == 1  # not counted twice


def test_an_unreadable_kernel_log_shows_as_gauge_alert_and_problem_and_goes_when_read_again(box: Box) -> None:
    runs = [box.run(), box.run(journalctl=NO_JOURNAL), box.run(journalctl=NO_JOURNAL)]
    blind = runs[1]
    assert blind.rc == 0
    assert blind.value("gpubox_gpu_kernel_log_readable") == 0
    since = blind.value("gpubox_gpu_kernel_log_unreadable_since_seconds")
    assert since is not None and blind.started <= since <= blind.ended
    assert runs[2].value("gpubox_gpu_kernel_log_unreadable_since_seconds") == since  # the spell's start is kept
    error = f"{box.path / NO_JOURNAL} not found: No such file or directory"
    assert f'gpubox_gpu_kernel_log_error{{error="{error}"}} 1' in blind.metrics
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    line = f"kernel log unreadable since {stamp} ({error}): Xid events cannot be seen"
    assert blind.health["problems"] == [line] and blind.health["tolerated"] == [line]
    assert blind.health["healthy"] and blind.marker is None  # the default: said, not acted on
    assert blind.health["summary"] == f"healthy (but: {line})" and blind.health["kernel_log_readable"] is False
    assert blind.one_line() == f"gpubox-gpu-metrics: {line}"
    runs.append(box.run())  # readable again: all of it gone
    back = runs[-1]
    assert back.rc == 0 and back.stderr == "" and back.value("gpubox_gpu_kernel_log_readable") == 1
    assert not [m for m in back.metrics if "unreadable_since" in m or "kernel_log_error" in m]
    assert back.health["problems"] == [] and back.health["healthy"] and back.health["summary"] == "healthy"
    assert json.loads((box.state / "state.json").read_text())["kernel_log_unreadable_since"] is None
    _the_alert_follows_the_collectors_gauge(box.path, [r.value("gpubox_gpu_kernel_log_readable") for r in runs])


def _the_alert_follows_the_collectors_gauge(tmp_path: Path, readable: list[float | None]) -> None:
    """The gauge as these runs wrote it, one run per 5 minutes, through the real alert rules: firing while 0,
    gone once 1. Catches a metric renamed on one side only."""
    promtool = os.environ.get("GPUBOX_PROMTOOL") or shutil.which("promtool")
    if not promtool:
        pytest.fail("needs promtool: make promtool (GPUBOX_PROMTOOL names it)")
    assert readable == [1, 0, 0, 1]
    values = " ".join(f"{int(v)}x4" for v in readable)  # each run's value held for 5 samples, 1 minute apart
    test = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": 'gpubox_gpu_kernel_log_readable{instance="box-a:9100"}', "values": values}],
                "alert_rule_test": [
                    {"eval_time": "4m", "alertname": "GpuboxGpuKernelLogUnreadable", "exp_alerts": []},
                    {"eval_time": "9m", "alertname": "GpuboxGpuKernelLogUnreadable", "exp_alerts": []},
                    {
                        "eval_time": "14m",
                        "alertname": "GpuboxGpuKernelLogUnreadable",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "instance": "box-a:9100"},
                                "exp_annotations": {
                                    "summary": "box-a:9100: the kernel log has not been readable for 5 minutes: "
                                    "Xid events cannot be seen",
                                    "description": _description(),
                                },
                            }
                        ],
                    },
                    {"eval_time": "19m", "alertname": "GpuboxGpuKernelLogUnreadable", "exp_alerts": []},
                ],
            }
        ],
    }
    path = tmp_path / "alert-test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def _description() -> str:
    """The alert's description as Prometheus holds it (the folded YAML scalar of gpubox-alerts.yml)."""
    import yaml

    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == "GpuboxGpuKernelLogUnreadable"]
    return rule["annotations"]["description"]


def test_an_unreadable_kernel_log_takes_the_box_out_when_asked_at_once_and_back_when_read(box: Box) -> None:
    blind = box.run("--kernel-log-unhealthy-after", "0", journalctl=NO_JOURNAL)
    assert not blind.health["healthy"] and blind.health["tolerated"] == []
    (line,) = blind.health["problems"]
    assert blind.marker == line + "\n" and blind.health["summary"] == f"unhealthy: {line}"
    assert blind.one_line() == f"gpubox-gpu-metrics: {line}; the box is reported unhealthy"
    back = box.run("--kernel-log-unhealthy-after", "0")
    assert back.health["healthy"] and back.marker is None and back.health["problems"] == []


def test_the_grace_counts_from_the_first_unreadable_run_kept_in_the_state_dir(box: Box) -> None:
    grace = ("--kernel-log-unhealthy-after", "600")
    first = box.run(*grace, journalctl=NO_JOURNAL)
    assert first.health["healthy"] and first.marker is None  # 0 s of 600
    state_file = box.state / "state.json"
    state = json.loads(state_file.read_text())
    state["kernel_log_unreadable_since"] -= 601  # the spell began 10 minutes ago, as a run then would have saved
    state_file.write_text(json.dumps(state))
    later = box.run(*grace, journalctl=NO_JOURNAL)
    assert not later.health["healthy"] and later.marker is not None
    assert later.value("gpubox_gpu_kernel_log_unreadable_since_seconds") == state["kernel_log_unreadable_since"]


def test_the_unreadable_spell_goes_on_across_a_reboot(box: Box) -> None:
    (box.state / "state.json").write_text(
        json.dumps({"boot_id": "another-boot", "cursor": "s=replay;i=9", "xids": [["0000:21:00", 79, 1.0]],
                    "kernel_log_unreadable_since": 1764681000.0})
    )  # fmt: skip
    run = box.run(journalctl=NO_JOURNAL)
    assert run.value("gpubox_gpu_kernel_log_unreadable_since_seconds") == 1764681000.0
    assert run.value("gpubox_gpu_xid_events") == 0  # the last boot's Xid is gone with its boot
    state = json.loads((box.state / "state.json").read_text())
    assert state["cursor"] == "" and state["xids"] == []


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("not executable", "could not be run: Permission denied"),
        ("failing", f"journalctl exit 1: {FAILED}"),
        ("empty", "journalctl shows no kernel line of this boot"),
        ("hanging", "did not answer within 1 s"),
    ],
)
def test_every_way_the_kernel_log_cannot_be_read_is_said(box: Box, kind: str, expected: str) -> None:
    journalctl = {
        "not executable": lambda: box.script("journalctl-noexec", "#!/bin/sh\nexit 0\n", 0o644),
        "failing": lambda: box.script("journalctl-fail", f"#!/bin/sh\necho '{FAILED}' >&2\nexit 1\n"),
        "empty": lambda: box.script("journalctl-empty", "#!/bin/sh\nexit 0\n"),
        "hanging": lambda: box.script("journalctl-hang", f"#!/bin/sh\nsleep 60 &\necho $! > {box.path}/child\nwait\n"),
    }[kind]()  # fmt: skip
    run = box.run("--timeout", "1", journalctl=journalctl)
    assert run.rc == 0 and run.value("gpubox_gpu_kernel_log_readable") == 0, run.stderr
    assert expected in run.health["problems"][0] and expected in run.one_line()
    assert run.value("gpubox_gpu_collector_success") == 1  # nvidia-smi answered: the GPUs are still reported
    if kind == "hanging":
        assert run.ended - run.started < 15
        _assert_gone(int((box.path / "child").read_text()))


def _assert_gone(pid: int) -> None:
    """The hanging command's own child was killed with it (its process group), not left running."""
    for _ in range(50):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.1)
    pytest.fail(f"process {pid} of the hanging command is still running")


# --- every way the collector can fail: one line naming what and why, never a traceback --------------------------


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        ({"state_dir": "{tmp}/no-such-state"}, "--state-dir {tmp}/no-such-state: {tmp}/no-such-state does not exist;"
         " create it (systemd's StateDirectory= creates it for the unit) or pass another path"),
        ({"out": "{tmp}/no-such-dir/gpubox_gpu.prom"}, "--out {tmp}/no-such-dir/gpubox_gpu.prom: {tmp}/no-such-dir does"
         " not exist; create it or pass another path"),
        ({"out": "/sys/gpubox_gpu.prom"}, "--out /sys/gpubox_gpu.prom: cannot write in /sys (Permission denied); pass"
         " a writable path"),
        ({"health": "{tmp}/kernel.log/health.json"}, "--health {tmp}/kernel.log/health.json: {tmp}/kernel.log is not a"
         " directory; create it or pass another path"),
        ({"unhealthy": "/sys/unhealthy"}, "--unhealthy /sys/unhealthy: cannot write in /sys (Permission denied); pass a"
         " writable path"),
        ({"lib": "{tmp}/no-lib"}, "cannot import gpu_metrics from --lib {tmp}/no-lib (No module named 'gpu_metrics');"
         " pass the directory that holds it"),
    ],
)  # fmt: skip
def test_a_file_it_cannot_write_stops_it_before_it_writes_anything(
    box: Box, paths: dict[str, str], expected: str
) -> None:
    run = box.run(**{k: v.format(tmp=box.path) for k, v in paths.items()})
    assert run.rc == 2 and run.one_line() == "gpubox-gpu-metrics: " + expected.format(tmp=box.path)
    assert sorted(p.name for p in box.path.iterdir() if p.suffix in (".prom", ".json") or p.name == "unhealthy") == []
    assert list(box.state.iterdir()) == []


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("missing", "not found: No such file or directory"), ("hanging", "did not answer within 1 s")],
)
def test_a_nvidia_smi_that_does_not_answer_is_one_line_and_an_unhealthy_verdict(
    box: Box, kind: str, expected: str
) -> None:
    smi = box.path / "no-nvidia-smi"
    if kind == "hanging":
        smi = box.script("nvidia-smi-hang", f"#!/bin/sh\nsleep 60 &\necho $! > {box.path}/child\nwait\n")
    run = box.run("--timeout", "1", nvidia_smi=str(smi))
    assert run.rc == 0 and run.value("gpubox_gpu_collector_success") == 0 and run.value("gpubox_gpus_seen") == 0
    problem = f"nvidia-smi failed: {smi} {expected}"
    assert run.health["problems"] == [problem] and run.marker == problem + "\n"
    assert run.one_line() == f"gpubox-gpu-metrics: nvidia-smi failed ({smi} {expected}); the box is reported unhealthy"
    assert run.value("gpubox_gpu_kernel_log_readable") == 1  # the kernel log was still read
    if kind == "hanging":
        assert run.ended - run.started < 15
        _assert_gone(int((box.path / "child").read_text()))


def test_a_bad_option_value_is_one_error_naming_it(box: Box) -> None:
    bad = [
        (("--timeout", "0"), "--timeout 0 must be more than 0 seconds"),
        (("--fatal-xids", "79,x"), "--fatal-xids '79,x' must be comma-separated Xid codes"),
    ]
    for extra, expected in bad:
        run = box.run(*extra)
        assert run.rc == 2 and expected in run.stderr.splitlines()[-1], run.stderr
        assert not (box.path / "health.json").exists()


def test_an_xid_logged_while_the_kernel_log_was_unreadable_is_read_once_it_is_readable(box: Box) -> None:
    box.run()
    with box.kernel_log.open("a") as fh:
        fh.write(XID_79 + "\n")
    blind = box.run(journalctl=NO_JOURNAL)
    assert blind.value("gpubox_gpu_xid_events") == 0 and blind.health["healthy"]  # not seen, and said so
    back = box.run()  # from the cursor saved before the spell
    assert back.value("gpubox_gpu_xid_events") == 1 and back.health["problems"] == ["Xid 79 on 0000:21:00"]


def test_the_driver_branch_picks_the_fatal_xids_and_an_unknown_one_is_refused(box: Box) -> None:
    gsp = "1764681600.5 box kernel: NVRM: Xid (PCI:0000:21:00): 119, pid=7, name=python3, Timeout after 45s of waiting"
    box.kernel_log.write_text(gsp + "\n")
    pinned = box.run()  # 535 by default: a GSP timeout is counted, not fatal
    assert pinned.rc == 0 and pinned.health["healthy"], pinned.health
    assert 'gpubox_gpu_xid_class_events{class="other",branch="535"} 1' in pinned.metrics
    box.state.joinpath("state.json").unlink()
    lts = box.run("--driver-branch", "580")
    assert not lts.health["healthy"] and lts.health["problems"] == ["Xid 119 on 0000:21:00"]
    assert 'gpubox_gpu_xid_class_events{class="gsp",branch="580"} 1' in lts.metrics
    (box.path / "health.json").unlink()
    refused = box.run("--driver-branch", "550")
    assert refused.rc == 2 and "--driver-branch 550 has no Xid catalog: use 535 or 580" in refused.stderr
    assert not (box.path / "health.json").exists()
