"""See harness/__init__.py; each script here also runs standalone, by path.

What the tests that drive the simulated GPU share: where the captures and the tools are, the replay's
environment, a fake sysfs, and a bin directory whose nvidia-smi is the replay.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "tests" / "fixtures" / "nvidia-smi"
REPLAY = HERE / "nvidia-smi"
MAKE_SYSFS = HERE / "make_sysfs.py"


def sim_env(box: str, state: Path, **extra: str) -> dict:
    """This process's environment with the replay pointed at ``box``'s capture and ``state``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOX_SIM_")}
    env.update(GPUBOX_SIM_BOX=box, GPUBOX_SIM_FIXTURES=str(FIXTURES), GPUBOX_SIM_STATE_DIR=str(state), **extra)
    return env


def make_sysfs(box: str, root: Path, *extra: str) -> None:
    """``box``'s captured sysfs written under ``root`` (make_sysfs.py's options in ``extra``)."""
    subprocess.run([sys.executable, str(MAKE_SYSFS), str(FIXTURES / box / "sysfs.json"), str(root), *extra], check=True)


def replay_bin(directory: Path) -> Path:
    """``directory``/bin, whose nvidia-smi is the replay tool run by this interpreter."""
    bindir = directory / "bin"
    bindir.mkdir()
    wrapper = bindir / "nvidia-smi"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPLAY}" "$@"\n')
    wrapper.chmod(0o755)
    return bindir
