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


# MXFP4 experts (gpt-oss) on GPUs below compute capability 9.0 run vLLM 0.32's Marlin W4A16 kernels, which keep the
# weights packed (4 bits + an e8m0 scale per 32: 0.53125 B per weight) but pad each rank's intermediate size to a
# multiple of 128 and the hidden size to 256 (vllm/model_executor/layers/quantization/mxfp4 and fused_moe
# oracle/mxfp4.py select_mxfp4_moe_backend; the OAI Triton kernels need sm90+). The checkpoint's files hold the
# unpadded experts, so the loaded weights exceed them: gpt-oss-20b's experts take 0.85 GiB more at tp 1.
MXFP4_METHODS = ("mxfp4", "gpt_oss_mxfp4")
MXFP4_BYTES_PER_WEIGHT = 0.5 + 1 / 32
NVFP4_BYTES_PER_WEIGHT = 0.5 + 1 / 16
# GPU names of compute capability 9.0 and newer (Hopper, Blackwell), whose MXFP4 kernels do not pad.
SM90_NAMES = ("H100", "H200", "H20", "H800", "GH200", "B200", "B100", "GB200", "B300", "RTX 50", "RTX PRO 6000")


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def marlin_mxfp4_padding(model: Any, gpu_name: str, tp: int) -> float:
    """Bytes per GPU the Marlin MXFP4 kernels add to a rank's experts (0 on sm90+ GPUs or without experts)."""
    experts = model.layout.experts if model.layout else None
    if not experts or any(name in gpu_name for name in SM90_NAMES):
        return 0.0
    inter = experts.intermediate // tp
    padded = _round_up(model.hidden, 256) * _round_up(inter, 128) - model.hidden * inter
    return 3 * padded * experts.routed * experts.moe_layers * MXFP4_BYTES_PER_WEIGHT


def _quant_bytes(quant: dict[str, Any], dtype_bytes: int) -> tuple[float, float]:
    """(bytes per weight of the quantized projections, of the experts) under a quantization_config."""
    method = str(quant.get("quant_method") or "").lower()
    algo = str(quant.get("quant_algo") or quant.get("format") or "").lower()
    if "nvfp4" in algo or method in ("modelopt_fp4", "nvfp4"):
        return NVFP4_BYTES_PER_WEIGHT, NVFP4_BYTES_PER_WEIGHT  # 4 bits and an fp8 scale per 16
    if method == "compressed-tensors":
        groups = [g for g in (quant.get("config_groups") or {}).values() if isinstance(g, dict)]
        weights = groups[0].get("weights") if groups and isinstance(groups[0].get("weights"), dict) else {}
        bits, group = int(weights.get("num_bits") or 8), int(weights.get("group_size") or 0)
        per = bits / 8 + (2 / group if group else 0)
        return per, per
    if method in ("modelopt", "fbgemm_fp8") or algo == "fp8":
        return 1.0, 1.0
    if method in MXFP4_METHODS:
        return float(dtype_bytes), MXFP4_BYTES_PER_WEIGHT  # only the experts are MXFP4
    if method in ("gptq", "awq", "awq_marlin", "gptq_marlin"):
        bits, group = int(quant.get("bits") or 4), int(quant.get("group_size") or 128)
        per = bits / 8 + (2 + bits / 8) / max(group, 1)  # packed weights, an fp16 scale and a zero per group
        return per, per
    if method == "fp8":
        block = quant.get("weight_block_size") or [128, 128]
        per = 1 + 4 / (int(block[0]) * int(block[1]))  # e4m3 weights and an fp32 scale per block
        return per, per
    if method:
        raise ValueError(f"quantization_config quant_method {method!r}: the shape estimate does not size it")
    return float(dtype_bytes), float(dtype_bytes)


def estimated_checkpoint_bytes(text: dict[str, Any], layout: Any, quant: Any, dtype_bytes: int = 2) -> int:
    """The size of a checkpoint's weight files from its config.json shapes and quantization_config: a catalog
    figure before download (model_catalog; the downloaded files' total size replaces it on the box).

    Attention projections on attention layers, the recurrent layers' input and output projections, the dense MLP
    or every routed and shared expert, the routers, and the embeddings and lm_head (untied unless
    tie_word_embeddings) in the model's dtype; the quantized projections at the method's bytes per weight."""
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    head_dim = text.get("head_dim") or hidden // heads
    q_out, kv_out = heads * head_dim, 2 * text.get("num_key_value_heads", heads) * head_dim
    linear_bytes, expert_bytes = _quant_bytes(quant if isinstance(quant, dict) else {}, dtype_bytes)
    attention = hidden * (q_out + kv_out) + q_out * hidden
    rec = layout.recurrent
    if rec is None:
        recurrent = 0
    elif rec.kind == "gdn":
        qkvz = 2 * rec.k_heads * rec.k_dim + 2 * rec.heads * rec.v_dim
        recurrent = hidden * (qkvz + 2 * rec.heads) + rec.heads * rec.v_dim * hidden
    else:
        recurrent = hidden * (2 * rec.inner + 2 * rec.groups * rec.state + rec.heads) + rec.inner * hidden
    total = 0.0
    for kind in layout.kinds:
        total += (recurrent if kind == "linear" else attention) * linear_bytes
    experts = layout.experts
    dense_layers = len(layout.kinds) - (experts.moe_layers if experts else 0)
    total += dense_layers * 3 * hidden * text.get("intermediate_size", 0) * linear_bytes
    if experts:
        total += experts.moe_layers * 3 * hidden * experts.routed * experts.intermediate * expert_bytes
        total += experts.moe_layers * (3 * hidden * experts.shared * linear_bytes + experts.routed * hidden * 2)
    tied = text.get("tie_word_embeddings") is True
    total += text["vocab_size"] * hidden * dtype_bytes * (1 if tied else 2)
    return int(total)
