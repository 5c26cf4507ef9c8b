"""kill_uid (the unsandboxed test client's clean-up) reaches only live processes of its own PID namespace.

A container's processes are visible in the host's /proc with the container's uid numbers, which name
other users there (rootful podman, no user namespace): the unit tests running beside molecule's boxes
must never kill a box's `vllm` or `sshd` because its uid number equals the test download user's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import model_client

UID = 64000 + os.getpid() % 1000  # a uid no account on this machine uses
SLEEP = f"setpriv --reuid={UID} --regid={UID} --clear-groups sleep 120"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")


def _pids() -> list[int]:
    out = subprocess.run(["pgrep", "-u", str(UID), "-x", "sleep"], capture_output=True, text=True).stdout
    return sorted(int(p) for p in out.split())


def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(what)
        time.sleep(0.05)


def test_kill_uid_kills_its_namespace_and_spares_another_pid_namespace() -> None:
    # Ours: started in the background of a shell that exits at once (reparented, so reaped when killed).
    here = int(
        subprocess.run(
            ["sh", "-c", f"{SLEEP} >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
        ).stdout
    )
    there = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", SLEEP])
    try:
        _until(lambda: len(_pids()) == 2, f"two sleeps of uid {UID}: {_pids()}")
        (theirs,) = [p for p in _pids() if p != here]
        assert model_client.uid_pids(UID) == [here]
        model_client.kill_uid(UID)
        _until(lambda: _pids() == [theirs], f"only the other namespace's sleep is left: {_pids()}")
        assert there.poll() is None, "the process of the other PID namespace was killed"
    finally:
        there.kill()
        subprocess.run(["pkill", "-9", "-u", str(UID)], check=False)


def test_a_zombie_of_the_uid_is_not_waited_for() -> None:
    child = subprocess.Popen(["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "true"])
    try:
        _until(lambda: Path(f"/proc/{child.pid}/stat").read_text().split(") ", 1)[1].startswith("Z"), "a zombie")
        assert child.pid not in model_client.uid_pids(UID)
        model_client.kill_uid(UID, timeout=2)  # returns: nothing live is left
    finally:
        child.wait()
