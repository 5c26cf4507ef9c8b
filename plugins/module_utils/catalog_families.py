"""The catalog's models of the V1 families (mixture-of-experts, sliding-window, hybrid): their published config.json,
the size of their weight files when a source gives it, the oldest vLLM that serves them and the sources. Data only;
model_catalog reads each config.json with the same reader as a downloaded one (its CATALOG holds the result).
"""

from __future__ import annotations

from typing import Any

_QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "sliding_window": None,
    "use_sliding_window": False,
    "rope_theta": 1000000.0,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
_GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "sliding_window": 128,
    "max_position_embeddings": 131072,
    "vocab_size": 201088,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    },
}
FAMILY_MODELS: dict[str, tuple[dict[str, Any], int | None, str, str]] = {
    # id: (config.json, weights bytes or None to estimate, the oldest vLLM that serves it, sources)
    "Qwen/Qwen3-30B-A3B": (
        _QWEN3_30B_A3B,
        61_064_216_576,
        "0.8.4",
        "Qwen/Qwen3-30B-A3B config.json (Qwen3MoeForCausalLM); weights: the bytes its safetensors headers hold "
        "(flytomelight.github.io/llm-cal, Qwen3-30B-A3B); min_vllm: the release that added Qwen3 and Qwen3-MoE",
    ),
    "Qwen/Qwen3-30B-A3B-GPTQ-Int4": (
        {**_QWEN3_30B_A3B, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}},
        None,
        "0.8.4",
        "Qwen/Qwen3-30B-A3B's shapes; quantization_config as Qwen's GPTQ-Int4 checkpoints state it (4 bits, group "
        "128; a public note gives about 16 GB of files); weights estimated from the shapes",
    ),
    "openai-mirror/gpt-oss-20b": (
        _GPT_OSS_20B,
        None,
        "0.10.1",
        "ModelScope's mirror of openai/gpt-oss-20b, its config.json (GptOssForCausalLM, MXFP4 experts, sliding "
        "window 128 on every other layer); weights estimated from the shapes (12.80 GiB; OpenAI's model card: a "
        "12.8 GiB checkpoint); min_vllm: the release that added gpt-oss",
    ),
    "openai-mirror/gpt-oss-120b": (
        {
            **_GPT_OSS_20B,
            "num_hidden_layers": 36,
            "num_local_experts": 128,
            "layer_types": ["sliding_attention", "full_attention"] * 18,
        },
        None,
        "0.10.1",
        "ModelScope's mirror of openai/gpt-oss-120b: gpt-oss-20b's config with 36 layers and 128 experts (OpenAI's "
        "model card); weights estimated from the shapes",
    ),
    "google/gemma-2-9b-it": (
        {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "hidden_size": 3584,
            "intermediate_size": 14336,
            "num_hidden_layers": 42,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 256,
            "query_pre_attn_scalar": 256,
            "sliding_window": 4096,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "max_position_embeddings": 8192,
            "vocab_size": 256000,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        None,
        "0.5.1",
        "google/gemma-2-9b-it config.json as its verbatim copies publish it (huggingface.co/hfhugs/gemma-2-9b-it); "
        "Gemma 2 alternates a 4096-token window and global attention layer by layer (vLLM's gemma2.py); weights "
        "estimated from the shapes",
    ),
    "google/gemma-3-27b-it": (
        {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "text_config": {
                "model_type": "gemma3_text",
                "hidden_size": 5376,
                "intermediate_size": 21504,
                "num_hidden_layers": 62,
                "num_attention_heads": 32,
                "num_key_value_heads": 16,
                "head_dim": 128,
                "query_pre_attn_scalar": 168,
                "sliding_window": 1024,
                "sliding_window_pattern": 6,
                "max_position_embeddings": 131072,
                "vocab_size": 262208,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            },
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        None,
        "0.8.0",
        "google/gemma-3-27b-it text_config (NVIDIA/TensorRT-LLM's test copy; 62 layers, 5 local : 1 global, a "
        "1024-token window); weights estimated from the language model's shapes (the vision tower's ~0.4B "
        "parameters are not counted)",
    ),
    "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8": (
        {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "hidden_size": 2048,
            "intermediate_size": 5120,
            "num_hidden_layers": 48,
            "full_attention_interval": 4,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "num_experts": 512,
            "num_experts_per_tok": 10,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "max_position_embeddings": 262144,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
        },
        None,
        "0.10.2",
        "Qwen3-Next-80B-A3B shapes from a same-architecture copy (QuantTrio/Qwen3-Coder-Next) and vLLM's "
        "Qwen3NextConfig defaults; block FP8 as Qwen's FP8 checkpoints state it; weights estimated from the shapes "
        "(vLLM's recipe: 96 GB of GPU memory at fp8)",
    ),
    "ibm-granite/granite-4.0-h-small": (
        {
            "architectures": ["GraniteMoeHybridForCausalLM"],
            "model_type": "granitemoehybrid",
            "hidden_size": 4096,
            "intermediate_size": 768,
            "num_hidden_layers": 40,
            "layer_types": (["mamba"] * 9 + ["attention"]) * 4,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 72,
            "num_experts_per_tok": 10,
            "shared_intermediate_size": 1536,
            "mamba_n_heads": 128,
            "mamba_d_head": 64,
            "mamba_n_groups": 1,
            "mamba_d_state": 128,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "max_position_embeddings": 131072,
            "vocab_size": 100352,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
        },
        None,
        "0.10.2",
        "ibm-granite/granite-4.0-h-small config.json keys as IBM/opal-sim's roofline wiki reads them (36 Mamba2 and 4 "
        "attention layers; the attention positions are every tenth layer here); weights estimated from the shapes "
        "(opal-sim: 32.19B parameters)",
    ),
}
