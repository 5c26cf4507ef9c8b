"""The oldest ansible-core meta/runtime.yml admits (its requires_ansible lower bound, which every role's
min_ansible_version repeats), for real: the newest release of that series, installed from PyPI into a
cached venv on the oldest controller Python it supports, parses site.yml and every playbook of the
checkout, builds the collection, installs it offline and runs test_collection's play of its modules,
lookup and roles from a directory of its own.

And the series below the floor (2.17, the last on Python 3.10) still cannot load the repo, for the one
reason meta/runtime.yml gives: when that stops being true, the floor can drop.

The cache: $GPUBOX_CACHE (default ~/.cache/gpubox)/ansible-core-<series>-py<python>, one per series
(2.18 on Python 3.11, 2.17 on 3.10). Cold, each is one venv and one `pip install ansible-core==<series>.*`
from PyPI (40 to 60 s each here); warm the file takes 30 to 60 s. A series whose Python is not on this
machine (PATH or pyenv) is skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from test_collection import (
    GALAXY,
    ROOT,
    VENDORED,
    ansible_core_floor,
    clean_env,
    install_offline,
    run,
    run_installed_play,
)

FLOOR = ansible_core_floor()
SERIES = f"{FLOOR.major}.{FLOOR.minor}"
# The oldest controller Python of each ansible-core series (ansible-core's support matrix): 2.17 is the
# last that runs on 3.10, Ubuntu 22.04's python3.
CONTROLLER_PYTHON = {"2.17": "3.10", "2.18": "3.11", "2.19": "3.11", "2.20": "3.12"}
PYTHON = CONTROLLER_PYTHON[SERIES]
CACHE = Path(os.environ.get("GPUBOX_CACHE", Path.home() / ".cache" / "gpubox"))
PLAYBOOKS = [ROOT / "site.yml", *sorted((ROOT / "playbooks").glob("*.yml"))]


def find_python(version: str) -> str | None:
    """An interpreter of that X.Y that runs (a pyenv shim on PATH may exist for a version not selected)."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return getattr(sys, "_base_executable", sys.executable)
    pyenv = sorted((Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python{version}"))
    for candidate in [shutil.which(f"python{version}"), *map(str, reversed(pyenv))]:
        if candidate is None:
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys, venv; print(*sys.version_info[:2], sep='.')"], capture_output=True, text=True
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


def core_venv(series: str, python_version: str) -> Path:
    """bin/ of the cached venv with the newest ansible-core of series on Python python_version (made once)."""
    venv = CACHE / f"ansible-core-{series}-py{python_version}"
    stamp = venv / "gpubox-floor.stamp"
    if not stamp.is_file():
        python = find_python(python_version)
        if python is None:
            pytest.skip(f"optional: no Python {python_version} here for ansible-core {series} (docs/testing.md)")
        # made in place (a venv is not relocatable); the stamp, written last, marks one that is whole
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, f"ansible-core=={series}.*"], check=True, capture_output=True)
        stamp.write_text(f"ansible-core=={series}.* on Python {python_version}\n")
    return venv / "bin"


@pytest.fixture(scope="module")
def floor_bin() -> Path:
    return core_venv(SERIES, PYTHON)


def checkout_env() -> dict[str, str]:
    """The checkout as a user runs it (ansible.cfg), its collections from the link and the vendored copies."""
    return clean_env(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=f"{ROOT / 'collections'}{os.pathsep}{VENDORED}",
        ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
    )


def core_version(bindir: Path) -> Version:
    out = run([str(bindir / "python"), "-c", "import ansible.release as r; print(r.__version__)"], ROOT, clean_env())
    return Version(out.stdout.strip())


def test_the_cached_venv_holds_the_floor_on_its_oldest_python(floor_bin: Path) -> None:
    version = core_version(floor_bin)
    assert (version.major, version.minor) == (FLOOR.major, FLOOR.minor) and version >= FLOOR, version
    out = run([str(floor_bin / "python"), "-c", "import sys; print(*sys.version_info[:2], sep='.')"], ROOT, clean_env())
    assert out.stdout.strip() == PYTHON


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_checkout_parses_under_the_floor(floor_bin: Path, playbook: Path) -> None:
    proc = run([str(floor_bin / "ansible-playbook"), "--syntax-check", str(playbook)], ROOT, checkout_env())
    # requires_ansible admits the floor (else: "Collection gpubox.gpubox does not support Ansible version")
    assert "does not support" not in proc.stdout + proc.stderr, proc.stderr


def test_the_installed_collection_plays_under_the_floor(floor_bin: Path, tmp_path: Path) -> None:
    out = tmp_path / "build"
    run(
        [str(floor_bin / "ansible-galaxy"), "collection", "build", "--output-path", str(out), str(ROOT)],
        ROOT,
        clean_env(),
    )
    (tarball,) = out.glob(f"{GALAXY['namespace']}-{GALAXY['name']}-*.tar.gz")
    installed, env = install_offline(floor_bin, tarball, tmp_path / "installed")
    work = tmp_path / "play"
    work.mkdir()
    run_installed_play(floor_bin, installed, env, work)


# Why the floor is not 2.17, the last ansible-core that runs on Ubuntu 22.04's own Python 3.10: the one
# construct of the repo it cannot load. When this fails because 2.17 parses site.yml, the floor can drop
# to 2.17 (meta/runtime.yml, every role's min_ansible_version) and a stock Ubuntu 22.04 controller works.
BELOW_FLOOR = {"2.18": ("2.17", "'break_when' is not a valid attribute for a LoopControl")}


@pytest.mark.skipif(SERIES not in BELOW_FLOOR, reason=f"not applicable: no blocker known below {SERIES}")
def test_the_series_below_the_floor_cannot_load_the_repo() -> None:
    below, reason = BELOW_FLOOR[SERIES]
    bindir = core_venv(below, CONTROLLER_PYTHON[below])
    argv = [str(bindir / "ansible-playbook"), "--syntax-check", str(ROOT / "site.yml")]
    proc = subprocess.run(argv, cwd=ROOT, env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, f"ansible-core {below} now parses site.yml: lower the floor to {below}"
    assert reason in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "roles/model_store/tasks/main.yml" in proc.stdout + proc.stderr
