"""roles/vllm_service/files/gpubox_vllm_guard.py: the ASGI middleware that refuses a request's own chat template.

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


def _run(body: bytes | list[bytes], method: str = "POST", disconnect_early: bool = False):
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
    asyncio.run(guard.RequestTemplateGuard(app)(scope, receive, send))
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
