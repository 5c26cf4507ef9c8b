"""Model catalog for the capacity planner: config.json facts known before a model is downloaded.

Keys are ModelScope ids (what ``gpubox_model_id`` holds). Every entry carries the fields the planner
reads (see capacity_planner.plan) plus ``source``. After download, ``config_mismatches`` compares an
entry with the real config.json so a wrong catalog line cannot go unnoticed. Stdlib only.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks

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
    "layers/heads/kv heads/hidden/head_dim/max pos/weights: shared/docs/facts.md model table; "
    "intermediate_size, vocab_size, torch_dtype: the model's published config.json"
)

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
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "hidden_size": 8192,
        # The AWQ checkpoint pads the MLP from 29568 (bf16 model) to 29696 so it splits into 128-groups.
        "intermediate_size": 29696,
        "vocab_size": 152064,
        "head_dim": 128,
        "torch_dtype": "float16",
        "max_position_embeddings": 32768,
        # facts.md gives "≈ 41.6 GB" for the 4-bit checkpoint; the exact byte count is checked after download.
        "weights_bytes": 41_600_000_000,
        "quantization": "awq_marlin",
        "source": _QWEN25_NOTE + "; weights_bytes approximate (facts.md: about 41.6 GB)",
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
INVENTORY_OPTIONAL = ("head_dim", "quantization", "source")
# The dtypes the capacity planner knows (capacity_planner.DTYPE_BYTES).
_DTYPES = ("bfloat16", "float16", "float32")
_INT_FACTS = tuple(k for k in (*INVENTORY_REQUIRED, "head_dim") if k != "torch_dtype")
# Bounds no real model reaches: keep 10**400 and friends out of the planner's float arithmetic.
_MAX_DIM = 1 << 24
_MAX_WEIGHTS = 1 << 50


class UnknownModelError(KeyError):
    """Raised for a gpubox_model_id that the catalog does not know."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0])


def catalog_model(model_id: str) -> dict[str, Any]:
    """The catalog entry for a ModelScope id (a copy); UnknownModelError names gpubox_model_id."""
    if model_id not in CATALOG:
        known = ", ".join(sorted(CATALOG))
        raise UnknownModelError(
            f"gpubox_model_id {model_id!r} is not in the capacity catalog (plugins/module_utils/"
            f"gpubox_models.py); use one of: {known}, add an entry with its config.json facts, or give "
            "them in the inventory as gpubox_model_config"
        )
    return dict(CATALOG[model_id])


def inventory_model(model_id: str, facts: Any) -> dict[str, Any]:
    """Planner facts from the inventory variable gpubox_model_config (used instead of the catalog).

    ``facts`` needs every key of INVENTORY_REQUIRED (config.json's values plus ``weights_bytes``, the
    total size of the weight files); ``head_dim``, ``quantization`` and ``source`` are optional.
    ValueError names gpubox_model_config and the key to fix.
    """
    name = "gpubox_model_config"
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
        if facts.get(key) is not None and facts[key] > (_MAX_WEIGHTS if key == "weights_bytes" else _MAX_DIM)
    ]
    if huge:
        raise ValueError(
            f"{name}: {', '.join(f'{key}' for key in huge)} is beyond any real model "
            f"(at most {_MAX_DIM} per dimension, {_MAX_WEIGHTS} weight bytes): "
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
    if quantization is not None and quantization not in state_checks.QUANTIZATIONS:
        raise ValueError(
            f"{name}: quantization must be null or a vLLM 0.7.3 method ({', '.join(state_checks.QUANTIZATIONS)}), "
            f"got {quantization!r}"
        )
    if not isinstance(facts["torch_dtype"], str) or facts["torch_dtype"].lower() not in _DTYPES:
        raise ValueError(
            f"{name}: torch_dtype must be one of {', '.join(_DTYPES)}, got {facts['torch_dtype']!r} "
            f"(as in {model_id}'s config.json)"
        )
    model = dict(facts)
    if not model.get("head_dim"):
        model["head_dim"] = model["hidden_size"] // model["num_attention_heads"]
    model.setdefault("quantization", None)
    model["source"] = f"inventory gpubox_model_config for {model_id}" + (
        f" ({facts['source']})" if facts.get("source") else ""
    )
    return model


def expected_model(model_id: str, model_config: Any = None) -> dict[str, Any]:
    """The model facts gpubox plans from: gpubox_model_config when the inventory gives it, else the
    catalog entry. Raises UnknownModelError or ValueError naming the variable to fix."""
    if model_config is not None:
        return inventory_model(model_id, model_config)
    return catalog_model(model_id)


def planned_model(inventory: dict[str, Any]) -> dict[str, Any]:
    """expected_model() with the serving dtype and quantization the inventory asks for."""
    model = expected_model(inventory["gpubox_model_id"], inventory.get("gpubox_model_config"))
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


def model_from_config_json(config: dict[str, Any], weights_bytes: int) -> dict[str, Any]:
    """Planner facts from a downloaded config.json plus the total size of the weight files."""
    if not isinstance(config, dict):
        raise TypeError(f"config.json must be a mapping, got {type(config).__name__}")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    missing = [k for k in CONFIG_FIELDS if k not in text and k != "torch_dtype"]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)}: not a decoder model the planner knows")
    heads = text["num_attention_heads"]
    return {
        "num_hidden_layers": text["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_key_value_heads", heads),
        "hidden_size": text["hidden_size"],
        "intermediate_size": text["intermediate_size"],
        "vocab_size": text["vocab_size"],
        "head_dim": text.get("head_dim") or text["hidden_size"] // heads,
        "torch_dtype": text.get("torch_dtype") or config.get("torch_dtype"),
        "max_position_embeddings": text["max_position_embeddings"],
        "weights_bytes": int(weights_bytes),
        "quantization": _quantization(config),
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
    return problems
