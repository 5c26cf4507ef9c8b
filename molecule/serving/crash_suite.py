#!/usr/bin/env python3
"""TEST ONLY: crash a fresh converge of site.yml at ten points and prove each re-run gets past it.

    crash_suite.py --box CONTAINER --inventory DIR --playbook site.yml --out DIR

The points follow a fresh converge in order. For each: a watcher inside the box (watcher.py) waits
for the point and strikes, while ansible-playbook runs site.yml against the box:
    kill    SIGKILL of every ansible process on the box (an SSH session lost mid-task);
    freeze  the box frozen at the point, then `podman restart -t 0` (a power cut).
Each run is the re-run of the one before, so it must first get past the previous point (a run that
cannot, e.g. dpkg left half-configured, fails here instead of reaching its own point). A run whose
previous point lies in the serving layer re-runs the layers from that one on, with the day-two tags
an operator uses (docs/day-two.md: `--tags model,service`; `env,model,service` while the Python
environment is what was struck), not the host layer it would find converged: each whole site.yml run
before the serving layer costs some 150 no-op tasks. The first three runs, and the last two, are
the whole site.yml. After every
strike the box's invariants are checked (the live model is absent or verifies against its manifest).
Then site.yml runs once more, undisturbed, and must converge; then upstream pushes a second commit
of the model to the hub's branch (day2_model_suite.give_hub_a_second_commit), and site.yml runs once
again and must change nothing and fetch no file: the box's model lock holds the first commit (day two
of the model goes on from there). The points and results go to OUT/results.json and OUT/results.md and to stdout.

The test hub serves the model's weights slowly (its throttle fault) so that a download can be
caught in flight; everything else runs at full speed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from day2_model_suite import give_hub_a_second_commit, hub_file_gets, hub_log_mark

from harness.ansible_vars import play_recap

HERE = Path(__file__).resolve().parent
BOX_DIR = "/usr/local/libexec/gpubox-crash"
RECORDS = "/var/lib/gpubox-crash"
MODEL_ROOT = "/data/models"
HUB_MODEL = "/srv/gpubox-sim/hub/model"
FAULTS = "/etc/gpubox-sim/hub-faults.json"
WEIGHTS = "model.safetensors"
RUN_TIMEOUT = 1500  # one ansible-playbook run, seconds
LOOK_EVERY = 3.0  # seconds between looks for the watcher's record


@dataclass
class Point:
    name: str
    what: str
    when: list[str]
    action: str  # kill | freeze
    after: float = 0.0
    tags: str = ""  # the run's --tags: empty, the whole site.yml
    # The engine's processes stopped (SIGSTOP) for the run and let go (SIGCONT) after it: the engine answers
    # nothing, as while it loads, so the readiness gate is waiting when it is struck, however fast the run
    # got there (an engine that had finished loading let the gate pass in under a second, before the strike).
    hold_engine: bool = False


STAGED = f"{MODEL_ROOT}/.staging/tiny-qwen2@*"
DPKG = "log:/var/log/dpkg.log:status half-installed "
PIP = r"proc:-m pip install .*requirements"
VLLM = r"vllm\.entrypoints\.openai\.api_server"
# The model_store module itself (not its async_wrapper, which outlives it for a moment).
MODULE = r"proc:^\S*python\S* \S*AnsiballZ_model_store\.py"
# The serving layer's roles from the struck one on (playbooks/serving.yml's tags).
ENV_ON = "env,model,service"
MODEL_ON = "model,service"
POINTS = [
    Point("apt-driver", "dpkg unpacking/configuring the NVIDIA driver packages", [DPKG + "nvidia"], "freeze"),
    Point("apt-cuda", "dpkg unpacking/configuring the CUDA packages", [DPKG + "cuda"], "kill"),
    Point("venv", "python3 -m venv creating the environment", [r"proc:-m venv .*/opt/gpubox/venv-lts-580"], "kill"),
    Point("pip-power", "pip installing the pinned packages", [PIP], "freeze", 8.0, ENV_ON),
    Point("pip-ssh", "pip installing the pinned packages (re-run)", [PIP], "kill", 5.0, ENV_ON),
    Point(
        "download-power",
        "the model client mid-download",
        [f"file:{STAGED}/**/*{WEIGHTS}*:300000"],
        "freeze",
        tags=ENV_ON,
    ),
    Point(
        "download-ssh",
        "the model client mid-download (re-run)",
        [f"file:{STAGED}/**/*{WEIGHTS}*:900000", MODULE],
        "kill",
        tags=MODEL_ON,
    ),
    Point(
        "before-publish",
        "download complete in staging, not yet published",
        [f"staged:{STAGED}:{HUB_MODEL}", MODULE],
        "kill",
        tags=MODEL_ON,
    ),
    Point("unit-start", "vllm.service starting (engine loading)", [f"young:{VLLM}:2:30"], "freeze", tags=MODEL_ON),
    Point(
        "readiness",
        "the readiness gate waiting for the engine",
        ["task:Wait until GET /health answers 200"],
        "kill",
        2.0,
        MODEL_ON,
        hold_engine=True,
    ),
]
VLLM_UNIT = "vllm.service"
# How long a controller-side kill looks for a process of ansible's on the box: a task that retries (the
# readiness gate: a try of up to 10 s, then 5 s apart) has none between its tries.
STRIKE_WITHIN = 20.0


@dataclass
class Result:
    point: str
    what: str
    action: str
    struck: bool = False
    seconds: float = 0.0
    playbook_rc: int | None = None
    invariants: list[str] = field(default_factory=list)
    live: str | None = None
    note: str = ""
    killed: int = 0  # a kill point: the processes of ansible's its strike killed on the box


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """podman ARGS; with check, a failure or a timeout ends the suite with what podman said (the last
    lines of the converge's output, where `make test` shows why a scenario failed), not a traceback."""
    try:
        proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        if not check:
            raise
        what = " ".join(args[:3])
        raise SystemExit(f"crash_suite: `podman {what} ...` did not return within {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip()[-800:]
        raise SystemExit(f"crash_suite: `podman {' '.join(args[:3])} ...` exited {proc.returncode}: {said}")
    return proc


def power_cut(box: str) -> None:
    """`podman restart -t 0`: the box loses every process at once and boots again. When podman itself
    fails to restart it (a harness failure, not the box's), the suite says so and tries once more from
    a stopped box before it gives up."""
    first = podman("restart", "-t", "0", box, check=False, timeout=300)
    if first.returncode == 0:
        return
    print(f"[crash] podman restart of {box} exited {first.returncode}: {first.stderr.strip()[-400:]}", flush=True)
    podman("stop", "-t", "0", box, check=False, timeout=120)
    podman("start", box, timeout=300)


def box_exec(box: str, *argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return podman("exec", box, *argv, check=check, timeout=timeout)


def root_on_host(box: str) -> Path | None:
    """The box's root filesystem as the host sees it (podman's overlay merged directory), or None where
    podman keeps it elsewhere."""
    proc = podman("inspect", "--format", "{{.GraphDriver.Data.MergedDir}}", box, check=False)
    path = Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None
    return path if path is not None and path.is_dir() else None


def recorded(box: str, record: str, root: Path | None = None) -> bool:
    """Whether the watcher wrote its record (a probe that hangs counts as not yet). Read through the box's
    root on the host when given (no process started: the controller looks every few seconds for the whole
    suite, and each `podman exec` costs a tenth of a second of CPU), else by `podman exec`."""
    if root is not None and root.is_dir():
        return (root / record.lstrip("/")).exists()
    try:
        return box_exec(box, "test", "-e", record, check=False, timeout=15).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def killed(box: str, record: str) -> list[int]:
    """The processes a kill point's strike killed, as its record lists them ([] when it found none)."""
    proc = box_exec(box, "cat", record, check=False, timeout=15)
    try:
        return list(json.loads(proc.stdout).get("struck") or [])
    except (ValueError, AttributeError):
        return []


def wait_booted(box: str, timeout: float = 180) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state = box_exec(box, "systemctl", "is-system-running", check=False).stdout.strip()
        if state in ("running", "degraded"):
            sshd = box_exec(box, "systemctl", "is-active", "ssh", check=False).stdout.strip()
            if sshd == "active":
                return
        time.sleep(1)
    raise SystemExit(f"crash_suite: {box} did not boot within {timeout}s after the restart")


def wait_reachable(box: str, timeout: float = 180) -> None:
    """Until the box's sshd answers through its published port, as the next run will reach it.

    After a power cut the box can be booted (sshd active inside) some seconds before the host reaches
    it again on its network (measured: a run started at once timed out connecting); an operator waits
    for the box to answer before running again, and so does the suite."""
    host, _, port = podman("port", box, "22/tcp").stdout.strip().splitlines()[0].rpartition(":")
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection((host, int(port)), timeout=3) as conn:
                conn.settimeout(3)
                if conn.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"crash_suite: {box}'s sshd did not answer on {host}:{port} within {timeout}s after the restart")


def run_playbook(args: argparse.Namespace, log: Path, extra: list[str] | None = None) -> subprocess.Popen:
    cmd = ["ansible-playbook", "-i", args.inventory, args.playbook, *(extra or [])]
    out = log.open("w")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)


def recap(log: Path) -> dict[str, int]:
    """The counters of the run's one host (its log's last PLAY RECAP); empty when it printed none."""
    return next(iter(play_recap(log.read_text(errors="replace")).values()), {})


def strike_point(args: argparse.Namespace, point: Point, index: int, out: Path) -> Result:
    box = args.box
    res = Result(point.name, point.what, point.action)
    record = f"{RECORDS}/{index:02d}-{point.name}.json"
    watch = ["python3", f"{BOX_DIR}/watcher.py", "--point", point.name, "--action", point.action]
    watch += ["--record", record, "--after", str(point.after), "--timeout", str(RUN_TIMEOUT)]
    on_box = [c for c in point.when if not c.startswith("task:")]
    tasks = [c.split(":", 1)[1] for c in point.when if c.startswith("task:")]
    for cond in on_box:
        watch += ["--when", cond]
    if on_box:
        podman("exec", "-d", box, *watch)
    if point.hold_engine:
        box_exec(box, "systemctl", "kill", "--signal=SIGSTOP", VLLM_UNIT, check=False)
    started = time.monotonic()
    next_look = started
    root = root_on_host(box)
    log = out / f"{index:02d}-{point.name}.log"
    proc = run_playbook(args, log, ["--tags", point.tags] if point.tags else None)
    fired, seen = False, None
    while proc.poll() is None:
        if time.monotonic() - started > RUN_TIMEOUT:
            proc.kill()
            break
        if tasks and seen is None:
            text = log.read_text(errors="replace")
            if all(f": {t}" in text for t in tasks):  # "TASK [role : name]" as ansible-playbook prints it
                seen = time.monotonic()
        look = False
        if tasks and seen is not None and not fired and time.monotonic() - seen >= point.after:
            strike = ["python3", f"{BOX_DIR}/watcher.py", "--point", point.name, "--strike"]
            strike += ["--within", str(STRIKE_WITHIN)]
            box_exec(box, *strike, "--action", point.action, "--record", record)
            look = True
        # The record is looked for every 3 s where each look is a `podman exec` (three a second cost more CPU
        # than the run they watched), every 0.5 s where it is a file read on the host. A frozen box waits that
        # long for its power cut: nothing runs on it.
        if time.monotonic() >= next_look:
            look, next_look = True, time.monotonic() + (LOOK_EVERY if root is None else 0.5)
        if not fired and look and recorded(box, record, root):
            fired = True
            if point.action == "freeze":
                power_cut(box)
                proc.kill()  # the operator's run ends with it; the next point's run is the re-run
                wait_booted(box)
                wait_reachable(box)
        time.sleep(0.3)
    res.playbook_rc = proc.returncode
    if point.hold_engine:
        box_exec(box, "systemctl", "kill", "--signal=SIGCONT", VLLM_UNIT, check=False)
    if not fired:
        fired = recorded(box, record)
    res.seconds = round(time.monotonic() - started, 1)
    if not fired:
        res.note = "the run ended without reaching the point"
        box_exec(box, "pkill", "-f", "gpubox-crash/watcher.py", check=False)
    elif point.action == "kill":
        res.killed = len(killed(box, record))
        if not res.killed:
            # The record says the point was seen, but no process of ansible's was there to kill: the run went
            # on past the point unharmed, so nothing about stopping there was tested.
            fired, res.note = False, "the strike found no process of ansible's on the box (it was past the point)"
    res.struck = fired
    check = json.loads(box_exec(box, "python3", f"{BOX_DIR}/watcher.py", "--check", MODEL_ROOT).stdout)
    res.invariants, res.live = check["problems"], check["live"]
    return res


def final_runs(args: argparse.Namespace, out: Path) -> list[dict]:
    runs = []
    for label in ("converge", "idempotence"):
        moved, mark = {}, None
        if label == "idempotence":  # upstream moves the branch: the lock must hold, nothing fetched
            a, b = give_hub_a_second_commit(args.box, out)
            moved, mark = {"master_was": a, "master_now": b}, hub_log_mark(args.box)
        log = out / f"final-{label}.log"
        started = time.monotonic()
        proc = run_playbook(args, log)
        rc = proc.wait(timeout=RUN_TIMEOUT)
        runs.append({"run": label, "rc": rc, "recap": recap(log), "seconds": round(time.monotonic() - started, 1)})
        if mark is not None:
            runs[-1].update(moved, hub_file_gets=[e["path"] for e in hub_file_gets(args.box, mark)])
        if rc != 0:
            break
    return runs


def markdown(results: list[Result], finals: list[dict]) -> str:
    lines = ["| # | point | how | run | struck | re-run rc | invariants after | seconds |", "|---" * 8 + "|"]
    tags = {p.name: p.tags for p in POINTS}
    for i, r in enumerate(results, 1):
        how = "SIGKILL of ansible's processes" if r.action == "kill" else "power cut (freeze + restart)"
        inv = "ok" if not r.invariants else "; ".join(r.invariants)
        struck = ("yes" if r.struck else "NO") + (f" ({r.killed} killed)" if r.action == "kill" else "")
        run = f"`--tags {tags[r.point]}`" if tags[r.point] else "site.yml"
        lines.append(f"| {i} | {r.what} | {how} | {run} | {struck} | {r.playbook_rc} | {inv} | {r.seconds} |")
    for f in finals:
        moved = (
            f", master moved to {f['master_now']}, files fetched: {len(f['hub_file_gets'])}"
            if "master_now" in f
            else ""
        )
        lines.append(f"\nfinal {f['run']}: rc {f['rc']}, {f['recap']}, {f['seconds']} s{moved}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--box", required=True)
    ap.add_argument("--inventory", required=True)
    ap.add_argument("--playbook", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", help="comma-separated subset (development)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    box_exec(args.box, "mkdir", "-p", BOX_DIR, RECORDS)
    podman("cp", str(HERE / "watcher.py"), f"{args.box}:{BOX_DIR}/watcher.py")
    box_exec(args.box, "sh", "-c", f'echo \'{{"throttle": {{"{WEIGHTS}": 400000}}}}\' > {FAULTS}')
    wanted = set(args.points.split(",")) if args.points else None
    results = []
    for index, point in enumerate(POINTS, 1):
        if wanted and point.name not in wanted:
            continue
        res = strike_point(args, point, index, out)
        results.append(res)
        print(
            f"[crash] {index:02d} {point.name}: struck={res.struck} killed={res.killed} rc={res.playbook_rc} "
            f"invariants={'ok' if not res.invariants else res.invariants} ({res.seconds} s)",
            flush=True,
        )
    box_exec(args.box, "rm", "-f", FAULTS)
    finals = final_runs(args, out)
    report = markdown(results, finals)
    (out / "results.md").write_text(report + "\n")
    (out / "results.json").write_text(json.dumps({"points": [asdict(r) for r in results], "final": finals}, indent=2))
    print(report)
    ok = all(r.struck and not r.invariants for r in results)
    ok = ok and len(finals) == 2 and all(f["rc"] == 0 for f in finals)
    ok = ok and finals[-1]["recap"].get("changed") == 0 and finals[-1]["recap"].get("failed") == 0
    ok = ok and finals[-1].get("hub_file_gets") == []
    if not ok:
        for f in finals:
            if f["rc"] != 0:
                print((out / f"final-{f['run']}.log").read_text(errors="replace")[-6000:])
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("ANSIBLE_FORCE_COLOR", "0")
    sys.exit(main())
