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


def vision_params(vision: Any, text_hidden: int) -> int:
    """Parameters of a multimodal checkpoint's vision tower from its ``vision_config`` (0 without one): ``depth``
    (or ``num_hidden_layers``) ViT blocks of qkv, output and two MLP projections (4 h^2 + 2 h i), the patch
    embedding (in_channels x temporal_patch_size x patch^2 x h), the position table (``num_position_embeddings``,
    else (image_size / patch)^2 rows) and the projection into the language model: Qwen3-VL's merger over
    spatial_merge_size^2 patches ((h m^2)^2 + h m^2 x out_hidden_size), else one h x text-hidden matrix (Gemma 3's
    mm_input_projection). Biases and norms are left out (under 0.1 %)."""
    if not isinstance(vision, dict):
        return 0
    ints = {k: v for k, v in vision.items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    h, i = ints.get("hidden_size", 0), ints.get("intermediate_size", 0)
    depth = ints.get("depth") or ints.get("num_hidden_layers", 0)
    if not (h and i and depth):
        return 0
    patch = ints.get("patch_size", 14)
    patch_embed = ints.get("in_channels", 3) * ints.get("temporal_patch_size", 1) * patch * patch * h
    positions = ints.get("num_position_embeddings") or (ints.get("image_size", 0) // patch) ** 2
    merge = ints.get("spatial_merge_size")
    if merge:
        merged = h * merge * merge
        projection = merged * merged + merged * ints.get("out_hidden_size", text_hidden)
    else:
        projection = h * text_hidden
    return depth * (4 * h * h + 2 * h * i) + patch_embed + positions * h + projection


def estimated_checkpoint_bytes(
    text: dict[str, Any], layout: Any, quant: Any, dtype_bytes: int = 2, vision: Any = None
) -> int:
    """The size of a checkpoint's weight files from its config.json shapes and quantization_config: a catalog
    figure before download (model_catalog; the downloaded files' total size replaces it on the box).

    Attention projections on attention layers (the query projection doubled where ``attn_output_gate`` adds the
    output gate, Qwen3.5/Qwen3-Next), the recurrent layers' input and output projections, the dense MLP or every
    routed and shared expert, the routers, the multi-token-prediction layers the checkpoint ships (an attention
    layer, the model's MLP and the 2h x h input projection each, Layout.mtp), and the embeddings and lm_head
    (untied unless tie_word_embeddings) in the model's dtype; the quantized projections at the method's bytes per
    weight; the vision tower (``vision``, the top-level vision_config: vision_params) in the model's dtype, as
    quantized checkpoints leave it (ModelOpt's and compressed-tensors' ignore lists name it)."""
    hidden, heads = text["hidden_size"], text["num_attention_heads"]
    head_dim = text.get("head_dim") or hidden // heads
    q_out, kv_out = heads * head_dim, 2 * text.get("num_key_value_heads", heads) * head_dim
    linear_bytes, expert_bytes = _quant_bytes(quant if isinstance(quant, dict) else {}, dtype_bytes)
    gate = q_out if text.get("attn_output_gate") is True else 0
    attention = hidden * (q_out + gate + kv_out) + q_out * hidden
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
    dense_mlp = 3 * hidden * text.get("intermediate_size", 0) * linear_bytes
    moe_mlp = 0.0
    if experts:
        moe_mlp = 3 * hidden * experts.routed * experts.intermediate * expert_bytes
        moe_mlp += 3 * hidden * experts.shared * linear_bytes + experts.routed * hidden * 2
    dense_layers = len(layout.kinds) - (experts.moe_layers if experts else 0)
    total += dense_layers * dense_mlp + (experts.moe_layers if experts else 0) * moe_mlp
    mtp = getattr(layout, "mtp", 0)
    total += mtp * ((attention + 2 * hidden * hidden) * linear_bytes + (moe_mlp if experts else dense_mlp))
    tied = text.get("tie_word_embeddings") is True
    total += text["vocab_size"] * hidden * dtype_bytes * (1 if tied else 2)
    total += vision_params(vision, hidden) * dtype_bytes
    return int(total)
