#!/usr/bin/env python3
"""Write a tiny, deterministic Qwen2 model directory for tests (or, with --arch, a tiny model of another family).

The model is real in shape and format (a vLLM CPU build can load and serve it) but its weights are
random: it exists to exercise download, verification and serving paths, not to say anything.

    python make_tiny_model.py OUT_DIR [--seed N] [--arch qwen2|qwen3_moe|gemma3]

``qwen3_moe`` is a mixture-of-experts model (Qwen3MoeForCausalLM: 4 experts, 2 per token, q/k norms) and
``gemma3`` an interleaved sliding-window one (Gemma3ForCausalLM, layer_types sliding then full, a 16-token
window): the planner's families, served by vLLM's real CPU engine in molecule/serving (day two, step 7).
The default, qwen2, is the model every scenario serves; its bytes do not depend on the other architectures.

Shape: 2 layers, hidden 256, 4 attention heads, 2 KV heads, head_dim 64, intermediate 512, a
byte-level BPE tokenizer of about 512 tokens with a ChatML chat template. Weights are BF16 in a
single model.safetensors. Every run with the same package versions writes the same bytes: the
weights come from numpy's legacy RandomState (its stream is frozen by numpy's policy), the
safetensors file is laid out here in a fixed order, and JSON is written with sorted keys.

Requires: numpy, tokenizers (tested with numpy 2.4.6, tokenizers 0.23.3).
"""

from __future__ import annotations

import argparse
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SEED = 20261130
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A fixed training text; its only job is to give the BPE trainer enough distinct pairs to fill the vocab.
CORPUS = [
    "The quick brown fox jumps over the lazy dog while the tiny model answers every question.",
    "A GPU box serves a language model; the operator checks the endpoint, the weights and the logs.",
    "hello world, this is a tiny model used only for testing the download and serving path.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and symbols: + - * / = ( ) [ ] { } < > ! ? ; :",
    "system user assistant tool function message content role name arguments result error",
    "Download the weights, verify every checksum, publish the directory, then start the service.",
    "Tensor parallel size two splits attention heads across both cards; memory planning comes first.",
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June",
    "configuration tokenizer generation safetensors revision manifest staging publish rollback resume",
]


@dataclass(frozen=True)
class TinyShape:
    vocab_target: int = 512
    hidden: int = 256
    intermediate: int = 512
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    max_positions: int = 2048
    arch: str = "qwen2"
    experts: int = 4
    experts_per_token: int = 2
    expert_intermediate: int = 128
    sliding_window: int = 16


ARCHES = ("qwen2", "qwen3_moe", "gemma3")


def build_tokenizer(shape: TinyShape) -> Tokenizer:
    """Train a byte-level BPE tokenizer on the fixed corpus."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_target,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def bf16_bytes(values: np.ndarray) -> bytes:
    """Round float32 values to BF16 (round to nearest even) and return little-endian bytes."""
    bits = values.astype("<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def tensor_shapes(shape: TinyShape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of the architecture, in a fixed order (embeddings tied: no lm_head)."""
    if shape.arch != "qwen2":
        return _family_shapes(shape, vocab)
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.q_proj.bias", (q,)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (shape.intermediate, h)),
            (p + "mlp.up_proj.weight", (shape.intermediate, h)),
            (p + "mlp.down_proj.weight", (h, shape.intermediate)),
        ]
    out.append(("model.norm.weight", (h,)))
    return out


def _family_shapes(shape: TinyShape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Qwen3-MoE (q/k norms, no qkv bias, a router and experts) or Gemma 3 (q/k norms, four norms a layer)."""
    h, q, kv, d = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        norms = ["input_layernorm", "post_attention_layernorm"]
        if shape.arch == "gemma3":
            norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
        out += [(p + name + ".weight", (h,)) for name in norms]
        out += [
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "self_attn.q_norm.weight", (d,)),
            (p + "self_attn.k_norm.weight", (d,)),
        ]
        if shape.arch == "qwen3_moe":
            out.append((p + "mlp.gate.weight", (shape.experts, h)))
            for e in range(shape.experts):
                x = f"{p}mlp.experts.{e}."
                inter = shape.expert_intermediate
                out += [(x + "gate_proj.weight", (inter, h)), (x + "up_proj.weight", (inter, h))]
                out.append((x + "down_proj.weight", (h, inter)))
        else:
            out += [
                (p + "mlp.gate_proj.weight", (shape.intermediate, h)),
                (p + "mlp.up_proj.weight", (shape.intermediate, h)),
                (p + "mlp.down_proj.weight", (h, shape.intermediate)),
            ]
    out.append(("model.norm.weight", (h,)))
    return out


def build_safetensors(shape: TinyShape, vocab: int, seed: int = SEED) -> bytes:
    """Serialise random BF16 weights in the safetensors layout (u64 header size, JSON header, data)."""
    rng = np.random.RandomState(seed)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, dims in tensor_shapes(shape, vocab):
        if name.endswith("norm.weight"):
            # Gemma's RMSNorm scales by (1 + weight): zeros there are Qwen's ones
            values = np.zeros(dims, dtype=np.float32) if shape.arch == "gemma3" else np.ones(dims, dtype=np.float32)
        else:
            values = (rng.standard_normal(dims) * 0.02).astype(np.float32)
        blob = bf16_bytes(values)
        header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data section 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def model_config(shape: TinyShape, vocab: int, eos_id: int) -> dict[str, object]:
    if shape.arch != "qwen2":
        return _family_config(shape, vocab, eos_id)
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "hidden_size": shape.hidden,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate,
        "max_position_embeddings": shape.max_positions,
        "max_window_layers": shape.layers,
        "model_type": "qwen2",
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


def _family_config(shape: TinyShape, vocab: int, eos_id: int) -> dict[str, object]:
    common: dict[str, object] = {
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "head_dim": shape.head_dim,
        "hidden_size": shape.hidden,
        "initializer_range": 0.02,
        "intermediate_size": shape.intermediate,
        "max_position_embeddings": shape.max_positions,
        "num_attention_heads": shape.heads,
        "num_hidden_layers": shape.layers,
        "num_key_value_heads": shape.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": vocab,
    }
    if shape.arch == "qwen3_moe":
        return {
            **common,
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_act": "silu",
            "attention_bias": False,
            "num_experts": shape.experts,
            "num_experts_per_tok": shape.experts_per_token,
            "moe_intermediate_size": shape.expert_intermediate,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "sliding_window": None,
            "use_sliding_window": False,
        }
    return {
        **common,
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "query_pre_attn_scalar": shape.head_dim,
        "sliding_window": shape.sliding_window,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(shape.layers)],
        "rope_local_base_freq": 10000.0,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
    }


def tokenizer_config(tok: Tokenizer) -> dict[str, object]:
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in SPECIAL_TOKENS
    }
    return {
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "model_max_length": 2048,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_tiny_model(out_dir: Path, shape: TinyShape | None = None, seed: int = SEED) -> list[Path]:
    """Write the model into out_dir (created if missing) and return the files written."""
    shape = shape or TinyShape()
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(shape)
    vocab = tok.get_vocab_size()
    eos_id = tok.token_to_id("<|im_end|>")
    files = {
        "config.json": model_config(shape, vocab, eos_id),
        "generation_config.json": {"bos_token_id": eos_id, "eos_token_id": eos_id, "max_new_tokens": 64},
        "tokenizer_config.json": tokenizer_config(tok),
        "special_tokens_map.json": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    }
    written = []
    for name, data in files.items():
        write_json(out_dir / name, data)
        written.append(out_dir / name)
    tok_path = out_dir / "tokenizer.json"
    tok_path.write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    weights = out_dir / "model.safetensors"
    weights.write_bytes(build_safetensors(shape, vocab, seed))
    return [*written, tok_path, weights]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=SEED, help="weights seed; another seed = another version")
    parser.add_argument("--arch", choices=ARCHES, default="qwen2", help="the architecture (a family of the planner)")
    args = parser.parse_args(argv)
    for path in make_tiny_model(args.out_dir, TinyShape(arch=args.arch), seed=args.seed):
        print(f"{path.stat().st_size:>10}  {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
