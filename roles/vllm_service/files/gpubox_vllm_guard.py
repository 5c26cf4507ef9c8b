"""ASGI middleware for vLLM 0.7.3's OpenAI server: refuse a request that brings its own chat template.

vLLM 0.7.3 renders a chat request's own Jinja template (the body's ``chat_template``, and
``chat_template_kwargs.chat_template``, which 0.7.3 merges over it) in jinja2's sandbox. The sandbox
bounds attribute access, not work, so any API-key holder can make the server render without end
(CVE-2025-61620, fixed in vLLM 0.11.0, which vLLM 0.7.3 cannot take: see
roles/python_env/files/advisories.yml). The vllm_service role loads this class with vLLM's own
``--middleware`` flag unless ``vllm_service_allow_request_chat_template`` is true.

The body is read the way FastAPI reads it for vLLM's request models (``json.loads`` of the raw bytes,
whatever the Content-Type), so an escaped key such as ``"chat\\u005ftemplate"`` is seen as what the
model sees. A body that does not parse, or is not an object, passes on: the route refuses it itself.
vLLM adds this middleware outermost, before its API-key check: a request with a template and no key
gets this 400, not a 401; the front door's body cap bounds what is parsed.

Runs inside the vLLM environment (Python 3.10 on Ubuntu 22.04): standard library only.
"""

from __future__ import annotations

import json

# Where vLLM 0.7.3 takes a template from the request (vllm/entrypoints/openai/protocol.py and
# serving_engine.py: the request's chat_template, then chat_template_kwargs merged over the call's kwargs).
TEMPLATE_FIELD = "chat_template"
KWARGS_FIELD = "chat_template_kwargs"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def refused_field(body: bytes):
    """The dotted name of the request template field ``body`` carries (not null), or None."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get(TEMPLATE_FIELD) is not None:
        return TEMPLATE_FIELD
    kwargs = data.get(KWARGS_FIELD)
    if isinstance(kwargs, dict) and kwargs.get(TEMPLATE_FIELD) is not None:
        return f"{KWARGS_FIELD}.{TEMPLATE_FIELD}"
    return None


def error_body(field: str) -> bytes:
    """OpenAI's error object, as the front door's own errors (roles/front_door) answer too."""
    message = (
        f"this server does not render a chat template sent with the request ({field}); it uses the model's own. "
        "The box's operator can allow it with vllm_service_allow_request_chat_template: true."
    )
    error = {"message": message, "type": "invalid_request_error", "param": field, "code": "request_chat_template"}
    return json.dumps({"error": error}).encode()


class RequestTemplateGuard:
    """Pure ASGI middleware (``vllm --middleware gpubox_vllm_guard.RequestTemplateGuard``)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before its body arrived: nothing to answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        field = refused_field(body)
        if field is not None:
            payload = error_body(field)
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": payload})
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect a streaming answer listens for

        await self.app(scope, replay, send)
