"""Ansible filters around the capacity planner (plugins/module_utils/gpubox_capacity.py).

Controller-side plugins cannot import custom module_utils through ``ansible.module_utils``, so the
sibling directory is put on sys.path and the pure-Python modules are imported by name.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _MODULE_UTILS not in sys.path:
    sys.path.insert(0, _MODULE_UTILS)

import gpubox_capacity  # noqa: E402
import gpubox_models  # noqa: E402

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - only without Ansible installed
    AnsibleFilterError = ValueError  # type: ignore[misc,assignment]


def gpubox_plan(model: dict, gpu: dict, serving: dict) -> dict:
    """Plan vLLM 0.7.3 memory; errors come back in the result, they never raise."""
    return gpubox_capacity.plan(model, gpu, serving)


def gpubox_catalog_model(model_id: str) -> dict:
    """Catalog facts for a ModelScope id; unknown ids fail naming gpubox_model_id and the known ids."""
    try:
        return gpubox_models.catalog_model(model_id)
    except gpubox_models.UnknownModelError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def gpubox_expected_model(model_id: str, model_config: dict | None = None) -> dict:
    """The model facts preflight plans from: gpubox_model_config when given, else the catalog entry."""
    try:
        return gpubox_models.expected_model(model_id, model_config)
    except (gpubox_models.UnknownModelError, ValueError) as exc:
        raise AnsibleFilterError(str(exc)) from exc


def gpubox_config_mismatches(config_json: dict, model_id: str, model_config: dict | None = None) -> list[str]:
    """Where a downloaded config.json disagrees with the facts preflight planned from (empty: agrees)."""
    return gpubox_models.config_mismatches(gpubox_expected_model(model_id, model_config), config_json)


_ROWS = (
    ("budget per GPU", "budget_gib_per_gpu", "{:.2f} GiB"),
    ("weights per GPU", "weights_gib_per_gpu", "{:.2f} GiB"),
    ("activation peak", "activation_peak_gib", "{:.2f} GiB"),
    ("non-torch", "non_torch_gib", "{:.2f} GiB"),
    ("KV cache per GPU", "kv_cache_gib_per_gpu", "{:.2f} GiB"),
    ("KV bytes/token/GPU", "kv_bytes_per_token_per_gpu", "{:d} B"),
    ("batched tokens", "max_num_batched_tokens", "{:d}"),
    ("GPU blocks", "gpu_blocks", "{:d}"),
    ("KV tokens", "kv_tokens", "{:d}"),
    ("max concurrency", "max_concurrency", "{:.2f}x"),
)


def gpubox_plan_table(plan: dict[str, Any]) -> str:
    """A fixed-width text table of a plan, followed by its errors and warnings."""
    lines = []
    for label, key, fmt in _ROWS:
        if key in plan:
            lines.append(f"{label:<20} {fmt.format(plan[key]):>14}")
    lines.append(f"{'fits':<20} {'yes' if plan.get('fits') else 'NO':>14}")
    lines.extend(f"ERROR: {e}" for e in plan.get("errors", []))
    lines.extend(f"WARNING: {w}" for w in plan.get("warnings", []))
    return "\n".join(lines)


class FilterModule:
    """gpubox capacity filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpubox_plan": gpubox_plan,
            "gpubox_catalog_model": gpubox_catalog_model,
            "gpubox_plan_table": gpubox_plan_table,
            "gpubox_config_mismatches": gpubox_config_mismatches,
            "gpubox_expected_model": gpubox_expected_model,
        }
