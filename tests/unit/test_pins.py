"""roles/python_env/files/gpubox_pins.py against a real (empty) venv with hand-made distributions."""

from __future__ import annotations

import json
import subprocess
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
