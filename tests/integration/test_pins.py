"""roles/python_env/files/gpubox_pins.py against a real (empty) venv with hand-made distributions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

PINS = Path(__file__).resolve().parents[2] / "roles" / "python_env" / "files" / "gpubox_pins.py"


def _site_packages(env: Path) -> Path:
    found = sorted(env.glob("lib/python*/site-packages"))
    assert found, f"no site-packages in {env}"
    return found[0]


def _add_dist(env: Path, name: str, version: str, scripts: tuple[str, ...] = ()) -> None:
    info = _site_packages(env) / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if scripts:
        lines = "".join(f"{script} = {name.replace('-', '_')}.cli:main\n" for script in scripts)
        (info / "entry_points.txt").write_text("[console_scripts]\n" + lines)


def _report(env: Path, tmp: Path, requirements: str, constraints: str = "") -> dict:
    (tmp / "req.txt").write_text(requirements)
    (tmp / "con.txt").write_text(constraints)
    out = subprocess.run(
        [str(env / "bin" / "python"), str(PINS), "--requirements", str(tmp / "req.txt"),
         "--constraints", str(tmp / "con.txt"), "--remove", "torchvision"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout)


@pytest.fixture
def env(tmp_path: Path) -> Path:
    path = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(path)
    return path


def test_exact_pins_missing_and_mismatched(env: Path, tmp_path: Path) -> None:
    _add_dist(env, "alpha", "1.0")
    _add_dist(env, "torch", "2.13.0+cpu")
    report = _report(env, tmp_path, "alpha==1.0\nbeta==2.0\n", "torch==2.13.0+cpu\ngamma==3.0\n")
    assert report["missing"] == ["beta"]
    assert report["mismatched"] == []
    assert report["satisfied"] is False
    report = _report(env, tmp_path, "alpha==1.1\n", "torch==2.13.0\n")
    assert report["mismatched"] == ["alpha 1.0 (pinned 1.1)"]  # a local build matches its public pin
    report = _report(env, tmp_path, "alpha==1.0\n", "torch==2.13.0+cu124\n")
    assert report["mismatched"] == ["torch 2.13.0+cpu (pinned 2.13.0+cu124)"]


def test_removal_list_reports_only_installed(env: Path, tmp_path: Path) -> None:
    _add_dist(env, "alpha", "1.0")
    assert _report(env, tmp_path, "alpha==1.0\n")["to_remove"] == []
    _add_dist(env, "torchvision", "0.28.0")
    assert _report(env, tmp_path, "alpha==1.0\n", "torchvision==0.28.0\n")["to_remove"] == ["torchvision"]


def test_missing_console_script_is_not_satisfied(env: Path, tmp_path: Path) -> None:
    # modelscope 1.23 -> 1.40: pip installs modelscope-hub (which now owns `modelscope`), then uninstalls
    # the old modelscope, whose record still lists bin/modelscope: the script is gone.
    _add_dist(env, "modelscope-hub", "0.5.1", scripts=("modelscope", "ms"))
    report = _report(env, tmp_path, "modelscope-hub==0.5.1\n")
    assert report["broken_scripts"] == ["modelscope-hub==0.5.1"]
    assert report["satisfied"] is False
    scripts = Path(sysconfig.get_path("scripts", vars={"base": str(env), "platbase": str(env)}))
    for name in ("modelscope", "ms"):
        (scripts / name).write_text("#!/bin/sh\n")
    report = _report(env, tmp_path, "modelscope-hub==0.5.1\n")
    assert report["broken_scripts"] == []
    assert report["satisfied"] is True


# --- every install step takes its files by hash (a real pip against a local wheel directory) --------------------------

LOCK_WHEELS = Path(__file__).resolve().parents[2] / "tools" / "lock_wheels.py"


def _wheel(path: Path, body: str) -> Path:
    """A real wheel of alpha 1.0 with a console script `alpha`; ``body`` is its module (other bytes, same name)."""
    import base64
    import hashlib
    import zipfile

    files = {
        "alpha/__init__.py": body,
        "alpha-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: alpha\nVersion: 1.0\n",
        "alpha-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "alpha-1.0.dist-info/entry_points.txt": "[console_scripts]\nalpha = alpha:main\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files["alpha-1.0.dist-info/RECORD"] = "\n".join([*record, "alpha-1.0.dist-info/RECORD,,"]) + "\n"
    path.mkdir(parents=True, exist_ok=True)
    wheel = path / "alpha-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


@pytest.fixture(scope="module")
def pip_env(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A venv with pip, a good and a tampered alpha-1.0 wheel (same file name), and the pins dir the role writes."""
    import hashlib
    import importlib.util

    root = tmp_path_factory.mktemp("hashes")
    env = root / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    good = _wheel(root / "good", "def main():\n    print('good')\n")
    bad = _wheel(root / "bad", "def main():\n    print('tampered')\n")
    assert good.name == bad.name and good.read_bytes() != bad.read_bytes()
    spec = importlib.util.spec_from_file_location("lock_wheels", LOCK_WHEELS)
    lock_wheels = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("lock_wheels", lock_wheels)  # its dataclass looks its module up
    spec.loader.exec_module(lock_wheels)
    pins = lock_wheels.read_pins("alpha==1.0\n")
    pins_dir = env / "gpubox"
    pins_dir.mkdir()
    (pins_dir / "requirements.txt").write_text("alpha==1.0\n")
    (pins_dir / "constraints.txt").write_text("alpha==1.0\n")
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    (pins_dir / "hashes.txt").write_text(lock_wheels.render("c.txt", pins, {pins[0]: [digest]}))
    (pins_dir / "gpubox_pins.py").write_text(PINS.read_text())
    # pip reads no machine configuration (index mirrors, find-links, constraints) in these runs
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    environ["PIP_CONFIG_FILE"] = os.devnull
    return {"env": env, "good": good.parent, "bad": bad.parent, "pins": pins_dir, "environ": environ}


def _role_argv(name: str, pip_env: dict, wheelhouse: Path, require_hashes: bool = True, **extra: object) -> list[str]:
    """The argv the python_env role renders (vars/main.yml, templated by Ansible) for this venv and wheel directory."""
    from harness.ansible_vars import render

    extra_vars = {
        "gpubox_env_prefix": str(pip_env["env"]),
        "python_env_wheelhouse": str(wheelhouse),
        "python_env_offline": True,
        "python_env_require_hashes": require_hashes,
        **extra,
    }
    return render("gpu-box", name, roles=("gpubox", "python_env"), extra_vars=extra_vars)


def _run(argv: list[str], pip_env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, env=pip_env["environ"], timeout=300)


def _installed_module(pip_env: dict) -> str | None:
    found = sorted(pip_env["env"].glob("lib/python*/site-packages/alpha/__init__.py"))
    return found[0].read_text() if found else None


def test_every_install_path_refuses_a_same_name_same_version_wheel_with_other_bytes(pip_env: dict) -> None:
    env, pins_dir = pip_env["env"], pip_env["pins"]
    script = env / "bin" / "alpha"
    uninstall = [str(env / "bin" / "python"), "-m", "pip", "uninstall", "--yes", "alpha"]

    # 1. The install step. Control: without the lock (python_env_require_hashes: false) pip takes the tampered file.
    plain = _role_argv("__python_env_install_argv", pip_env, pip_env["bad"], require_hashes=False)
    assert "--require-hashes" not in plain
    assert _run(plain, pip_env).returncode == 0 and "tampered" in _installed_module(pip_env)
    _run(uninstall, pip_env)
    locked = _role_argv("__python_env_install_argv", pip_env, pip_env["bad"])
    assert locked[-3:] == ["--require-hashes", "--requirement", f"{pins_dir}/hashes.txt"]
    refused = _run(locked, pip_env)
    assert refused.returncode != 0 and "HASH" in refused.stderr.upper(), refused.stderr
    assert _installed_module(pip_env) is None
    ok = _run(_role_argv("__python_env_install_argv", pip_env, pip_env["good"]), pip_env)
    assert ok.returncode == 0, ok.stderr
    assert "good" in _installed_module(pip_env) and script.exists()

    # 2. The repair of a missing console script, from the lock's own entry (gpubox_pins.py --lock).
    script.unlink()
    compare = _role_argv("__python_env_compare_argv", pip_env, pip_env["bad"])
    report = json.loads(_run(compare, pip_env).stdout)
    assert report["broken_scripts"] == ["alpha==1.0"] and report["repair_unlocked"] == []
    assert report["repair_lock"].startswith("alpha==1.0 --hash=sha256:")
    repair_file = Path(_role_argv("__python_env_repair_file", pip_env, pip_env["bad"]))
    repair_file.write_text(report["repair_lock"])  # what the role's copy task writes
    scripts = {"stdout": json.dumps(report)}
    # Control: the old repair (name==version, no hash) takes the tampered file.
    old = _role_argv(
        "__python_env_repair_argv", pip_env, pip_env["bad"], require_hashes=False, __python_env_scripts=scripts
    )
    assert old[-1] == "alpha==1.0" and "--require-hashes" not in old
    assert _run(old, pip_env).returncode == 0 and "tampered" in _installed_module(pip_env)
    _run([*_role_argv("__python_env_install_argv", pip_env, pip_env["good"]), "--force-reinstall"], pip_env)
    assert "good" in _installed_module(pip_env)
    script.unlink()
    repair = _role_argv("__python_env_repair_argv", pip_env, pip_env["bad"], __python_env_scripts=scripts)
    assert "--require-hashes" in repair and str(repair_file) in repair and "--force-reinstall" in repair
    refused = _run(repair, pip_env)
    assert refused.returncode != 0 and "HASH" in refused.stderr.upper(), refused.stderr
    assert not script.exists() and "good" in _installed_module(pip_env)
    fixed = _run(
        _role_argv("__python_env_repair_argv", pip_env, pip_env["good"], __python_env_scripts=scripts), pip_env
    )
    assert fixed.returncode == 0, fixed.stderr
    assert script.exists() and "good" in _installed_module(pip_env)
    assert json.loads(_run(compare, pip_env).stdout)["satisfied"] is True


def test_a_broken_distribution_the_lock_does_not_name_is_reported(env: Path, tmp_path: Path) -> None:
    _add_dist(env, "modelscope-hub", "0.5.1", scripts=("modelscope",))
    (tmp_path / "lock.txt").write_text("other==1.0 \\\n    --hash=sha256:" + "1" * 64 + "\n")
    (tmp_path / "req.txt").write_text("modelscope-hub==0.5.1\n")
    out = subprocess.run(
        [str(env / "bin" / "python"), str(PINS), "--requirements", str(tmp_path / "req.txt"),
         "--lock", str(tmp_path / "lock.txt")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    report = json.loads(out.stdout)
    assert report["repair_unlocked"] == ["modelscope-hub==0.5.1"] and report["repair_lock"] == ""
