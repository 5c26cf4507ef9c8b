"""The capacity planner's model of vLLM's V1 engine (``engine="v1"``: the lts-580 stack's vLLM); stdlib only.

capacity_planner.plan() calls into this module for the terms where V1 budgets memory differently from vLLM 0.7.3's
V0 engine. Read from vLLM's own source (vllm/v1/worker/gpu_worker.py ``init_device`` and
``determine_available_memory``, vllm/utils/mem_utils.py ``memory_profiling``, vllm/v1/core/kv_cache_utils.py):

1. The baseline snapshot is taken *after* the distributed environment (NCCL, custom all-reduce) is set up, so those
   buffers are not in the budget: V1's non-torch term is only what grows during loading and profiling
   (cuBLAS/attention workspaces), ``NON_TORCH_GIB``, without V0's per-tp NCCL term.
2. ``requested = cudaMemGetInfo total x gpu_memory_utilization``; the KV budget is ``requested - weights -
   torch peak increase of the profiling run - non-torch increase`` (vLLM logs it as "Available KV cache memory:
   X GiB"); the weights are what loading allocated ("Model loading took X GiB").
3. CUDA graphs: with ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`` the graphs' estimated memory is subtracted from
   the KV budget as well. vLLM PR #30515 (December 2025) added the estimate switched off; vLLM's own start-up line
   says it is on by default since v0.21.0 ("CUDA graph memory profiling is enabled (default since v0.21.0)", logged
   by 0.27.1 in github.com/gpustack/runner/pull/251), and 0.18/0.19-era logs still announce it as coming
   (github.com/vllm-project/vllm/pull/39559). Earlier V1 releases capture the graphs outside the budget, in the
   ``1 - gpu_memory_utilization`` headroom. ``serving["cudagraph_in_budget"]`` says which (default true: the lts
   stack's vLLM 0.32 is newer than 0.21); ``enforce_eager`` captures none. The estimate per GPU is
   ``CUDAGRAPH_GIB`` unless ``serving["cudagraph_gib"]`` gives a measured one.
4. Chunked prefill is always on; ``max_num_batched_tokens`` and ``max_num_seqs`` default by GPU size (vLLM's
   engine arguments for the API server: 2048 tokens and 256 sequences below 70 GiB or on an A100, 8192 and 1024
   from 70 GiB otherwise).
5. ``GPU KV cache size: N tokens`` = blocks x block_size with blocks = KV budget // (block_size x KV bytes per
   token); V1 refuses to start when one ``max_model_len`` sequence does not fit ("To serve at least one request
   with the models's max seq len ...").

The profiling run's activation peak is modelled with V0's terms (MLP live set over the batched tokens, the sampler
over max_num_seqs x vocab); tests/data/calibration_v1/*.yml holds public V1 start-up logs with their sources and
``python bench/report.py`` reports the fit.
"""

from __future__ import annotations

import math
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import value_text

# V0's non-torch base term (capacity_planner.NON_TORCH_BASE_GIB) without the per-tp NCCL part, which V1 leaves out.
NON_TORCH_GIB = 0.10
# The CUDA-graph estimate is the median of the estimates public V1 logs print ("Estimated CUDA graph memory",
# "CUDAGraph memory"): 0.13 GiB (2x RTX 5090 tp 2, github.com/noonghunna/club-3090/issues/1087), 0.64 GiB
# (github.com/generative-computing/granite-switch/issues/128), 1.62 GiB (github.com/vllm-project/vllm/pull/39559).
CUDAGRAPH_GIB = 0.64
LARGE_GPU_GIB = 70
BATCHED_TOKENS = {False: 2048, True: 8192}  # GPU below / from LARGE_GPU_GIB
MAX_NUM_SEQS = {False: 256, True: 1024}
MAX_CUDAGRAPH_GIB = 2**24 / 1024  # capacity_planner.MAX_GPU_MIB in GiB


def is_large_gpu(usable_mib: float, name: str = "") -> bool:
    """Whether vLLM's API server takes the large-GPU defaults: a device total from LARGE_GPU_GIB on, unless the
    device name says A100 (vLLM's engine-argument defaults leave the A100 80GB on the small ones; vllm-project/vllm
    tests/engine/test_arg_utils.py ``test_defaults_with_usage_context`` states the same rule)."""
    return usable_mib / 1024 >= LARGE_GPU_GIB and "a100" not in name.lower()


def default_max_num_seqs(large_gpu: bool) -> int:
    return MAX_NUM_SEQS[large_gpu]


def default_batched_tokens(large_gpu: bool) -> int:
    return BATCHED_TOKENS[large_gpu]


def non_torch_gib() -> float:
    """Non-torch memory that grows after V1's baseline (taken once NCCL is set up): workspaces only."""
    return NON_TORCH_GIB


def _gib_ok(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and 0 <= value <= MAX_CUDAGRAPH_GIB


def cudagraph_gib(serving: dict, eager: bool, errors: list[str]) -> float:
    """CUDA-graph memory counted in the KV budget per GPU (0 when eager or captured outside the budget).

    Appends a message naming the key and the fix to ``errors`` for a bad ``cudagraph_in_budget``/``cudagraph_gib``."""
    in_budget = serving.get("cudagraph_in_budget", True)
    measured = serving.get("cudagraph_gib")
    if not isinstance(in_budget, bool):
        errors.append(
            f"serving cudagraph_in_budget must be true or false, got {value_text.short(in_budget)}: true for vLLM "
            "0.21 and later (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 is their default), false before"
        )
    elif measured is not None and not _gib_ok(measured):
        errors.append(
            f"serving cudagraph_gib must be null or a number of GiB >= 0, got {value_text.short(measured)}: use the "
            "figure vLLM logs as its CUDA graph memory estimate"
        )
    elif in_budget and not eager:
        return float(CUDAGRAPH_GIB if measured is None else measured)
    return 0.0
