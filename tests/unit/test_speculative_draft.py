"""Speculative decoding with a second checkpoint: gpubox_speculative_config's draft_model, eagle and eagle3 on lts-580.

- the desired state names the draft or EAGLE head (ModelScope id, revision, and its config.json facts when the
  capacity catalog does not carry it) and refuses bad input naming the variable (speculative_config.py, through
  state_checks, the one validator);
- the planner adds its weights, its KV layers, its buffers and its profiling peak (capacity_draft.py, read from vLLM
  0.32.0's source); each test compares with the same plan without the draft (the control) and checks the
  difference against the terms computed from the inputs;
- the desired_state lookup lists it among the checkpoints the model store publishes, with its lock entry, and the
  vLLM unit's --speculative-config carries its published local path (tests/engines parses that line with vLLM
  0.32.0's own parser; tests/integration/test_modelstore_draft.py downloads it from the test hub).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    capacity_planner,
    lock_file,
    model_catalog,
    preflight_checks,
    state_checks,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import vllm_args
from test_vllm_args import TOPOLOGIES, group_state

GIB = 1024**3
NAME = "gpubox_speculative_config"
RTX_3090 = {"name": "NVIDIA GeForce RTX 3090", "count": 2, "memory_total_mib": 24576}
SERVING = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.9,
           "max_model_len": 8192, "max_num_seqs": 16}  # fmt: skip
TOKENS = 2048  # vLLM 0.32's max_num_batched_tokens below 70 GiB (capacity_v1.BATCHED_TOKENS)
QWEN3_8B = "Qwen/Qwen3-8B"
LLAMA_8B = "LLM-Research/Meta-Llama-3.1-8B-Instruct"
# Test inputs shaped like the public config.json of the drafts people pair with these targets (the figures are the
# test's, not facts the repository states): a Qwen3-0.6B (the target's KV head shape), a Llama-3.2-1B (head size 64,
# half the target's) and an EAGLE-3 head for Llama-3.1-8B (one layer, stored in float16).
QWEN3_SMALL = {
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "hidden_size": 1024,
    "intermediate_size": 3072, "vocab_size": 151936, "head_dim": 128, "torch_dtype": "bfloat16",
    "max_position_embeddings": 40960, "weights_bytes": 1_503_300_328,
}  # fmt: skip
LLAMA_SMALL = {
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 2048,
    "intermediate_size": 8192, "vocab_size": 128256, "head_dim": 64, "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072, "weights_bytes": 2_471_645_608,
}  # fmt: skip
EAGLE3_JSON = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
    "vocab_size": 128256, "draft_vocab_size": 32000, "max_position_embeddings": 2048, "torch_dtype": "float16",
}  # fmt: skip
EAGLE3 = {"config_json": EAGLE3_JSON, "weights_bytes": 850_000_000}


def spec(method: str, model: str, config: Any = None, tokens: int = 3, **more: Any) -> dict[str, Any]:
    out = {"method": method, "model": model, "revision": "master", "num_speculative_tokens": tokens, **more}
    return out if config is None else {**out, "config": config}


def target(model_id: str) -> dict[str, Any]:
    return {**model_catalog.catalog_model(model_id), "model_id": model_id}


def plans(model_id: str, speculative: dict[str, Any], **serving: Any) -> tuple[dict, dict]:
    """(the plan without speculative decoding, the plan with it): the control and the case."""
    profile = {**SERVING, **serving}
    base = capacity_planner.plan(target(model_id), RTX_3090, profile, stack="lts-580")
    with_draft = capacity_planner.plan(target(model_id), RTX_3090, {**profile, "speculative_config": speculative},
                                       stack="lts-580")  # fmt: skip
    assert base["fits"] and with_draft["fits"], (base["errors"], with_draft["errors"])
    return base, with_draft


def kv_bytes(layers: int, kv_heads: int, head_dim: int, tp: int = 2) -> int:
    return layers * 2 * max(1, kv_heads // tp) * head_dim * 2  # K and V, bf16


# --------------------------------------------------------------------------- the plan


def test_a_draft_model_adds_its_weights_kv_layers_and_buffers() -> None:
    """A Qwen3-0.6B-shaped draft of Qwen3-8B: its KV layers have the target's shape and join its full-attention
    layers; its files load split by tp, with their rotary cache."""
    base, plan = plans(QWEN3_8B, spec("draft_model", "Qwen/Qwen3-Draft", QWEN3_SMALL))
    weights = QWEN3_SMALL["weights_bytes"] / 2 + 40960 * 128 * 2
    assert plan["draft_weights_gib"] == pytest.approx(weights / GIB)
    assert plan["weights_gib_per_gpu"] - base["weights_gib_per_gpu"] == pytest.approx(weights / GIB)
    assert plan["kv_bytes_per_token_per_gpu"] - base["kv_bytes_per_token_per_gpu"] == kv_bytes(28, 8, 128)
    # max_num_seqs x k draft tokens, the input buffers, the expanded ids, positions and slot mapping
    buffers = 16 * 3 * 8 + TOKENS * 12 + (TOKENS + 16) * 20
    assert plan["runner_buffers_gib"] - base["runner_buffers_gib"] == pytest.approx(buffers / GIB)
    budget = plan["kv_cache_gib_per_gpu"] * GIB  # the KV tokens follow the smaller budget and the wider token
    assert plan["kv_tokens"] == pytest.approx(int(budget // (16 * plan["kv_bytes_per_token_per_gpu"])) * 16, abs=16)
    assert plan["kv_tokens"] < base["kv_tokens"]
    assert plan["activation_peak_gib"] == base["activation_peak_gib"]  # the small draft's peak is below the target's


def test_a_draft_whose_layers_differ_in_shape_adds_its_own_page_to_every_block() -> None:
    """A Llama-3.2-1B-shaped draft (head size 64) of Llama-3.1-8B (128): one full-attention group whose page is the
    sum of every layer's (vLLM's UniformTypeKVCacheSpecs), so each token costs both models' bytes."""
    base, plan = plans(LLAMA_8B, spec("draft_model", "LLM-Research/Llama-Draft", LLAMA_SMALL))
    assert base["kv_bytes_per_token_per_gpu"] == kv_bytes(32, 8, 128)
    assert plan["kv_bytes_per_token_per_gpu"] == kv_bytes(32, 8, 128) + kv_bytes(16, 8, 64)
    per_block = 16 * plan["kv_bytes_per_token_per_gpu"]
    assert plan["gpu_blocks"] == pytest.approx(plan["kv_cache_gib_per_gpu"] * GIB // per_block, abs=1)


def test_an_eagle3_head_counts_the_targets_hidden_states_it_reads() -> None:
    """An EAGLE-3 head: stored in float16, loaded in the target's bfloat16 (the same width); its rotary cache spans
    the target's max_model_len (vLLM raises its 2048 positions); while it proposes in the profiling run the target's
    last and three auxiliary hidden states are held beside its MLP live set, which here is the activation peak; it
    keeps a hidden-state buffer of max_num_batched_tokens rows."""
    base, plan = plans(LLAMA_8B, spec("eagle3", "yuhuili/EAGLE3-Test", EAGLE3))
    weights = 850_000_000 / 2 + 8192 * 128 * 2
    assert plan["draft_weights_gib"] == pytest.approx(weights / GIB)
    assert plan["kv_bytes_per_token_per_gpu"] - base["kv_bytes_per_token_per_gpu"] == kv_bytes(1, 8, 128)
    peak = 1.45 * TOKENS * (2 * 4096 + 3 * 14336 / 2) * 2 + 4 * TOKENS * 4096 * 2
    assert plan["activation_peak_gib"] == pytest.approx(peak / GIB)
    assert base["activation_peak_gib"] < plan["activation_peak_gib"]
    buffers = 16 * 3 * 8 + TOKENS * 12 + TOKENS * 4096 * 2
    assert plan["runner_buffers_gib"] - base["runner_buffers_gib"] == pytest.approx(buffers / GIB)
    eagle = capacity_planner.plan(target(LLAMA_8B), RTX_3090, {**SERVING, "speculative_config": spec(
        "eagle", "yuhuili/EAGLE-Test", EAGLE3)}, stack="lts-580")  # fmt: skip
    assert eagle["activation_peak_gib"] == pytest.approx((peak - 3 * TOKENS * 4096 * 2) / GIB)  # no aux states


def test_a_float32_draft_is_planned_at_the_targets_width() -> None:
    draft = {**QWEN3_SMALL, "torch_dtype": "float32", "weights_bytes": 2 * QWEN3_SMALL["weights_bytes"]}
    _base, wide = plans(QWEN3_8B, spec("draft_model", "Qwen/Qwen3-Draft", draft))
    _base, narrow = plans(QWEN3_8B, spec("draft_model", "Qwen/Qwen3-Draft", QWEN3_SMALL))
    assert wide["draft_weights_gib"] == pytest.approx(narrow["draft_weights_gib"])


def test_the_drafts_vocabulary_must_be_the_targets_for_a_draft_model_only() -> None:
    """vLLM 0.32 refuses a draft_model whose vocabulary differs (verify_equal_vocab_size_if_draft_model); an EAGLE head
    maps its own (draft_vocab_size) and is not refused: the control."""
    other = {**QWEN3_SMALL, "vocab_size": 152064}
    refused = capacity_planner.plan(target(QWEN3_8B), RTX_3090,
                                    {**SERVING, "speculative_config": spec("draft_model", "Qwen/Q-Draft", other)},
                                    stack="lts-580")  # fmt: skip
    assert not refused["fits"]
    assert any(e.startswith(NAME) and "152,064" in e and "151,936" in e for e in refused["errors"]), refused["errors"]
    head = capacity_planner.plan(target(QWEN3_8B), RTX_3090,
                                 {**SERVING, "speculative_config": spec("eagle", "Qwen/Q-Head", other)},
                                 stack="lts-580")  # fmt: skip
    assert head["fits"], head["errors"]


@pytest.mark.parametrize(
    ("serving", "draft", "words"),
    [
        ({"pipeline_parallel_size": 2}, QWEN3_SMALL, "gpubox_pipeline_parallel_size 2"),
        ({"tensor_parallel_size": 2}, {**QWEN3_SMALL, "num_attention_heads": 15, "num_key_value_heads": 5},
         "gpubox_tensor_parallel_size 2 does not split"),
        ({}, {"config_json": {**EAGLE3_JSON, "num_experts": 8, "num_experts_per_tok": 2,
                              "moe_intermediate_size": 768}, "weights_bytes": 10**9}, "dense full-attention"),
    ],
)  # fmt: skip
def test_what_the_planner_does_not_model_is_refused_naming_the_variable(serving: dict, draft: dict, words: str) -> None:
    result = capacity_planner.plan(
        target(QWEN3_8B), {**RTX_3090, "count": 4},
        {**SERVING, **serving, "speculative_config": spec("draft_model", "Qwen/Q-Draft", draft)}, stack="lts-580",
    )  # fmt: skip
    assert not result["fits"] and any(e.startswith(NAME) and words in e for e in result["errors"]), result["errors"]


def test_n_gram_and_mtp_still_plan_a_dense_model_without_a_layout() -> None:
    """Before this change, speculative decoding on a dense model given as facts (no config_json, so no layout) raised
    AttributeError in the planner ('NoneType' object has no attribute 'window'): make plan and preflight died with a
    traceback. n-gram now plans it: the same blocks per token as without it."""
    base, plan = plans(QWEN3_8B, {"method": "ngram", "num_speculative_tokens": 3})
    assert plan["kv_bytes_per_token_per_gpu"] == base["kv_bytes_per_token_per_gpu"]
    assert plan["runner_buffers_gib"] > base["runner_buffers_gib"]


# --------------------------------------------------------------------------- the desired state


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"method": "eagle3", "num_speculative_tokens": 3}, "give its model (the ModelScope id"),
        ({"method": "draft_model", "model": "Qwen/Qwen3-8B", "num_speculative_tokens": 3}, "give its revision"),
        (spec("eagle3", "a/b"), "model 'a/b' is not in the capacity catalog: give its config.json facts as config"),
        (spec("eagle3", "a/../b", EAGLE3), "model is 'a/../b', which is not valid"),
        (spec("eagle3", "a/b", EAGLE3, revision="x y"), "revision is 'x y', which is not valid"),
        (spec("eagle3", "a/b", {"config_json": EAGLE3_JSON}), "config: weights_bytes must be the total size"),
        (spec("eagle3", "a/b", EAGLE3, draft_tensor_parallel_size=1), "keys gpubox does not plan for method eagle3"),
        (spec("eagle3", "a/b", EAGLE3, tokens=0), "num_speculative_tokens must be an integer from 1 to 16"),
        ({"method": "medusa", "num_speculative_tokens": 3}, "'medusa' is not one gpubox plans"),
        ({"method": "ngram", "num_speculative_tokens": 3, "revision": "x"}, "keys gpubox does not plan"),
    ],
)
def test_a_bad_second_checkpoint_is_refused_naming_the_variable(value: dict, words: str) -> None:
    _value, error = state_checks.check(NAME, value)
    assert error and error.startswith(NAME) and words in error, error


def test_a_good_one_is_its_own_normal_form() -> None:
    value = spec("eagle3", "a/b", EAGLE3)
    checked, error = state_checks.check(NAME, value)
    assert error is None and checked == value
    assert state_checks.check(NAME, checked) == (checked, None)
    catalog = spec("draft_model", QWEN3_8B)  # a catalog model needs no config
    assert state_checks.check(NAME, catalog) == (catalog, None)


def test_a_draft_the_store_cannot_publish_beside_the_model_is_refused() -> None:
    for draft, words in (("Other/Qwen3-8B", "share the name 'Qwen3-8B'"), (QWEN3_8B, "is the served model itself")):
        values = {"gpubox_model_id": QWEN3_8B, NAME: spec("draft_model", draft)}
        state = state_checks.validate(values)
        assert any(e.startswith(NAME) and words in e for e in state.errors), state.errors
    fine = state_checks.validate({"gpubox_model_id": QWEN3_8B, NAME: spec("draft_model", "Qwen/Qwen3-4B", QWEN3_SMALL)})
    assert not any(e.startswith(NAME) for e in fine.errors), fine.errors


def test_the_pinned_stack_refuses_a_draft_naming_lts_580() -> None:
    problems = state_checks.stack_fact_flag_problems({NAME: spec("eagle3", "a/b", EAGLE3)}, "pinned-0.7.3")
    assert len(problems) == 1 and problems[0].startswith(NAME) and "set gpubox_stack: lts-580" in problems[0]


# --------------------------------------------------------------------------- the lookup and the command line


def test_the_lookup_lists_the_draft_for_the_model_store_with_its_lock_entry(tmp_path: Path) -> None:
    draft = "yuhuili/EAGLE3-Test"
    commit, content = "b" * 40, "c" * 64
    lock = tmp_path / "models.lock.json"
    lock.write_text(lock_file.render_lock({f"{draft}@master": {"commit": commit, "endpoint": "https://hub.example",
                                                               "content_sha256": content}}))  # fmt: skip
    facts = {"gpubox_stack": "lts-580", "gpubox_model_lock_file": str(lock)}
    without = group_state(TOPOLOGIES[0], facts)
    assert [c["kind"] for c in without["gpubox_model_checkpoints"]] == ["model"]  # the control: one checkpoint
    state = group_state(TOPOLOGIES[0], {**facts, NAME: spec("eagle3", draft, EAGLE3)})
    assert state["errors"] == []
    model, second = state["gpubox_model_checkpoints"]
    assert model == {**without["gpubox_model_checkpoints"][0]}
    assert model["model_id"] == state["gpubox_model_id"] and model["fact"] == "gpubox_model"
    assert second == {
        "kind": "draft", "fact": "gpubox_model_draft", "model_id": draft, "revision": "master", "name": "EAGLE3-Test",
        "commit": commit, "fetch_revision": commit, "content_sha256": content, "cache_fetch_refusal": None,
        "config": EAGLE3,
    }  # fmt: skip


def test_the_command_line_carries_the_published_local_path() -> None:
    state = group_state(TOPOLOGIES[0], {"gpubox_stack": "lts-580", NAME: spec("eagle3", "yuhuili/EAGLE3-Test", EAGLE3)})
    argv = vllm_args(state)
    rendered = json.loads(argv[argv.index("--speculative-config") + 1])
    assert rendered == {"method": "eagle3", "model": "/data/models/EAGLE3-Test", "num_speculative_tokens": 3}
    assert argv[argv.index("--model") + 1] == "/data/models/" + state["gpubox_model_id"].rsplit("/", 1)[1]
    ngram = group_state(
        TOPOLOGIES[0], {"gpubox_stack": "lts-580", NAME: {"method": "ngram", "num_speculative_tokens": 3}}
    )
    argv = vllm_args(ngram)  # the control: a method without a second checkpoint renders as given
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "ngram", "num_speculative_tokens": 3}


# --------------------------------------------------------------------------- preflight's disk check


def test_preflight_counts_the_drafts_files_still_to_fetch() -> None:
    config = {"gpubox_model_root": "/data/models", NAME: spec("draft_model", "Qwen/Q-Draft", QWEN3_SMALL)}
    model = {"weights_bytes": 10 * GIB}
    gib = 1024**3

    def need(present: int, draft_present: int, free: int) -> list[str]:
        report = preflight_checks._Report()
        host = preflight_checks.HostFacts(disk_free_bytes=free, disk_mount="/", model_bytes_present=present,
                                          draft_bytes_present=draft_present)  # fmt: skip
        preflight_checks._check_disk(host, config, model, 0, report)
        return report.errors

    draft = QWEN3_SMALL["weights_bytes"]
    assert need(0, 0, 10 * gib + draft) == []
    assert need(0, 0, 10 * gib + draft - 1) != []  # the control: one byte short of the model and the draft
    assert "the speculative draft's" in need(0, 0, 10 * gib)[0]
    assert need(10 * gib, draft, 0) == []  # both published already: nothing to fetch


def unit_file(facts: dict[str, Any], local: dict[str, Any]) -> str:
    """roles/vllm_service's unit for a gpu_2x3090 box with these facts and local facts (ansible_local)."""
    from ansible.template import trust_as_template

    from harness.ansible_vars import ROOT, templar_for

    extra = {"gpubox_stack": "lts-580", **facts, "ansible_managed": "Ansible managed"}
    extra["ansible_facts"] = {"ansible_local": local}
    templar, _ = templar_for("unit-draft", roles=("gpubox", "vllm_service"), extra_vars=extra, groups=("gpu_2x3090",))
    return templar.template(trust_as_template((ROOT / "roles/vllm_service/templates/vllm.service.j2").read_text()))


def test_the_vllm_unit_names_the_drafts_commit_so_a_new_draft_restarts_it() -> None:
    local = {"gpubox_model_draft": {"commit": "b" * 40, "version_path": "/data/models/.versions/EAGLE3-Test@b"}}
    text = unit_file({NAME: spec("eagle3", "yuhuili/EAGLE3-Test", EAGLE3)}, local)
    assert f"# Drafts with yuhuili/EAGLE3-Test (gpubox_speculative_config) at commit {'b' * 40} in version " in text
    moved = unit_file({NAME: spec("eagle3", "yuhuili/EAGLE3-Test", EAGLE3)}, {"gpubox_model_draft": {"commit": "c"}})
    assert moved != text  # another commit is another unit file: the handler restarts vLLM
    ngram = unit_file({NAME: {"method": "ngram", "num_speculative_tokens": 3}}, local)
    assert "Drafts with" not in ngram  # the control: no second checkpoint, no line (a stale fact is not named)


def test_a_refused_draft_leaves_the_lookup_answering_with_the_error() -> None:
    """The lookup reads the lock for the draft from the raw value when the fact is refused: a draft method without a
    revision is an error line, not a traceback."""
    state = group_state(TOPOLOGIES[0], {"gpubox_stack": "lts-580", NAME: {"method": "eagle3", "model": "a/b",
                                                                            "num_speculative_tokens": 3}})  # fmt: skip
    assert any(e.startswith(NAME) and "give its revision" in e for e in state["errors"]), state["errors"]
    assert [c["kind"] for c in state["gpubox_model_checkpoints"]] == ["model"]
