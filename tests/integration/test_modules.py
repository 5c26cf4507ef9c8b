"""The collection's modules run the real way: `ansible localhost -m gpubox.gpubox.<module>` (the AnsiballZ
path, harness.ansible_vars.run_module), each run a whole ansible process; and the GPU probe compiled with nvcc.
The Python each module wraps is tested in-process in tests/unit (test_gpu_facts.py, test_node_textfile.py,
test_model_lock.py, test_tenant_metrics.py, test_preflight.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import gpu_parsers as g
from ansible_collections.gpubox.gpubox.plugins.module_utils import lock_file, store_layout
from ansible_collections.gpubox.gpubox.plugins.module_utils.node_textfile import parse_samples
from harness import ansible_vars
from harness.fakegpu import make_sysfs, replay_bin, sim_env
from harness.front_door_log import line

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------ gpubox.gpubox.gpu_facts, gpu_check_library

GPU_CHECK = ROOT / "roles" / "gpu_tuning" / "files" / "gpubox-gpu-check"
PROBE_SRC = ROOT / "roles" / "gpu_tuning" / "files" / "gpubox-p2p-probe.cu"


@pytest.fixture
def sim_path(tmp_path: Path) -> Path:
    """A bin directory whose nvidia-smi is the replay tool, run by this interpreter."""
    return replay_bin(tmp_path)


def env_lines(tmp_path: Path) -> list:
    text = (tmp_path / "etc" / "nccl.env").read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _ansible() -> str | None:
    candidate = ansible_vars.tool("ansible")
    return str(candidate) if candidate.exists() else shutil.which("ansible")


def run_module(
    tmp_path: Path, args: str, module: str = "gpubox.gpubox.gpu_facts", check: bool = False, **extra: str
) -> dict:
    if _ansible() is None:
        pytest.fail("ansible is not installed: make venv")
    env = sim_env("rtx3090x2-pcie", tmp_path / "simstate", **extra)
    return ansible_vars.run_module(module, args, tmp_path, check, env)


def test_module_reads_nvidia_smi(tmp_path: Path, sim_path: Path) -> None:
    make_sysfs("rtx3090x2-pcie", tmp_path / "root")
    result = run_module(tmp_path, f"nvidia_smi={sim_path / 'nvidia-smi'} sysfs_root={tmp_path / 'root'}")
    facts = result["ansible_facts"]["gpubox_gpu"]
    assert result.get("changed") is False
    assert facts["source"] == "nvidia-smi"
    assert facts["count"] == 2
    assert facts["p2p_read"] == {"0-1": "NS"}
    assert facts["gpus"][1]["pcie_link_width_current"] == 4
    assert facts["loaded_module_version"] == "535.261.03"


def test_module_falls_back_to_sysfs_on_mismatch(tmp_path: Path, sim_path: Path) -> None:
    make_sysfs("rtx3090x2-pcie", tmp_path / "root", "--module-version", "535.183.01")
    result = run_module(
        tmp_path,
        f"nvidia_smi={sim_path / 'nvidia-smi'} sysfs_root={tmp_path / 'root'}",
        GPUBOX_SIM_FAIL="mismatch",
    )
    assert not result.get("failed"), result
    facts = result["ansible_facts"]["gpubox_gpu"]
    assert facts["source"] == "sysfs"
    assert "Driver/library version mismatch" in facts["nvidia_smi_error"]
    assert facts["count"] == 2
    assert facts["gpus"][1]["pcie_link_width_current"] == 4
    assert facts["loaded_module_version"] == "535.183.01"


def test_module_without_nvidia_smi_uses_sysfs(tmp_path: Path) -> None:
    make_sysfs("rtx4090x4", tmp_path / "root", "--no-module")
    result = run_module(tmp_path, f"nvidia_smi={tmp_path / 'absent'} sysfs_root={tmp_path / 'root'}")
    facts = result["ansible_facts"]["gpubox_gpu"]
    assert (facts["source"], facts["count"], facts["nvidia_smi_path"]) == ("sysfs", 4, None)
    assert facts["nvidia_smi_error"] is None and facts["loaded_module_version"] is None


def test_library_module_installs_the_parser_the_check_imports(tmp_path: Path, sim_path: Path) -> None:
    lib_dir = tmp_path / "usr-local-lib-gpubox"
    lib_dir.mkdir()
    dest = lib_dir / "gpu_parsers.py"
    source = (ROOT / "plugins" / "module_utils" / "gpu_parsers.py").read_bytes()

    def install(check: bool = False) -> dict:
        result = run_module(tmp_path, f"dest={dest}", module="gpubox.gpubox.gpu_check_library", check=check)
        assert not result.get("failed"), result
        return result

    assert install(check=True)["changed"] is True and not dest.exists(), "check mode writes nothing"
    first = install()
    assert first["changed"] is True and dest.read_bytes() == source
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644
    assert (first["sha256"], first["size"]) == (hashlib.sha256(source).hexdigest(), len(source))
    assert install()["changed"] is False, "same content and mode: nothing to do"
    assert [p.name for p in lib_dir.iterdir()] == ["gpu_parsers.py"], "no temporary file is left behind"

    dest.write_bytes(source + b"# drift\n")
    dest.chmod(0o600)
    assert install(check=True)["changed"] is True and dest.read_bytes().endswith(b"# drift\n")
    assert install()["changed"] is True and dest.read_bytes() == source
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644
    assert install()["changed"] is False

    # The installed copy is all the boot-time check needs: it runs without site-packages (-S), so nothing
    # but the standard library and --lib is importable.
    env = sim_env("rtx3090x2-pcie", tmp_path / "simstate")
    env["PATH"] = f"{sim_path}{os.pathsep}{env.get('PATH', '')}"
    argv = [sys.executable, "-S", str(GPU_CHECK), "--lib", str(lib_dir), "--probe", str(tmp_path / "no-probe")]
    argv += ["--out", str(tmp_path / "etc" / "nccl.env"), "--state", str(tmp_path / "var" / "gpu-check.json")]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert env_lines(tmp_path) == ["NCCL_P2P_DISABLE=1"]


def test_library_module_refuses_a_missing_directory(tmp_path: Path) -> None:
    dest = tmp_path / "absent" / "gpu_parsers.py"
    result = run_module(tmp_path, f"dest={dest}", module="gpubox.gpubox.gpu_check_library")
    assert result["failed"] and "does not exist" in result["msg"] and not dest.parent.exists()


# --------------------------------------------------------------------------- the probe program


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="optional: no nvcc here (docs/testing.md)")
def test_probe_compiles_and_reports_no_device_as_unavailable(tmp_path: Path) -> None:
    binary = tmp_path / "gpubox-p2p-probe"
    subprocess.run(["nvcc", "-O2", "-o", str(binary), str(PROBE_SRC)], check=True, capture_output=True)
    proc = subprocess.run(
        [str(binary)],
        capture_output=True,
        text=True,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
        timeout=60,
    )
    result = g.parse_probe_output(proc.stdout, proc.returncode, gpu_count=2)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert result.status == "unavailable"
    assert json.loads(proc.stdout)["pairs"] == {}


# --------------------------------------------------------------------------- gpubox.gpubox.box_metrics

HOST_LAYER = {
    "gpubox_driver": {"version": "535.261.03-1", "branch": "535"},
    "gpubox_cuda": {"version": "12.2", "home": "/usr/local/cuda-12.2"},
    "gpubox_gpu_check": {"decision": {"p2p_enabled": False, "reasons": ["pair 0-1: NS"]}},
}


def test_module_writes_the_textfile(tmp_path: Path) -> None:
    dest = tmp_path / "gpubox.prom"
    args = json.dumps({"dest": str(dest), "local_facts": HOST_LAYER, "planned_gpu_blocks": 4768})
    first = ansible_vars.run_module("gpubox.gpubox.box_metrics", args, cwd=tmp_path)
    assert first["changed"] is True, first
    assert first["names"] == ["gpubox_info", "gpubox_kv_cache_blocks_planned"]
    assert 'gpubox_info{cuda="12.2",driver="535.261.03-1",p2p="disabled"} 1' in dest.read_text()
    again = ansible_vars.run_module("gpubox.gpubox.box_metrics", args, cwd=tmp_path)
    assert again["changed"] is False


def test_module_refuses_a_missing_directory(tmp_path: Path) -> None:
    args = json.dumps({"dest": str(tmp_path / "nope" / "gpubox.prom"), "local_facts": {}})
    result = ansible_vars.run_module("gpubox.gpubox.box_metrics", args, cwd=tmp_path)
    assert result.get("failed") and "does not exist" in result["msg"]


# --------------------------------------------------------------------------- gpubox.gpubox.model_lock


A = "a" * 40
B = "0123456789abcdef0123456789abcdef01234567"
MODEL = "Qwen/Qwen2.5-7B-Instruct"


def test_the_module_writes_only_on_a_change_and_replaces_only_when_asked(tmp_path: Path) -> None:
    lock = tmp_path / "models.lock.json"
    item = {"model_id": MODEL, "revision": "master", "commit": A, "endpoint": "https://www.modelscope.cn"}

    def run(commit: str, replace: bool, check: bool = False) -> dict:
        args = json.dumps({"path": str(lock), "resolved": [{**item, "commit": commit}], "replace": replace})
        return ansible_vars.run_module("gpubox.gpubox.model_lock", args, tmp_path, check=check)

    assert run(A, False, check=True)["changed"] and not lock.exists()
    assert run(A, False)["changed"] and lock_file.read_lock(str(lock))[f"{MODEL}@master"]["commit"] == A
    mtime = lock.stat().st_mtime_ns
    assert not run(B, False)["changed"] and lock.stat().st_mtime_ns == mtime  # a converge never moves a lock
    assert run(B, True)["changed"] and lock_file.read_lock(str(lock))[f"{MODEL}@master"]["commit"] == B
    failed = run("content-" + "1" * 32, True)
    assert failed.get("failed") and "names no commit id" in failed["msg"]
    assert lock_file.read_lock(str(lock))[f"{MODEL}@master"]["commit"] == B


# ------------------------------------------------ gpubox.gpubox.gpu_check_library: the tenant collector's library


COLLECTOR = ROOT / "roles" / "metrics" / "files" / "gpubox-tenant-metrics"
LIB = ROOT / "plugins" / "module_utils"


def counts(tmp_path: Path) -> dict[tuple[str, tuple], str]:
    text = (tmp_path / "t.prom").read_text()
    return {(name, tuple(sorted(labels.items()))): value for name, labels, value in parse_samples(text)}


def test_the_library_module_installs_what_the_collector_loads_alone(tmp_path: Path) -> None:

    lib = tmp_path / "lib"
    lib.mkdir()
    dest = lib / "tenant_metrics.py"
    result = ansible_vars.run_module("gpubox.gpubox.gpu_check_library", f"library=tenant_metrics dest={dest}", tmp_path)
    assert result.get("changed") is True, result
    assert dest.read_bytes() == (LIB / "tenant_metrics.py").read_bytes()
    log = tmp_path / "access.log"
    log.write_text(line())
    (tmp_path / "state").mkdir()
    # -S: nothing but the standard library and --lib is importable, as on the box.
    argv = [
        sys.executable,
        "-S",
        str(COLLECTOR),
        "--lib",
        str(lib),
        "--log",
        str(log),
        "--out",
        str(tmp_path / "t.prom"),
    ]
    out = subprocess.run([*argv, "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert counts(tmp_path)[("gpubox_front_door_requests_total", (("code", "2xx"), ("tenant", "team-a")))] == "1"


# ------------------------------------------------------------ gpubox.gpubox.model_root: the walk preflight reads


def test_preflight_reads_the_root_walk_from_the_module(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    os.chown(tmp_path / "home", 1000, 1000)
    (tmp_path / "via").symlink_to("home")
    root = tmp_path / "via" / "models"
    result = ansible_vars.run_module("gpubox.gpubox.model_root", json.dumps({"root": str(root)}), tmp_path, check=True)
    assert result["problems"] == store_layout.root_path_problems(root) and len(result["problems"]) == 1, result
    assert not result.get("changed") and not root.exists()
