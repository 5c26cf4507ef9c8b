"""plugins/module_utils/gpu_metrics.py: the GPU metrics collector's parser, renderer and health verdict.

Inputs: the real H200's answers to the collector's query (tests/fixtures/nvidia-smi/_reference/h200x1, idle, and
_reference/h200x1-load, idle and under a bf16 matrix-product load with a power-cap clock event), the replay
nvidia-smi's answers for every box (the derived RTX 3090/4090 boxes too), `NVRM: Xid` lines in the formats of
public reports (sources beside each), and journalctl's answers as journal_answer reads them. promtool (Debian's
prometheus package, GPUBOX_PROMTOOL) checks the rendered text as Prometheus reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import gpu_metrics

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
REAL = FIXTURES / "_reference" / "h200x1"
LOAD = FIXTURES / "_reference" / "h200x1-load"
REPLAY = ROOT / "harness" / "fakegpu" / "nvidia-smi"
BOXES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and not p.name.startswith("_"))

# NVRM: Xid lines as public reports show them (the kernel log's own text; journalctl -o short-unix puts the time first).
XID_LINES = {
    # https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/nvidia/debug.md
    "row remapper (63)": "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
    "reset gpu to activate.",
    # https://gist.github.com/kohsuke/84ce815d0a8ad85ecaf6 (syslog, with the dmesg time)
    "syslog (32)": "Dec 23 23:30:56 rescue kernel: [ 179.437933] NVRM: Xid (PCI:0000:01:00): 32, "
    "Channel ID 00000005 intr 00008000",
    # https://pastebin.com/xJaypMZt: an older driver, the bus without "PCI:"
    "old format (3)": "Jan 18 11:38:05 localhost kernel: [ 269.517039] NVRM: Xid (0000:01:00): 3, "
    "C 00000005 SC 00000007 M 00001ffc Data ffffffff",
    # NVIDIA's Xid 79 text (https://docs.nvidia.com/deploy/xid-errors/), as journalctl -k -o short-unix prints it
    "fallen off the bus (79)": "1764681600.123456 box kernel: NVRM: Xid (PCI:0000:4b:00): 79, pid=2211, "
    "name=python3, GPU has fallen off the bus.",
}  # fmt: skip


def _real_rows() -> list[dict]:
    assert (REAL / "fields.txt").read_text().strip() == ",".join(gpu_metrics.FIELDS), (
        "gpu_metrics.FIELDS changed: capture collector-query.csv again on a real GPU (fixtures README)"
    )
    return gpu_metrics.parse_query((REAL / "collector-query.csv").read_text())


def _replay(box: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUBOX_SIM_BOX=box, GPUBOX_SIM_FIXTURES=str(FIXTURES), GPUBOX_SIM_STATE_DIR="/nonexistent")
    return subprocess.run([sys.executable, str(REPLAY), *args], env=env, capture_output=True, text=True, check=False)


def test_the_real_h200_answer_parses_field_by_field() -> None:
    (row,) = _real_rows()
    assert row["name"] == "NVIDIA H200" and row["pci.bus_id"] == "00000000:00:06.0"
    assert row["temperature.gpu"] == "32" and row["power.draw"] == "76.79" and row["enforced.power.limit"] == "700.00"
    assert row["clocks.sm"] == "345" and row["clocks.max.sm"] == "1980"
    assert row["memory.total"] == "143771" and row["ecc.mode.current"] == "Enabled"
    assert row["fan.speed"] is None and row["retired_pages.pending"] is None  # [N/A]: H200 has no fan, remaps rows
    assert row["clocks_throttle_reasons.gpu_idle"] == "Active" and row["pstate"] == "P0"
    assert row["pcie.link.gen.current"] == "5" and row["pcie.link.width.max"] == "16"


def test_the_real_answer_renders_each_metric_in_its_unit() -> None:
    text = gpu_metrics.render(_real_rows(), expected=1, now=1764681600.0)
    ident = 'gpu="0",uuid="GPU-c93167f7-1439-8c94-a2af-3f167c9495af",name="NVIDIA H200",bus_id="00000000:00:06.0"'
    for line in (
        f"gpubox_gpu_temperature_celsius{{{ident}}} 32",
        f"gpubox_gpu_power_draw_watts{{{ident}}} 76.79",
        f"gpubox_gpu_power_limit_watts{{{ident}}} 700",
        f"gpubox_gpu_sm_clock_hertz{{{ident}}} 345000000",
        f"gpubox_gpu_memory_total_bytes{{{ident}}} {143771 * 1048576}",
        f"gpubox_gpu_utilization_ratio{{{ident}}} 0",
        f"gpubox_gpu_ecc_enabled{{{ident}}} 1",
        f'gpubox_gpu_throttle_active{{{ident},reason="gpu_idle"}} 1',
        f'gpubox_gpu_throttle_active{{{ident},reason="hw_slowdown"}} 0',
        f'gpubox_gpu_pcie_link_gen{{{ident},kind="current"}} 5',
        f'gpubox_gpu_pcie_link_width{{{ident},kind="max"}} 16',
        f"gpubox_gpu_pstate{{{ident}}} 0",
        "gpubox_gpus_seen 1",
        "gpubox_gpus_expected 1",
        "gpubox_gpu_fatal_xid_events 0",
        "gpubox_gpu_xid_events 0",
        "gpubox_gpu_collector_success 1",
    ):
        assert line in text.splitlines(), line
    assert "gpubox_gpu_fan_speed_ratio" not in text and "gpubox_gpu_retired_pages_pending" not in text  # N/A: absent


@pytest.mark.parametrize("box", BOXES)
def test_every_replayed_box_answers_the_collectors_query(box: str) -> None:
    out = _replay(box, "--query-gpu=" + ",".join(gpu_metrics.FIELDS), "--format=csv,noheader,nounits")
    assert out.returncode == 0, out.stdout + out.stderr
    rows = gpu_metrics.parse_query(out.stdout)
    count = _replay(box, "--query-gpu=count", "--format=csv,noheader").stdout.splitlines()[0]
    assert len(rows) == int(count)
    text = gpu_metrics.render(rows, expected=len(rows))
    assert text.count("gpubox_gpu_temperature_celsius{") == len(rows)
    if "rtx" in box:  # GeForce: no ECC, no retired pages
        assert "gpubox_gpu_ecc_enabled" not in text and "gpubox_gpu_retired_pages" not in text


def _load_rows(name: str = "load.csv") -> list[dict]:
    """Each line of the load capture is one answer of the one GPU: parsed line by line."""
    assert (LOAD / "fields.txt").read_text().strip() == ",".join(gpu_metrics.FIELDS), (
        "gpu_metrics.FIELDS changed: capture the load answers again on a real GPU (h200x1-load/README.md)"
    )
    return [gpu_metrics.parse_query(line)[0] for line in (LOAD / name).read_text().splitlines() if line.strip()]


def test_the_real_h200_under_load_is_held_by_its_power_cap_and_renders_so() -> None:
    rows = _load_rows()
    assert len(rows) == 20
    for row in rows:
        assert row["name"] == "NVIDIA H200" and row["pstate"] == "P0"
        assert float(row["utilization.gpu"]) >= 99 and float(row["memory.used"]) > 1000
        assert 0.98 * 700 <= float(row["power.draw"]) <= 700.0 and row["enforced.power.limit"] == "700.00"
        assert 1400 <= float(row["clocks.sm"]) < float(row["clocks.max.sm"]) == 1980
        assert row["clocks_throttle_reasons.sw_power_cap"] == "Active"
        assert row["clocks_throttle_reasons.gpu_idle"] == "Not Active"
        assert row["fan.speed"] is None and row["retired_pages.pending"] is None  # [N/A] under load too
    text = gpu_metrics.render(rows[:1], expected=1).splitlines()
    ident = 'gpu="0",uuid="GPU-0d2f8299-8419-6f0b-06ef-70b0c327362b",name="NVIDIA H200",bus_id="00000000:00:06.0"'
    for line in (
        f'gpubox_gpu_throttle_active{{{ident},reason="sw_power_cap"}} 1',
        f'gpubox_gpu_throttle_active{{{ident},reason="gpu_idle"}} 0',
        f'gpubox_gpu_throttle_active{{{ident},reason="hw_thermal_slowdown"}} 0',
        f"gpubox_gpu_power_draw_watts{{{ident}}} 692.57",
        f"gpubox_gpu_utilization_ratio{{{ident}}} 1",
        f"gpubox_gpu_memory_utilization_ratio{{{ident}}} 0.25",
        f"gpubox_gpu_sm_clock_hertz{{{ident}}} 1470000000",
    ):
        assert line in text, line
    assert gpu_metrics.health(rows[:1], 1).healthy  # a power cap at full load is the card working, not a fault


@pytest.mark.parametrize("name", ["idle.csv", "after.csv"])
def test_the_real_h200_idle_before_and_after_the_load(name: str) -> None:
    for row in _load_rows(name):
        assert row["clocks_throttle_reasons.gpu_idle"] == "Active"
        assert row["clocks_throttle_reasons.sw_power_cap"] == "Not Active"
        assert row["utilization.gpu"] == "0" and row["clocks.sm"] == "345" and float(row["power.draw"]) < 100


def test_the_load_header_names_the_fields_as_driver_580_does() -> None:
    header = (LOAD / "load-header.csv").read_text().splitlines()[0]
    assert header == (REAL / "collector-query-header.csv").read_text().splitlines()[0]
    row = (LOAD / "load-header.csv").read_text().splitlines()[1]
    assert "691.28 W, 700.00 W" in row and ", Not Active, Not Active, Active, Not Active," in row


def test_the_replayed_header_shows_the_real_units() -> None:
    real = (REAL / "collector-query-header.csv").read_text().splitlines()[0].split(", ")
    replay = _replay("h200x2", "--query-gpu=" + ",".join(gpu_metrics.FIELDS), "--format=csv").stdout.splitlines()[0]
    units = [c.split(" [", 1)[1] if " [" in c else "" for c in real]
    assert [c.split(" [", 1)[1] if " [" in c else "" for c in replay.split(", ")] == units


def test_a_row_of_another_length_is_refused() -> None:
    with pytest.raises(gpu_metrics.MetricsError, match="line 1 has 2 values for"):
        gpu_metrics.parse_query("0, GPU-x\n")


@pytest.mark.parametrize(("name", "line"), sorted(XID_LINES.items()))
def test_xid_lines_of_every_format_are_read(name: str, line: str) -> None:
    ((bus, code, when),) = gpu_metrics.parse_xids([line, "NVRM: loading NVIDIA UNIX Open Kernel Module 580.159.04"])
    assert code == int(name.rsplit("(", 1)[1].rstrip(")"))
    assert bus in ("0000:10:1c", "0000:01:00", "0000:4b:00")
    assert when == (1764681600.123456 if line[0].isdigit() else None)


def test_the_real_kernel_log_has_no_xid() -> None:
    assert gpu_metrics.parse_xids((REAL / "kernel-nvrm.txt").read_text().splitlines()) == []


def test_xids_are_counted_by_bus_and_code_and_fatal_ones_make_the_box_unhealthy() -> None:
    rows = gpu_metrics.parse_query(_replay("rtx3090x2-nvlink", "--query-gpu=" + ",".join(gpu_metrics.FIELDS),
                                           "--format=csv,noheader,nounits").stdout)  # fmt: skip
    xids = gpu_metrics.parse_xids([XID_LINES["fallen off the bus (79)"], XID_LINES["row remapper (63)"]] * 2)
    text = gpu_metrics.render(rows, expected=2, xids=xids)
    assert 'gpubox_gpu_xid_events_total{bus="0000:4b:00",code="79",fatal="true"} 2' in text
    assert 'gpubox_gpu_xid_events_total{bus="0000:10:1c",code="63",fatal="false"} 2' in text
    assert 'gpubox_gpu_xid_last_timestamp_seconds{bus="0000:4b:00"} 1764681600.123456' in text
    assert "gpubox_gpu_fatal_xid_events 2" in text
    assert gpu_metrics.health(rows, 2, xids).problems == ["Xid 79 on 0000:4b:00"]
    assert gpu_metrics.health(rows, 2, gpu_metrics.parse_xids([XID_LINES["row remapper (63)"]])).problems == []
    assert gpu_metrics.health(rows, 2, xids, fatal_xids=[63]).problems == ["Xid 63 on 0000:10:1c"]
    assert not gpu_metrics.health(rows, 2, xids).healthy


def test_a_missing_gpu_or_a_failed_query_is_unhealthy_and_said() -> None:
    rows = _real_rows()
    assert gpu_metrics.health(rows, 1).problems == [] and gpu_metrics.health(rows, 1).summary() == "healthy"
    assert gpu_metrics.health(rows, 2).problems == ["nvidia-smi sees 1 GPU(s), the inventory expects 2"]
    failed = "exit 18: Failed to initialize NVML: Driver/library version mismatch"
    assert gpu_metrics.health([], 2, error=failed).problems == [f"nvidia-smi failed: {failed}"]
    text = gpu_metrics.render([], 2, error=failed)
    assert "gpubox_gpus_seen 0" in text and "gpubox_gpu_collector_success 0" in text
    assert f'gpubox_gpu_collector_error{{error="{failed}"}} 1' in text


def test_label_values_are_escaped() -> None:
    row = dict.fromkeys(gpu_metrics.FIELDS)
    row.update({"index": "0", "name": 'a "b" \\ c\nd', "temperature.gpu": "40"})
    assert 'name="a \\"b\\" \\\\ c\\nd"' in gpu_metrics.render([row], 1)


@pytest.mark.skipif(not os.environ.get("GPUBOX_PROMTOOL") and not shutil.which("promtool"), reason="needs promtool")
def test_promtool_reads_every_rendered_file_as_valid_metrics() -> None:
    promtool = os.environ.get("GPUBOX_PROMTOOL") or shutil.which("promtool")
    xids = gpu_metrics.parse_xids(XID_LINES.values())
    blind = gpu_metrics.KernelLog(False, 1764681000.0, 'journalctl exit 1: "No journal files were found."')
    for text in (
        gpu_metrics.render(_real_rows(), 1, xids, now=1764681600.5),
        gpu_metrics.render([], 2, error='exit 9: "NVIDIA-SMI has failed"'),
        gpu_metrics.render(_load_rows(), 1, now=1764681600.5, kernel_log=blind),
        gpu_metrics.render(_load_rows(), 1, now=1764681600.5, kernel_log=gpu_metrics.KernelLog(True)),
    ):
        out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stdout + out.stderr + text


def test_the_planned_share_and_the_p2p_verdict_are_exported_only_when_known() -> None:
    rows = _real_rows()
    text = gpu_metrics.render(rows, 1, memory_share=0.9, p2p_enabled=False).splitlines()
    assert "gpubox_gpu_memory_planned_share 0.9" in text and "gpubox_gpu_p2p_enabled 0" in text
    assert "gpubox_gpu_p2p_enabled 1" in gpu_metrics.render(rows, 1, p2p_enabled=True).splitlines()
    bare = gpu_metrics.render(rows, 1)
    assert "gpubox_gpu_memory_planned_share" not in bare and "gpubox_gpu_p2p_enabled" not in bare


COLLECTOR = ROOT / "roles" / "metrics" / "files" / "gpubox-gpu-metrics"


@pytest.mark.parametrize(
    ("state", "line"),
    [
        ({"decision": {"p2p_enabled": True, "pairs": [], "reasons": []}}, "gpubox_gpu_p2p_enabled 1"),
        ({"decision": {"p2p_enabled": False, "pairs": [], "reasons": ["ACS"]}}, "gpubox_gpu_p2p_enabled 0"),
        ({"decision": {"p2p_enabled": "yes"}}, None),  # not a verdict: left out
        ({"decision": None}, None),
        ([1, 2], None),
        ("{not json", None),
        (None, None),  # the GPU check has not run: no file
    ],
)
def test_the_collector_exports_the_gpu_checks_verdict(tmp_path: Path, state: object, line: str | None) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        f"#!/bin/sh\nGPUBOX_SIM_BOX=rtx3090x2-pcie GPUBOX_SIM_FIXTURES={FIXTURES} GPUBOX_SIM_STATE_DIR=/nonexistent "
        f'exec {sys.executable} {REPLAY} "$@"\n'
    )
    smi.chmod(0o755)
    check = tmp_path / "gpu-check.json"
    if isinstance(state, str):
        check.write_text(state)
    elif state is not None:
        check.write_text(json.dumps(state))
    argv = [
        sys.executable, str(COLLECTOR), "--lib", str(ROOT / "plugins" / "module_utils"), "--nvidia-smi", str(smi),
        "--expected", "2", "--out", str(tmp_path / "gpubox_gpu.prom"), "--health", str(tmp_path / "health.json"),
        "--unhealthy", str(tmp_path / "unhealthy"), "--state-dir", str(tmp_path), "--gpu-check-state", str(check),
        "--memory-share", "0.92",
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    text = (tmp_path / "gpubox_gpu.prom").read_text().splitlines()
    assert "gpubox_gpu_memory_planned_share 0.92" in text and "gpubox_gpus_seen 2" in text
    assert [x for x in text if x.startswith("gpubox_gpu_p2p_enabled ")] == ([line] if line else [])
    assert json.loads((tmp_path / "health.json").read_text())["healthy"] is True


# --- the kernel log: read, or said that it was not (issue 34) -----------------------------------------------------

CURSOR = "s=4c1f;i=2a9;b=1c82afd0;m=5e1;t=62e1;x=9d0e"
NO_FILES = "No journal files were opened due to insufficient permissions."  # systemd's journalctl, not root
KERNEL = "1764681600.123456 box kernel: NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04\n"


@pytest.mark.parametrize(
    ("answer", "had_cursor", "expected"),
    [
        ((0, KERNEL + f"-- cursor: {CURSOR}\n", ""), False, ([KERNEL.strip()], CURSOR, "")),
        ((0, "", ""), True, ([], "", "")),  # nothing new since the last run: read, nothing to add
        ((0, "", ""), False, ([], "", gpu_metrics.EMPTY_KERNEL_LOG)),  # no line of this boot at all
        ((1, "", ""), False, ([], "", "journalctl exit 1: nothing said under -q (journalctl -k -b says why)")),
        ((1, "", "Failed to seek to cursor: Invalid argument\n"), True,
         ([], "", "journalctl exit 1: Failed to seek to cursor: Invalid argument")),
        ((0, "", f"{NO_FILES}\n"), True, ([], "", f"journalctl printed no line and said: {NO_FILES}")),
    ],
)  # fmt: skip
def test_journalctls_answer_is_read_or_said_unreadable(answer: tuple, had_cursor: bool, expected: tuple) -> None:
    assert gpu_metrics.journal_answer(*answer, had_cursor=had_cursor) == expected


def test_the_unreadable_spell_starts_once_and_ends_when_read() -> None:
    assert gpu_metrics.unreadable_since(None, False, 100.0) == 100.0
    assert gpu_metrics.unreadable_since(100.0, False, 160.0) == 100.0
    assert gpu_metrics.unreadable_since(100.0, True, 220.0) is None
    assert gpu_metrics.unreadable_since(900.0, False, 220.0) == 220.0  # a start in the future (clock set back)


def test_an_unreadable_kernel_log_is_a_gauge_an_error_and_a_problem() -> None:
    rows = _real_rows()
    blind = gpu_metrics.KernelLog(False, 1764681000.0, "journalctl could not be run: No such file or directory")
    text = gpu_metrics.render(rows, 1, now=1764681600.0, kernel_log=blind).splitlines()
    assert "gpubox_gpu_kernel_log_readable 0" in text
    assert "gpubox_gpu_kernel_log_unreadable_since_seconds 1764681000" in text
    assert 'gpubox_gpu_kernel_log_error{error="journalctl could not be run: No such file or directory"} 1' in text
    assert "gpubox_gpu_xid_events 0" in text  # still written: the gauge above says it is blind
    line = (
        "kernel log unreadable since 2025-12-02T13:10:00Z (journalctl could not be run: No such file or directory): "
        "Xid events cannot be seen"
    )
    verdict = gpu_metrics.health(rows, 1, kernel_log=blind, now=1764681600.0)
    assert verdict.problems == [line] and verdict.tolerated == [line] and verdict.healthy  # default: never unhealthy
    assert verdict.summary() == f"healthy (but: {line})"
    read = gpu_metrics.render(rows, 1, kernel_log=gpu_metrics.KernelLog(True)).splitlines()
    assert "gpubox_gpu_kernel_log_readable 1" in read
    assert not [x for x in read if "unreadable_since" in x or "kernel_log_error" in x]
    assert gpu_metrics.health(rows, 1, kernel_log=gpu_metrics.KernelLog(True)).problems == []
    assert "kernel_log" not in gpu_metrics.render(rows, 1)  # nobody looked: nothing said


@pytest.mark.parametrize(
    ("after", "unreadable_for", "healthy"),
    [(-1, 10**6, True), (0, 0, False), (600, 599, True), (600, 600, False), (600, 3600, False)],
)
def test_an_unreadable_kernel_log_makes_the_box_unhealthy_only_after_its_grace(
    after: float, unreadable_for: float, healthy: bool
) -> None:
    now = 1764681600.0
    blind = gpu_metrics.KernelLog(False, now - unreadable_for, "journalctl did not answer within 20 s")
    xid = gpu_metrics.parse_xids([XID_LINES["fallen off the bus (79)"]])
    verdict = gpu_metrics.health(_real_rows(), 1, kernel_log=blind, now=now, kernel_log_unhealthy_after=after)
    assert verdict.healthy is healthy and len(verdict.problems) == 1
    assert verdict.untolerated == ([] if healthy else verdict.problems)
    assert verdict.summary().startswith("healthy (but: kernel log" if healthy else "unhealthy: kernel log")
    both = gpu_metrics.health(_real_rows(), 1, xid, kernel_log=blind, now=now, kernel_log_unhealthy_after=after)
    assert not both.healthy and both.untolerated[0] == "Xid 79 on 0000:4b:00"
    assert both.as_json()["healthy"] is False and both.as_json()["problems"] == both.problems


# --- Xid classes per driver branch -------------------------------------------------------------------
# Lines as public R580-era reports show them: https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1045 (Xid
# 119 GSP RPC timeout, then 154) and https://forums.developer.nvidia.com/t/364958 (Xid 120 GSP exception, 154).
R580_LINES = [
    "NVRM: Xid (PCI:0000:01:00): 119, pid=2171, name=python3, Timeout after 45s of waiting for RPC response "
    "from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
    "NVRM: Xid (PCI:0000:01:00): 120, GSP kernel exception: store access page fault (cause:0xf)",
    "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
]


def test_the_device_plugins_application_errors_are_never_fatal_on_either_branch() -> None:
    for branch in gpu_metrics.DRIVER_BRANCHES:
        for code in (13, 31, 43, 45, 68, 109):
            assert gpu_metrics.xid_class(code, branch) == "application"
            assert code not in gpu_metrics.fatal_xids(branch)


def test_r580_adds_the_gsp_and_recovery_xids_to_the_fatal_set_and_535_does_not() -> None:
    assert gpu_metrics.fatal_xids(535) == gpu_metrics.FATAL_XIDS == (46, 48, 74, 79, 95)
    assert gpu_metrics.fatal_xids(580) == (46, 48, 74, 79, 95, 119, 120, 154)
    assert [gpu_metrics.xid_class(c, 580) for c in (119, 120, 154, 79, 63)] == [
        "gsp", "gsp", "recovery", "fatal", "other",
    ]  # fmt: skip
    assert [gpu_metrics.xid_class(c, 535) for c in (119, 120, 154, 79)] == ["other", "other", "other", "fatal"]
    assert gpu_metrics.xid_class(119) == "other"  # the default branch is the pinned stack's, 535


def test_an_unknown_branch_is_refused_by_name() -> None:
    for branch in (550, "580", True):
        with pytest.raises(ValueError, match=r"driver branch .* has no Xid catalog here: use one of 535, 580"):
            gpu_metrics.xid_catalog(branch)  # type: ignore[arg-type]


@pytest.mark.parametrize(("branch", "unhealthy"), [(535, []), (580, ["Xid 119 on 0000:01:00", "Xid 120 on 0000:01:00",
                                                                    "Xid 154 on 0000:01:00"])])  # fmt: skip
def test_a_gsp_hang_takes_an_r580_box_out_and_is_counted_by_class(branch: int, unhealthy: list[str]) -> None:
    rows = _real_rows()
    xids = gpu_metrics.parse_xids([*R580_LINES, XID_LINES["row remapper (63)"]])
    fatal = gpu_metrics.fatal_xids(branch)
    assert gpu_metrics.health(rows, 1, xids, fatal_xids=fatal).problems == unhealthy
    text = gpu_metrics.render(rows, expected=1, xids=xids, fatal_xids=fatal, driver_branch=branch)
    if branch == 580:
        assert 'gpubox_gpu_xid_class_events{class="gsp",branch="580"} 2' in text
        assert 'gpubox_gpu_xid_class_events{class="recovery",branch="580"} 1' in text
        assert 'gpubox_gpu_xid_class_events{class="other",branch="580"} 1' in text
        assert "gpubox_gpu_fatal_xid_events 3" in text
    else:
        assert 'gpubox_gpu_xid_class_events{class="other",branch="535"} 4' in text
        assert "gpubox_gpu_fatal_xid_events 0" in text
