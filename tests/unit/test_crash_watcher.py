"""The crash suite's watcher (molecule/serving/watcher.py): it strikes once every condition holds, tells
the controller on stdout, and reads /proc only for a round whose earlier (file) conditions hold.
The strike itself is replaced here: on this machine it would signal the host's own ansible processes."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

WATCHER = Path(__file__).resolve().parents[2] / "molecule/serving/watcher.py"
spec = importlib.util.spec_from_file_location("gpubox_crash_watcher_under_test", WATCHER)
watcher = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = watcher
spec.loader.exec_module(watcher)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> dict:
    seen = {"scans": 0, "strikes": []}
    real = watcher.processes

    def counting() -> dict:
        seen["scans"] += 1
        return real()

    monkeypatch.setattr(watcher, "processes", counting)
    monkeypatch.setattr(watcher, "strike", lambda action, procs: seen["strikes"].append(action) or [])
    return seen


@pytest.fixture
def marker() -> Iterator[str]:
    """A proc: condition that holds: a process of this test's own, by a name no other process has
    (the watcher leaves its own process out, and the machine's other processes are not this test's)."""
    name = f"gpubox-watcher-test-{os.getpid()}"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", name])
    try:
        yield f"proc:{name}"
    finally:
        proc.kill()
        proc.wait()


def _args(tmp_path: Path, when: list[str], timeout: float) -> argparse.Namespace:
    record = tmp_path / "rec" / "01-point.json"
    return argparse.Namespace(point="p", when=when, after=0.0, action="kill", record=str(record), timeout=timeout)


def test_no_proc_scan_while_the_file_condition_fails(tmp_path: Path, scans: dict, marker: str) -> None:
    args = _args(tmp_path, [f"file:{tmp_path}/staging/*.part:10", marker], timeout=0.3)
    assert watcher.watch(args) == 1  # timed out: the file never grew
    assert scans["scans"] == 0 and scans["strikes"] == []
    assert not Path(args.record).exists()


def test_strikes_and_says_so_once_every_condition_holds(
    tmp_path: Path, scans: dict, marker: str, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "staging").mkdir()
    (tmp_path / "staging" / "w.part").write_bytes(b"x" * 20)
    args = _args(tmp_path, [f"file:{tmp_path}/staging/*.part:10", marker], 5)
    assert watcher.watch(args) == 0
    assert scans["strikes"] == ["kill"] and scans["scans"] >= 1
    record = json.loads(Path(args.record).read_text())
    assert record["point"] == "p" and record["matched"][0].endswith("w.part")
    assert capsys.readouterr().out.strip() == "struck p"


def _session_after(looks: int) -> tuple[dict, object]:
    """processes(): no ansible process for the first ``looks`` scans, then an sshd session running a module."""
    seen = {"scans": 0}
    session = {100: (1, "sshd: root@notty"), 101: (100, "/bin/sh -c python3 && sleep 0"), 102: (101, "python3")}

    def fake() -> dict:
        seen["scans"] += 1
        return session if seen["scans"] > looks else {1: (0, "/sbin/init")}

    return seen, fake


@pytest.mark.parametrize(("within", "killed"), [("2", [101, 102]), ("0", [])])
def test_a_controller_kill_looks_for_ansible_within_its_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, within: str, killed: list[int]
) -> None:
    """A task that retries (the readiness gate) has no process on the box between its tries: --strike with
    --within keeps looking until one runs; without it (the control) the strike finds nothing and says so."""
    seen, fake = _session_after(3)
    monkeypatch.setattr(watcher, "processes", fake)
    monkeypatch.setattr(watcher, "strike", lambda action, procs: sorted(watcher.ansible_pids(procs)))
    record = tmp_path / "01-readiness.json"
    argv = ["watcher.py", "--point", "readiness", "--strike", "--action", "kill", "--record", str(record)]
    monkeypatch.setattr(sys, "argv", [*argv, "--within", within])
    assert watcher.main() == 0
    assert json.loads(record.read_text())["struck"] == killed
    assert seen["scans"] == (4 if killed else 1)
