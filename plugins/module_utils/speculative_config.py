"""gpubox_speculative_config: the speculative decoding a box's vLLM runs (vLLM 0.32's --speculative-config).

``parse`` is the fact's checker (state_checks wraps it, passing its own checkers of a ModelScope id, a revision and
a model's config.json facts for the second checkpoint): the methods gpubox plans, their token count, the n-gram
lookup bounds and, for a method that drafts with a second checkpoint, that checkpoint (``model``, ``revision`` and,
for a model outside the capacity catalog, ``config`` in gpubox_model_config's forms). A ValueError names the
variable and the fix. ``draft_facts`` reads the second checkpoint's config.json facts with the reader of
gpubox_model_config (model_catalog), for the planner and the model store's config check. ``vllm_config`` is what the
unit's --speculative-config carries: the second checkpoint as the model store's published local path, never a hub
id. Imports value_text and model_catalog (neither imports back).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import model_catalog, value_text

# --speculative-config methods gpubox plans (vLLM 0.32.0 vllm/config/speculative.py SpeculativeMethod): n-gram
# lookup and the model's own multi-token-prediction layers need no second model; a draft model (draft_model) or an
# EAGLE head (eagle, eagle3) is a second checkpoint, which the model store fetches, verifies and publishes beside the
# served model. The deprecated per-model MTP names are "mtp" since 0.32.
SPECULATIVE_METHODS = ("ngram", "mtp", "draft_model", "eagle", "eagle3")
DRAFT_METHODS = ("draft_model", "eagle", "eagle3")
# Methods of vLLM 0.32.0 gpubox does not plan: medusa, mlp_speculator and suffix make it fall back to the V1 model
# runner (vllm/config/vllm.py _get_v2_model_runner_unsupported_features), dflash and dspark draft in parallel blocks
# the planner has no model of.
_UNPLANNED = ("dflash", "dspark", "medusa", "mlp_speculator", "suffix", "ngram_gpu", "custom_class")
_KEYS = {
    "ngram": ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"),
    "mtp": ("method", "num_speculative_tokens"),
    **dict.fromkeys(DRAFT_METHODS, ("method", "num_speculative_tokens", "model", "revision", "config")),
}
_EXAMPLE = "{method: eagle3, model: OWNER/NAME, revision: <commit>, num_speculative_tokens: 3}"

# The desired state's checkers of a ModelScope id and a revision: (name, value) -> value, raising ValueError.
Check = Callable[[str, Any], Any]


def parse(name: str, value: Any, ids: tuple[Check, Check] | None = None) -> dict[str, Any]:
    """The checked mapping (the keys as given; parse(parse(x)) is parse(x)). ``ids``: the checkers of
    gpubox_model_id and gpubox_model_revision (state_checks passes its own), applied to the second checkpoint."""
    if not isinstance(value, Mapping):
        shown = value_text.short(value)
        raise ValueError(f"{name} must be a mapping like {{method: ngram, num_speculative_tokens: 3}}, got {shown}")
    method = value.get("method")
    if method in _UNPLANNED:
        raise ValueError(
            f"{name} method {method!r} is not one gpubox plans (its memory or its model runner is not modelled): "
            f"use one of {', '.join(SPECULATIVE_METHODS)}"
        )
    if method not in SPECULATIVE_METHODS:
        shown = value_text.short(method)
        raise ValueError(f"{name} method must be one of {', '.join(SPECULATIVE_METHODS)}, got {shown}")
    unknown = sorted(str(k) for k in value if k not in _KEYS[method])
    if unknown:
        raise ValueError(
            f"{name} has keys gpubox does not plan for method {method}: {', '.join(unknown)}; use "
            f"{', '.join(_KEYS[method])}"
        )
    out: dict[str, Any] = {"method": method}
    for key, low, high, required in (
        ("num_speculative_tokens", 1, 16, True),
        ("prompt_lookup_min", 1, 64, False),
        ("prompt_lookup_max", 1, 64, False),
    ):
        number = value.get(key)
        if number is None and not required:
            continue
        if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
            raise ValueError(f"{name} {key} must be an integer from {low} to {high}, got {value_text.short(number)}")
        out[key] = number
    if out.get("prompt_lookup_min", 1) > out.get("prompt_lookup_max", 64):
        raise ValueError(f"{name} prompt_lookup_min must not exceed prompt_lookup_max")
    if method in DRAFT_METHODS:
        out.update(_second_checkpoint(name, method, value, ids))
    return out


def _second_checkpoint(name: str, method: str, value: Mapping, ids: tuple[Check, Check] | None) -> dict[str, Any]:
    what = "draft model" if method == "draft_model" else "EAGLE head"
    for key, example in (("model", "the ModelScope id OWNER/NAME"), ("revision", "a commit, branch or tag")):
        if value.get(key) is None:
            raise ValueError(
                f"{name} method {method} drafts with a second checkpoint, the {what}: give its {key} ({example}), "
                f"e.g. {_EXAMPLE}"
            )
    config = value.get("config")
    if ids is not None:
        ids[0](f"{name} model", value["model"])
        ids[1](f"{name} revision", value["revision"])
    draft_facts(name, value["model"], config)
    out = {"model": value["model"], "revision": value["revision"]}
    if config is not None:
        out["config"] = config
    return out


def draft_facts(name: str, model_id: Any, config: Any) -> dict[str, Any]:
    """The second checkpoint's config.json facts: its catalog entry, or ``config`` in gpubox_model_config's forms
    (the published config.json whole as config_json plus weights_bytes, or the facts), read by the same reader
    (model_catalog.expected_model). ValueError names ``name`` and the fix."""
    if not isinstance(model_id, str):
        raise ValueError(f"{name} model must be a ModelScope id OWNER/NAME, got {value_text.short(model_id)}")
    if config is None and model_id not in model_catalog.CATALOG:
        raise ValueError(
            f"{name} model {model_id!r} is not in the capacity catalog: give its config.json facts as config, e.g. "
            "config: {config_json: <its config.json>, weights_bytes: <the size of its weight files>}"
        )
    try:
        return model_catalog.expected_model(model_id, config, f"{name} config")
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise ValueError(str(exc)) from None


def is_draft(config: Any) -> bool:
    """Whether a checked gpubox_speculative_config drafts with a second checkpoint the model store publishes."""
    return isinstance(config, Mapping) and config.get("method") in DRAFT_METHODS


def checkpoint_name(config: Any) -> str | None:
    """The directory name the second checkpoint is published under (<root>/<name>), or None without one."""
    if not is_draft(config) or not isinstance(config.get("model"), str) or "/" not in config["model"]:
        return None
    return config["model"].rsplit("/", 1)[1]


def store_problems(values: Mapping[str, Any]) -> list[str]:
    """A second checkpoint the model store cannot publish beside the served model: the served model itself, or
    another model of the same name (both would be <gpubox_model_root>/<name>)."""
    config, model_id = values.get("gpubox_speculative_config"), values.get("gpubox_model_id")
    name = checkpoint_name(config)
    if not name or not isinstance(model_id, str) or "/" not in model_id:
        return []
    if config["model"] == model_id:
        return [
            f"gpubox_speculative_config model {model_id!r} is the served model itself (gpubox_model_id): a draft or "
            "EAGLE head is another checkpoint; use method mtp for the model's own prediction layers"
        ]
    if name == model_id.rsplit("/", 1)[1]:
        return [
            f"gpubox_speculative_config model {config['model']!r} and gpubox_model_id {model_id!r} share the name "
            f"{name!r}: both would be published at <gpubox_model_root>/{name}; serve a draft with another name"
        ]
    return []


def vllm_config(config: Mapping[str, Any], root: str) -> dict[str, Any]:
    """The --speculative-config mapping of a checked config: a second checkpoint is its published local path
    (``<root>/<name>``, the model store's live link), without the hub's revision or the planner's config facts."""
    out = {k: v for k, v in config.items() if k not in ("model", "revision", "config")}
    name = checkpoint_name(config)
    if name:
        out["model"] = f"{root}/{name}"
    return out
