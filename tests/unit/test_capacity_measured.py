"""A measured start (capacity_measured, issue 45 item 5): an architecture the planner does not model is refused by
default naming gpubox_capacity_measured_start; set true on lts-580 it starts unplanned at a conservative budget and
the serving report names vLLM's own KV figure to pin. Each decision has its control beside it.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    capacity_planner,
    model_catalog,
    preflight_checks,
    state_checks,
    vllm_startup,
)
from test_capacity_families import gpt_oss_20b, qwen3_next
from test_preflight import group_config, healthy_host

GIB = 1024**3
NAME = "gpubox_capacity_measured_start"
RTX_3090 = {"name": "NVIDIA GeForce RTX 3090", "count": 2, "memory_total_mib": 24576}
SERVING = {
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 1,
    "gpu_memory_utilization": 0.85,
    "max_model_len": 8192,
    "max_num_seqs": 16,
}
# DeepSeek-V2-Lite's shape, dense (a 16B-class checkpoint, 31 GB in bf16): multi-head latent attention.
MLA = {
    "model_type": "deepseek_v2",
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "vocab_size": 102400,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
    "kv_lora_rank": 512,
}
WEIGHTS = 31_400_000_000
# Each architecture the planner refuses by name, as a change to Qwen3-Next's config.json (or MLA above).
UNMODELLED = {
    "mla": MLA,
    "nemotron-h": {**qwen3_next(), "hybrid_override_pattern": "M-M*"},
    "chunked-local": {**qwen3_next(), "attention_chunk_size": 8192},
    "unknown-layer-type": {**qwen3_next(), "layer_types": ["full_attention", "weird"] * 24},
}


def _model(config: dict, weights: int = WEIGHTS) -> dict:
    model = model_catalog.inventory_model("org/model", {"config_json": config, "weights_bytes": weights})
    return {**model, "model_id": "org/model"}


def _plan(config: dict, stack: str = "lts-580", weights: int = WEIGHTS, **serving: object) -> dict:
    return capacity_planner.plan(_model(config, weights), RTX_3090, {**SERVING, **serving}, stack=stack)


@pytest.mark.parametrize("arch", sorted(UNMODELLED))
def test_an_unmodelled_architecture_is_refused_by_default_naming_the_variable(arch: str) -> None:
    refused = _plan(UNMODELLED[arch])
    assert not refused["fits"] and not refused["measured_start"]
    (error,) = refused["errors"]
    assert error.startswith("gpubox_model_id org/model: config.json ") and "planner" in error
    assert f"set {NAME}: true (gpubox_stack lts-580)" in error
    # control: the same model with the variable true starts measured instead
    measured = _plan(UNMODELLED[arch], measured_start=True)
    assert measured["fits"], measured["errors"]
    assert measured["measured_start"] == "no plan; vLLM sizes the cache at 0.85"


def test_the_facts_form_with_mla_attention_is_the_same_class() -> None:
    facts = {**model_catalog.catalog_model("Qwen/Qwen2.5-14B-Instruct"), "attention": "mla", "model_id": "org/m"}
    refused = capacity_planner.plan(facts, RTX_3090, SERVING, stack="lts-580")
    assert not refused["fits"] and f"set {NAME}: true" in refused["errors"][0]
    measured = capacity_planner.plan(facts, RTX_3090, {**SERVING, "measured_start": True}, stack="lts-580")
    assert measured["fits"] and measured["measured_start"], measured["errors"]


def test_a_measured_start_plans_no_cache_checks_the_weights_and_says_so() -> None:
    plan = _plan(MLA, measured_start=True)
    assert plan["weights_gib_per_gpu"] == pytest.approx(WEIGHTS / 2 / GIB)
    assert plan["budget_gib_per_gpu"] == pytest.approx((24576 - 450) * 0.85 / 1024)
    assert (plan["kv_tokens"], plan["kv_cache_gib_per_gpu"], plan["warnings"]) == (0, 0.0, [])
    table = capacity_planner.plan_table(plan)
    assert "measured start: no plan; vLLM sizes the cache at 0.85" in table
    # control: a planned model's table has no such line
    assert "measured start" not in capacity_planner.plan_table(_plan(gpt_oss_20b(), weights=13_761_300_000))


def test_a_known_architecture_plans_the_same_with_the_variable() -> None:
    for config, weights in ((gpt_oss_20b(), 13_761_300_000), (qwen3_next(), 45 * 10**9)):
        planned = _plan(config, weights=weights, gpu_memory_utilization=0.92)
        assert _plan(config, weights=weights, gpu_memory_utilization=0.92, measured_start=True) == planned
        assert not planned["measured_start"]
    assert _plan(gpt_oss_20b(), weights=13_761_300_000)["fits"]


def test_weights_that_do_not_fit_are_still_refused() -> None:
    one_gpu = _plan(MLA, measured_start=True, tensor_parallel_size=1)
    assert not one_gpu["fits"]
    assert one_gpu["errors"] == [
        f"weights of gpubox_model_id org/model need {WEIGHTS / GIB:.2f} GiB per GPU but gpubox_gpu_memory_utilization "
        "x gpubox_gpu_memory_total_mib leaves 20.03 GiB: a measured start needs them to fit too; raise "
        "gpubox_tensor_parallel_size, use a quantized model or bigger GPUs"
    ]
    assert _plan(MLA, measured_start=True, tensor_parallel_size=2)["fits"]  # control: split over two GPUs they fit
    beyond = _plan(MLA, measured_start=True, tensor_parallel_size=4)
    assert any("gpubox_gpu_count is 2" in e for e in beyond["errors"])


def test_a_malformed_config_is_still_refused_by_the_validator() -> None:
    broken = {**qwen3_next(), "linear_num_value_heads": "32"}  # a bad value, not an unknown architecture
    problem = state_checks.check("gpubox_model_config", {"config_json": broken, "weights_bytes": WEIGHTS})[1]
    assert problem and "linear_num_value_heads must be an integer" in problem
    # control: an unknown architecture passes the validator and reaches the planner (which refuses or measures)
    unknown = UNMODELLED["nemotron-h"]
    assert state_checks.check("gpubox_model_config", {"config_json": unknown, "weights_bytes": WEIGHTS})[1] is None


def test_the_first_start_is_conservative_and_a_pin_is_what_starts_after() -> None:
    high = _plan(MLA, measured_start=True, gpu_memory_utilization=0.92)
    assert not high["fits"]
    assert high["errors"][0].startswith(f"{NAME}: the first start of an unplanned model is conservative, ")
    assert "at most 0.85, got 0.92" in high["errors"][0]
    assert _plan(MLA, measured_start=True, gpu_memory_utilization=0.85)["fits"]  # control: at the cap
    pin = 5 * GIB
    pinned = _plan(MLA, measured_start=True, gpu_memory_utilization=0.92, kv_cache_memory_bytes=pin)
    assert pinned["fits"], pinned["errors"]
    assert pinned["measured_start"] == "no plan; the pinned 5.00 GiB KV cache starts"
    assert pinned["kv_cache_pinned_gib"] == pinned["kv_cache_gib_per_gpu"] == 5
    too_much = _plan(MLA, measured_start=True, gpu_memory_utilization=0.92, kv_cache_memory_bytes=8 * GIB)
    assert not too_much["fits"] and too_much["errors"][0].startswith("gpubox_kv_cache_memory_bytes pins 8.00 GiB")
    # without the variable a pin does not start an unplanned model either
    assert not _plan(MLA, kv_cache_memory_bytes=pin)["fits"]


def test_the_pinned_stack_is_refused_naming_lts_580() -> None:
    pinned_stack = _plan(MLA, stack="pinned-0.7.3", measured_start=True)
    assert not pinned_stack["fits"]
    assert pinned_stack["errors"][0] == (
        f"{NAME} is true but the stack runs vLLM 0.7.3, which has no --kv-cache-memory-bytes to pin the budget vLLM "
        f"measures: set gpubox_stack: lts-580, or {NAME}: false"
    )
    # control: false on the pinned stack says nothing about the variable's stack
    model = {**model_catalog.catalog_model("Qwen/Qwen2.5-14B-Instruct"), "model_id": "q"}
    plain = capacity_planner.plan(model, RTX_3090, {**SERVING, "measured_start": False}, stack="pinned-0.7.3")
    assert plain["fits"] and not any(NAME in e for e in plain["errors"])


@pytest.mark.parametrize("value", ["yes", 1, [], {"a": 1}])
def test_the_variable_is_true_or_false(value: object) -> None:
    value_error = state_checks.check(NAME, value)[1]
    assert value_error and value_error.startswith(f"{NAME} must be true or false")
    assert any(e.startswith(f"{NAME} must be true or false") for e in _plan(MLA, measured_start=value)["errors"])
    assert state_checks.check(NAME, False) == (False, None)  # control


def test_preflight_prints_one_line_when_the_box_starts_unplanned() -> None:
    config = group_config("gpu_2x3090") | {
        "gpubox_stack": "lts-580",
        "gpubox_model_id": "org/model",
        "gpubox_model_config": {"config_json": MLA, "weights_bytes": WEIGHTS},
        "gpubox_gpu_memory_utilization": 0.85,
    }
    refused = preflight_checks.preflight(healthy_host("gpu_2x3090"), config)
    assert any(f"set {NAME}: true" in e for e in refused["errors"])
    assert "measured start" not in refused["table"]
    started = preflight_checks.preflight(healthy_host("gpu_2x3090"), config | {NAME: True})
    assert not [e for e in started["errors"] if "does not model" in e or NAME in e], started["errors"]
    lines = [line for line in started["table"].splitlines() if "measured start" in line]
    assert lines == ["plan: measured start     no plan; vLLM sizes the cache at 0.85 (gpubox_capacity_measured_start)"]


def test_the_serving_report_names_the_measured_figure_to_pin() -> None:
    log = "Model loading took 14.9 GiB\nAvailable KV cache memory: 3.21 GiB\nGPU KV cache size: 100,000 tokens"
    line = vllm_startup.compared(_plan(MLA, measured_start=True), vllm_startup.measured(log))
    assert line == (
        "KV cache: 3.21 GiB measured vs - GiB planned per GPU; 100,000 tokens measured vs - planned "
        f"(pin it for later starts: gpubox_kv_cache_memory_bytes: {int(3.21 * GIB)})"
    )
    # control: a planned box compares with its plan's figures
    planned = vllm_startup.compared({"kv_cache_gib_per_gpu": 3.0, "kv_tokens": 90000}, vllm_startup.measured(log))
    assert "vs 3.00 GiB planned" in planned and "vs 90,000 planned" in planned
