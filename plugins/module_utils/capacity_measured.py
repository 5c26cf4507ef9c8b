"""A measured start: serving a model whose architecture the capacity planner does not model (stdlib only).

The planner refuses by name an architecture it has no model of (capacity_layout.UnmodelledError: multi-head latent
attention, chunked local attention, Nemotron-H's hybrid_override_pattern, a layer type or recurrent layer it does
not know, or ``attention: mla`` in gpubox_model_config). That refusal stays the default; its message names
``gpubox_capacity_measured_start``. Set true on the lts-580 stack, the refusal becomes a measured start instead of a
plan (issue 45 item 5):

* vLLM sizes the KV cache itself: its profiling run measures the weights and the activation peak at start and gives
  the rest of ``gpubox_gpu_memory_utilization`` x the card to the cache. The serving report reads vLLM's own
  figure (vllm_startup.py) and the box pins it for the unit's later starts (kv_pin.py: vLLM 0.32's
  --kv-cache-memory-bytes), so a restart while another process holds GPU memory cannot shrink the pool; the
  inventory may pin it instead (gpubox_kv_cache_memory_bytes). vLLM 0.7.3 (pinned-0.7.3) has no such flag: there the
  variable is refused.
* That first start is conservative: ``gpubox_gpu_memory_utilization`` at most ``MAX_UTILIZATION`` (0.85), refused
  above it. What vLLM allocates after it has sized the cache lives in the rest of the card: the CUDA context
  (capacity_v1.CUDA_CONTEXT_GIB, 0.5 GiB), the V2 runner's sampler warm-up (capacity_v1's docstring, item 7:
  14 B x 256 rows x a 152k vocabulary = 0.51 GiB) and whatever an architecture the planner does not know adds
  there. For the architectures it models the planner checks that headroom (capacity_v1.warmup_check); here it
  cannot, so the first start keeps 15% of the card free (3.5 GiB of a 24 GB card's 23.55 GiB) where vLLM's default
  0.90 keeps 10% (2.4 GiB). The cost: the measured (and then pinned) cache is that much smaller.
* The weights must still fit: the checkpoint's files / (tp x pp) against the budget, the planner's weight estimate
  without the parts it reads from a modelled architecture (rotary cache, quantization layouts). A pinned cache must
  fit beside them. Bad facts, a tp x pp beyond the GPUs and any other refusal stay refusals.
* With gpubox_kv_cache_memory_bytes set as well, the pin is what starts (no plan, no utilization cap).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import value_text

NAME = "gpubox_capacity_measured_start"
STACK = "lts-580"  # the stack whose vLLM (0.32.0) has --kv-cache-memory-bytes to pin the measured figure
MAX_UTILIZATION = 0.85
GIB = 1024**3
MIB = 1024**2
MAX_WEIGHTS_BYTES = 1 << 50


def requested(serving: Any) -> bool:
    return isinstance(serving, dict) and serving.get("measured_start") is True


def input_problem(serving: Any, engine: str) -> str | None:
    """The variable itself: true or false (null is false), and true only on the stack that can pin the figure."""
    value = serving.get("measured_start") if isinstance(serving, dict) else None
    if value is None or value is False:
        return None
    if value is not True:
        return f"{NAME} must be true or false, got {value_text.short(value)}: false unless a measured start is meant"
    if engine != "v1":
        return (
            f"{NAME} is true but the stack runs vLLM 0.7.3, which has no --kv-cache-memory-bytes to pin the budget "
            f"vLLM measures: set gpubox_stack: {STACK}, or {NAME}: false"
        )
    return None


def refused(unmodelled: list[str]) -> list[str]:
    """The default: each architecture refusal, naming the variable that starts it measured instead."""
    return [
        f"{line}; or set {NAME}: true (gpubox_stack {STACK}) to start it unplanned at a conservative budget and pin "
        "the KV cache vLLM measures (docs/planner.md, measured start)"
        for line in unmodelled
    ]


def plan(model: dict, gpu: Any, serving: Any, named: str, result: Any) -> None:
    """Fill ``result`` (capacity_planner.Plan) for a measured start: no KV plan, the weights and any pin checked
    against the budget, ``measured_start`` saying what starts."""
    total = (gpu.total_mib - gpu.reserved_mib) * MIB
    budget = total * serving.utilization
    result.engine = serving.engine
    result.budget_gib_per_gpu = budget / GIB
    files = model.get("weights_bytes")
    if isinstance(files, bool) or not isinstance(files, int) or not 0 < files <= MAX_WEIGHTS_BYTES:
        result.errors.append(
            f"{named}: weights_bytes must be the checkpoint's weight bytes (1 to {MAX_WEIGHTS_BYTES:,}), got "
            f"{value_text.short(files)}: a measured start still checks that the weights fit; give it in "
            "gpubox_model_config"
        )
        return
    weights = files / (serving.tp * serving.pp)
    result.weights_gib_per_gpu = weights / GIB
    result.weights_source = "checkpoint files / (tp x pp) (measured start)"
    util_name = "gpubox_gpu_memory_utilization"
    if serving.tp * serving.pp > gpu.count:
        result.errors.append(
            f"gpubox_tensor_parallel_size x gpubox_pipeline_parallel_size = {serving.tp * serving.pp} GPUs, but "
            f"gpubox_gpu_count is {gpu.count}: use at most {gpu.count} GPUs in total"
        )
    if weights >= budget:
        result.errors.append(
            f"weights of {named} need {weights / GIB:.2f} GiB per GPU but {util_name} x gpubox_gpu_memory_total_mib "
            f"leaves {budget / GIB:.2f} GiB: a measured start needs them to fit too; raise "
            "gpubox_tensor_parallel_size, use a quantized model or bigger GPUs"
        )
        return
    if serving.kv_pinned is not None:
        pinned = serving.kv_pinned
        result.kv_cache_pinned_gib = result.kv_cache_gib_per_gpu = pinned / GIB
        result.measured_start = f"no plan; the pinned {pinned / GIB:.2f} GiB KV cache starts"
        if weights + pinned > budget:
            result.errors.append(
                f"gpubox_kv_cache_memory_bytes pins {pinned / GIB:.2f} GiB of KV cache per GPU but {util_name} x "
                f"the card leaves {(budget - weights) / GIB:.2f} GiB after the weights: pin what the serving report "
                "measured"
            )
        return
    result.measured_start = f"no plan; vLLM sizes the cache at {serving.utilization:.2f}"
    if serving.utilization > MAX_UTILIZATION:
        result.errors.append(
            f"{NAME}: the first start of an unplanned model is conservative, {util_name} at most "
            f"{MAX_UTILIZATION:.2f}, got {serving.utilization:.2f}: lower it to {MAX_UTILIZATION:.2f} for this start "
            "(the planner cannot check what this architecture allocates outside the budget), then pin the KV cache "
            "the serving report measures with gpubox_kv_cache_memory_bytes"
        )
