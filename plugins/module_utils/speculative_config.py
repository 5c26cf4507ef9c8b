"""gpubox_speculative_config: the speculative decoding a box's vLLM runs (vLLM 0.32's --speculative-config).

``parse`` is the fact's checker (state_checks wraps it): the methods gpubox plans, their token count and the n-gram
lookup bounds; a ValueError names the variable and the fix. Imports only value_text (a leaf).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import value_text

# --speculative-config methods gpubox plans (vLLM 0.32.0 vllm/config/speculative.py): n-gram lookup and the model's
# own multi-token-prediction layers need no second model; a draft model or an EAGLE head is a second checkpoint the
# model store does not fetch yet. The deprecated per-model MTP names are "mtp" since 0.32.
SPECULATIVE_METHODS = ("ngram", "mtp")
_SPECULATIVE_SECOND_MODEL = ("draft_model", "eagle", "eagle3", "dflash", "medusa", "mlp_speculator")
_SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


def parse(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        shown = value_text.short(value)
        raise ValueError(f"{name} must be a mapping like {{method: ngram, num_speculative_tokens: 3}}, got {shown}")
    method = value.get("method")
    if method in _SPECULATIVE_SECOND_MODEL:
        raise ValueError(
            f"{name} method {method!r} needs a second model (the draft or head) on the box, which the model store does "
            f"not fetch yet: use one of {', '.join(SPECULATIVE_METHODS)}"
        )
    if method not in SPECULATIVE_METHODS:
        shown = value_text.short(method)
        raise ValueError(f"{name} method must be one of {', '.join(SPECULATIVE_METHODS)}, got {shown}")
    unknown = sorted(str(k) for k in value if k not in _SPECULATIVE_KEYS or (method == "mtp" and "lookup" in str(k)))
    if unknown:
        allowed = ", ".join(_SPECULATIVE_KEYS)
        raise ValueError(f"{name} has keys gpubox does not plan: {', '.join(unknown)}; use {allowed}")
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
    return out
