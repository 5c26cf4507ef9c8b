"""The one reader of vLLM's start-up lines about memory (stdlib only).

vLLM 0.32.0's V1 engine logs, once per start (vllm/v1/worker/gpu_worker.py, vllm/v1/core/kv_cache_utils.py
``update_kv_cache_capacity``; the CPU worker vllm/v1/worker/cpu_worker.py):

    Model loading took 14.2474 GiB ...
    Available KV cache memory: 6.01 GiB
    GPU KV cache size: 569,878 tokens, Maximum concurrency for 131,072 tokens per request: 4.35x
    (older V1 releases print the last two on separate lines; the CPU engine says "CPU KV cache size")
    Explicitly set (1.0/23.54) GiB for KV cache on node 0.          (the CPU engine's budget)
    ... Replace gpu_memory_utilization config with `--kv-cache-memory=12345678` (0.01 GiB) to fit into requested
    memory, ...                                                      (vLLM's own figure to pin, exact; kv_pin.py)

``measured()`` reads the last start in a journal excerpt (the lines of one unit invocation) into what the box
reports beside its plan: the weights, the KV budget in GiB, the KV tokens and the concurrency at max_model_len.
A figure the log does not print is left out, never guessed; the numbers are checked to be finite and positive.
"""

from __future__ import annotations

import math
import re
from typing import Any

_GIB = r"(-?\d+(?:\.\d+)?)\s*GiB"
PATTERNS: dict[str, re.Pattern[str]] = {
    "weights_gib": re.compile(r"Model loading took " + _GIB),
    "kv_cache_gib": re.compile(r"Available KV cache memory: " + _GIB),
    "kv_tokens": re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: (\d+(?:\.\d+)?)x"),
    "kv_cache_gib_set": re.compile(r"Explicitly set \((\d+(?:\.\d+)?)/[\d.]+\) GiB for KV cache"),
    "kv_cache_memory_suggested": re.compile(r"--kv-cache-memory=(\d+)` \([\d.]+ GiB\) to fit into requested memory"),
}
MAX_LINES = 200_000


def _number(text: str) -> float | None:
    value = float(text.replace(",", ""))
    return value if math.isfinite(value) else None


def measured(log: Any) -> dict[str, float]:
    """The memory figures of the last start in ``log`` (text, or a list of lines); {} when it has none."""
    lines = log.splitlines() if isinstance(log, str) else [str(line) for line in (log or [])]
    found: dict[str, float] = {}
    for line in lines[-MAX_LINES:]:
        if "Model loading took" in line:
            found = {}  # a new start: only the last one counts
        for key, pattern in PATTERNS.items():
            match = pattern.search(line)
            if match:
                value = _number(match.group(1))
                if value is not None:
                    found[key] = value
    if "kv_cache_gib" not in found and "kv_cache_gib_set" in found:
        found["kv_cache_gib"] = found["kv_cache_gib_set"]
    found.pop("kv_cache_gib_set", None)
    for key in ("kv_tokens", "kv_cache_memory_suggested"):
        if key in found:
            found[key] = int(found[key])
    return found


def pin_bytes(measured_figures: Any) -> int | None:
    """The KV budget to pin from a start's figures: vLLM's own exact suggestion "to fit into requested memory" where
    it logs one (it leaves 150 MiB of the profiled figure as a margin), else "Available KV cache memory"; None
    without either."""
    if not isinstance(measured_figures, dict):
        return None
    suggested = measured_figures.get("kv_cache_memory_suggested")
    if isinstance(suggested, int) and not isinstance(suggested, bool) and suggested > 0:
        return suggested
    gib = measured_figures.get("kv_cache_gib")
    if isinstance(gib, (int, float)) and not isinstance(gib, bool) and gib > 0:
        return int(gib * 1024**3)
    return None


def compared(plan: Any, measured_figures: dict[str, float], pin: Any = None) -> str:
    """The report's one line: the plan's KV budget and tokens against what vLLM measured, and how to pin it (or,
    with ``pin``, the box's own pin: kv_pin.py)."""
    plan = plan if isinstance(plan, dict) else {}
    planned_gib, planned_tokens = plan.get("kv_cache_gib_per_gpu"), plan.get("kv_tokens")
    if plan.get("measured_start") and not plan.get("kv_cache_pinned_gib"):
        planned_gib = planned_tokens = None  # a measured start plans no cache (capacity_measured): vLLM sized it
    gib, tokens = measured_figures.get("kv_cache_gib"), measured_figures.get("kv_tokens")
    if gib is None and tokens is None:
        return "KV cache: vLLM's start-up log reports no figure to compare with the plan"
    parts = []
    if gib is not None:
        shown = f"{planned_gib:.2f}" if isinstance(planned_gib, (int, float)) else "-"
        parts.append(f"{gib:.2f} GiB measured vs {shown} GiB planned per GPU")
    if tokens is not None:
        shown = f"{planned_tokens:,}" if isinstance(planned_tokens, int) else "-"
        parts.append(f"{tokens:,} tokens measured vs {shown} planned")
    line = "KV cache: " + "; ".join(parts)
    if isinstance(pin, dict) and pin.get("bytes"):
        line += f" (pinned by the box for later starts: {pin['bytes']} bytes, measured {pin.get('measured_at', '')})"
    elif (value := pin_bytes(measured_figures)) is not None:
        line += f" (pin it for later starts: gpubox_kv_cache_memory_bytes: {value})"
    return line
