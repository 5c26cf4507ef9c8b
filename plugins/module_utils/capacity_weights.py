"""The weights the capacity planner loads per checkpoint (stdlib only; capacity_planner's docstring explains).

``linear_params`` counts the projections quantization methods quantize (the experts of an expert layout included);
``checkpoint_weights`` turns a checkpoint's file size into the bytes vLLM loads, refusing a "pre-quantized" method
over a checkpoint as large as its unquantized projections.
"""

from __future__ import annotations

from typing import Any

BNB_4BIT_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)  # nf4 + uint8 absmax per 64 + fp32 per 256 blocks
DEQUANTIZING_METHODS = ("bitsandbytes", "gguf")
PREQUANTIZED_METHODS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "gptq_marlin_24", "marlin", "gguf", "aqlm")


def linear_params(model: Any) -> int:
    """Parameters of the attention and MLP projections (the layers quantization methods quantize)."""
    q_out = model.heads * model.head_dim
    kv_out = 2 * model.kv_heads * model.head_dim
    per_layer = model.hidden * (q_out + kv_out) + q_out * model.hidden + 3 * model.hidden * model.intermediate
    experts = model.layout.experts if model.layout else None
    if not experts:
        return model.layers * per_layer
    # expert layers: every routed expert's gate, up and down projections, and the shared experts'
    expert_mlp = 3 * model.hidden * (experts.routed * experts.intermediate + experts.shared)
    dense_mlp = 3 * model.hidden * model.intermediate
    return model.layers * per_layer + experts.moe_layers * (expert_mlp - dense_mlp)


def checkpoint_weights(model: Any, source: Any, errors: list[str], var: Any) -> tuple[int | None, str]:
    """The bytes vLLM loads, and where the figure comes from (see the module docstring)."""
    stated = source if isinstance(source, str) and source else "weights_bytes: the checkpoint's weight files"
    method = model.quantization
    unquantized_linear = linear_params(model) * model.dtype_bytes
    if method == "bitsandbytes" and model.weights_bytes >= unquantized_linear:
        loaded = model.weights_bytes - linear_params(model) * (model.dtype_bytes - BNB_4BIT_BYTES_PER_PARAM)
        return int(loaded), (
            f"bitsandbytes in-flight 4-bit: linear layers of the {model.weights_bytes:,} B checkpoint at "
            f"{BNB_4BIT_BYTES_PER_PARAM * 8:.3f} bits per weight, the rest as stored"
        )
    if method in PREQUANTIZED_METHODS and model.weights_bytes >= unquantized_linear:
        errors.append(
            f"{var('model.quantization')} is {method} but the model's weights_bytes ({model.weights_bytes:,}) "
            f"is as large as its unquantized linear layers ({unquantized_linear:,} B): {method} needs a "
            "pre-quantized checkpoint; give the total size of its weight files as weights_bytes in "
            "gpubox_model_config (or pick the quantized model id)"
        )
        return None, stated
    return model.weights_bytes, stated
