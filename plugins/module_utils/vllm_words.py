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
