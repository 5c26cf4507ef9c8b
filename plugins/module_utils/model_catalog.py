"""Model catalog for the capacity planner: config.json facts known before a model is downloaded.

Keys are ModelScope ids (what ``gpubox_model_id`` holds). Every entry carries the fields the planner
reads (see capacity_planner.plan) plus ``source``. After download, ``config_mismatches`` compares an
entry with the real config.json so a wrong catalog line cannot go unnoticed. Stdlib only.
"""

from __future__ import annotations

import math
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    capacity_layout,
    capacity_weights,
    catalog_families,
    vllm_words,
)

# Fields that must agree between a catalog entry and the downloaded config.json.
CONFIG_FIELDS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "torch_dtype",
)

_QWEN25_NOTE = (
    "layers/heads/kv heads/hidden/head_dim/max pos/weights: docs/facts.md, Models; "
    "intermediate_size, vocab_size, torch_dtype: the model's published config.json"
)


def quantized_checkpoint_bytes(entry: dict[str, Any], bits: int, group_size: int, tied: bool = False) -> int:
    """Size of a GPTQ/AWQ checkpoint from config.json shapes and its quantization_config.

    Each attention/MLP projection (in x out) stores its weights packed at ``bits`` per weight, and per
    group of ``group_size`` input rows one fp16 scale and one ``bits``-wide zero point per output; the
    embeddings, the lm_head (unless tied), norms and the q/k/v biases stay in fp16.
    """
    hidden, heads = entry["hidden_size"], entry["num_attention_heads"]
    head_dim = entry.get("head_dim") or hidden // heads
    q_out, kv_out = heads * head_dim, 2 * entry["num_key_value_heads"] * head_dim
    inter = entry["intermediate_size"]
    projections = ((hidden, q_out + kv_out), (q_out, hidden), (hidden, 2 * inter), (inter, hidden))
    per_layer = 0.0
    for rows, cols in projections:
        groups = math.ceil(rows / group_size)
        per_layer += rows * cols * bits / 8 + groups * cols * (2 + bits / 8)
    per_layer += 2 * (2 * hidden + q_out + kv_out)  # two norms and the q/k/v biases, fp16
    embeddings = entry["vocab_size"] * hidden * 2 * (1 if tied else 2)
    return int(entry["num_hidden_layers"] * per_layer + embeddings + hidden * 2)


_QWEN25_72B_AWQ_SHAPES = {
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    # The AWQ checkpoint pads the MLP from 29568 (bf16 model) to 29696 so it splits into 128-groups.
    "intermediate_size": 29696,
    "vocab_size": 152064,
    "head_dim": 128,
}

CATALOG: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-7B-Instruct": {
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 32768,
        "weights_bytes": 15_231_233_024,
        "quantization": None,
        "source": _QWEN25_NOTE,
    },
    "Qwen/Qwen2.5-14B-Instruct": {
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "vocab_size": 152064,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 32768,
        "weights_bytes": 29_540_067_328,
        "quantization": None,
        "source": _QWEN25_NOTE,
    },
    "Qwen/Qwen2.5-32B-Instruct": {
        "num_hidden_layers": 64,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "hidden_size": 5120,
        "intermediate_size": 27648,
        "vocab_size": 152064,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 32768,
        "weights_bytes": 65_527_752_704,
        "quantization": None,
        "source": _QWEN25_NOTE,
    },
    "Qwen/Qwen2.5-72B-Instruct-AWQ": {
        **_QWEN25_72B_AWQ_SHAPES,
        "torch_dtype": "float16",
        "max_position_embeddings": 32768,
        # quantization_config of the checkpoint: AWQ, 4 bits, group size 128, zero point (GEMM packing).
        "weights_bytes": quantized_checkpoint_bytes(_QWEN25_72B_AWQ_SHAPES, bits=4, group_size=128),
        "weights_source": (
            "quantization config (AWQ 4-bit, group 128) over config.json shapes: 41.60 GB "
            "(docs/facts.md: about 41.6 GB); the downloaded files' total size replaces it"
        ),
        "quantization": "awq_marlin",
        "source": _QWEN25_NOTE + "; weights_bytes from the quantization config (quantized_checkpoint_bytes)",
    },
    # Qwen3 dense: vLLM added the Qwen3ForCausalLM architecture in 0.8.4, so only a stack whose vLLM is that new or
    # newer serves it (state_checks refuses it on another stack, naming the stack that serves it).
    "Qwen/Qwen3-8B": {
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "vocab_size": 151936,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 40960,
        "weights_bytes": 16_381_470_720,
        "quantization": None,
        "min_vllm": "0.8.4",
        "source": (
            "Qwen/Qwen3-8B config.json (Qwen3ForCausalLM, no QKV bias, q/k norms of head_dim, untied lm_head); "
            "weights_bytes: 8,190,735,360 bf16 parameters counted from those shapes, the total_size of its "
            "model.safetensors.index.json; min_vllm: the vLLM release that added Qwen3ForCausalLM"
        ),
    },
    "LLM-Research/Meta-Llama-3.1-8B-Instruct": {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 131072,
        "weights_bytes": 16_060_522_496,
        "quantization": None,
        "source": (
            "meta-llama/Llama-3.1-8B-Instruct config.json (mirrored on ModelScope as LLM-Research/...); "
            "weights_bytes: total_size of model.safetensors.index.json (8.03e9 bf16 parameters)"
        ),
    },
}


# What an inventory must give for a model the catalog does not carry (gpubox_model_config): the same
# facts as a catalog entry. head_dim may be left out when it is hidden_size / num_attention_heads.
INVENTORY_REQUIRED = (*CONFIG_FIELDS, "weights_bytes")
INVENTORY_OPTIONAL = (
    "head_dim",
    "quantization",
    "source",
    "attention",
    "sliding_window",
    "kv_lora_rank",
    "weights_source",
    "config_json",
)
# gpubox_model_config's other form: the model's published config.json as it is (config_json) and the size of its
# weight files; the planner reads the layers, experts and attention from it (capacity_layout).
CONFIG_JSON_FORM = ("config_json", "weights_bytes", "source", "weights_source")
MOE_KEYS = capacity_layout.MOE_KEYS
moe_keys = capacity_layout.moe_keys


# Why such a model is refused in the facts form, in every message that refuses one.
MOE_NOT_MODELLED = (
    "the planner reads a mixture-of-experts model's experts, shared experts and dense layers from its published "
    "config.json: give it whole as gpubox_model_config's config_json (with weights_bytes)"
)


# Attention layouts (capacity_planner.ATTENTION_KINDS): the planner models "full" and refuses the others.
ATTENTION_KINDS = capacity_layout.ATTENTION_KINDS
# The dtypes the capacity planner knows (capacity_planner.DTYPE_BYTES).
_DTYPES = ("bfloat16", "float16", "float32")
_INT_FACTS = tuple(k for k in (*INVENTORY_REQUIRED, "head_dim", "sliding_window", "kv_lora_rank") if k != "torch_dtype")
# Bounds no real model reaches: keep 10**400 and friends out of the planner's float arithmetic.
MAX_DIM = 1 << 24
MAX_WEIGHTS_BYTES = 1 << 50


class UnknownModelError(KeyError):
    """Raised for a gpubox_model_id that the catalog does not know."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0])


def catalog_model(model_id: str) -> dict[str, Any]:
    """The catalog entry for a ModelScope id (a copy); UnknownModelError names gpubox_model_id."""
    if model_id not in CATALOG:
        known = ", ".join(sorted(CATALOG))
        raise UnknownModelError(
            f"gpubox_model_id {model_id!r} is not in the capacity catalog (CATALOG in plugins/module_utils/"
            f"model_catalog.py); use one of: {known}, add an entry with its config.json facts, or give "
            "them in the inventory as gpubox_model_config"
        )
    return dict(CATALOG[model_id])


def min_vllm(model_id: Any) -> str | None:
    """The oldest vLLM release that serves a catalog model (its ``min_vllm``), or None (every stack's vLLM does)."""
    entry = CATALOG.get(model_id) if isinstance(model_id, str) else None
    return entry.get("min_vllm") if entry else None


def inventory_model(model_id: str, facts: Any, name: str = "gpubox_model_config") -> dict[str, Any]:
    """Planner facts from the inventory variable gpubox_model_config (used instead of the catalog).

    ``facts`` needs every key of INVENTORY_REQUIRED (config.json's values plus ``weights_bytes``, the
    total size of the weight files); ``head_dim``, ``quantization`` and ``source`` are optional.
    ValueError names ``name`` (gpubox_model_config, or the speculative config's draft) and the key to fix.
    """
    if not isinstance(facts, dict):
        raise ValueError(
            f"{name} must be a mapping of {model_id}'s config.json facts ({', '.join(INVENTORY_REQUIRED)}), "
            f"got {type(facts).__name__}"
        )
    odd = [key for key in facts if not isinstance(key, str)]
    if odd:
        raise ValueError(
            f"{name} keys must be config.json names (strings), got {', '.join(repr(k) for k in odd[:3])}: "
            f"use only {', '.join(INVENTORY_REQUIRED + INVENTORY_OPTIONAL)}"
        )
    if "config_json" in facts:
        return _inventory_config_json(name, model_id, facts)
    moe = moe_keys(facts)
    if moe:
        raise ValueError(f"{name}: {model_id} is a mixture-of-experts model ({', '.join(moe)}): {MOE_NOT_MODELLED}")
    missing = [key for key in INVENTORY_REQUIRED if facts.get(key) is None]
    if missing:
        raise ValueError(
            f"{name} lacks {', '.join(missing)}: copy them from {model_id}'s config.json (weights_bytes is "
            "the total size of its weight files)"
        )
    unknown = sorted(set(facts) - set(INVENTORY_REQUIRED) - set(INVENTORY_OPTIONAL))
    if unknown:
        raise ValueError(
            f"{name} has unknown keys {', '.join(unknown)}: use only "
            f"{', '.join(INVENTORY_REQUIRED + INVENTORY_OPTIONAL)}"
        )
    bad = [
        key
        for key in _INT_FACTS
        if facts.get(key) is not None
        and (isinstance(facts[key], bool) or not isinstance(facts[key], int) or facts[key] <= 0)
    ]
    if bad:
        raise ValueError(
            f"{name}: {', '.join(f'{key}={facts[key]!r}' for key in bad)} must be positive integers "
            f"(as in {model_id}'s config.json)"
        )
    huge = [
        key
        for key in _INT_FACTS
        if facts.get(key) is not None and facts[key] > (MAX_WEIGHTS_BYTES if key == "weights_bytes" else MAX_DIM)
    ]
    if huge:
        raise ValueError(
            f"{name}: {', '.join(f'{key}' for key in huge)} is beyond any real model "
            f"(at most {MAX_DIM} per dimension, {MAX_WEIGHTS_BYTES} weight bytes): "
            f"copy the values from {model_id}'s config.json"
        )
    heads, kv_heads, hidden = facts["num_attention_heads"], facts["num_key_value_heads"], facts["hidden_size"]
    if kv_heads > heads or heads % kv_heads:
        raise ValueError(
            f"{name}: num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads}) "
            f"(as in {model_id}'s config.json)"
        )
    if hidden < heads or (facts.get("head_dim") is None and hidden % heads):
        raise ValueError(
            f"{name}: hidden_size ({hidden}) must be a multiple of num_attention_heads ({heads}), or give head_dim "
            f"(as in {model_id}'s config.json)"
        )
    quantization = facts.get("quantization")
    if quantization is not None and quantization not in KNOWN_QUANTIZATIONS:
        raise ValueError(
            f"{name}: quantization must be null or a method of a stack's vLLM (the quant_method of the checkpoint's "
            f"quantization_config, e.g. awq, gptq, fp8, mxfp4; vllm_words.RELEASES lists each release's), got "
            f"{str(quantization)[:40]!r}"
        )
    if not isinstance(facts["torch_dtype"], str) or facts["torch_dtype"].lower() not in _DTYPES:
        raise ValueError(
            f"{name}: torch_dtype must be one of {', '.join(_DTYPES)}, got {facts['torch_dtype']!r} "
            f"(as in {model_id}'s config.json)"
        )
    attention = _inventory_attention(name, model_id, facts)
    model = dict(facts)
    model["attention"] = attention
    if not model.get("head_dim"):
        model["head_dim"] = model["hidden_size"] // model["num_attention_heads"]
    model.setdefault("quantization", None)
    source = facts.get("weights_source")
    if source is not None and not isinstance(source, str):
        raise ValueError(
            f"{name}: weights_source must be text saying where weights_bytes comes from, got {type(source).__name__}"
        )
    model["weights_source"] = (
        source or f"gpubox_model_config weights_bytes ({model['weights_bytes']:,} B of weight files)"
    )
    model["source"] = f"inventory gpubox_model_config for {model_id}" + (
        f" ({facts['source']})" if facts.get("source") else ""
    )
    return model


# Any stack's vLLM's methods: which one the box's stack has is the desired state's and the planner's check.
KNOWN_QUANTIZATIONS = tuple(sorted({m for r in vllm_words.RELEASES.values() for m in r.quantizations}))


def _inventory_config_json(name: str, model_id: str, facts: dict[str, Any]) -> dict[str, Any]:
    """gpubox_model_config in its config.json form: the published config.json and the weight files' size.

    A fact the planner reads from config_json may be given beside it only with the same value (the validated form
    this returns carries them all, so validating it again gives it back); a different one is refused by name."""
    weights = facts.get("weights_bytes")
    if isinstance(weights, bool) or not isinstance(weights, int) or not 0 < weights <= MAX_WEIGHTS_BYTES:
        raise ValueError(
            f"{name}: weights_bytes must be the total size of {model_id}'s weight files in bytes (1 to "
            f"{MAX_WEIGHTS_BYTES:,}), got {str(weights)[:40]!r}"
        )
    for key in ("source", "weights_source"):
        if facts.get(key) is not None and not isinstance(facts[key], str):
            raise ValueError(f"{name}: {key} must be text, got {type(facts[key]).__name__}")
    try:
        model = model_from_config_json(facts["config_json"], weights)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} config_json of {model_id}: {exc}") from None
    unknown = sorted(k for k in set(facts) - set(CONFIG_JSON_FORM) if not isinstance(k, str) or k not in model)
    if unknown:
        raise ValueError(
            f"{name} gives config_json, so its other keys may only be {', '.join(CONFIG_JSON_FORM[1:])}; it has "
            f"{', '.join(map(str, unknown))}: the planner reads every other fact from config_json"
        )
    differ = sorted(k for k in set(facts) - set(CONFIG_JSON_FORM) if facts[k] != model[k])
    if differ:
        raise ValueError(
            f"{name}: {', '.join(f'{k}={facts[k]!r}' for k in differ)} disagree with config_json "
            f"({', '.join(f'{k}={model[k]!r}' for k in differ)}): give the fact once, in config_json"
        )
    model["weights_source"] = facts.get("weights_source") or f"gpubox_model_config weights_bytes ({weights:,} B)"
    source = facts.get("source") or ""
    prefix = f"inventory gpubox_model_config config_json for {model_id}"
    model["source"] = source if source.startswith(prefix) else prefix + (f" ({source})" if source else "")
    return model


def _inventory_attention(name: str, model_id: str, facts: dict[str, Any]) -> str:
    """The attention layout gpubox_model_config states (full when it says nothing about it)."""
    attention = facts.get("attention")
    if attention is not None and attention not in ATTENTION_KINDS:
        raise ValueError(
            f"{name}: attention must be one of {', '.join(ATTENTION_KINDS)}, got {attention!r}: full for "
            f"multi-head/grouped-query attention, mla when {model_id}'s config.json has kv_lora_rank, "
            "sliding_window or mixed when it uses a sliding window on all or some layers"
        )
    if facts.get("kv_lora_rank") is not None and attention not in (None, "mla"):
        raise ValueError(
            f"{name}: kv_lora_rank ({facts['kv_lora_rank']}) means multi-head latent attention, but attention is "
            f"{attention!r}: set attention: mla or drop kv_lora_rank (as in {model_id}'s config.json)"
        )
    if facts.get("sliding_window") is not None and attention is None:
        raise ValueError(
            f"{name}: sliding_window ({facts['sliding_window']}) is given without attention: say attention: "
            "sliding_window (every layer), mixed (some layers), or full when the model does not use it "
            "(e.g. Qwen2's use_sliding_window: false)"
        )
    if attention is None:
        return "mla" if facts.get("kv_lora_rank") is not None else "full"
    return attention


def expected_model(model_id: str, model_config: Any = None, name: str = "gpubox_model_config") -> dict[str, Any]:
    """The model facts gpubox plans from: gpubox_model_config (``name``) when the inventory gives it, else the
    catalog entry. Raises UnknownModelError or ValueError naming the variable to fix."""
    if model_config is not None:
        return inventory_model(model_id, model_config, name)
    return catalog_model(model_id)


def planned_model(inventory: dict[str, Any]) -> dict[str, Any]:
    """expected_model() with the serving dtype and quantization the inventory asks for."""
    model = expected_model(inventory["gpubox_model_id"], inventory.get("gpubox_model_config"))
    model["model_id"] = inventory["gpubox_model_id"]
    if inventory.get("gpubox_model_dtype"):
        model["torch_dtype"] = inventory["gpubox_model_dtype"]
    if "gpubox_model_quantization" in inventory:
        model["quantization"] = inventory["gpubox_model_quantization"]
    return model


def _quantization(config: dict[str, Any]) -> str | None:
    qcfg = config.get("quantization_config")
    if not isinstance(qcfg, dict):
        return None
    method = qcfg.get("quant_method")
    return str(method) if method else None


def attention_of(config: dict[str, Any]) -> str:
    """The attention layout a config.json describes, as vLLM 0.7.3 would run it."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if text.get("kv_lora_rank") is not None:
        return "mla"
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and len(set(map(str, layer_types))) > 1:
        return "mixed"
    if text.get("interleaved_sliding_window") or text.get("sliding_window_pattern"):
        return "mixed"
    if str(text.get("model_type") or config.get("model_type") or "") in ("gemma2", "gemma3", "gemma3_text", "cohere2"):
        return "mixed"
    window = text.get("sliding_window")
    if isinstance(window, list):
        return "mixed"
    if isinstance(window, int) and not isinstance(window, bool) and text.get("use_sliding_window", True) is not False:
        positions = text.get("max_position_embeddings")
        if not isinstance(positions, int) or window < positions:
            return "sliding_window"
    return "full"


def model_from_config_json(config: dict[str, Any], weights_bytes: int) -> dict[str, Any]:
    """Planner facts from a published config.json plus the total size of the weight files.

    The config itself rides along (``config_json``): the planner reads the layers, experts and attention from it
    (capacity_layout.layout, which raises a LayoutError naming the key it cannot read)."""
    if not isinstance(config, dict):
        raise TypeError(f"config.json must be a mapping, got {type(config).__name__}")
    text = capacity_layout.text_config(config)
    try:
        experts = capacity_layout.layout(config).experts
    except capacity_layout.UnmodelledError:  # rides along: the planner refuses it by name or starts it measured
        experts = None
    size_keys = [k for k in CONFIG_FIELDS if k not in ("torch_dtype", "intermediate_size")]
    missing = [k for k in size_keys if k not in text]
    if not text.get("intermediate_size") and not experts:
        missing.append("intermediate_size")
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}: not a decoder model the planner knows")
    heads = text["num_attention_heads"]
    dtype = text.get("torch_dtype") or config.get("torch_dtype") or text.get("dtype") or config.get("dtype")
    return {
        "num_hidden_layers": text["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_key_value_heads", heads),
        "hidden_size": text["hidden_size"],
        # a model whose every MLP is experts (gpt-oss) states only the expert's size
        "intermediate_size": text.get("intermediate_size") or experts.intermediate,
        "vocab_size": text["vocab_size"],
        "head_dim": text.get("head_dim") or text["hidden_size"] // heads,
        "torch_dtype": dtype,
        "max_position_embeddings": text["max_position_embeddings"],
        "weights_bytes": int(weights_bytes),
        "quantization": _quantization(config),
        "attention": attention_of(config),
        "config_json": config,
        "weights_source": "the downloaded checkpoint: total size of its weight files",
        "source": "downloaded config.json",
    }


def config_mismatches(catalog_entry: dict[str, Any], config_json: dict[str, Any]) -> list[str]:
    """One line per planner fact where the downloaded config.json disagrees with the catalog."""
    text = config_json.get("text_config") if isinstance(config_json.get("text_config"), dict) else config_json
    problems = []
    for key in CONFIG_FIELDS:
        expected = catalog_entry.get(key)
        actual = text.get(key, config_json.get(key))
        if key == "num_key_value_heads" and actual is None:
            actual = text.get("num_attention_heads")
        if actual != expected:
            problems.append(
                f"{key}: catalog has {expected!r}, config.json has {actual!r}; fix the catalog entry "
                "in plugins/module_utils/model_catalog.py or check gpubox_model_id/gpubox_model_revision"
            )
    head_dim = catalog_entry.get("head_dim")
    real_head_dim = text.get("head_dim") or text.get("hidden_size", 0) // max(1, text.get("num_attention_heads", 1))
    if head_dim is not None and real_head_dim != head_dim:
        problems.append(f"head_dim: catalog has {head_dim!r}, config.json implies {real_head_dim!r}")
    attention = catalog_entry.get("attention") or "full"
    if attention_of(config_json) != attention:
        problems.append(
            f"attention: catalog has {attention!r}, config.json describes {attention_of(config_json)!r}; the "
            "planner models only full attention: fix the entry or gpubox_model_config"
        )
    return problems


# --------------------------------------------------------------------------- families (the V1 engine plans them)
# Each entry is the published config.json (config_json) read by the same reader as a downloaded one, and the size of
# the checkpoint's weight files: measured where a source gives it, otherwise estimated from the shapes and the
# quantization_config (capacity_weights.estimated_checkpoint_bytes, e.g. 61,063,823,360 B for Qwen3-30B-A3B against
# the 61,064,216,576 B its safetensors headers hold); the downloaded files' total size replaces it on the box.
_FAMILY_MODELS = catalog_families.FAMILY_MODELS


def _family_entry(model_id: str) -> dict[str, Any]:
    config, weights, needed, source = _FAMILY_MODELS[model_id]
    text = capacity_layout.text_config(config)
    found = capacity_layout.layout(config)
    estimated = capacity_weights.estimated_checkpoint_bytes(
        text, found, config.get("quantization_config"), vision=config.get("vision_config")
    )
    entry = model_from_config_json(config, weights or estimated)
    entry["weights_source"] = (
        "the checkpoint's weight files"
        if weights
        else f"estimated from config.json shapes and quantization_config ({estimated:,} B); the downloaded files' "
        "total size replaces it"
    )
    entry["min_vllm"] = needed
    entry["source"] = source
    return entry


CATALOG.update({model_id: _family_entry(model_id) for model_id in _FAMILY_MODELS})
