"""What a model's published config.json says about its layers, for the capacity planner (stdlib only).

One reader of a config.json's architecture keys, used by preflight (the downloaded config.json), ``make plan`` and
the catalog (gpubox_model_config's ``config_json``): ``layout()`` returns a ``Layout`` or raises ``LayoutError``
naming the key and the fix. It knows, by the keys the families publish:

* **attention per layer**: ``layer_types`` (gpt-oss, Gemma 3 and recent configs: full_attention,
  sliding_attention, linear_attention, mamba, attention), ``sliding_window_pattern`` (Gemma 3: every Nth layer is
  global), Gemma 2's alternation (even layers slide, vLLM's gemma2.py), ``full_attention_interval`` (Qwen3-Next:
  every Nth layer is full, the rest Gated DeltaNet), and one ``sliding_window`` on every layer (Mistral);
  ``use_sliding_window: false`` (Qwen2) means none. ``attention_sinks`` (gpt-oss) are per-head learned logits:
  weights, not KV.
* **experts**: ``num_experts``/``num_local_experts``/``n_routed_experts``, ``num_experts_per_tok``/
  ``experts_per_token``, the expert's ``moe_intermediate_size`` (``intermediate_size`` where the model has no
  other: Mixtral, gpt-oss), shared experts (``shared_expert_intermediate_size``; ``n_shared_experts`` x the expert
  size), dense layers (``first_k_dense_replace``, ``mlp_only_layers``, ``decoder_sparse_step``).
* **recurrent state** of linear-attention/Mamba layers: Gated DeltaNet (``linear_*`` keys) and Mamba2
  (``mamba_*`` keys); their per-sequence state sizes are capacity_v1's.

What it does not know is refused by name: multi-head latent attention (``kv_lora_rank``), chunked local attention
(``attention_chunk_size``, Llama 4), a ``hybrid_override_pattern`` (Nemotron-H), and any layer type it has no
model of.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks, value_text, vllm_words

FULL, SLIDING, LINEAR = "full", "sliding", "linear"
# layer_types spellings -> the planner's kinds
LAYER_TYPES = {
    "full_attention": FULL,
    "attention": FULL,
    "global": FULL,
    "sliding_attention": SLIDING,
    "sliding_window": SLIDING,
    "local": SLIDING,
    "linear_attention": LINEAR,
    "mamba": LINEAR,
    "mamba2": LINEAR,
}
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")
MAX_DIM = 1 << 24
FAMILIES = ("dense", "moe", "sliding", "hybrid")
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")  # DeepSeek/GLM's, Qwen3-Next/Qwen3.5's
# vLLM 0.32 keeps a recurrent layer's temporal (SSM) state in the model's dtype (mamba_ssm_cache_dtype "auto",
# vllm/model_executor/layers/mamba/mamba_utils.py _mamba_state_dtype) except where a model's config hook sets it:
# the Qwen3.5 architectures take their text config's mamba_ssm_dtype (vllm/model_executor/models/config.py
# Qwen3_5ForConditionalGenerationConfig, mapped to these names in its MODELS_CONFIG_MAP); Qwen3.6/3.8 publish
# "float32", which doubles the state page and so the attention block size beside it.
SSM_DTYPE_ARCHITECTURES = (
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
)
SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# gpubox_model_config's attention word in the facts form (without config_json): only "full" is planned from facts.
ATTENTION_KINDS = ("full", "mla", "sliding_window", "mixed")
# config.json keys that mean a mixture-of-experts model (Mixtral: num_local_experts; Qwen-MoE: num_experts,
# moe_intermediate_size; DeepSeek: n_routed_experts; all of them num_experts_per_tok).
MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok")


def moe_keys(config: dict[str, Any]) -> list[str]:
    """The mixture-of-experts keys a config (or gpubox_model_config) sets; a dense model's 0 or null is none."""
    return [k for k in MOE_KEYS if config.get(k) is not None and config.get(k) != 0]


class LayoutError(ValueError):
    """A config.json the planner cannot read; the message names the key and the fix."""


class UnmodelledError(LayoutError):
    """A well-formed config.json of an architecture the planner has no model of (MLA, chunked local attention,
    Nemotron-H, an unknown layer type or recurrent layer): capacity_measured may start it unplanned."""


@dataclass(frozen=True)
class Experts:
    """The mixture-of-experts MLP: ``routed`` experts per MoE layer, ``active`` per token, each of ``intermediate``;
    ``shared`` the shared experts' total intermediate size (0 when none); ``moe_layers`` of the model's layers have
    the experts, the others a dense MLP of intermediate_size."""

    routed: int
    active: int
    intermediate: int
    shared: int
    moe_layers: int


@dataclass(frozen=True)
class Recurrent:
    """One linear-attention/Mamba layer's shape. ``kind``: "gdn" (Gated DeltaNet: ``heads`` value heads,
    ``k_heads`` key heads of ``k_dim``, value heads of ``v_dim``) or "mamba2" (``heads`` heads of ``v_dim``,
    ``groups`` groups, ``state`` the SSM state size, ``inner`` = expand x hidden); ``conv`` the conv kernel;
    ``ssm_bytes`` the temporal (SSM) state's bytes per element, 0 for the model's dtype
    (SSM_DTYPE_ARCHITECTURES)."""

    kind: str
    heads: int
    k_heads: int
    k_dim: int
    v_dim: int
    groups: int
    state: int
    inner: int
    conv: int
    ssm_bytes: int = 0


@dataclass(frozen=True)
class Layout:
    """The layers of a model as the planner sizes them. ``kinds``: one of FULL/SLIDING/LINEAR per layer;
    ``window``: the sliding layers' window in tokens (0 without); ``sinks``: attention sinks (gpt-oss)."""

    kinds: tuple[str, ...]
    window: int
    experts: Experts | None
    recurrent: Recurrent | None
    sinks: bool
    mtp: int = 0  # multi-token-prediction layers (num_nextn_predict_layers / mtp_num_hidden_layers), for MTP drafts

    def count(self, kind: str) -> int:
        return self.kinds.count(kind)

    @property
    def family(self) -> str:
        """The family as the stacks name it: "hybrid" (recurrent layers), "sliding", "moe" or "dense"; a model of
        several families is named by all of them (``families``)."""
        return "+".join(self.families)

    @property
    def families(self) -> tuple[str, ...]:
        found = []
        if self.experts:
            found.append("moe")
        if self.count(SLIDING):
            found.append("sliding")
        if self.count(LINEAR):
            found.append("hybrid")
        return tuple(found) or ("dense",)


def describe(layout: Layout | None, layers: int, tp: int) -> str:
    """One line of what the planner read of a model's layers, as ``make plan`` and preflight print it: the
    attention kinds with the window, the recurrent layers, the experts resident on each GPU under tensor parallel
    (vLLM keeps every expert on every rank, each 1/tp of its width), shared experts and attention sinks."""
    if layout is None:
        return f"{layers} layers (full attention), dense MLP"
    names = {FULL: "full attention", SLIDING: f"sliding ({layout.window} tokens)", LINEAR: "linear/Mamba"}
    kinds = ", ".join(f"{layout.count(kind)} {names[kind]}" for kind in (FULL, SLIDING, LINEAR) if layout.count(kind))
    parts = [f"{len(layout.kinds)} layers ({kinds})"]
    if layout.recurrent is not None:
        parts.append(f"recurrent state: {layout.recurrent.kind}")
    if layout.sinks:
        parts.append("attention sinks")
    experts = layout.experts
    if experts is not None:
        width = f", each 1/{tp} of its width" if tp > 1 else ""
        line = (
            f"experts: {experts.routed} routed, {experts.intermediate} wide ({experts.active} a token) in "
            f"{experts.moe_layers} of {len(layout.kinds)} layers, all {experts.routed} resident on each GPU{width}"
        )
        if experts.shared:
            line += f", shared experts of {experts.shared} in all"
        parts.append(line)
    return "; ".join(parts)


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config.json (``text_config`` of multimodal configs such as Gemma 3)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def _int(config: dict[str, Any], key: str, fix: str, minimum: int = 1) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_DIM:
        raise LayoutError(f"config.json {key} must be an integer from {minimum} to {MAX_DIM:,}, got {value!r}: {fix}")
    return value


def _first(config: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    return next((key for key in keys if config.get(key) not in (None, 0, False)), None)


def _kinds(config: dict[str, Any], layers: int) -> tuple[str, ...]:
    fix = "copy it from the model's published config.json"
    types = config.get("layer_types") or config.get("layers_block_type")
    if types is not None:
        key = "layer_types" if config.get("layer_types") is not None else "layers_block_type"
        if not isinstance(types, list) or len(types) != layers:
            raise LayoutError(
                f"config.json {key} must list one type per layer ({layers} = num_hidden_layers), got "
                f"{len(types) if isinstance(types, list) else type(types).__name__}: {fix}"
            )
        unknown = sorted({str(t) for t in types if str(t) not in LAYER_TYPES})
        if unknown:
            raise UnmodelledError(
                f"config.json {key} has layer types the planner does not model ({', '.join(unknown)}): it knows "
                f"{', '.join(sorted(LAYER_TYPES))}"
            )
        kinds = tuple(LAYER_TYPES[str(t)] for t in types)
        if SLIDING in kinds and not config.get("sliding_window"):
            raise LayoutError(f"config.json {key} has sliding layers but no sliding_window: {fix}")
        return kinds
    if config.get("full_attention_interval") is not None:
        every = _int(config, "full_attention_interval", fix)
        return tuple(FULL if (i + 1) % every == 0 else LINEAR for i in range(layers))
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False or window in (None, 0):
        return (FULL,) * layers
    pattern = config.get("sliding_window_pattern")
    if pattern is not None:
        every = _int(config, "sliding_window_pattern", fix)
        return tuple(FULL if (i + 1) % every == 0 else SLIDING for i in range(layers))
    if str(config.get("model_type", "")) == "gemma2":
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))
    positions = config.get("max_position_embeddings")
    if isinstance(window, int) and isinstance(positions, int) and window >= positions:
        return (FULL,) * layers  # a window as long as the context slides nothing
    return (SLIDING,) * layers


def _experts(config: dict[str, Any], layers: int) -> Experts | None:
    count_key = _first(config, EXPERT_COUNT_KEYS)
    if count_key is None:
        return None
    fix = "copy it from the model's published config.json"
    routed = _int(config, count_key, fix)
    top_key = _first(config, TOP_K_KEYS)
    if top_key is None:
        raise LayoutError(
            f"config.json has {count_key} ({routed}) but no experts per token ({' or '.join(TOP_K_KEYS)}): {fix}"
        )
    active = _int(config, top_key, fix)
    if active > routed:
        raise LayoutError(f"config.json {top_key} ({active}) exceeds {count_key} ({routed}): {fix}")
    size_key = "moe_intermediate_size" if config.get("moe_intermediate_size") else "intermediate_size"
    intermediate = _int(config, size_key, fix)
    shared = 0
    shared_key = next((k for k in ("shared_expert_intermediate_size", "shared_intermediate_size") if config.get(k)), "")
    if shared_key:
        shared = _int(config, shared_key, fix)
    elif config.get("n_shared_experts"):
        shared = _int(config, "n_shared_experts", fix) * intermediate
    dense = set(range(min(int(config.get("first_k_dense_replace") or 0), layers)))
    only = config.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise LayoutError(f"config.json mlp_only_layers must be a list of layer numbers, got {only!r}: {fix}")
    dense |= {i for i in only if 0 <= i < layers}
    step = config.get("decoder_sparse_step") or 1
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise LayoutError(f"config.json decoder_sparse_step must be a positive integer, got {step!r}: {fix}")
    dense |= {i for i in range(layers) if (i + 1) % step}
    return Experts(routed, active, intermediate, shared, layers - len(dense))


def _ssm_bytes(config: dict[str, Any], architectures: Any) -> int:
    """The temporal state's bytes per element a config sets for vLLM (0: the model's dtype)."""
    if not isinstance(architectures, list) or not set(map(str, architectures)) & set(SSM_DTYPE_ARCHITECTURES):
        return 0
    dtype = config.get("mamba_ssm_dtype")
    if dtype is None:
        return 0
    if dtype not in SSM_DTYPE_BYTES:
        raise LayoutError(
            f"config.json mamba_ssm_dtype must be one of {', '.join(SSM_DTYPE_BYTES)}, got {dtype!r}: copy it from the "
            "model's published config.json"
        )
    return SSM_DTYPE_BYTES[dtype]


def _recurrent(
    config: dict[str, Any], kinds: tuple[str, ...], hidden: int, architectures: Any = None
) -> Recurrent | None:
    if LINEAR not in kinds:
        return None
    fix = "copy it from the model's published config.json"
    if config.get("linear_num_value_heads") is not None:
        return Recurrent(
            kind="gdn",
            heads=_int(config, "linear_num_value_heads", fix),
            k_heads=_int(config, "linear_num_key_heads", fix),
            k_dim=_int(config, "linear_key_head_dim", fix),
            v_dim=_int(config, "linear_value_head_dim", fix),
            groups=0,
            state=0,
            inner=0,
            conv=_int(config, "linear_conv_kernel_dim", fix),
            ssm_bytes=_ssm_bytes(config, architectures),
        )
    if config.get("mamba_n_heads") is not None or config.get("mamba_d_state") is not None:
        heads = _int(config, "mamba_n_heads", fix)
        head_dim = _int(config, "mamba_d_head", fix)
        expand = config.get("mamba_expand", 2)
        if not isinstance(expand, int) or isinstance(expand, bool) or expand < 1:
            raise LayoutError(f"config.json mamba_expand must be a positive integer, got {expand!r}: {fix}")
        return Recurrent(
            kind="mamba2",
            heads=heads,
            k_heads=0,
            k_dim=0,
            v_dim=head_dim,
            groups=_int(config, "mamba_n_groups", fix),
            state=_int(config, "mamba_d_state", fix),
            inner=expand * hidden,
            conv=_int(config, "mamba_d_conv", fix),
            ssm_bytes=_ssm_bytes(config, architectures),
        )
    raise UnmodelledError(
        "config.json has linear-attention or Mamba layers but neither the Gated DeltaNet keys (linear_num_value_heads, "
        "linear_num_key_heads, linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim) nor the Mamba2 "
        "keys (mamba_n_heads, mamba_d_head, mamba_n_groups, mamba_d_state, mamba_d_conv, mamba_expand): the planner "
        "models those two recurrent layers only"
    )


def layout(config: Any) -> Layout:
    """The Layout a published config.json describes; LayoutError names the key and the fix."""
    if not isinstance(config, dict):
        raise LayoutError(f"config.json must be a mapping, got {type(config).__name__}")
    text = text_config(config)
    if text.get("kv_lora_rank") is not None:
        raise UnmodelledError(
            "config.json has kv_lora_rank: multi-head latent attention (DeepSeek-V2/V3, Kimi) caches one compressed "
            "latent per token and layer, which the planner does not model; serve a model with full, sliding-window "
            "or hybrid attention"
        )
    if text.get("attention_chunk_size") not in (None, 0):
        raise UnmodelledError(
            "config.json has attention_chunk_size: chunked local attention (Llama 4) is not modelled by the planner"
        )
    if text.get("hybrid_override_pattern") is not None:
        raise UnmodelledError(
            "config.json has hybrid_override_pattern (Nemotron-H): its Mamba, attention and MLP layers are separate "
            "layers the planner does not model"
        )
    fix = "copy it from the model's published config.json"
    layers = _int(text, "num_hidden_layers", fix)
    hidden = _int(text, "hidden_size", fix)
    kinds = _kinds(text, layers)
    window = 0
    if SLIDING in kinds:
        window = _int(text, "sliding_window", fix)
    if FULL not in kinds and SLIDING not in kinds:
        raise LayoutError(f"config.json describes no attention layer among {layers}: {fix}")
    return Layout(
        kinds=kinds,
        window=window,
        experts=_experts(text, layers),
        recurrent=_recurrent(text, kinds, hidden, config.get("architectures") or text.get("architectures")),
        sinks=bool(text.get("attention_sinks") or str(text.get("model_type", "")) == "gpt_oss"),
        mtp=next((_int(text, key, fix, 0) for key in MTP_KEYS if key in text), 0),
    )


def serving_stacks(word: str, kind: str) -> str:
    """'; gpubox_stack X (vLLM v) serves it' for a family or quantization method some stack's release has."""
    names = [
        name
        for name, stack in stacks.STACKS.items()
        if word in (stack.words.families if kind == "family" else stack.words.quantizations)
    ]
    shown = " or ".join(f"{name} (vLLM {stacks.STACKS[name].vllm})" for name in names)
    return f"; set gpubox_stack: {shown}, which serves it" if names else "; no stack serves it"


def model_layout(
    model: dict, named: str, words: vllm_words.Release, errors: list[str], unmodelled: list[str] | None = None
) -> Any:
    """The Layout of a planner model dict (None for a dense full-attention model given as facts), or False after
    appending an error naming ``named`` (the model) to ``errors``: the layout is read from ``config_json``; a family
    the release ``words`` does not plan is refused naming the stacks that serve it. An architecture the planner
    does not model at all goes to ``unmodelled`` instead when it is given (the caller decides: capacity_measured)."""
    refused = errors if unmodelled is None else unmodelled
    config = model.get("config_json")
    if config is None:
        moe = moe_keys(model)
        attention = "full" if model.get("attention") is None else model.get("attention")
        if attention not in ATTENTION_KINDS:
            errors.append(
                f"gpubox_model_config: attention must be one of {', '.join(ATTENTION_KINDS)}, got "
                f"{value_text.short(attention)}: fix gpubox_model_config (or the catalog entry)"
            )
            return False
        if attention == "mla":
            refused.append(
                f"{named}: the planner does not model its attention (mla, from gpubox_model_config or the catalog): "
                "multi-head latent attention caches one compressed latent per token and layer, replicated on every "
                "GPU; serve a model with full, sliding-window or hybrid attention"
            )
            return False
        if moe or attention != "full":
            what = f"a mixture-of-experts model ({', '.join(moe)})" if moe else f"{attention} attention"
            errors.append(
                f"{named}: {what} is planned from the model's published config.json: give it as gpubox_model_config "
                "config_json with weights_bytes (the planner reads experts, layer types and windows from it)"
            )
            return False
        return None
    try:
        found = layout(config)
    except UnmodelledError as exc:
        refused.append(f"{named}: {exc}")
        return False
    except LayoutError as exc:
        errors.append(f"{named}: {exc}")
        return False
    missing = [family for family in found.families if family not in words.families]
    if missing:
        errors.append(
            f"{named} is a {found.family} model ({', '.join(_FAMILY_WORDS[f] for f in missing)}): the planner "
            f"models it on vLLM's V1 engine, not on vLLM {words.version}'s {words.engine.upper()} engine"
            + serving_stacks(missing[0], "family")
        )
        return False
    return found


_FAMILY_WORDS = {
    "moe": "mixture-of-experts layers",
    "sliding": "sliding-window attention layers",
    "hybrid": "linear-attention or Mamba layers",
    "dense": "dense layers",
}
