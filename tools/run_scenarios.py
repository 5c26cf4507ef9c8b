#!/usr/bin/env python3
"""Run molecule scenarios, a few at a time, and report each one's result and duration.

Each scenario's full output goes to .cache/molecule-logs/<scenario>.log; a failed scenario's tail is
printed, and after the summary, last of all (CI shows a run's last lines), the action each failed
scenario failed in and the end of what it said (`why_failed`). Exit status is non-zero when any
scenario fails or when none ran. Every scenario is merged over the one molecule base,
.config/molecule/config.yml, named explicitly so that a copy of the tree without .git (where molecule
would not find it) runs the same configuration.

While a scenario runs its output is read line by line and the start and end of each molecule action
(destroy, syntax, create, prepare, converge, idempotence, side_effect, verify, ...) are timed. After
the last scenario the times go to .cache/molecule-logs/times.json (or --times FILE), which
`make bench` tables once copied to bench/scenario-times.json (bench/report.py --record-times).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / ".config" / "molecule" / "config.yml"
LOGDIR = ROOT / ".cache" / "molecule-logs"
# Scenarios that need inputs our CI machines cannot reach; without them they are reported as skipped.
REQUIRES = {
    "python_env_conda": ("GPUBOX_MINIFORGE_INSTALLER", "GPUBOX_MINIFORGE_SHA256", "GPUBOX_CONDA_CHANNEL"),
    # Ubuntu's archive (the image and the real 535 packages): .github/workflows/ubuntu.yml sets it.
    "host_ubuntu": ("GPUBOX_UBUNTU_DRIVER_PIN",),
}
# After molecule exits, how long its output pipe may stay open (a process it left behind holding it)
# before the rest is given up: the scenario ends when molecule does, as when its output went to a file.
DRAIN_AFTER_EXIT_S = 5.0

# Molecule 26.10 (requirements-dev.lock) logs one line when an action starts and one when it ends
# (molecule/logger.py section_logger): without colour (PY_COLORS=0, as the Makefile sets)
#   INFO     [default > converge] Executing
#   INFO     [default > converge] Executed: Successful
#   ERROR    [default > converge] Executed: Failed
# and with colour (ANSI codes around each part) `INFO     default ➜ converge: Executing`.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ACTION_LINE = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"(?:\[(?P<s1>[\w.\-/]+) > (?P<a1>[a-z_]+)\]|(?P<s2>[\w.\-/]+) ➜ (?P<a2>[a-z_]+):)"
    r" (?:(?P<start>Executing)|Executed: (?P<state>\w[\w ,]*?))(?: \(.*\))?\s*$"
)


@dataclass(frozen=True)
class ActionMark:
    """One action boundary in molecule's output: `start` or `end` (then `state`: Successful, Failed, ...)."""

    scenario: str
    action: str
    edge: str
    state: str = ""


def parse_action_line(line: str) -> ActionMark | None:
    """The action boundary a line of molecule output marks, or None for any other line."""
    match = ACTION_LINE.match(ANSI.sub("", line).rstrip("\r\n"))
    if not match:
        return None
    scenario = match.group("s1") or match.group("s2")
    action = match.group("a1") or match.group("a2")
    if match.group("start"):
        return ActionMark(scenario, action, "start")
    return ActionMark(scenario, action, "end", match.group("state"))


@dataclass(frozen=True)
class Phase:
    phase: str
    seconds: float


def phases_from_marks(marks: list[tuple[float, ActionMark]], scenario: str, end: float) -> list[Phase]:
    """The actions of `scenario`, in order, each timed from its start line to its end line.

    `marks` are (seconds, mark) as read. An action with no end line (molecule stopped in it) lasts until
    the next action starts or, for the last one, until `end` (when molecule exited). Repeated actions
    (destroy, first and last) are listed each time they ran.
    """
    phases: list[Phase] = []
    open_action: tuple[str, float] | None = None
    for at, mark in marks:
        if mark.scenario != scenario:
            continue
        if mark.edge == "start":
            if open_action:
                phases.append(Phase(open_action[0], round(at - open_action[1], 1)))
            open_action = (mark.action, at)
        elif open_action and open_action[0] == mark.action:
            phases.append(Phase(mark.action, round(at - open_action[1], 1)))
            open_action = None
    if open_action:
        phases.append(Phase(open_action[0], round(end - open_action[1], 1)))
    return phases


@dataclass
class Result:
    scenario: str
    ok: bool
    seconds: float
    log: Path
    skipped: str = ""
    phases: list[Phase] = field(default_factory=list)

    @property
    def state(self) -> str:
        return "skipped" if self.skipped else "passed" if self.ok else "failed"


def pump(proc: subprocess.Popen[bytes], out: BinaryIO, on_line: Callable[[bytes], None]) -> None:
    """Copy the process's output to `out` line by line (each line also to `on_line`) until it closes,
    or until DRAIN_AFTER_EXIT_S after the process exited."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    pending = b""
    exited_at: float | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at > DRAIN_AFTER_EXIT_S:
                break
            if not sel.select(timeout=0.5):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                out.write(line + b"\n")
                on_line(line)
            out.flush()
    if pending:
        out.write(pending)
        on_line(pending)
    proc.stdout.close()


def run(scenario: str, logdir: Path) -> Result:
    if not (ROOT / "molecule" / scenario / "molecule.yml").is_file():
        raise SystemExit(f"run_scenarios: no scenario molecule/{scenario}/molecule.yml")
    log = logdir / f"{scenario}.log"
    missing = [name for name in REQUIRES.get(scenario, ()) if not os.environ.get(name)]
    if missing:
        why = "needs " + ", ".join(missing) + " (not reachable from this machine)"
        print(f"[molecule] {scenario}: SKIPPED, {why}", flush=True)
        return Result(scenario, True, 0.0, log, skipped=why)
    start = time.monotonic()
    marks: list[tuple[float, ActionMark]] = []

    def on_line(line: bytes) -> None:
        mark = parse_action_line(line.decode("utf-8", errors="replace"))
        if mark:
            marks.append((time.monotonic() - start, mark))

    print(f"[molecule] {scenario}: started", flush=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["molecule", "--base-config", str(BASE_CONFIG), "test", "-s", scenario],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            pump(proc, out, on_line)
        except BaseException:
            proc.kill()
            raise
        returncode = proc.wait()
    seconds = time.monotonic() - start
    res = Result(scenario, returncode == 0, seconds, log, phases=phases_from_marks(marks, scenario, seconds))
    print(f"[molecule] {scenario}: {'passed' if res.ok else 'FAILED'} in {res.seconds:.0f} s", flush=True)
    return res


FAILED_TASK = re.compile(r"^(?:fatal|failed): \[(?P<host>[^\]]+)\].*?FAILED!")
TASK_LINE = re.compile(r"^TASK \[(?P<task>.*)\]")
WHY_LINES = 8  # lines of what the failed task said, per scenario
WHY_WIDTH = 220  # characters a line, at most


def failed_task(lines: list[str]) -> list[str]:
    """The last failed task of an ansible-playbook output that was not ignored: `host: TASK [name]`,
    then the end of what it said (its msg, the last lines of its stderr and stdout: a suite run by
    `command` prints its verdict last). ansible-playbook prints the result as JSON after `FAILED! =>`,
    on that line or over the following ones up to a closing brace of its own."""
    for at in range(len(lines) - 1, -1, -1):
        if not (m := FAILED_TASK.match(lines[at])):
            continue
        raw = [lines[at].split("=>", 1)[1].strip() if "=>" in lines[at] else ""]
        if raw[0] == "{":
            for line in lines[at + 1 :]:
                raw.append(line)
                if line == "}":
                    break
        after = lines[at + len(raw) : at + len(raw) + 1]
        if after and after[0].strip() == "...ignoring":
            continue
        try:
            result = json.loads("\n".join(raw))
        except ValueError:
            result = None
        said: list[str] = []
        if isinstance(result, dict):
            said += str(result.get("msg", "")).splitlines()[-3:]
            for key in ("stderr_lines", "stdout_lines"):
                said += [str(line) for line in result.get(key) or [] if str(line).strip()][-3:]
        said = [line for line in said if line.strip()] or [line for line in raw if line.strip()]
        task = next((t["task"] for line in reversed(lines[:at]) if (t := TASK_LINE.match(line))), "?")
        return [f"{m['host']}: TASK [{task}]", *said[-WHY_LINES:]]
    return []


def why_failed(text: str) -> list[str]:
    """Why a scenario failed, in a few lines, from its molecule log: the action that failed, then within
    it pytest's FAILED lines (verify), else the last failed task that was not ignored, else molecule's
    own CRITICAL or ERROR lines (an idempotence run that changed something names the tasks after it)."""
    lines = [ANSI.sub("", line) for line in text.splitlines()]
    begin, action = 0, "?"
    for i, line in enumerate(lines):
        mark = parse_action_line(line)
        if mark and mark.edge == "start":
            begin, action = i, mark.action
        elif mark and mark.state.startswith("Failed"):
            break
    segment = lines[begin:]
    said = [line for line in segment if line.startswith("FAILED ")][-WHY_LINES:]
    said = said or failed_task(segment)
    if not said:
        crit = [
            i
            for i, line in enumerate(segment)
            if line.startswith(("CRITICAL", "ERROR")) and not parse_action_line(line)
        ]
        if crit:
            said = [segment[crit[-1]]] + [line for line in segment[crit[-1] + 1 :] if line.lstrip().startswith("* ")]
    return [f"{action}: " + (said[0] if said else "(no failed task or test in its log: see the lines above)")] + [
        "  " + line for line in said[1 : WHY_LINES + 1]
    ]


def times_record(results: list[Result], jobs: int, started: datetime, finished: datetime) -> dict[str, Any]:
    """The times.json document: each scenario's result, wall time and phases, in the order given."""
    return {
        "scenarios": [
            {
                "scenario": r.scenario,
                "result": r.state,
                "seconds": round(r.seconds, 1),
                "phases": [{"phase": p.phase, "seconds": p.seconds} for p in r.phases],
            }
            for r in results
        ],
        "jobs": jobs,
        "started": started.isoformat(timespec="seconds"),
        "finished": finished.isoformat(timespec="seconds"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("scenarios", nargs="+")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--times", type=Path, default=LOGDIR / "times.json", help="write the times here")
    args = ap.parse_args()
    LOGDIR.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda s: run(s, LOGDIR), args.scenarios))
    record = times_record(results, max(1, args.jobs), started, datetime.now(timezone.utc))
    args.times.parent.mkdir(parents=True, exist_ok=True)
    args.times.write_text(json.dumps(record, indent=2) + "\n")
    for r in results:
        if not r.ok:
            lines = r.log.read_text(errors="replace").splitlines()
            print(f"\n===== {r.scenario}: last 80 lines of {r.log} =====")
            print("\n".join(lines[-80:]))
    print("\nmolecule summary:")
    for r in results:
        state = "SKIPPED" if r.skipped else "passed" if r.ok else "FAILED"
        print(f"  {r.scenario:<24} {state:<7} {r.seconds:6.0f} s {r.skipped}")
    for r in results:
        if not r.ok and r.log.exists():
            why = why_failed(r.log.read_text(errors="replace"))
            print(f"{r.scenario} failed in " + "\n".join(line[:WHY_WIDTH] for line in why))
    ran = [r for r in results if not r.skipped]
    return 0 if ran and all(r.ok for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
