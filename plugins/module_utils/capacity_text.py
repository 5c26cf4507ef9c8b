"""The capacity plan as a fixed-width text table, followed by its errors and warnings (stdlib only).

capacity_planner re-exports PLAN_ROWS and plan_table; ``make plan``, preflight and the plan_table filter print it.
"""

from __future__ import annotations

from typing import Any

OPTIONAL_ROWS = ("kv_cache_pinned_gib", "draft_weights_gib")  # shown only when set
PLAN_ROWS = (
    ("budget per GPU", "budget_gib_per_gpu", "{:.2f} GiB"),
    ("weights per GPU", "weights_gib_per_gpu", "{:.2f} GiB"),
    ("  rotary cos/sin", "rotary_cache_gib", "{:.2f} GiB"),
    ("  draft weights", "draft_weights_gib", "{:.2f} GiB"),
    ("activation peak", "activation_peak_gib", "{:.2f} GiB"),
    ("  MLP live set", "mlp_peak_gib", "{:.2f} GiB"),
    ("  sampler live set", "sampler_peak_gib", "{:.2f} GiB"),
    ("non-torch", "non_torch_gib", "{:.2f} GiB"),
    ("CUDA graphs (budget)", "cudagraph_gib", "{:.2f} GiB"),
    ("runner buffers", "runner_buffers_gib", "{:.2f} GiB"),
    ("KV budget pinned", "kv_cache_pinned_gib", "{:.2f} GiB"),
    ("KV cache per GPU", "kv_cache_gib_per_gpu", "{:.2f} GiB"),
    ("KV bytes/token/GPU", "kv_bytes_per_token_per_gpu", "{:d} B"),
    ("batched tokens", "max_num_batched_tokens", "{:d}"),
    ("GPU blocks", "gpu_blocks", "{:d}"),
    ("KV tokens", "kv_tokens", "{:d}"),
    ("max concurrency", "max_concurrency", "{:.2f}x"),
)


def plan_table(plan: dict[str, Any]) -> str:
    """A fixed-width text table of a plan, followed by its errors and warnings."""
    lines = [f"layout: {plan['layout']}"] if plan.get("layout") else []
    for label, key, fmt in PLAN_ROWS:
        if key in plan and not (key in OPTIONAL_ROWS and not plan[key]):
            lines.append(f"{label:<20} {fmt.format(plan[key]):>14}")
    lines.append(f"{'fits':<20} {'yes' if plan.get('fits') else 'NO':>14}")
    if plan.get("measured_start"):  # capacity_measured: an architecture the planner does not model
        lines.append(f"measured start: {plan['measured_start']}")
    if plan.get("weights_source"):
        lines.append(f"weights from: {plan['weights_source']}")
    lines.extend(f"ERROR: {e}" for e in plan.get("errors", []))
    lines.extend(f"WARNING: {w}" for w in plan.get("warnings", []))
    return "\n".join(lines)
