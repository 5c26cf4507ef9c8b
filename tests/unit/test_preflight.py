"""Preflight: every broken configuration or host state is refused with a message naming its variable.

Healthy hosts are built from the nvidia-smi fixtures (tests/fixtures/nvidia-smi/<box>/), parsed with
gpubox_gpu exactly as the gpubox.gpubox.gpu_facts module does; the sysfs view is written to a temporary
directory with harness/fakegpu/make_sysfs.py (the GPU edge is the only thing simulated).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    gpu_parsers,
    model_catalog,
    preflight_checks,
    store_layout,
)
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
GROUP_VARS = ROOT / "inventories" / "production" / "group_vars"
ROLE = ROOT / "roles" / "preflight"
GIB = 1024**3
BOX_OF_GROUP = {"gpu_2x3090": "rtx3090x2-nvlink", "gpu_4x4090": "rtx4090x4"}


def _load_by_path(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


make_sysfs = _load_by_path("make_sysfs_under_test", ROOT / "harness" / "fakegpu" / "make_sysfs.py")


@functools.cache
def _smi_fact(box: str) -> str:
    d = FIXTURES / box
    fact = gpu_parsers.gpu_facts(
        query_xml=(d / "q.xml").read_text(),
        topo_m=(d / "topo-m.txt").read_text(),
        topo_p2p_r=(d / "topo-p2p-r.txt").read_text(),
        query_csv=(d / "query-gpu.csv").read_text(),
        sysfs_root="/nonexistent-gpubox-test-root",
    )
    return json.dumps(fact)


def smi_fact(box: str) -> dict:
    """The gpubox_gpu fact of a fixture box as nvidia-smi reports it (a fresh copy)."""
    return json.loads(_smi_fact(box))


def sysfs_fact(box: str, root: Path, drop: int = 0) -> dict:
    """The gpubox_gpu fact as read from a fake sysfs tree of the box (no driver yet).

    ``drop`` leaves out that many GPU functions (simulates cards the PCI bus no longer sees).
    """
    spec = json.loads((FIXTURES / box / "sysfs.json").read_text())
    gpus = [bdf for bdf, attrs in spec["devices"].items() if attrs["class"].startswith("0x03")]
    for bdf in gpus[len(gpus) - drop :]:
        del spec["devices"][bdf]
    make_sysfs.write_sysfs(spec, root, module=False)
    return gpu_parsers.gpu_facts(sysfs_root=root)


def group_config(group: str) -> dict:
    """The raw gpubox_* facts of a box of ``group`` as Ansible resolves them, plus preflight's settings."""
    merged = ansible_vars.facts(f"unit-{group}", groups=(group,))
    merged.update(
        {
            "preflight_ram_factor": 2.0,
            "preflight_disk_headroom_bytes": 10 * GIB,
            "preflight_supported_os": ["Ubuntu 22.04", "Debian 12"],
        }
    )
    return merged


def healthy_host(group: str, gpu: dict | None = None) -> dict:
    return {
        "distribution": "Ubuntu",
        "distribution_version": "22.04",
        "memtotal_mb": 128 * 1024,
        "gpu": gpu if gpu is not None else smi_fact(BOX_OF_GROUP[group]),
        "disk_free_bytes": 500 * GIB,
        "disk_mount": "/data",
        "model_bytes_present": 0,
        "model_root_stat": "0 755 directory",
        "secure_boot": False,
    }


# --- healthy boxes ------------------------------------------------------------------------------


@pytest.mark.parametrize("group", sorted(BOX_OF_GROUP), ids=sorted(BOX_OF_GROUP))
def test_shipped_profiles_on_healthy_fixture_boxes_pass(group: str) -> None:
    result = preflight_checks.preflight(healthy_host(group), group_config(group))
    assert result["errors"] == []
    assert result["warnings"] == []
    assert result["plan"]["fits"] is True
    assert "FAIL" not in result["table"]


@pytest.mark.parametrize("group", sorted(BOX_OF_GROUP), ids=sorted(BOX_OF_GROUP))
def test_shipped_profiles_pass_before_the_driver_exists(group: str, tmp_path: Path) -> None:
    """From sysfs only the count and the PCI device id can be compared, and they match."""
    host = healthy_host(group, gpu=sysfs_fact(BOX_OF_GROUP[group], tmp_path))
    assert host["gpu"]["source"] == "sysfs"
    result = preflight_checks.preflight(host, group_config(group))
    assert result["errors"] == []
    assert result["warnings"] == []


def test_debian_12_point_release_is_supported() -> None:
    host = healthy_host("gpu_2x3090") | {"distribution": "Debian", "distribution_version": "12.8"}
    assert preflight_checks.preflight(host, group_config("gpu_2x3090"))["errors"] == []


def test_numeric_strings_from_extra_vars_are_accepted() -> None:
    config = group_config("gpu_2x3090") | {
        "gpubox_tensor_parallel_size": "2",
        "gpubox_gpu_memory_utilization": "0.92",
        "gpubox_port": "8000",
    }
    assert preflight_checks.preflight(healthy_host("gpu_2x3090"), config)["errors"] == []


def test_model_already_on_disk_needs_only_the_headroom() -> None:
    host = healthy_host("gpu_2x3090") | {"disk_free_bytes": 11 * GIB, "model_bytes_present": 29_540_067_328}
    assert preflight_checks.preflight(host, group_config("gpu_2x3090"))["errors"] == []
    host["model_bytes_present"] = 0
    assert any("gpubox_model_root" in e for e in preflight_checks.preflight(host, group_config("gpu_2x3090"))["errors"])


# --- the bad-inputs suite -----------------------------------------------------------------------

Mutation = Callable[[dict, dict, Path], None]


def _cfg(**values: Any) -> Mutation:
    def apply(host: dict, config: dict, tmp: Path) -> None:
        config.update(values)

    return apply


def _host(**values: Any) -> Mutation:
    def apply(host: dict, config: dict, tmp: Path) -> None:
        host.update(values)

    return apply


def _drop_config(name: str) -> Mutation:
    def apply(host: dict, config: dict, tmp: Path) -> None:
        del config[name]

    return apply


def _one_gpu_missing(host: dict, config: dict, tmp: Path) -> None:
    # Simulated: the fact as nvidia-smi would give it with the last card gone from the bus.
    host["gpu"]["gpus"].pop()
    host["gpu"]["count"] = len(host["gpu"]["gpus"])


def _sysfs_one_gpu_missing(host: dict, config: dict, tmp: Path) -> None:
    host["gpu"] = sysfs_fact("rtx4090x4", tmp, drop=1)


def _sysfs_wrong_model(host: dict, config: dict, tmp: Path) -> None:
    host["gpu"] = sysfs_fact("rtx4090x4", tmp)  # 4 x 4090 in the PCI view of a box planned as 2 x 3090
    config.update({"gpubox_gpu_count": 4, "gpubox_tensor_parallel_size": 2})


def _no_gpus_at_all(host: dict, config: dict, tmp: Path) -> None:
    host["gpu"] = gpu_parsers.gpu_facts(sysfs_root=tmp)  # an empty tree: a box without NVIDIA GPUs


def _wrong_gpu_model(host: dict, config: dict, tmp: Path) -> None:
    host["gpu"] = smi_fact("rtx4090x4")
    config.update({"gpubox_gpu_count": 4})


# (id, group, mutation, variable that the error must name)
BAD_CASES: list[tuple[str, str, Mutation, str]] = [
    ("tp3-on-2-gpus", "gpu_2x3090", _cfg(gpubox_tensor_parallel_size=3), "gpubox_tensor_parallel_size"),
    (
        "tp-not-dividing-heads",
        "gpu_4x4090",
        _cfg(
            gpubox_model_id="Qwen/Qwen2.5-14B-Instruct",
            gpubox_model_dtype="bfloat16",
            gpubox_model_quantization=None,
            gpubox_tensor_parallel_size=3,
        ),
        "gpubox_tensor_parallel_size",
    ),
    ("tp-0", "gpu_2x3090", _cfg(gpubox_tensor_parallel_size=0), "gpubox_tensor_parallel_size"),
    ("tp-negative", "gpu_2x3090", _cfg(gpubox_tensor_parallel_size=-2), "gpubox_tensor_parallel_size"),
    ("tp-word", "gpu_2x3090", _cfg(gpubox_tensor_parallel_size="two"), "gpubox_tensor_parallel_size"),
    (
        "pp2-with-tp2-on-2-gpus",
        "gpu_2x3090",
        _cfg(gpubox_pipeline_parallel_size=2),
        "gpubox_pipeline_parallel_size",
    ),
    (
        "utilization-1.2",
        "gpu_2x3090",
        _cfg(gpubox_gpu_memory_utilization=1.2),
        "gpubox_gpu_memory_utilization",
    ),
    (
        "utilization-abc",
        "gpu_2x3090",
        _cfg(gpubox_gpu_memory_utilization="abc"),
        "gpubox_gpu_memory_utilization",
    ),
    ("utilization-0", "gpu_2x3090", _cfg(gpubox_gpu_memory_utilization=0), "gpubox_gpu_memory_utilization"),
    ("max-model-len-above-model", "gpu_2x3090", _cfg(gpubox_max_model_len=65536), "gpubox_max_model_len"),
    (
        "max-model-len-beyond-kv-budget",
        "gpu_2x3090",
        _cfg(gpubox_max_model_len=32768, gpubox_gpu_memory_utilization=0.75),
        "gpubox_max_model_len",
    ),
    ("max-model-len-negative", "gpu_2x3090", _cfg(gpubox_max_model_len=-1), "gpubox_max_model_len"),
    ("max-num-seqs-0", "gpu_2x3090", _cfg(gpubox_max_num_seqs=0), "gpubox_max_num_seqs"),
    (
        "batched-tokens-below-max-model-len",
        "gpu_2x3090",
        _cfg(gpubox_max_num_batched_tokens=4096),
        "gpubox_max_num_batched_tokens",
    ),
    ("kv-cache-dtype-int4", "gpu_2x3090", _cfg(gpubox_kv_cache_dtype="int4"), "gpubox_kv_cache_dtype"),
    ("block-size-64", "gpu_2x3090", _cfg(gpubox_block_size=64), "gpubox_block_size"),
    ("enforce-eager-yes", "gpu_2x3090", _cfg(gpubox_enforce_eager="yes"), "gpubox_enforce_eager"),
    ("model-dtype-int3", "gpu_2x3090", _cfg(gpubox_model_dtype="int3"), "gpubox_model_dtype"),
    (
        "qwen32b-bf16-on-2x3090",
        "gpu_2x3090",
        _cfg(gpubox_model_id="Qwen/Qwen2.5-32B-Instruct"),
        "gpubox_model_id",
    ),
    ("unknown-model", "gpu_2x3090", _cfg(gpubox_model_id="Qwen/Qwen9-1T"), "gpubox_model_id"),
    ("model-id-not-a-string", "gpu_2x3090", _cfg(gpubox_model_id=42), "gpubox_model_id"),
    ("wrong-gpu-model", "gpu_2x3090", _wrong_gpu_model, "gpubox_gpu_name"),
    ("one-gpu-missing", "gpu_4x4090", _one_gpu_missing, "gpubox_gpu_count"),
    ("one-gpu-missing-tp-too-big", "gpu_4x4090", _one_gpu_missing, "gpubox_tensor_parallel_size"),
    ("sysfs-count-mismatch", "gpu_4x4090", _sysfs_one_gpu_missing, "gpubox_gpu_count"),
    ("sysfs-wrong-pci-device", "gpu_2x3090", _sysfs_wrong_model, "gpubox_gpu_name"),
    ("no-nvidia-gpu", "gpu_2x3090", _no_gpus_at_all, "gpubox_gpu_count"),
    ("no-gpu-facts", "gpu_2x3090", _host(gpu=None), "gpubox_gpu"),
    ("gpu-memory-mismatch", "gpu_2x3090", _cfg(gpubox_gpu_memory_mib=49152), "gpubox_gpu_memory_mib"),
    ("gpu-memory-abc", "gpu_2x3090", _cfg(gpubox_gpu_memory_mib="abc"), "gpubox_gpu_memory_mib"),
    ("gpu-count-0", "gpu_2x3090", _cfg(gpubox_gpu_count=0), "gpubox_gpu_count"),
    ("host-not-in-topology-group", "gpu_2x3090", _drop_config("gpubox_gpu_name"), "gpubox_gpu_name"),
    ("ram-16gb", "gpu_2x3090", _host(memtotal_mb=16 * 1024), "preflight_ram_factor"),
    ("ram-unknown", "gpu_2x3090", _host(memtotal_mb=None), "memtotal_mb"),
    ("ram-factor-abc", "gpu_2x3090", _cfg(preflight_ram_factor="abc"), "preflight_ram_factor"),
    ("disk-too-small", "gpu_2x3090", _host(disk_free_bytes=20 * GIB), "gpubox_model_root"),
    ("disk-unknown", "gpu_2x3090", _host(disk_free_bytes=None), "gpubox_model_root"),
    ("root-not-roots", "gpu_2x3090", _host(model_root_stat="1000 755 directory"), "gpubox_model_root"),
    ("root-world-writable", "gpu_2x3090", _host(model_root_stat="0 1777 directory"), "gpubox_model_root"),
    ("root-group-writable", "gpu_2x3090", _host(model_root_stat="0 775 directory"), "gpubox_model_root"),
    ("root-a-file", "gpu_2x3090", _host(model_root_stat="0 644 regular file"), "gpubox_model_root"),
    ("root-stat-garbage", "gpu_2x3090", _host(model_root_stat="?? x"), "gpubox_model_root"),
    (
        "disk-headroom-negative",
        "gpu_2x3090",
        _cfg(preflight_disk_headroom_bytes=-1),
        "preflight_disk_headroom_bytes",
    ),
    ("missing-api-key", "gpu_2x3090", _cfg(gpubox_api_key=""), "vault_gpubox_api_key"),
    ("ubuntu-20.04", "gpu_2x3090", _host(distribution_version="20.04"), "preflight_supported_os"),
    ("ubuntu-22.10", "gpu_2x3090", _host(distribution_version="22.10"), "preflight_supported_os"),
    (
        "debian-11",
        "gpu_2x3090",
        _host(distribution="Debian", distribution_version="11"),
        "preflight_supported_os",
    ),
    (
        "supported-os-not-a-list",
        "gpu_2x3090",
        _cfg(preflight_supported_os="Ubuntu"),
        "preflight_supported_os",
    ),
    ("port-negative", "gpu_2x3090", _cfg(gpubox_port=-1), "gpubox_port"),
    ("port-70000", "gpu_2x3090", _cfg(gpubox_port=70000), "gpubox_port"),
    ("port-abc", "gpu_2x3090", _cfg(gpubox_port="abc"), "gpubox_port"),
    (
        "served-name-with-space",
        "gpu_2x3090",
        _cfg(gpubox_served_model_name="my model"),
        "gpubox_served_model_name",
    ),
]


@pytest.mark.parametrize(("group", "mutate", "variable"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_input_is_refused_naming_the_variable(group: str, mutate: Mutation, variable: str, tmp_path: Path) -> None:
    host, config = healthy_host(group), group_config(group)
    mutate(host, config, tmp_path)
    result = preflight_checks.preflight(host, config)
    assert result["errors"], f"no error for {variable}; warnings: {result['warnings']}"
    assert any(variable in error for error in result["errors"]), result["errors"]
    assert "error(s)" in result["table"]


@pytest.mark.parametrize(
    ("arrangement", "words"),
    [
        ("parent-world-writable", "mode 0777, writable by group or others"),
        ("parent-group-writable", "mode 2775, writable by group or others"),
        ("parent-not-roots", "owned by uid 1000, not root"),
        ("parent-through-a-link-into-a-users-dir", "owned by uid 1000, not root"),
        ("link-owned-by-a-user", "reached through the symlink"),
        ("sticky-parent-like-tmp", ""),
    ],
)
def test_the_model_roots_real_path_is_checked_by_the_store_walk(tmp_path: Path, arrangement: str, words: str) -> None:
    """model_root_problems is what gpubox.gpubox.model_root (store_layout.root_path_problems, the model
    store's own walk) found on real directories; preflight refuses each, naming gpubox_model_root."""
    parent = tmp_path / "data"
    parent.mkdir()
    root = parent / "models"
    if arrangement == "parent-world-writable":
        os.chmod(parent, 0o777)
    elif arrangement == "parent-group-writable":
        os.chmod(parent, 0o2775)
    elif arrangement == "parent-not-roots":
        os.chown(parent, 1000, 1000)
    elif arrangement == "parent-through-a-link-into-a-users-dir":
        (tmp_path / "home").mkdir()
        os.chown(tmp_path / "home", 1000, 1000)
        (tmp_path / "home" / "disk").mkdir()
        (tmp_path / "via").symlink_to(tmp_path / "home" / "disk")
        root = tmp_path / "via" / "models"
    elif arrangement == "link-owned-by-a-user":
        (tmp_path / "via").symlink_to(parent)
        os.chown(tmp_path / "via", 1000, 1000, follow_symlinks=False)
        root = tmp_path / "via" / "models"
    else:
        os.chmod(parent, 0o1777)
    problems = store_layout.root_path_problems(root)
    host = healthy_host("gpu_2x3090") | {"model_root_problems": problems}
    errors = preflight_checks.preflight(host, group_config("gpu_2x3090"))["errors"]
    if not words:  # sticky, like /tmp: no other user may rename root's entries
        assert problems == [] and not [e for e in errors if "gpubox_model_root" in e], errors
        return
    assert len(problems) == 1 and words in problems[0], problems
    assert problems[0] in errors and problems[0].startswith(f"gpubox_model_root {root}")


def _gpu(host: dict, **fields: Any) -> dict:
    host["gpu"]["gpus"][0].update(fields)
    return host


WRONG_TYPES = [
    # (a mutation of the healthy host, the fact.field named)
    (lambda h: _gpu(h, memory_total_mib="24576 MiB"), "gpubox_gpu.gpus[0].memory_total_mib"),
    (lambda h: _gpu(h, memory_total_mib=24576.0), "gpubox_gpu.gpus[0].memory_total_mib"),
    (lambda h: _gpu(h, pcie_link_width_current="x8"), "gpubox_gpu.gpus[0].pcie_link_width_current"),
    (lambda h: _gpu(h, bar1_total_mib=True), "gpubox_gpu.gpus[0].bar1_total_mib"),
    (lambda h: _gpu(h, pci_device_id=8708), "gpubox_gpu.gpus[0].pci_device_id"),
    (lambda h: _gpu(h, name=["NVIDIA GeForce RTX 3090"]), "gpubox_gpu.gpus[0].name"),
    (lambda h: _gpu(h, index="0"), "gpubox_gpu.gpus[0].index"),
    (lambda h: h | {"gpu": h["gpu"] | {"source": 1}}, "gpubox_gpu.source"),
    (lambda h: h | {"gpu": h["gpu"] | {"gpus": [h["gpu"]["gpus"][0], "GPU 1"]}}, "gpubox_gpu.gpus[1]"),
    (lambda h: h | {"memtotal_mb": "131072"}, "memtotal_mb"),
    (lambda h: h | {"disk_free_bytes": 5e11}, "disk_free_bytes"),
    (lambda h: h | {"model_bytes_present": "0"}, "model_bytes_present"),
    (lambda h: h | {"model_root_stat": 755}, "model_root_stat"),
    (lambda h: h | {"model_root_problems": "none"}, "model_root_problems"),
    (lambda h: h | {"model_root_problems": [1]}, "model_root_problems"),
    (lambda h: h | {"secure_boot": "no"}, "secure_boot"),
    (lambda h: h | {"distribution": ["Ubuntu"]}, "distribution"),
]


@pytest.mark.parametrize(("mutate", "field"), WRONG_TYPES, ids=[w[1] + f"-{n}" for n, w in enumerate(WRONG_TYPES)])
def test_a_fact_of_the_wrong_type_is_refused_naming_the_fact_and_field(mutate: Any, field: str) -> None:
    """Issue 31 item 7: a fact of the wrong type was skipped (a "24576 MiB" memory passed, where the
    integer of another size is refused); now every field preflight reads is typed, and refused naming it."""
    host = mutate(healthy_host("gpu_2x3090"))
    errors = preflight_checks.preflight(host, group_config("gpu_2x3090"))["errors"]
    named = [e for e in errors if e.startswith(f"the box's fact {field} ")]
    assert len(named) == 1 and "Fix: " in named[0], errors
    assert not [e for e in errors if "is unknown" in e], f"reported twice: {errors}"


def test_the_memory_of_a_gpu_is_compared_when_it_is_an_integer() -> None:
    """The control of the case above: the same field as an integer is read and compared."""
    good = preflight_checks.preflight(healthy_host("gpu_2x3090"), group_config("gpu_2x3090"))["errors"]
    assert good == []
    small = _gpu(healthy_host("gpu_2x3090"), memory_total_mib=12288)
    errors = preflight_checks.preflight(small, group_config("gpu_2x3090"))["errors"]
    assert any("has 12288 MiB" in e for e in errors), errors


def test_bad_suite_is_large_enough_and_ids_are_unique() -> None:
    ids = [c[0] for c in BAD_CASES]
    assert len(ids) >= 20
    assert len(set(ids)) == len(ids)


def test_all_errors_are_reported_at_once_not_only_the_first() -> None:
    host = healthy_host("gpu_2x3090") | {"memtotal_mb": 16 * 1024, "distribution_version": "20.04"}
    config = group_config("gpu_2x3090") | {"gpubox_api_key": "", "gpubox_max_num_seqs": 0}
    errors = preflight_checks.preflight(host, config)["errors"]
    for variable in (
        "preflight_ram_factor",
        "preflight_supported_os",
        "vault_gpubox_api_key",
        "gpubox_max_num_seqs",
    ):
        assert any(variable in e for e in errors), (variable, errors)


def test_ram_error_states_the_ram_found_and_needed() -> None:
    host = healthy_host("gpu_2x3090") | {"memtotal_mb": 16 * 1024}
    (error,) = [e for e in preflight_checks.preflight(host, group_config("gpu_2x3090"))["errors"] if "RAM" in e]
    assert "16.0 GiB" in error
    assert "55.0 GiB" in error  # 2.0 x 29,540,067,328 B of Qwen2.5-14B weights


def test_unknown_model_still_validates_the_serving_profile() -> None:
    config = group_config("gpu_2x3090") | {"gpubox_model_id": "nope/nope", "gpubox_max_num_seqs": 0}
    result = preflight_checks.preflight(healthy_host("gpu_2x3090"), config)
    assert result["plan"] is None
    assert any("gpubox_model_id" in e and "catalog" in e for e in result["errors"])
    assert any("gpubox_max_num_seqs" in e for e in result["errors"])
    assert not any("model facts" in e for e in result["errors"])


@pytest.mark.parametrize(
    ("host", "config"),
    [(None, {}), ({}, None), ("host", []), ({}, {})],
    ids=["host-none", "config-none", "wrong-types", "both-empty"],
)
def test_garbage_never_raises(host: Any, config: Any) -> None:
    result = preflight_checks.preflight(host, config)
    assert result["errors"]
    assert set(result) == {"errors", "warnings", "plan", "table"}


# --- warnings that must not stop a box ----------------------------------------------------------


def _pcie_fixture(host: dict, config: dict, tmp: Path) -> None:
    host["gpu"] = smi_fact("rtx3090x2-pcie")


WARN_CASES: list[tuple[str, Mutation, list[str]]] = [
    (
        "utilization-0.97",
        _cfg(gpubox_gpu_memory_utilization=0.97),
        ["gpubox_gpu_memory_utilization", "CUDA-graph"],
    ),
    ("32k-context-x8-seqs", _cfg(gpubox_max_model_len=32768), ["gpubox_max_num_seqs", "concurrency 1.64x"]),
    ("x4-slot", _pcie_fixture, ["GPU 1", "00000000:08:00.0", "PCIe x4 of x16"]),
    ("bar1-256mib", _pcie_fixture, ["BAR1 of 256 MiB", "Resizable BAR"]),
    ("port-80", _cfg(gpubox_port=80), ["gpubox_port"]),
    (
        "secure-boot-note",
        lambda h, c, t: (h.update(secure_boot=True), c.update(secure_boot_warning="enroll the DKMS MOK")),
        ["enroll the DKMS MOK"],
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [c[1:] for c in WARN_CASES], ids=[c[0] for c in WARN_CASES])
def test_thin_or_slow_setups_warn_without_error(mutate: Mutation, expected: list[str], tmp_path: Path) -> None:
    host, config = healthy_host("gpu_2x3090"), group_config("gpu_2x3090")
    mutate(host, config, tmp_path)
    result = preflight_checks.preflight(host, config)
    assert result["errors"] == []
    assert any(all(text in w for text in expected) for w in result["warnings"]), result["warnings"]


def test_nvidia_smi_failure_is_a_warning_and_sysfs_still_checks(tmp_path: Path) -> None:
    fact = sysfs_fact("rtx3090x2-nvlink", tmp_path)
    fact["nvidia_smi_error"] = "Failed to initialize NVML: Driver/library version mismatch"
    result = preflight_checks.preflight(healthy_host("gpu_2x3090", gpu=fact), group_config("gpu_2x3090"))
    assert result["errors"] == []
    assert any("Driver/library version mismatch" in w for w in result["warnings"])


def test_secure_boot_off_or_without_a_distro_note_is_silent() -> None:
    host = healthy_host("gpu_2x3090") | {"secure_boot": True}
    assert preflight_checks.preflight(host, group_config("gpu_2x3090"))["warnings"] == []


# --- the table, the filter plugin, the role's declared variables -------------------------------


def test_table_shows_checks_and_plan() -> None:
    host = healthy_host("gpu_2x3090") | {"memtotal_mb": 16 * 1024}
    table = preflight_checks.preflight(host, group_config("gpu_2x3090"))["table"]
    assert "Qwen/Qwen2.5-14B-Instruct on 2 x NVIDIA GeForce RTX 3090" in table
    assert "plan: KV tokens" in table
    ram = next(line for line in table.splitlines() if line.startswith("RAM"))
    assert ram.endswith("FAIL")


@pytest.mark.parametrize("stack", ["pinned-0.7.3", "lts-580"])
def test_table_names_the_stack_its_support_ends_and_open_advisories(stack: str) -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks

    config = group_config("gpu_2x3090") | {"gpubox_stack": stack}
    lines = preflight_checks.preflight(healthy_host("gpu_2x3090"), config)["table"].splitlines()
    assert lines[1:5] == stacks.summary_lines(stack)[:4]
    assert lines[1].startswith(f"stack {stack}: ")
    assert any(line.startswith("  open advisories (accepted, unfixed): ") for line in lines)


def test_filter_plugin_exposes_gpubox_preflight() -> None:
    from ansible_collections.gpubox.gpubox.plugins.filter import gpubox_filters

    filters = gpubox_filters.FilterModule().filters()
    result = filters["preflight"](healthy_host("gpu_2x3090"), group_config("gpu_2x3090"))
    assert result["errors"] == []


def test_role_defaults_and_argument_specs_declare_the_same_variables() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    assert set(defaults) == set(specs["argument_specs"]["main"]["options"])
    assert all(name.startswith("preflight_") for name in defaults)


def test_role_supported_os_default_matches_its_vars_files() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    vars_files = {p.stem for p in (ROLE / "vars").glob("*.yml")} - {"main"}
    assert {entry.replace(" ", "-").split(".")[0] for entry in defaults["preflight_supported_os"]} == vars_files


def test_every_role_task_is_tagged_always_and_changes_nothing() -> None:
    def walk(tasks: list[dict]) -> list[dict]:
        found = []
        for task in tasks:
            found.append(task)
            for key in ("block", "rescue", "always"):
                found.extend(walk(task.get(key, [])))
        return found

    tasks = walk(yaml.safe_load((ROLE / "tasks" / "main.yml").read_text()))
    top_level = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    assert all("always" in task.get("tags", []) for task in top_level), [t.get("name") for t in top_level]
    for task in tasks:
        for module in ("ansible.builtin.command", "ansible.builtin.shell"):
            if module in task:
                assert task.get("changed_when") is False and task.get("check_mode") is False, task["name"]
        for writer in ("ansible.builtin.copy", "ansible.builtin.template", "ansible.builtin.file"):
            assert writer not in task, task.get("name")


def test_fixture_facts_are_fresh_copies() -> None:
    """The cached fixture fact is handed out as a copy, so one case cannot leak into the next."""
    first = smi_fact("rtx4090x4")
    first["gpus"].pop()
    assert len(smi_fact("rtx4090x4")["gpus"]) == 4


# --- a model outside the catalog: gpubox_model_config -------------------------------------------

SIM_CPU_ENGINE_VARS = ROOT / "molecule" / "shared" / "group_vars" / "gpubox_sim_cpu_engine.yml"


def sim_cpu_engine_config() -> dict:
    """gpu_2x3090 plus the gpubox_* variables of the serving scenario's tiny model (as Ansible merges them)."""
    test_vars = yaml.safe_load(SIM_CPU_ENGINE_VARS.read_text())
    return group_config("gpu_2x3090") | {k: v for k, v in test_vars.items() if k.startswith("gpubox_")}


def test_serving_scenario_plans_its_tiny_model_from_the_inventory() -> None:
    config = sim_cpu_engine_config()
    assert config["gpubox_model_id"] not in model_catalog.CATALOG
    result = preflight_checks.preflight(healthy_host("gpu_2x3090"), config)
    assert result["errors"] == []
    assert result["plan"]["fits"] is True
    # its model.safetensors plus the rotary cos/sin cache (2048 positions x head_dim 64 x float32, the serving dtype)
    assert result["plan"]["weights_gib_per_gpu"] == pytest.approx((2_628_800 + 2048 * 64 * 4) / GIB, rel=0.01)
    without = {k: v for k, v in config.items() if k != "gpubox_model_config"}
    errors = preflight_checks.preflight(healthy_host("gpu_2x3090"), without)["errors"]
    assert any("not in the capacity catalog" in e and "gpubox_model_config" in e for e in errors)


def test_model_config_replaces_the_catalog_entry() -> None:
    # Same id as a catalog model, but the inventory's facts win: 8x the weights no longer fit 2 x 24 GiB.
    entry = dict(model_catalog.CATALOG["Qwen/Qwen2.5-14B-Instruct"])
    entry["weights_bytes"] *= 8
    config = group_config("gpu_2x3090") | {"gpubox_model_config": entry}
    result = preflight_checks.preflight(healthy_host("gpu_2x3090"), config)
    assert result["plan"]["fits"] is False
    assert any("RAM" in e for e in result["errors"])


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"vocab_size": None}, "gpubox_model_config lacks vocab_size"),
        ({"weights_bytes": None, "torch_dtype": None}, "lacks torch_dtype, weights_bytes"),
        ({"hidden_size": 0}, "hidden_size=0 must be positive integers"),
        ({"num_hidden_layers": "2"}, "num_hidden_layers='2'"),
        ({"num_attention_heads": True}, "num_attention_heads=True"),
        ({"layers": 2}, "unknown keys layers"),
        ({"torch_dtype": "int3"}, "torch_dtype must be one of bfloat16"),
    ],
    ids=["missing", "two-missing", "zero", "string", "bool", "unknown-key", "bad-dtype"],
)
def test_bad_model_config_is_refused_naming_the_key(change: dict, expected: str) -> None:
    facts = dict(sim_cpu_engine_config()["gpubox_model_config"])
    for key, value in change.items():
        if value is None:
            facts.pop(key)
        else:
            facts[key] = value
    config = sim_cpu_engine_config() | {"gpubox_model_config": facts}
    result = preflight_checks.preflight(healthy_host("gpu_2x3090"), config)
    assert result["plan"] is None or result["plan"]["fits"] is False
    assert any(expected in e for e in result["errors"]), result["errors"]


def test_model_config_must_be_a_mapping() -> None:
    config = sim_cpu_engine_config() | {"gpubox_model_config": ["num_hidden_layers", 2]}
    errors = preflight_checks.preflight(healthy_host("gpu_2x3090"), config)["errors"]
    assert any("gpubox_model_config must be a mapping" in e for e in errors)


def test_tiny_model_facts_match_the_generated_model(tmp_path: Path) -> None:
    """The group_vars' facts are what make_tiny_model.py writes (config.json and weight file size)."""
    import subprocess

    subprocess.run(
        [sys.executable, str(ROOT / "harness" / "hub" / "make_tiny_model.py"), str(tmp_path / "m")],
        check=True,
        capture_output=True,
    )
    facts = sim_cpu_engine_config()["gpubox_model_config"]
    config_json = json.loads((tmp_path / "m" / "config.json").read_text())
    assert model_catalog.config_mismatches(facts, config_json) == []
    assert facts["weights_bytes"] == (tmp_path / "m" / "model.safetensors").stat().st_size


def test_preflight_refuses_an_mla_model_config_with_a_message_not_a_traceback() -> None:
    """DeepSeek-V2/V3/R1 latent attention (kv_lora_rank in config.json) through gpubox_model_config."""
    config = sim_cpu_engine_config()
    config["gpubox_model_config"] = {**config["gpubox_model_config"], "kv_lora_rank": 512}
    result = preflight_checks.preflight(healthy_host("gpu_2x3090"), config)
    refusals = [e for e in result["errors"] if "latent attention" in e]
    assert refusals, result["errors"]
    assert "gpubox_model_config" in refusals[0] and config["gpubox_model_id"] in refusals[0]
    assert "Traceback" not in "\n".join(result["errors"])


def test_the_demo_box_plans_its_tiny_moe_model_from_the_generated_config_json(tmp_path: Path) -> None:
    """`make demo`'s box (inventories/demo/host_vars/gpu-box.yml): the supported stack and a tiny mixture-of-experts
    model whose gpubox_model_config is make_tiny_model.py --arch qwen3_moe's config.json and weight file size; its
    plan fits on the supported stack and the pinned stack refuses it by name."""
    import subprocess

    import yaml

    demo = yaml.safe_load((ROOT / "inventories" / "demo" / "host_vars" / "gpu-box.yml").read_text())
    subprocess.run(
        [sys.executable, str(ROOT / "harness" / "hub" / "make_tiny_model.py"), str(tmp_path / "m"), "--arch",
         demo["gpubox_sim_tiny_arch"]],
        check=True,
        capture_output=True,
    )  # fmt: skip
    facts = demo["gpubox_model_config"]
    assert facts["config_json"] == json.loads((tmp_path / "m" / "config.json").read_text())
    assert facts["weights_bytes"] == (tmp_path / "m" / "model.safetensors").stat().st_size
    config = sim_cpu_engine_config() | {k: demo[k] for k in ("gpubox_stack", "gpubox_model_id", "gpubox_model_config")}
    result = preflight_checks.preflight(healthy_host("gpu_2x3090"), config)
    assert result["errors"] == [] and result["plan"]["fits"], result["errors"]
    pinned = preflight_checks.preflight(healthy_host("gpu_2x3090"), config | {"gpubox_stack": "pinned-0.7.3"})
    assert any("is a moe model" in e and "gpubox_stack: lts-580" in e for e in pinned["errors"]), pinned["errors"]
