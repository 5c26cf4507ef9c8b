"""GPU memory capacity planner for vLLM 0.7.3's V0 engine (pure Python, stdlib only).

What vLLM 0.7.3 does at start-up (read from the 0.7.3 wheel: vllm/worker/worker.py
``determine_num_available_blocks``, vllm/utils.py ``memory_profiling``, vllm/config.py
``SchedulerConfig``, vllm/engine/arg_utils.py, vllm/worker/cache_engine.py):

1. A baseline memory snapshot is taken after the CUDA context exists but before NCCL/model load.
2. The weights are loaded (``weights``: bytes PyTorch allocated while loading).
3. A profiling forward pass runs over ``max_num_batched_tokens`` tokens split into ``max_num_seqs``
   dummy prompts; ``activation`` = increase of torch's allocated-bytes peak during that pass.
4. ``non_torch`` = growth, since the baseline, of device memory that torch did not allocate
   (NCCL communicators, custom all-reduce buffers, cuBLAS/attention workspaces).
5. ``kv = total_gpu_memory * gpu_memory_utilization - weights - activation - non_torch``;
   ``# GPU blocks = floor(kv / (block_size * kv_bytes_per_token_per_gpu))``, the minimum over ranks.
   ``total_gpu_memory`` is what cudaMemGetInfo reports: nvidia-smi's total minus the driver's
   reserved memory. The CUDA context and later CUDA-graph capture are *not* in the budget: they live in
   the ``1 - gpu_memory_utilization`` headroom, which is why 0.95+ OOMs once graphs are captured.
6. vLLM refuses to start when ``# GPU blocks * block_size < max_model_len``.

Defaults (vLLM 0.7.3, V0): ``max_num_seqs`` 256; ``block_size`` 16; chunked prefill is switched on by
itself only when ``max_model_len > 32768`` (CUDA, no sliding window), and then
``max_num_batched_tokens`` defaults to 2048, otherwise to ``max(max_model_len, 2048)``.

The two terms that cannot be read from a config are modelled physically and calibrated against the
public start-up logs kept in tests/data/calibration/*.yml (``python bench/report.py`` reports the fit):

* activation peak (bytes) = ``max(MLP live set, sampler live set)`` on the driver rank, the MLP live set
  alone on the other ranks. vLLM 0.7.3's ``profile_run`` (vllm/worker/model_runner.py ``_dummy_run``)
  runs the forward pass over ``T = max_num_batched_tokens`` tokens in ``S = max_num_seqs`` dummy prompts
  with ``SamplingParams(top_p=0.99, top_k=vocab - 1)``, then ``compute_logits`` (one row per prompt,
  gathered to the driver) and, on the driver only, ``Sampler.forward``. The two phases run one after the
  other, so the peak is the larger of the two, not their sum:

  - MLP live set = ``ACTIVATION_FACTOR * T * (2 * hidden + 3 * intermediate / tp) * act_bytes`` (residual +
    normed input, the fused gate_up output and the activation output of one layer, sharded by tp;
    ``act_bytes`` 2 for bf16/fp16). bitsandbytes and GGUF dequantize each weight shard to bf16 before the
    matmul (vllm/model_executor/layers/quantization/bitsandbytes.py ``_apply_4bit_weight``), which adds
    the largest dequantized shard and its output: ``(hidden + T) * intermediate / tp * act_bytes``.
  - sampler live set = ``SAMPLER_BYTES * S * vocab + T * hidden * act_bytes``: the model's output hidden
    states stay referenced while the sampler runs; the caller keeps the bf16 logits (2 B per entry);
    the sampler casts them to fp32 (4 B) and ``_apply_top_k_top_p`` sorts each row (fp32 values 4 B and
    int64 indices 8 B, plus the sort's own buffers). Counted from the 0.7.3 code: during the sort 18 B per
    entry are referenced (caller's bf16 logits 2, fp32 logits 4, sorted values 4, indices 8) plus the sort's
    scratch; at the scatter that re-sorts the masked logits 32 B (those 18, top-k mask 1, ``probs_sort`` 4,
    ``probs_sum`` 4, top-p mask 1, the scatter's output 4); the later softmax/log_softmax/exponential phase
    about 22 B. Measured with torch's allocator on an H200 by
    bench/sampler_peak.py (torch 2.11; vLLM 0.7.3 ships 2.5.1): 38 B per (sequence x vocab entry) for
    1 or >= 128 sequences (the sort keeps 20 B of scratch) and 50 B for 2-127 sequences (another
    segmented-sort path). Checked on public logs: Llama-3-8B at 256 sequences logs 1.26 GiB at tp 1 and
    at tp 2 (vLLM PR #10511), the tp-independent peak that only the sampler gives; the model says 1.22.
    DeepSeek-R1-Distill-Qwen-1.5B (vocab 151936) at 256 sequences logs 1.39 GiB (vllm#12529), 8x its MLP
    live set; the model says 1.38.
  - ``ACTIVATION_FACTOR = 1.45``: measured/modelled MLP ratio of the cases whose peak is the MLP: 1.61 on
    the non-driver rank of a Qwen2.5-14B-architecture model tp2 at 2048 tokens (vllm#13061) and 1.31 for
    Qwen2.5-32B tp2 at 10000 tokens (vllm#15815). The remainder is allocator slack and attention
    temporaries.
* non-torch (GiB) = ``NON_TORCH_BASE_GIB + NON_TORCH_PER_TP_GIB * tp`` = 0.10 + 0.075 * tp, a least-squares
  line through the logged values 0.16 (tp 1, H100, PR #12126), 0.25 and 0.30 (tp 2: 2x4090 vllm#13061,
  2xL40S vllm#15815) and 0.34-0.43 (tp 4, A100-40GB, vllm#16570). NCCL buffers grow with the number of
  peers, hence the per-tp term.
* ``DEFAULT_RESERVED_MIB = 450``: nvidia-smi total minus cudaMemGetInfo total on 24 GB cards
  (RTX 4090: 24564 MiB vs 23.55 GiB logged in vllm#13061 and #11550 = 449 MiB; a 23.58 GiB 24 GB card in
  vllm PR #14447 = 430 MiB from 24576). Pass ``gpu["memory_reserved_mib"]`` when it is known
  (``nvidia-smi -q``: FB Memory Usage / Reserved).

Weights per GPU are ``weights_bytes / (tp * pp)`` plus the rotary embedding's cos/sin cache (below), where
``weights_bytes`` is the total size of the checkpoint's weight files (safetensors or .gguf); vLLM's own
figure is within ~0.2 GiB of that for the calibration cases (e.g. Qwen2.5-32B tp2: 30.52 planned, 30.71
logged). bitsandbytes quantizes an unquantized checkpoint while loading it: when ``weights_bytes`` is at
least the linear layers at the model's dtype, the linear layers count at ``BNB_4BIT_BYTES_PER_PARAM`` (nf4
+ double-quantized absmax, vLLM's in-flight ``quantize_4bit(compress_statistics=True)``) and the rest as
stored. GPTQ/AWQ/GGUF/fp8 checkpoints are already quantized, so their files are their weights; a
``weights_bytes`` that is as large as the unquantized linear layers is refused. ``weights_source`` in the
plan says where the figure came from. The cos/sin cache (vllm/model_executor/layers/rotary_embedding.py
``RotaryEmbedding.__init__``: a buffer of ``max_position_embeddings x rotary_dim`` in the model's dtype,
built from config.json's ``max_position_embeddings`` whatever ``max_model_len`` is, one per process and
not split by tp) is allocated while the model loads, so vLLM counts it in "model weights take": 32 MiB for
a 131072-position model, 0.24 GiB for Qwen2.5-7B-Instruct-1M's 1010000 positions (the longctx-wsl case
logs 5.43 GiB, the files alone give 5.17). The planner takes ``rotary_dim = head_dim`` (partial-rotary
models over-count a little).

vLLM's V1 engine (``engine="v1"``, the lts stack's vLLM) budgets memory differently; its terms, constants and
calibration live in capacity_v1.py.

Model families (config_json, read by capacity_layout): mixture-of-experts, sliding-window and hybrid models are
planned on the V1 engine (capacity_v1) and refused by name, naming the stacks that serve them, on a release the
planner does not model them for (vllm_words.Release.families). Multi-head latent attention is refused.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    capacity_draft,
    capacity_layout,
    capacity_measured,
    capacity_text,
    capacity_v1,
    capacity_weights,
    model_catalog,
    stacks,
    value_text,
    vllm_words,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils import desired_state_schema as schema

GIB = 1024**3
MIB = 1024**2

# Calibrated constants (see module docstring for the data behind each).
ACTIVATION_FACTOR = 1.45
SAMPLER_BYTES = 38  # per (sequence x vocab entry) for 1 or >= 128 sequences (bench/sampler_peak.py)
SAMPLER_BYTES_SMALL_BATCH = 50  # 2-127 sequences: torch's other segmented-sort path
SAMPLER_SMALL_BATCH = range(2, 128)
BNB_4BIT_BYTES_PER_PARAM = capacity_weights.BNB_4BIT_BYTES_PER_PARAM
DEQUANTIZING_METHODS = capacity_weights.DEQUANTIZING_METHODS
PREQUANTIZED_METHODS = capacity_weights.PREQUANTIZED_METHODS
linear_params = capacity_weights.linear_params
ATTENTION_KINDS = capacity_layout.ATTENTION_KINDS
NON_TORCH_BASE_GIB = 0.10
NON_TORCH_PER_TP_GIB = 0.075
DEFAULT_RESERVED_MIB = 450

# vLLM 0.7.3 facts.
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_BLOCK_SIZE = 16
CUDA_BLOCK_SIZES = vllm_words.BLOCK_SIZES
KV_CACHE_DTYPES = vllm_words.KV_CACHE_DTYPES
CHUNKED_PREFILL_AUTO_ABOVE = 32768
CHUNKED_PREFILL_BATCHED_TOKENS = 2048
MIN_BATCHED_TOKENS = 2048

# Engines: "v0" is vLLM 0.7.3 (this module), "v1" the lts stack's vLLM (capacity_v1.py; its constants re-exported).
ENGINES = ("v0", "v1")
DEFAULT_ENGINE = "v0"
V1_NON_TORCH_GIB = capacity_v1.NON_TORCH_GIB
V1_CUDAGRAPH_GIB = capacity_v1.CUDAGRAPH_GIB
V1_LARGE_GPU_GIB = capacity_v1.LARGE_GPU_GIB

# Thresholds for warnings.
UTILIZATION_WARN_AT = 0.95
KV_MARGIN_WARN_GIB = 1.0

# A model's own dtype (config.json's torch_dtype, vLLM 0.7.3's --dtype): vLLM 0.7.3 takes auto, half, float16,
# bfloat16, float and float32 (vllm/engine/arg_utils.py); bf16/fp16 are the spellings some configs use. fp8 is
# a KV-cache dtype or a quantization, never a model dtype: an fp8 checkpoint says so in its quantization_config.
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "bf16": 2, "fp16": 2, "float32": 4, "float": 4}
KV_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float16": 2, "bfloat16": 2}
DTYPE_BYTES = {**MODEL_DTYPE_BYTES, **KV_DTYPE_BYTES}

# The largest value the planner takes for each kind of number (beyond these, nothing real and the float
# arithmetic overflows): config.json's integers (hidden sizes, vocab, 10M-token contexts fit), weight bytes
# (a PiB), MiB per GPU (16 TiB), GPUs and parallel sizes, and the serving limits.
MAX_CONFIG_INT = model_catalog.MAX_DIM
MAX_WEIGHTS_BYTES = model_catalog.MAX_WEIGHTS_BYTES
MAX_GPU_MIB = 2**24
MAX_GPUS = 64
MAX_SERVING_INT = 2**26

# The planner's input keys and the inventory variables (group_vars) that set them, from the one table of the
# desired state (desired_state_schema.py: each row's planner key).
INVENTORY_NAMES = schema.inventory_names()


def var(key: str) -> str:
    """Inventory variable for a planner input key, e.g. ``serving.max_num_seqs`` -> gpubox_max_num_seqs."""
    return INVENTORY_NAMES.get(key, INVENTORY_NAMES["model"] if key.startswith("model.") else key)


@dataclass(frozen=True)
class ModelFacts:
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    intermediate: int
    vocab: int
    head_dim: int
    dtype_bytes: int
    max_position_embeddings: int
    weights_bytes: int
    quantization: str | None
    weights_source: str = ""
    layout: capacity_layout.Layout | None = None  # from config_json; None: every layer full attention, dense MLP
    weights_loaded: bool = False  # weights_bytes is what vLLM logged as loaded (a calibration case), not the files


@dataclass(frozen=True)
class GpuFacts:
    name: str
    total_mib: float
    reserved_mib: float
    count: int


@dataclass(frozen=True)
class ServingFacts:
    tp: int
    pp: int
    utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    kv_dtype_bytes: int
    enforce_eager: bool
    block_size: int
    engine: str = DEFAULT_ENGINE
    cudagraph_gib: float = 0.0  # V1: CUDA-graph memory counted in the KV budget (0 for V0, eager or outside)
    sampler: str = "native-sort"  # V1: the profiling run's top-k/top-p path (capacity_v1.SAMPLERS); V0 sorts
    speculative: dict | None = None  # V1: gpubox_speculative_config (capacity_v1.speculative_* size it)
    kv_pinned: int | None = None  # V1: gpubox_kv_cache_memory_bytes, the budget vLLM takes instead of profiling


@dataclass
class Plan:
    weights_gib_per_gpu: float = 0.0
    draft_weights_gib: float = 0.0  # V1: a draft's or EAGLE head's weights and rotary cache (capacity_draft)
    rotary_cache_gib: float = 0.0
    activation_peak_gib: float = 0.0
    mlp_peak_gib: float = 0.0
    sampler_peak_gib: float = 0.0
    non_torch_gib: float = 0.0
    cudagraph_gib: float = 0.0
    runner_buffers_gib: float = 0.0
    sampler_warmup_gib: float = 0.0
    warmup_headroom_gib: float = 0.0
    kv_cache_gib_per_gpu: float = 0.0
    kv_bytes_per_token_per_gpu: int = 0
    gpu_blocks: int = 0
    kv_tokens: int = 0
    max_concurrency: float = 0.0
    budget_gib_per_gpu: float = 0.0
    max_num_batched_tokens: int = 0
    weights_source: str = ""
    layout: str = ""  # capacity_layout.describe: the layers, windows and experts the plan read
    engine: str = DEFAULT_ENGINE
    fits: bool = False
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kv_cache_pinned_gib: float = 0.0
    measured_start: str = ""  # capacity_measured: what starts instead of a plan ("" = planned)


class _Collector:
    """Collects validation errors so that every bad input is reported, not only the first."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def int_at_least(
        self, section: dict, section_name: str, key: str, minimum: int, hint: str, maximum: int = MAX_SERVING_INT
    ) -> int:
        value = section.get(key)
        name = var(f"{section_name}.{key}")
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            self.errors.append(f"{name} must be an integer from {minimum} to {maximum:,}, got {_shown(value)}: {hint}")
            return minimum
        return value


_shown = value_text.short  # an input as a message shows it


def _number_in(value: Any, low: float, high: float, low_open: bool = True) -> bool:
    """A real, finite number (not a bool) in (low, high] (or [low, high] when not ``low_open``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return (value > low if low_open else value >= low) and value <= high


def inventory_inputs(inventory: dict[str, Any]) -> tuple[dict, dict]:
    """The gpu and serving inputs of plan() from the inventory's gpubox_* variables (INVENTORY_NAMES).

    Variables left out take vLLM's or gpubox's defaults (pipeline 1, kv cache dtype auto, no eager).
    """
    gpu = {key.split(".", 1)[1]: inventory.get(name) for key, name in INVENTORY_NAMES.items() if key.startswith("gpu.")}
    serving = {
        key.split(".", 1)[1]: inventory.get(name) for key, name in INVENTORY_NAMES.items() if key.startswith("serving.")
    }
    for key, default in (("pipeline_parallel_size", 1), ("kv_cache_dtype", "auto"), ("enforce_eager", False)):
        if serving.get(key) is None:
            serving[key] = default
    return gpu, serving


def _positive_int(value: Any, maximum: int = MAX_CONFIG_INT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= maximum


def _named(model: dict) -> str:
    return f"{var('model')} {model['model_id']}" if isinstance(model.get("model_id"), str) else var("model")


def _model_facts(
    model: dict, errors: list[str], words: vllm_words.Release | None = None, unmodelled: list[str] | None = None
) -> ModelFacts | None:
    # The integer facts of a model: config.json's fields plus the weight files' size (model_catalog).
    words = words or vllm_words.RELEASES[stacks.STACKS[stacks.DEFAULT].vllm]
    named = _named(model)
    layout = capacity_layout.model_layout(model, named, words, errors, unmodelled)
    if layout is False:
        return None
    required = tuple(k for k in model_catalog.INVENTORY_REQUIRED if k != "torch_dtype")
    limits = {"weights_bytes": MAX_WEIGHTS_BYTES}
    bad = [k for k in required if not _positive_int(model.get(k), limits.get(k, MAX_CONFIG_INT))]
    head_dim = model.get("head_dim")
    if head_dim is not None and not _positive_int(head_dim):
        bad.append("head_dim")
    if bad:
        errors.append(
            f"{var('model')}: model facts {', '.join(bad)} missing or not positive integers (at most "
            f"{MAX_CONFIG_INT:,}, weights_bytes {MAX_WEIGHTS_BYTES:,}); "
            "use a model from the catalog (gpubox_models) or give its config.json values"
        )
        return None
    raw_dtype = model.get("torch_dtype")
    dtype = raw_dtype.lower() if isinstance(raw_dtype, str) else ""
    if dtype not in MODEL_DTYPE_BYTES:
        hint = (
            "fp8 is a KV-cache dtype (gpubox_kv_cache_dtype) or a quantization, not a model dtype; "
            if dtype in KV_DTYPE_BYTES
            else ""
        )
        errors.append(
            f"{var('model.torch_dtype')} must be one of bfloat16, float16, float32 (vLLM's --dtype), got "
            f"{_shown(raw_dtype)}: {hint}set it to the model's torch_dtype from config.json"
        )
        return None
    head_dim = model.get("head_dim") or model["hidden_size"] // model["num_attention_heads"]
    quantization = model.get("quantization")
    if quantization is not None and quantization not in words.quantizations:
        errors.append(
            f"{var('model.quantization')} must be null or a quantization method of vLLM {words.version}, got "
            f"{_shown(quantization)}: use the quant_method of the checkpoint's quantization_config"
            + capacity_layout.serving_stacks(quantization, "quantization")
        )
        return None
    facts = ModelFacts(
        layers=model["num_hidden_layers"],
        heads=model["num_attention_heads"],
        kv_heads=model["num_key_value_heads"],
        hidden=model["hidden_size"],
        intermediate=model["intermediate_size"],
        vocab=model["vocab_size"],
        head_dim=int(head_dim),
        dtype_bytes=MODEL_DTYPE_BYTES[dtype],
        max_position_embeddings=model["max_position_embeddings"],
        weights_bytes=model["weights_bytes"],
        quantization=quantization,
        layout=layout,
        weights_loaded=model.get("weights_loaded") is True,
    )
    weights, source = capacity_weights.checkpoint_weights(facts, model.get("weights_source"), errors, var)
    if weights is None:
        return None
    return replace(facts, weights_bytes=weights, weights_source=source)


def _gpu_facts(gpu: dict, errors: list[str]) -> GpuFacts | None:
    col = _Collector()
    count = col.int_at_least(gpu, "gpu", "count", 1, "set it to the number of GPUs in the box", MAX_GPUS)
    total = gpu.get("memory_total_mib")
    if not _number_in(total, 0, MAX_GPU_MIB):
        col.errors.append(
            f"{var('gpu.memory_total_mib')} must be a positive number of MiB per GPU (at most {MAX_GPU_MIB:,}), "
            f"got {_shown(total)}: use nvidia-smi's memory.total (e.g. 24576 for an RTX 3090)"
        )
    reserved = gpu.get("memory_reserved_mib", DEFAULT_RESERVED_MIB)
    if reserved is None:
        reserved = DEFAULT_RESERVED_MIB
    if not _number_in(reserved, 0, MAX_GPU_MIB, low_open=False):
        col.errors.append(f"gpu memory_reserved_mib must be a number from 0 to {MAX_GPU_MIB:,}, got {_shown(reserved)}")
    errors.extend(col.errors)
    if col.errors:
        return None
    name = gpu.get("name")
    return GpuFacts(name if isinstance(name, str) and name else "GPU", float(total), float(reserved), count)


def _serving_facts(
    serving: dict,
    model: ModelFacts | None,
    errors: list[str],
    engine: str = DEFAULT_ENGINE,
    large_gpu: bool = False,
    words: vllm_words.Release | None = None,
) -> ServingFacts | None:
    words = words or words_of(engine)
    # the release's KV dtypes the planner knows a width for, and its block sizes
    kv_dtypes = tuple(d for d in words.kv_cache_dtypes if d == "auto" or d in DTYPE_BYTES)
    col = _Collector()
    tp = col.int_at_least(serving, "serving", "tensor_parallel_size", 1, "use 1, 2, 4 or 8", MAX_GPUS)
    pp = col.int_at_least(serving, "serving", "pipeline_parallel_size", 1, "use 1 unless you span hosts", MAX_GPUS)
    max_len = col.int_at_least(serving, "serving", "max_model_len", 1, "set the context length to serve, e.g. 8192")
    seqs_raw = serving.get("max_num_seqs")
    max_seqs = (
        (DEFAULT_MAX_NUM_SEQS if engine == "v0" else capacity_v1.default_max_num_seqs(large_gpu))
        if seqs_raw is None
        else col.int_at_least(serving, "serving", "max_num_seqs", 1, "e.g. 8 for a small team")
    )

    util = serving.get("gpu_memory_utilization")
    if not _number_in(util, 0, 1):
        col.errors.append(
            f"{var('serving.gpu_memory_utilization')} must be a fraction in (0, 1], got {_shown(util)}: "
            "use 0.90-0.92 (vLLM's default is 0.90)"
        )
        util = 0.9

    chunked = engine == "v1" or max_len > CHUNKED_PREFILL_AUTO_ABOVE
    default_tokens = CHUNKED_PREFILL_BATCHED_TOKENS if chunked else max(max_len, MIN_BATCHED_TOKENS)
    if engine == "v1":
        default_tokens = capacity_v1.default_batched_tokens(large_gpu)
    batched_raw = serving.get("max_num_batched_tokens")
    batched = (
        default_tokens
        if batched_raw is None
        else col.int_at_least(serving, "serving", "max_num_batched_tokens", 1, "or null for vLLM's default")
    )
    if batched_raw is not None and batched < max_len and not chunked:
        col.errors.append(
            f"{var('serving.max_num_batched_tokens')} ({batched}) is smaller than "
            f"{var('serving.max_model_len')} ({max_len}); vLLM 0.7.3 refuses this without chunked "
            "prefill: raise it or set it to null"
        )
    if batched < max_seqs:
        col.errors.append(
            f"{var('serving.max_num_batched_tokens')} ({batched}) must be >= "
            f"{var('serving.max_num_seqs')} ({max_seqs}): lower max_num_seqs or raise the token budget"
        )

    kv_dtype = "auto" if serving.get("kv_cache_dtype") is None else serving.get("kv_cache_dtype")
    if kv_dtype not in kv_dtypes:
        col.errors.append(
            f"{var('serving.kv_cache_dtype')} must be one of {', '.join(kv_dtypes)} (vLLM {words.version}'s the "
            f"planner sizes), got {_shown(kv_dtype)}"
        )
        kv_dtype = "auto"

    block_raw = serving.get("block_size")
    block = DEFAULT_BLOCK_SIZE if block_raw is None else block_raw
    if block not in words.block_sizes or isinstance(block, bool):
        col.errors.append(
            f"{var('serving.block_size')} must be one of {words.block_sizes} on CUDA or null (16), "
            f"got {_shown(block_raw)}"
        )
        block = DEFAULT_BLOCK_SIZE

    eager = serving.get("enforce_eager", False)
    if not isinstance(eager, bool):
        col.errors.append(f"{var('serving.enforce_eager')} must be true or false, got {_shown(eager)}")
        eager = False

    cudagraph = capacity_v1.cudagraph_gib(serving, eager, col.errors) if engine == "v1" else 0.0
    sampler = capacity_v1.sampler_path(serving, col.errors) if engine == "v1" else "native-sort"
    speculative = capacity_v1.speculative_input(serving, model, col.errors) if engine == "v1" else None

    errors.extend(col.errors)
    if col.errors:
        return None
    kv_bytes = (model.dtype_bytes if model else 2) if kv_dtype == "auto" else DTYPE_BYTES[kv_dtype]
    facts = (tp, pp, float(util), max_len, max_seqs, batched, chunked, kv_bytes, eager, block, engine, cudagraph)
    pinned = capacity_v1.pinned_input(serving, col.errors) if engine == "v1" else None
    return ServingFacts(*facts, sampler, speculative, pinned)


def kv_bytes_per_token_per_gpu(model: ModelFacts, serving: ServingFacts) -> int:
    """K and V for every layer on this GPU; kv heads are split by tp and replicated below one per GPU."""
    kv_heads_per_gpu = max(1, model.kv_heads // serving.tp)
    attention_layers = model.layers if model.layout is None else model.layers - model.layout.count("linear")
    layers_per_gpu = math.ceil(attention_layers / serving.pp)
    return 2 * layers_per_gpu * kv_heads_per_gpu * model.head_dim * serving.kv_dtype_bytes


def rotary_cache_bytes(model: ModelFacts) -> int:
    """The rotary embedding's cos/sin cache on every GPU: max_position_embeddings x head_dim in the model's dtype."""
    act_bytes = 2 if model.dtype_bytes < 2 else model.dtype_bytes
    return model.max_position_embeddings * model.head_dim * act_bytes


def mlp_peak_bytes(model: ModelFacts, serving: ServingFacts) -> float:
    """Calibrated MLP live set of the forward pass over max_num_batched_tokens (every rank)."""
    act_bytes = 2 if model.dtype_bytes < 2 else model.dtype_bytes
    tokens = serving.max_num_batched_tokens
    per_token = 2 * model.hidden + 3 * model.intermediate / serving.tp
    peak = ACTIVATION_FACTOR * tokens * per_token * act_bytes
    experts = model.layout.experts if model.layout else None
    if experts:  # the expert layers' fused-MoE live set (V2: a persistent workspace); dense layers keep theirs
        moe = ACTIVATION_FACTOR * capacity_v1.moe_live_bytes(tokens, model.hidden, experts, serving.tp, act_bytes)
        if serving.sampler == "v2":
            moe = 2 * tokens * model.hidden * act_bytes
        peak = max(moe, peak if experts.moe_layers < model.layers else 0.0)
    if model.quantization in DEQUANTIZING_METHODS:
        peak += (model.hidden + tokens) * model.intermediate / serving.tp * act_bytes
    return peak


def sampler_peak_bytes(model: ModelFacts, serving: ServingFacts) -> float:
    """Live set while the driver samples one token for each of max_num_seqs dummy prompts."""
    act_bytes = 2 if model.dtype_bytes < 2 else model.dtype_bytes
    seqs = serving.max_num_seqs
    per_entry = SAMPLER_BYTES_SMALL_BATCH if seqs in SAMPLER_SMALL_BATCH else SAMPLER_BYTES
    hidden_states = serving.max_num_batched_tokens * model.hidden * act_bytes
    # V0 always sorts (serving.sampler is "native-sort"); V1 takes the path its release runs.
    return capacity_v1.sampler_logits_bytes(serving.sampler, seqs, model.vocab, per_entry) + hidden_states


def activation_peak_bytes(model: ModelFacts, serving: ServingFacts) -> float:
    """Peak of the profiling pass on the driver rank, which has the fewest blocks (the one vLLM uses)."""
    draft = capacity_draft.peak_bytes(model, serving)  # V1: the draft's proposal beside the target's hidden states
    return max(mlp_peak_bytes(model, serving), sampler_peak_bytes(model, serving), draft)


def non_torch_gib(serving: ServingFacts) -> float:
    """V0: NCCL and workspaces since the baseline (per-tp term); V1's baseline comes after NCCL is set up."""
    if serving.engine == "v1":
        return capacity_v1.non_torch_gib()
    return NON_TORCH_BASE_GIB + NON_TORCH_PER_TP_GIB * serving.tp


def _topology_errors(model: ModelFacts, gpu: GpuFacts, serving: ServingFacts) -> list[str]:
    errors = []
    if serving.tp * serving.pp > gpu.count:
        errors.append(
            f"{var('serving.tensor_parallel_size')} x {var('serving.pipeline_parallel_size')} = "
            f"{serving.tp * serving.pp} GPUs, but {var('gpu.count')} is {gpu.count}: use at most "
            f"{gpu.count} GPUs in total"
        )
    if model.heads % serving.tp:
        errors.append(
            f"{var('serving.tensor_parallel_size')} ({serving.tp}) must divide the model's "
            f"{model.heads} attention heads (vLLM 0.7.3 refuses otherwise): choose a divisor of {model.heads}"
        )
    if not (model.kv_heads % serving.tp == 0 or serving.tp % model.kv_heads == 0):
        errors.append(
            f"{var('serving.tensor_parallel_size')} ({serving.tp}) and the model's {model.kv_heads} KV "
            "heads: "
            "one must divide the other (vLLM splits or replicates KV heads): choose another tp"
        )
    if serving.max_model_len > model.max_position_embeddings:
        errors.append(
            f"{var('serving.max_model_len')} ({serving.max_model_len}) exceeds the model's "
            f"max_position_embeddings ({model.max_position_embeddings}); vLLM refuses it unless "
            f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set: lower it to <= {model.max_position_embeddings}"
        )
    return errors


def _capacity(model: ModelFacts, gpu: GpuFacts, serving: ServingFacts, result: Plan) -> None:
    total_bytes = (gpu.total_mib - gpu.reserved_mib) * MIB
    budget = total_bytes * serving.utilization
    draft_weights = capacity_draft.weights_bytes(model, serving)
    weights = model.weights_bytes / (serving.tp * serving.pp) + rotary_cache_bytes(model) + draft_weights
    if model.quantization in capacity_weights.MXFP4_METHODS and not model.weights_loaded:
        weights += capacity_weights.marlin_mxfp4_padding(model, gpu.name, serving.tp) / serving.pp
    activation = activation_peak_bytes(model, serving)
    non_torch = non_torch_gib(serving) * GIB
    cudagraph = serving.cudagraph_gib * GIB
    buffers = capacity_v1.persistent_bytes(model, serving)
    kv_bytes = capacity_v1.pinned_kv(serving, budget - weights - activation - non_torch - cudagraph - buffers, result)
    per_token = kv_bytes_per_token_per_gpu(model, serving)
    blocks = max(0, int(kv_bytes // (serving.block_size * per_token)))
    tokens = blocks * serving.block_size
    requests = blocks / math.ceil(serving.max_model_len / serving.block_size)
    if serving.engine == "v1" and (model.layout is not None or serving.speculative):  # vLLM 0.32's token figure
        per_request, per_block, request_blocks = capacity_v1.family_request_bytes(model, serving)
        blocks, tokens = capacity_v1.kv_tokens(kv_bytes, per_block, request_blocks, serving.max_model_len)
        per_token = max(1, round(per_request / serving.max_model_len))
        requests = blocks / request_blocks
        if kv_bytes > 0 and (problem := capacity_v1.mamba_blocks_problem(model.layout, serving, blocks)):
            result.errors.append(problem)

    result.layout = capacity_layout.describe(model.layout, model.layers, serving.tp)
    result.budget_gib_per_gpu = budget / GIB
    result.weights_gib_per_gpu, result.draft_weights_gib = weights / GIB, draft_weights / GIB
    result.rotary_cache_gib = rotary_cache_bytes(model) / GIB
    result.activation_peak_gib = activation / GIB
    result.mlp_peak_gib = mlp_peak_bytes(model, serving) / GIB
    result.sampler_peak_gib = sampler_peak_bytes(model, serving) / GIB
    result.weights_source = model.weights_source
    result.non_torch_gib = non_torch / GIB
    result.cudagraph_gib = serving.cudagraph_gib
    result.runner_buffers_gib = buffers / GIB
    result.engine = serving.engine
    result.kv_cache_gib_per_gpu = kv_bytes / GIB
    result.kv_bytes_per_token_per_gpu = per_token
    result.max_num_batched_tokens = serving.max_num_batched_tokens
    result.gpu_blocks = blocks
    result.kv_tokens = tokens
    result.max_concurrency = result.kv_tokens / serving.max_model_len

    util_name = var("serving.gpu_memory_utilization")
    len_name = var("serving.max_model_len")
    if weights >= budget:
        result.errors.append(
            f"weights of {var('model')} need {weights / GIB:.2f} GiB per GPU but {util_name} x "
            f"{var('gpu.memory_total_mib')} leaves {budget / GIB:.2f} GiB: raise "
            f"{var('serving.tensor_parallel_size')}, use a quantized model or bigger GPUs"
        )
    elif result.kv_tokens < serving.max_model_len:
        result.errors.append(
            f"KV cache holds {result.kv_tokens} tokens per GPU ({kv_bytes / GIB:.2f} GiB) but {len_name} is "
            f"{serving.max_model_len}: vLLM refuses to start; lower {len_name}, raise {util_name} or tp"
        )

    warmup, headroom, rows = capacity_v1.warmup_check(
        serving, model.vocab, requests, total_bytes, activation, cudagraph
    )
    result.sampler_warmup_gib, result.warmup_headroom_gib = warmup / GIB, headroom / GIB
    if warmup > headroom and not result.errors:
        result.errors.append(
            f"vLLM's sampler warm-up after the KV cache is sized needs {warmup / GIB:.2f} GiB ({rows} rows x "
            f"{model.vocab:,} vocabulary) outside the budget, but {util_name} {serving.utilization:.2f} leaves "
            f"{headroom / GIB:.2f} GiB: the start fails out of memory; lower {util_name} or "
            f"{var('serving.max_num_seqs')}"
        )
    if serving.utilization >= UTILIZATION_WARN_AT and not serving.cudagraph_gib:
        result.warnings.append(
            f"{util_name} is {serving.utilization:.2f} (>= {UTILIZATION_WARN_AT}): CUDA-graph capture "
            "and the CUDA context live outside this budget and OOM at start or first request; use 0.90-0.92"
        )
    if result.kv_tokens >= serving.max_model_len and result.max_concurrency < serving.max_num_seqs:
        result.warnings.append(
            f"{var('serving.max_num_seqs')} is {serving.max_num_seqs} but the KV cache holds only "
            f"{result.max_concurrency:.2f} sequences of {len_name} {serving.max_model_len} "
            f"(max concurrency {result.max_concurrency:.2f}x): long requests will queue or be preempted"
        )
    margin = kv_bytes - serving.max_model_len * per_token
    if result.kv_tokens >= serving.max_model_len and margin < KV_MARGIN_WARN_GIB * GIB:
        result.warnings.append(
            f"KV cache margin beyond one {len_name} sequence is {margin / GIB:.2f} GiB "
            f"(< {KV_MARGIN_WARN_GIB:.0f} GiB): a small change in activation or driver memory stops vLLM"
        )


def words_of(engine: str, stack: Any = None) -> vllm_words.Release:
    """The vLLM release a plan checks words and families against: the stack's, else the first stack's of the
    engine (v0: the pinned stack's 0.7.3, v1: the lts stack's)."""
    if isinstance(stack, str) and stack in stacks.STACKS:
        return stacks.STACKS[stack].words
    return next(s.words for s in stacks.STACKS.values() if s.engine == engine)


def plan(model: dict, gpu: dict, serving: dict, engine: str = DEFAULT_ENGINE, stack: Any = None) -> dict:
    """Plan vLLM memory per GPU for an engine: "v0" (vLLM 0.7.3, the pinned stack) or "v1" (the lts stack's vLLM).

    ``stack`` (gpubox_stack), when given, sets the engine and the release whose words and families the model is
    checked against. Never raises on bad input: problems come back in ``errors``."""
    result = Plan()
    if isinstance(stack, str) and stack in stacks.STACKS:
        engine = stacks.STACKS[stack].engine
    if engine not in ENGINES:
        result.errors.append(
            f"engine must be one of {', '.join(ENGINES)}, got {_shown(engine)}: v0 for vLLM 0.7.3 (the pinned "
            "stack), v1 for the lts stack's vLLM"
        )
        return asdict(result)
    result.engine = engine
    for label, value, name in (
        ("model", model, var("model")),
        ("gpu", gpu, var("gpu.name")),
        ("serving", serving, "serving profile"),
    ):
        if not isinstance(value, dict):
            result.errors.append(f"{name}: the {label} facts must be a mapping, got {type(value).__name__}")
    if result.errors:
        return asdict(result)
    unmodelled: list[str] = []  # the architecture refusals (capacity_measured decides)
    model_facts = _model_facts(model, result.errors, words_of(engine, stack), unmodelled)
    gpu_facts = _gpu_facts(gpu, result.errors)
    large = bool(gpu_facts) and capacity_v1.is_large_gpu(gpu_facts.total_mib - gpu_facts.reserved_mib, gpu_facts.name)
    serving_facts = _serving_facts(serving, model_facts, result.errors, engine, large, words_of(engine, stack))
    if problem := capacity_measured.input_problem(serving, engine):
        result.errors.append(problem)
    if unmodelled and (problem or not capacity_measured.requested(serving)):
        result.errors.extend(capacity_measured.refused(unmodelled))
    elif unmodelled and gpu_facts and serving_facts:  # gpubox_capacity_measured_start: vLLM measures instead
        capacity_measured.plan(model, gpu_facts, serving_facts, _named(model), result)
    if model_facts and gpu_facts and serving_facts:
        result.errors.extend(_topology_errors(model_facts, gpu_facts, serving_facts))
        _capacity(model_facts, gpu_facts, serving_facts, result)
    result.fits = not result.errors
    return asdict(result)


# The plan as a text table (capacity_text.py): make plan, preflight and the filter print it.
PLAN_ROWS = capacity_text.PLAN_ROWS
plan_table = capacity_text.plan_table
