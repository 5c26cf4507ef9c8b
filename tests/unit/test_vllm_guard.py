"""roles/vllm_service/files/gpubox_vllm_guard.py: the ASGI middleware that refuses or bounds what vLLM 0.7.3's open
advisories need (a request's own chat template, chat_template_kwargs, mm_processor_kwargs, n/best_of, guided-decoding
fields), with a 400 naming the field.

Driven here with a recording ASGI app and asyncio (the guard uses the standard library only); tests/vllm073 runs it
inside vLLM 0.7.3's own app, and molecule/serving sends such requests through the front door to a real vLLM.
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
    assert guard.check_config(config) == guard.DEFAULTS
    config = render(
        "gpu-box", "__vllm_service_guard_config", roles=("gpubox", "vllm_service"), extra_vars={"vllm_service_max_n": 2}
    )
    assert guard.check_config(config)["max_n"] == 2
