"""roles/vllm_service/files/gpubox_vllm_guard.py: the ASGI middleware that refuses or bounds what the engines' open
advisories need (a request's own chat template, chat_template_kwargs, mm_processor_kwargs, sequences and fan-out,
guided decoding by whatever field asks for it, the backend), with a 400 naming the field.

Driven here with a recording ASGI app and asyncio (the guard uses the standard library only); tests/engines
runs it inside each stack's vLLM release's own app, 0.7.3's and 0.32.0's (IN_APP_SCRIPT below, on every POST route), and
molecule/serving sends such requests through the front door to a real vLLM.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import REQUEST_TEMPLATE_GUARD, vllm_args
from test_vllm_args import group_state

GUARD_FILE = Path(__file__).resolve().parents[2] / "roles" / "vllm_service" / "files" / "gpubox_vllm_guard.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpubox_vllm_guard", GUARD_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


guard = _load()


class Recorder:
    """An ASGI app that reads its whole body, then one more message, and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.after: list[dict] = []

    async def __call__(self, scope, receive, send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.bodies.append(body)
        if scope.get("method") != "GET":
            self.after.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _run(body: bytes | list[bytes], method: str = "POST", disconnect_early: bool = False, config: dict | None = None):
    """Send ``body`` (one message, or one per chunk) through the guard; the app, and what was answered."""
    chunks = body if isinstance(body, list) else [body]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    if disconnect_early:
        messages = messages[:1]
        messages[0]["more_body"] = True
    messages.append({"type": "http.disconnect"})
    app, sent = Recorder(), []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": "/v1/chat/completions", "headers": []}
    asyncio.run(guard.RequestTemplateGuard(app, config=config or {})(scope, receive, send))
    return app, sent


def _refusal(sent) -> dict:
    start, body = sent
    assert start["status"] == 400
    assert dict(start["headers"])[b"content-type"] == b"application/json"
    assert int(dict(start["headers"])[b"content-length"]) == len(body["body"])
    return json.loads(body["body"])["error"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"messages": [], "chat_template": "{{ 1 }}"}', "chat_template"),
        (b'{"chat_template": ""}', "chat_template"),  # vLLM would fall back to the model's; the rule stays simple
        (b'{"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}', "chat_template_kwargs.chat_template"),
        # JSON escapes and UTF-16: json.loads (what FastAPI runs on vLLM's request bodies) reads them as the key.
        (b'{"chat\\u005ftemplate": "x"}', "chat_template"),
        ('{"chat_template": "x"}'.encode("utf-16"), "chat_template"),
        # A duplicate key: the last one is what the request model gets, and what the guard judges.
        (b'{"chat_template": null, "chat_template": "x"}', "chat_template"),
    ],
)
def test_a_body_with_a_template_is_refused_and_never_reaches_the_app(body: bytes, param: str) -> None:
    app, sent = _run(body)
    error = _refusal(sent)
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert "vllm_service_allow_request_chat_template" in error["message"]
    assert app.bodies == []


def test_a_template_split_over_chunks_is_seen_whole() -> None:
    app, sent = _run([b'{"chat_tem', b'plate": "{{ 1 }', b'}"}'])
    assert _refusal(sent)["param"] == "chat_template"
    assert app.bodies == []


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "chat_template"}]}',  # the word, not the field
        b'{"chat_template": null, "chat_template_kwargs": {"enable_thinking": false}}',
        b'{"chat_template": "x", "chat_template": null}',
        b'{"chat_template_kwargs": "chat_template"}',
        b'[{"chat_template": "x"}]',  # not an object: vLLM's route refuses it itself
        b"not json {",
        b"",
        b"[" * 100_000,  # deeper than json.loads recurses: the route fails it the same way
    ],
)
def test_a_body_without_a_template_reaches_the_app_byte_for_byte(body: bytes) -> None:
    chunks = [body[:7], body[7:]] if len(body) > 7 else [body]
    app, sent = _run(chunks)
    assert app.bodies == [body]
    assert app.after == [{"type": "http.disconnect"}]  # after the replayed body, the client's own messages
    assert sent[0]["status"] == 200


def test_a_get_is_passed_on_without_reading_its_body() -> None:
    app, sent = _run(b'{"chat_template": "x"}', method="GET")
    assert app.bodies == [b'{"chat_template": "x"}'] and sent[0]["status"] == 200


def test_a_client_that_leaves_before_its_body_is_complete_gets_nothing() -> None:
    app, sent = _run([b'{"chat_template": "x"}', b"rest"], disconnect_early=True)
    assert app.bodies == [] and sent == []


def test_a_lifespan_scope_is_passed_on() -> None:
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(guard.RequestTemplateGuard(app)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]


def test_the_rendered_flag_names_the_guard_class() -> None:
    args = vllm_args(group_state("gpu_2x3090"), refuse_request_chat_template=True)
    assert args[-2:] == ["--middleware", REQUEST_TEMPLATE_GUARD]
    module, name = REQUEST_TEMPLATE_GUARD.rsplit(".", 1)
    assert module == GUARD_FILE.stem and isinstance(getattr(guard, name), type)
    assert "--middleware" not in vllm_args(group_state("gpu_2x3090"))


def test_a_knob_that_is_not_a_bool_is_named() -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import VllmProfileError

    with pytest.raises(VllmProfileError, match="vllm_service_allow_request_chat_template"):
        vllm_args(group_state("gpu_2x3090"), refuse_request_chat_template="no")


# --- the engine's other open advisories (roles/python_env/files/advisories.yml) ------------------------------------

BIG_SCHEMA = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(1000)}}


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        # CVE-2025-62426: a kwargs key that is a parameter of the template call, or any name not allowed
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize", "request_kwargs_not_allowed"),
        (
            {"chat_template_kwargs": {"max_length": 10**9}},
            "chat_template_kwargs.max_length",
            "request_kwargs_not_allowed",
        ),
        ({"chat_template_kwargs": {"x": 1}}, "chat_template_kwargs.x", "request_kwargs_not_allowed"),
        (
            {"chat_template_kwargs": {"enable_thinking": "a" * 257}},
            "chat_template_kwargs.enable_thinking",
            "request_kwargs_value",
        ),
        (
            {"chat_template_kwargs": {"enable_thinking": [1]}},
            "chat_template_kwargs.enable_thinking",
            "request_kwargs_value",
        ),
        # CVE-2026-114053: mm_processor_kwargs reaches the processor loader
        (
            {"mm_processor_kwargs": {"code_revision": "evil"}},
            "mm_processor_kwargs.code_revision",
            "request_kwargs_not_allowed",
        ),
        # CVE-2026-34756: n / best_of without an upper bound; a JSON integer up to the bound, nothing else
        ({"n": 9}, "n", "value_above_limit"),
        ({"n": 10**12}, "n", "value_above_limit"),
        ({"n": "1000000000"}, "n", "value_above_limit"),  # pydantic would read the string as an int
        ({"n": 2.0}, "n", "value_above_limit"),
        ({"n": True}, "n", "value_above_limit"),
        ({"best_of": 9}, "best_of", "value_above_limit"),
        # CVE-2025-32381 / CVE-2025-29770: each guided-decoding field bounded in bytes
        ({"guided_json": BIG_SCHEMA}, "guided_json", "guided_decoding_too_large"),
        ({"guided_json": json.dumps(BIG_SCHEMA)}, "guided_json", "guided_decoding_too_large"),
        ({"guided_regex": "a" * 16385}, "guided_regex", "guided_decoding_too_large"),
        ({"guided_grammar": "é" * 8193}, "guided_grammar", "guided_decoding_too_large"),  # bytes, not characters
        ({"guided_choice": ["x" * 100] * 200}, "guided_choice", "guided_decoding_too_large"),
        ({"guided_whitespace_pattern": " " * 16385}, "guided_whitespace_pattern", "guided_decoding_too_large"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": BIG_SCHEMA}}},
            "response_format",
            "guided_decoding_too_large",
        ),
    ],
)
def test_what_an_open_advisory_needs_is_refused_with_the_field_named(body: dict, param: str, code: str) -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}).encode()
    app, sent = _run(raw)
    error = _refusal(sent)
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error"), error
    assert param.split(".")[0] in error["message"], error
    if code != "request_kwargs_value":
        assert "vllm_service_" in error["message"], "the message names the operator's knob"
    assert app.bodies == []


@pytest.mark.parametrize(
    "body",
    [
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"chat_template_kwargs": {"enable_thinking": "a" * 256}},
        {"chat_template_kwargs": {}},
        {"chat_template_kwargs": None, "mm_processor_kwargs": None, "mm_processor_kwargs_": {"x": 1}},
        {"mm_processor_kwargs": {}},
        {"n": 8, "best_of": 8},
        {"n": None, "best_of": None},
        {"n": 0},  # below the bound: vLLM's own model refuses it
        {"guided_json": {"type": "object", "properties": {"a": {"type": "string"}}}},
        {"guided_regex": "a" * 16384},
        {"guided_choice": ["yes", "no"], "response_format": {"type": "json_object"}},
    ],
)
def test_what_stays_inside_the_bounds_reaches_the_app_byte_for_byte(body: dict) -> None:
    raw = json.dumps({"model": "m", **body}).encode()
    app, sent = _run(raw)
    assert app.bodies == [raw] and sent[0]["status"] == 200


def test_the_bounds_follow_the_settings() -> None:
    config = {
        "max_n": 2,
        "max_guided_decoding_bytes": 10,
        "chat_template_kwargs_allowed": ["reasoning_effort"],
        "mm_processor_kwargs_allowed": ["num_crops"],
    }
    cases = {
        b'{"n": 3}': "n",
        b'{"guided_regex": "a{11}xxxxxx"}': "guided_regex",
        b'{"chat_template_kwargs": {"enable_thinking": true}}': "chat_template_kwargs.enable_thinking",
    }
    for raw, param in cases.items():
        assert _refusal(_run(raw, config=config)[1])["param"] == param
    for raw in (b'{"n": 2}', b'{"guided_regex": "a+"}', b'{"chat_template_kwargs": {"reasoning_effort": "low"}}',
                b'{"mm_processor_kwargs": {"num_crops": 4}}'):  # fmt: skip
        app, _ = _run(raw, config=config)
        assert app.bodies == [raw], raw


def test_an_allowed_request_template_also_passes_inside_the_kwargs() -> None:
    config = {"allow_request_chat_template": True}
    for raw in (b'{"chat_template": "{{ 1 }}"}', b'{"chat_template_kwargs": {"chat_template": "{{ 1 }}"}}'):
        app, _ = _run(raw, config=config)
        assert app.bodies == [raw]
    # the other rules still hold
    assert _refusal(_run(b'{"chat_template_kwargs": {"tokenize": true}}', config=config)[1])["param"] == (
        "chat_template_kwargs.tokenize"
    )


# --- the effect, whichever field asks for it (issue 46) --------------------------------------------------------------
#
# The bodies refused below passed the guard before it bounded effects: a0d49de's guard let 42 of the 43 through (all
# but the structural_tag response_format, a field it bounded whole already), since it bounded the guided_* fields and
# response_format one by one, n and best_of one by one, no backend and no nesting. Each class keeps a control, the
# same payload where it asks for no grammar or no fan-out, which passes.

BOUND = guard.DEFAULTS["max_guided_decoding_bytes"]


def schema_of(size: int) -> dict:
    """A JSON schema of at least ``size`` bytes as compact JSON (string properties, about 25 bytes each)."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(size // 20)}}


HUGE_SCHEMA = schema_of(90 * BOUND)  # the hostile round's figure: 90 times the bound through a tool


def chat_tool(name: str = "f", parameters: dict = HUGE_SCHEMA) -> dict:
    return {"type": "function", "function": {"name": name, "description": "d", "parameters": parameters}}


CHAT_TOOL = chat_tool()
RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": HUGE_SCHEMA}  # the Responses API's shape
ANTHROPIC_TOOL = {"name": "f", "input_schema": HUGE_SCHEMA}
NAMED = {"type": "function", "function": {"name": "f"}}
HALF = "a" * (BOUND // 2 + 1)  # two of these are over the bound together, each under it alone


def nested(depth: int) -> dict:
    """A schema of a few hundred bytes that nests ``depth`` objects."""
    schema: dict = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"not": schema}
    return schema


DEPTH = guard.MAX_GRAMMAR_NESTING


def effect_probes(schema: dict) -> dict:
    """The refused classes, one body each, with the field the refusal names; the grammar classes carry ``schema``."""
    return {
        # guided decoding through a tool: a named tool_choice (0.7.3, 0.32.0), "required" (0.32.0), none given ("auto")
        "tool_named": ({"tools": [chat_tool(parameters=schema)], "tool_choice": NAMED}, "tools"),
        "tool_required": ({"tools": [chat_tool(parameters=schema)], "tool_choice": "required"}, "tools"),
        "structured_outputs": ({"structured_outputs": {"json": schema}}, "structured_outputs"),
        "response_format_object": (
            {"guided_regex": HALF, "response_format": {"type": "json_schema", "json_schema": {"schema": HALF}}},
            "response_format",
        ),
        "text_format": ({"text": {"format": {"type": "json_schema", "name": "s", "schema": schema}}}, "text.format"),
        # fan-out: hundreds of thousands of prompts in one body; token-id prompts; conversations of the batch route
        "prompt_list": ({"prompt": ["x"] * 300_000}, "prompt"),
        "token_prompts": ({"prompt": [[1, 2, 3]] * 9}, "prompt"),
        "prompts_times_n": ({"prompt": ["x", "y"], "n": 8}, "prompt"),
        "conversations": ({"messages": [[{"role": "user", "content": "hi"}]] * 9}, "messages"),
        # the backend is the server's
        "backend": ({"guided_decoding_backend": "outlines"}, "guided_decoding_backend"),
        # a grammar nested deeper than vLLM 0.32.0 compiles (sampling_params.py 36), small in bytes
        "deep_schema": ({"guided_json": nested(DEPTH + 20)}, "guided_json"),
    }


# The classes at the hostile round's sizes. The in-app tests (tests/engines) send each class to every POST route of
# each release's own app at 4 times the bound (in_app_job): how the guard treats a grammar's size is proven here, on
# every size; there, that no route of the app is left out (90 times the bound took some 200 ms a body on every route).
EFFECT_PROBES = effect_probes(HUGE_SCHEMA)
IN_APP_PROBES = effect_probes(schema_of(4 * BOUND))

# What passes the guard: the same payloads where they ask for no grammar or no fan-out.
EFFECT_CONTROLS = {
    "tool_none": {"tools": [CHAT_TOOL], "tool_choice": "none"},
    "big_message": {"messages": [{"role": "user", "content": "x" * 90 * BOUND}]},  # a prompt, not a grammar
    "prompts_at_bound": {"prompt": ["x"] * 8},
    "one_token_prompt": {"prompt": list(range(20_000)), "n": 8},  # one token-id prompt, however long
    "stop_list": {"prompt": "x", "n": 8, "stop": ["s"] * 1000},  # a list that is not prompts
    "backend_null": {"guided_decoding_backend": None, "structured_outputs": {"regex": "a+"}},
    "deep_metadata": {"metadata": nested(DEPTH + 20), "guided_json": nested(DEPTH)},  # deep, but no grammar
}


@pytest.mark.parametrize(("body", "param"), EFFECT_PROBES.values(), ids=EFFECT_PROBES)
def test_each_field_that_reaches_the_engine_is_bounded_by_its_effect(body: dict, param: str) -> None:
    raw = json.dumps({"model": "m", **body}).encode()
    app, sent = _run(raw)
    error = _refusal(sent)
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert app.bodies == []
    code, knob = {
        "tools": ("guided_decoding_too_large", "vllm_service_max_guided_decoding_bytes"),
        "structured_outputs": ("guided_decoding_too_large", "vllm_service_max_guided_decoding_bytes"),
        "response_format": ("guided_decoding_too_large", "vllm_service_max_guided_decoding_bytes"),
        "text.format": ("guided_decoding_too_large", "vllm_service_max_guided_decoding_bytes"),
        "prompt": ("request_fanout_above_limit", "vllm_service_max_n"),
        "messages": ("request_fanout_above_limit", "vllm_service_max_n"),
        "guided_decoding_backend": ("guided_decoding_backend_not_allowed", None),
        "guided_json": ("guided_decoding_too_deep", None),
    }[param]
    assert error["code"] == code, error
    if knob:  # the message names the bound and the knob that sets it
        bound = BOUND if "guided" in knob else guard.DEFAULTS["max_n"]
        assert knob in error["message"] and f"at most {bound} " in error["message"], error


@pytest.mark.parametrize("body", EFFECT_CONTROLS.values(), ids=EFFECT_CONTROLS)
def test_the_same_payload_where_it_asks_for_no_grammar_or_fan_out_passes(body: dict) -> None:
    raw = json.dumps({"model": "m", **body}).encode()
    app, sent = _run(raw)
    assert app.bodies == [raw] and sent[0]["status"] == 200


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # every shape of tool choice that makes a grammar of the tools: OpenAI chat, Responses, Anthropic, Cohere
        ({"tools": [CHAT_TOOL]}, "tools"),  # no tool_choice: "auto"
        ({"tools": [CHAT_TOOL], "tool_choice": "auto"}, "tools"),
        ({"tools": [RESPONSES_TOOL], "tool_choice": {"type": "function", "name": "f"}}, "tools"),
        ({"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "any"}}, "tools"),
        ({"tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "tool", "name": "f"}}, "tools"),
        ({"tools": [CHAT_TOOL], "tool_choice": "REQUIRED"}, "tools"),
        # many small tools: each under the bound, the grammar of all of them is not
        ({"tools": [chat_tool(f"f{i}", schema_of(BOUND // 4)) for i in range(5)], "tool_choice": "required"}, "tools"),
        # 0.32.0's fields: structured_outputs (each constraint), response_format structural_tag, output_config.format
        ({"structured_outputs": {"grammar": "a" * (BOUND + 1)}}, "structured_outputs"),
        ({"structured_outputs": {"choice": ["x" * 100] * 200}}, "structured_outputs"),
        ({"structured_outputs": {"structural_tag": json.dumps(HUGE_SCHEMA)}}, "structured_outputs"),
        ({"response_format": {"type": "structural_tag", "format": HUGE_SCHEMA}}, "response_format"),
        ({"output_config": {"format": {"type": "json_schema", "schema": HUGE_SCHEMA}}}, "output_config.format"),
        # fields under the bound one by one, over it together: the largest is named
        ({"guided_json": schema_of(BOUND // 2), "tools": [chat_tool("f", schema_of(BOUND // 2))], "tool_choice": NAMED},
         "tools"),  # the tool is the larger by its name and description
        # the token-in route's sampling parameters are judged as a request of their own
        ({"sampling_params": {"structured_outputs": {"json": HUGE_SCHEMA}}}, "sampling_params.structured_outputs"),
        ({"sampling_params": {"n": 9}}, "sampling_params.n"),
        ({"sampling_params": {"n": 2}, "prompt": ["a"] * 5}, "prompt"),
        # fan-out: best_of counts per prompt, as do the other prompt lists
        ({"prompt": ["a", "b"], "best_of": 5}, "prompt"),
        ({"prompt": [[1]] * 4, "n": 3}, "prompt"),
        ({"prompt": ["a"] * 4, "prompt_embeds": ["e"] * 5}, "prompt_embeds"),
        ({"items": ["a"] * 9, "query": "q"}, "items"),
        ({"questions": {f"q{i}": {"type": "choice"} for i in range(9)}, "state": "s"}, "questions"),
        ({"messages": [[{"role": "user", "content": "hi"}]] * 3, "n": 3}, "messages"),
        # any backend a request names: 0.7.3's field with options, 0.32.0's private one
        ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
        ({"guided_decoding_backend": "outlines:no-fallback"}, "guided_decoding_backend"),
        ({"structured_outputs": {"json": {"type": "object"}, "_backend": "outlines"}}, "structured_outputs._backend"),
        ({"structured_outputs": {"regex": "a", "backend": "guidance"}}, "structured_outputs.backend"),
        ({"sampling_params": {"guided_decoding_backend": "outlines"}}, "sampling_params.guided_decoding_backend"),
        # nesting: as a JSON string, inside a tool or a structural tag (wrapping counted), past json.loads' depth
        ({"guided_json": json.dumps(nested(DEPTH + 1))}, "guided_json"),
        ({"tools": [chat_tool("f", nested(DEPTH))], "tool_choice": NAMED}, "tools"),
        ({"structured_outputs": {"structural_tag": json.dumps(nested(DEPTH))}}, "structured_outputs"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": nested(DEPTH - 1)}}},
         "response_format"),
        ({"guided_json": "[" * 5000 + "]" * 5000}, "guided_json"),
    ],
)  # fmt: skip
def test_every_shape_of_the_same_effect_is_refused(body: dict, param: str) -> None:
    raw = json.dumps({"model": "m", **body}).encode()
    app, sent = _run(raw)
    assert _refusal(sent)["param"] == param
    assert app.bodies == []


@pytest.mark.parametrize(
    "body",
    [
        {"tools": [CHAT_TOOL], "tool_choice": {"type": "none"}},  # Anthropic's none
        {"tools": [CHAT_TOOL], "tool_choice": "NONE"},  # Cohere's
        {"tools": [], "tool_choice": "required"},  # no tools: vLLM refuses it itself
        {"tools": [chat_tool("f", schema_of(BOUND // 2))], "tool_choice": NAMED},
        {"structured_outputs": {"json_object": True}, "response_format": {"type": "json_object"}},
        {"text": {"verbosity": "low"}, "output_config": {"effort": "low"}},  # no format
        {"prompt": "a", "n": 8, "best_of": 8},
        {"prompt": ["a", "b"], "n": 4, "best_of": 4},
        {"prompt": [[1, 2], [3, 4]], "n": 4},
        {"prompt": [], "n": 8},  # no prompt at all: vLLM refuses it itself
        {"prompt": {"id": "p", "variables": {}}, "n": 8},  # the Responses API's stored prompt: one
        {"messages": [{"role": "user", "content": "hi"}] * 100, "n": 8},  # one conversation of many messages
        {"messages": [[{"role": "user", "content": "hi"}]] * 8},
        {"questions": {"a": {}, "b": {}}, "items": ["x"] * 6},
        {"sampling_params": {"n": 8, "structured_outputs": {"regex": "a+"}}, "token_ids": [1, 2]},
        {"structured_outputs": {"json": {"type": "object"}, "_backend": None}},
        {"tools": [chat_tool("f", nested(DEPTH + 20))], "tool_choice": "none"},
        {"tools": [chat_tool("f", nested(DEPTH - 4))], "tool_choice": NAMED},  # the wrapping is 4 deep
        {"guided_regex": "[" * 100, "guided_choice": ["{" * 50]},  # text that is not JSON
    ],
)  # fmt: skip
def test_what_asks_for_no_more_than_the_bounds_passes(body: dict) -> None:
    raw = json.dumps({"model": "m", **body}).encode()
    app, sent = _run(raw)
    assert app.bodies == [raw] and sent[0]["status"] == 200


# Runs inside a vLLM environment (tests/engines) after the release's own ``build(argv)``, which returns
# its OpenAI app built from vLLM's parser on ``argv``: one app with the guard (loaded by --middleware from
# roles/vllm_service/files on PYTHONPATH, as on the box) and one without. Every sweep body goes to every POST route the
# guarded app registers; each case (a route and a body that route's own request model takes) goes to both apps.
IN_APP_SCRIPT = """
import json, sys
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
{build}
clients = {{
    "guarded": TestClient(build(["--api-key", "k", "--middleware", "{guard}"]), raise_server_exceptions=False),
    "bare": TestClient(build(["--api-key", "k"]), raise_server_exceptions=False),
}}
headers = {{"Authorization": "Bearer k", "Content-Type": "application/json"}}
routes = sorted({{r.path for r in clients["guarded"].app.routes if isinstance(r, APIRoute) and "POST" in r.methods}})
def post(which, path, raw):
    answer = clients[which].post(path.replace("{{response_id}}", "resp_x"), content=raw, headers=headers)
    return [answer.status_code, answer.text[:2000]]
job = json.load(sys.stdin)
sweep = {{}}
for name, body in job["sweep"].items():
    raw = json.dumps(body)
    for path in routes:
        sweep[path + " " + name] = post("guarded", path, raw)
cases = {{}}
for name, (path, body) in job["cases"].items():
    raw = json.dumps(body)
    cases[name] = {{which: post(which, path, raw) for which in clients}}
print(json.dumps({{"routes": routes, "sweep": sweep, "cases": cases}}))
"""


def guard_fields(module) -> set:
    """Every request field the guard reads, by its top-level name."""
    return {
        module.TEMPLATE_FIELD,
        module.KWARGS_FIELD,
        module.MM_KWARGS_FIELD,
        *module.COUNT_FIELDS,
        *module.GUIDED_FIELDS,
        *module.FORMAT_FIELDS,
        module.TOOLS_FIELD,
        module.TOOL_CHOICE_FIELD,
        module.BACKEND_FIELD,
        *module.PROMPT_LIST_FIELDS,
        module.CONVERSATIONS_FIELD,
        module.QUESTIONS_FIELD,
        module.NESTED_PARAMS_FIELD,
        *module.TOKEN_ID_LIST_FIELDS,
        module.LOGIT_BIAS_FIELD,
    }


GUARD_CODES = (
    "guided_decoding_too_large",
    "guided_decoding_too_deep",
    "request_fanout_above_limit",
    "guided_decoding_backend_not_allowed",
)


def guard_param(answer: list) -> str | None:
    """The field a guard refusal names, or None when the answer is not the guard's."""
    status, text = answer
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return None
    return error.get("param") if status == 400 and error.get("code") in GUARD_CODES else None


def in_app_job(cases: dict) -> str:
    """The JSON the in-app script reads: the sweep (EFFECT_PROBES' bodies) and the release's cases."""
    sweep = {name: {"model": "m", **body} for name, (body, _param) in IN_APP_PROBES.items()}
    return json.dumps({"sweep": sweep, "cases": {name: [path, body] for name, (path, body, _) in cases.items()}})


def check_in_app(got: dict, cases: dict, reached: str) -> None:
    """Every sweep body refused on every POST route, naming its field; each case refused by the guarded app naming
    its field (or, a control, passed on) while the bare app's own request model takes it: its answer contains
    ``reached`` (what the route says when it runs without an engine)."""
    assert {"/v1/chat/completions", "/v1/completions", "/tokenize"} <= set(got["routes"]), got["routes"]
    for path in got["routes"]:
        for name, (_body, param) in EFFECT_PROBES.items():
            answer = got["sweep"][f"{path} {name}"]
            assert guard_param(answer) == param, (path, name, answer)
    for name, (_path, _body, param) in cases.items():
        answer = got["cases"][name]
        assert reached in answer["bare"][1], (name, "vLLM's own model refused it: not a control", answer["bare"])
        if param is None:
            assert reached in answer["guarded"][1], (name, answer["guarded"])
        else:
            assert guard_param(answer["guarded"]) == param, (name, answer["guarded"])


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"max_n": 0}, "vllm_service_max_n"),
        ({"max_n": "8"}, "vllm_service_max_n"),
        ({"max_n": True}, "vllm_service_max_n"),
        ({"max_guided_decoding_bytes": -1}, "vllm_service_max_guided_decoding_bytes"),
        ({"allow_request_chat_template": "no"}, "vllm_service_allow_request_chat_template"),
        ({"chat_template_kwargs_allowed": ["tokenize"]}, "vllm_service_chat_template_kwargs_allowed"),
        ({"chat_template_kwargs_allowed": "enable_thinking"}, "vllm_service_chat_template_kwargs_allowed"),
        ({"mm_processor_kwargs_allowed": ["code_revision"]}, "vllm_service_mm_processor_kwargs_allowed"),
        ({"max_batch": 1}, "unknown setting"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(settings: dict, names: str) -> None:
    with pytest.raises(guard.GuardConfigError, match=names):
        guard.check_config(settings)
    assert guard.main(["--check", json.dumps(settings)]) == 2


def test_the_settings_file_beside_the_module_is_read_and_a_missing_one_means_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "gpubox_vllm_guard.json"
    assert guard.load_config(str(path)) == guard.DEFAULTS
    path.write_text(json.dumps({"max_n": 3}))
    assert guard.load_config(str(path))["max_n"] == 3
    path.write_text("{not json")
    with pytest.raises(guard.GuardConfigError, match="not JSON"):
        guard.load_config(str(path))
    assert str(GUARD_FILE.with_suffix(".json")) == guard.CONFIG_FILE


def test_the_guard_defaults_are_the_role_defaults() -> None:
    import yaml

    role = GUARD_FILE.parents[1]
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    for key, value in guard.DEFAULTS.items():
        assert defaults[f"vllm_service_{key}"] == value, key
        assert specs[f"vllm_service_{key}"]["default"] == value, key
    assert guard.main(["--check", json.dumps(guard.DEFAULTS)]) == 0


def test_the_role_writes_the_settings_the_guard_reads() -> None:
    """The role's settings dict (vars/main.yml), templated by Ansible, passes the guard's own check unchanged."""
    from harness.ansible_vars import render

    config = render("gpu-box", "__vllm_service_guard_config", roles=("gpubox", "vllm_service"))
    # the role's knobs at their defaults, and the served model's vocabulary (Qwen2.5-14B-Instruct's config.json)
    assert guard.check_config(config) == {**guard.DEFAULTS, "vocab_size": 152064}
    config = render(
        "gpu-box", "__vllm_service_guard_config", roles=("gpubox", "vllm_service"), extra_vars={"vllm_service_max_n": 2}
    )
    assert guard.check_config(config)["max_n"] == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": [1, 2, 512], "max_tokens": 1}, "prompt"),  # one token-id prompt, an id one past the end
        ({"prompt": [[1, 2], [3, 99999]]}, "prompt"),  # a list of token-id prompts
        ({"prompt": "hi", "stop_token_ids": [2, 600], "min_tokens": 4}, "stop_token_ids"),  # CVE-2026-100654
        ({"messages": [], "allowed_token_ids": [-1]}, "allowed_token_ids"),  # negative
        ({"prompt": "hi", "logit_bias": {"513": 5}}, "logit_bias"),
        ({"sampling_params": {"stop_token_ids": [512]}}, "sampling_params.stop_token_ids"),
    ],
)
def test_a_token_id_outside_the_models_vocabulary_is_refused_naming_the_field(body: dict, field: str) -> None:
    config = guard.check_config({"vocab_size": 512})
    found = guard.refusal(json.dumps(body).encode(), config)
    assert found is not None and found.field == field and found.code == "token_id_out_of_vocabulary", found
    assert "ids 0 to 511" in found.message
    # control: without the model's vocabulary (no setting), the same body passes on as before
    assert guard.refusal(json.dumps(body).encode(), guard.check_config({})) is None


def test_token_ids_inside_the_vocabulary_and_text_prompts_pass() -> None:
    config = guard.check_config({"vocab_size": 512})
    for body in (
        {"prompt": [0, 1, 511]},
        {"prompt": [[0], [511]], "stop_token_ids": [511], "allowed_token_ids": [0, 5], "logit_bias": {"7": -100}},
        {"prompt": ["a string", "another"], "logit_bias": {"not-an-id": 1}},
        {"prompt": "text", "stop_token_ids": None},
    ):
        assert guard.refusal(json.dumps(body).encode(), config) is None, body


@pytest.mark.parametrize("vocab", [0, -5, "512", True, 1.5])
def test_a_bad_vocab_size_setting_stops_the_guard_naming_it(vocab) -> None:
    with pytest.raises(guard.GuardConfigError, match="vocab_size"):
        guard.check_config({"vocab_size": vocab})
