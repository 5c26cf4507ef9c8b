"""Both ends of the ansible-core range the collection supports, for real: the oldest meta/runtime.yml
admits (its requires_ansible lower bound, which every role's min_ansible_version repeats) and the newest
ansible-core release. For each, the newest release of that series, installed from PyPI into a cached
venv on the oldest controller Python it supports, parses site.yml and every playbook of the checkout,
builds the collection, installs it offline and runs test_collection's play of its modules, lookup and
roles from a directory of its own; and none of those runs prints a deprecation warning that is ours.

And the series below the floor (2.18, out of support since November 2026) is refused by the checkout,
for the reason meta/runtime.yml gives (ansible.cfg turns ansible-core's version-mismatch warning into
an error).

The cache: $GPUBOX_CACHE (default ~/.cache/gpubox)/ansible-core-<series>-py<python>, one per series
(2.19 on Python 3.11, 2.21 on 3.12, 2.18 on 3.11). Cold, each is one venv and one `pip install
ansible-core==<series>.*` from PyPI (10 to 60 s each here); warm the file takes 25 to 40 s on the
2-core development machine. A series whose Python is not on this machine (PATH or pyenv) is skipped
here; CI's controller job installs each one and sets GPUBOX_CORE_PYTHONS=required, which turns that
skip into a failure (.github/workflows/ubuntu.yml, docs/testing.md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

import test_collection
from test_collection import (
    GALAXY,
    ROOT,
    VENDORED,
    ansible_core_floor,
    clean_env,
    install_offline,
    run_installed_play,
)

FLOOR = ansible_core_floor()
SERIES = f"{FLOOR.major}.{FLOOR.minor}"
# The newest ansible-core release on PyPI: 2.21 (2.21.5 on 2026-12-06; 2.22 is at rc1). Move it on
# when 2.22.0 is out, with its controller Python below.
NEWEST = "2.21"
# The oldest controller Python of each ansible-core series (ansible-core's support matrix; its
# Requires-Python): 2.17 is the last that runs on 3.10, Ubuntu 22.04's python3; 2.20 needs 3.12.
CONTROLLER_PYTHON = {"2.17": "3.10", "2.18": "3.11", "2.19": "3.11", "2.20": "3.12", "2.21": "3.12"}
PYTHON = CONTROLLER_PYTHON[SERIES]
CACHE = Path(os.environ.get("GPUBOX_CACHE", Path.home() / ".cache" / "gpubox"))
PLAYBOOKS = [ROOT / "site.yml", *sorted((ROOT / "playbooks").glob("*.yml"))]

# Deprecation warnings we accept, each from code that is not ours, with the reason; anything else
# fails the run that printed it. A pattern is matched against the warning's whole text.
ACCEPTED_DEPRECATIONS = {
    # cryptography 51 deprecates DSA; ansible-core's own ssh-agent client (ansible/_internal/_ssh) imports
    # its DSA classes at start-up, in 2.19 and 2.21 alike. Ours neither imports nor uses DSA.
    r"ansible/_internal/_ssh/_ssh_agent\.py:\d+: CryptographyDeprecationWarning: DSA is deprecated": (
        "ansible-core's import of cryptography's DSA"
    ),
}
# What ansible-core prints for a deprecated construct (`[DEPRECATION WARNING]: ...` and its indented
# lines), and a Python DeprecationWarning (or a subclass) printed with its file and line.
DEPRECATION = re.compile(r"^\[DEPRECATION WARNING\]:.*(?:\n(?!\[|\n).*)*|^\S+\.py:\d+: \w*DeprecationWarning: .*", re.M)


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
        if python is None and os.environ.get("GPUBOX_CORE_PYTHONS") == "required":  # CI: no skipping
            pytest.fail(f"no Python {python_version} for ansible-core {series}: install it (docs/testing.md)")
        if python is None:
            pytest.skip(
                f"optional: no Python {python_version} here for ansible-core {series}; CI's controller job has it "
                "(docs/testing.md)"
            )
        # made in place (a venv is not relocatable); the stamp, written last, marks one that is whole
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, f"ansible-core=={series}.*"], check=True, capture_output=True)
        stamp.write_text(f"ansible-core=={series}.* on Python {python_version}\n")
    return venv / "bin"


@pytest.fixture(scope="module", params=[SERIES, NEWEST], ids=lambda s: f"floor-{s}" if s == SERIES else f"newest-{s}")
def core(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(series, bin/ of its cached venv): the floor, then the newest release."""
    return request.param, core_venv(request.param, CONTROLLER_PYTHON[request.param])


class Runs:
    """test_collection.run, recording what each ansible command printed, with deprecation warnings on."""

    def __init__(self) -> None:
        self.outputs: list[tuple[str, str]] = []

    def __call__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=dict(env, ANSIBLE_DEPRECATION_WARNINGS="True"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.outputs.append(
            (" ".join(Path(a).name if a.startswith("/") else a for a in argv[:3]), proc.stdout + proc.stderr)
        )
        assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc

    def deprecations(self) -> list[str]:
        """Every deprecation warning printed, as '<command>: <warning>'."""
        return [f"{cmd}: {m.group(0)}" for cmd, out in self.outputs for m in DEPRECATION.finditer(out)]

    def ours(self) -> list[str]:
        """The deprecation warnings no ACCEPTED_DEPRECATIONS pattern matches."""
        return [w for w in self.deprecations() if not any(re.search(p, w) for p in ACCEPTED_DEPRECATIONS)]


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Runs:
    """Every ansible command of the test, test_collection's helpers' included, goes through one Runs."""
    recorder = Runs()
    monkeypatch.setattr(test_collection, "run", recorder)
    return recorder


def checkout_env() -> dict[str, str]:
    """The checkout as a user runs it (ansible.cfg), its collections from the link and the vendored copies."""
    return clean_env(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=f"{ROOT / 'collections'}{os.pathsep}{VENDORED}",
        ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
    )


def core_version(bindir: Path, runs: Runs) -> Version:
    out = runs([str(bindir / "python"), "-c", "import ansible.release as r; print(r.__version__)"], ROOT, clean_env())
    return Version(out.stdout.strip())


def test_each_cached_venv_holds_its_series_on_its_oldest_python(core: tuple[str, Path], runs: Runs) -> None:
    series, bindir = core
    version = core_version(bindir, runs)
    assert f"{version.major}.{version.minor}" == series, version
    assert series != SERIES or version >= FLOOR, version
    out = runs([str(bindir / "python"), "-c", "import sys; print(*sys.version_info[:2], sep='.')"], ROOT, clean_env())
    assert out.stdout.strip() == CONTROLLER_PYTHON[series]


def test_the_checkout_parses_every_playbook(core: tuple[str, Path], runs: Runs) -> None:
    # One ansible-playbook for all of them (each one's parse costs less than the start-up): it parses
    # them in turn, names each, and stops at the first that fails, naming its file.
    series, bindir = core
    proc = runs(
        [str(bindir / "ansible-playbook"), "--syntax-check", *map(str, PLAYBOOKS)],
        ROOT,
        checkout_env(),
    )
    parsed = re.findall(r"^playbook: (\S+)$", proc.stdout, re.M)
    assert [ROOT / p for p in parsed] == PLAYBOOKS, proc.stdout
    # requires_ansible admits the series (else: "Collection gpubox.gpubox does not support Ansible version")
    assert "does not support" not in proc.stdout + proc.stderr, proc.stderr
    assert runs.ours() == [], f"ansible-core {series}: deprecation warnings of ours"


def test_the_installed_collection_plays(core: tuple[str, Path], runs: Runs, tmp_path: Path) -> None:
    series, bindir = core
    out = tmp_path / "build"
    runs(
        [str(bindir / "ansible-galaxy"), "collection", "build", "--output-path", str(out), str(ROOT)],
        ROOT,
        clean_env(),
    )
    (tarball,) = out.glob(f"{GALAXY['namespace']}-{GALAXY['name']}-*.tar.gz")
    installed, env = install_offline(bindir, tarball, tmp_path / "installed")
    work = tmp_path / "play"
    work.mkdir()
    run_installed_play(bindir, installed, env, work)
    assert len(runs.outputs) == 5, [cmd for cmd, _ in runs.outputs]  # build, install, the play, 2 syntax checks
    assert runs.ours() == [], f"ansible-core {series}: deprecation warnings of ours"


# The control of the two tests above: a construct each series deprecates (a mapping for `action`,
# deprecated in 2.19 for removal in 2.23), parsed the same way, is caught and is not accepted.
DEPRECATED_PLAY = """\
- name: A deprecated construct
  hosts: localhost
  gather_facts: false
  tasks:
    - name: The module and its arguments as a mapping
      action:
        module: ansible.builtin.debug
        msg: deprecated
"""


def test_a_deprecation_of_ours_is_caught(core: tuple[str, Path], runs: Runs, tmp_path: Path) -> None:
    _series, bindir = core
    (tmp_path / "deprecated.yml").write_text(DEPRECATED_PLAY)
    runs([str(bindir / "ansible-playbook"), "--syntax-check", str(tmp_path / "deprecated.yml")], ROOT, checkout_env())
    (warning,) = runs.ours()
    assert "Using a mapping for `action` is deprecated" in warning, warning


# Why the floor is not lower: the series below it is out of support (meta/runtime.yml), and the checkout
# refuses it: ansible.cfg's collections_on_ansible_version_mismatch = error makes requires_ansible's
# bound an error instead of ansible-core's default warning. The older blocker stays too: 2.17 (the last
# on Ubuntu 22.04's own Python 3.10) cannot parse roles/model_store's loop_control.break_when.
BELOW_FLOOR = {"2.19": ("2.18", "Collection gpubox.gpubox does not support Ansible version 2.18.")}


@pytest.mark.skipif(SERIES not in BELOW_FLOOR, reason=f"not applicable: no blocker known below {SERIES}")
def test_the_series_below_the_floor_is_refused() -> None:
    below, reason = BELOW_FLOOR[SERIES]
    bindir = core_venv(below, CONTROLLER_PYTHON[below])
    argv = [str(bindir / "ansible-playbook"), "--syntax-check", str(ROOT / "site.yml")]
    proc = subprocess.run(argv, cwd=ROOT, env=checkout_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0, f"ansible-core {below} now loads the checkout: check ansible.cfg and meta/runtime.yml"
    assert reason in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    # the control: the same run with ansible-core's default (a warning) parses, so the refusal is that setting's
    proc = subprocess.run(
        argv,
        cwd=ROOT,
        env=dict(checkout_env(), ANSIBLE_COLLECTIONS_ON_ANSIBLE_VERSION_MISMATCH="warning"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and reason in proc.stderr, proc.stdout + proc.stderr
