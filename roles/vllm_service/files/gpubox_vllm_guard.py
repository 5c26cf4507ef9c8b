"""ASGI middleware for vLLM 0.7.3's OpenAI server: refuse or bound what the engine's open advisories need.

vLLM 0.7.3 carries advisories fixed only in later releases (roles/python_env/files/advisories.yml lists them).
Those a request body can reach are closed or bounded here, before any route reads the body:

- a request's own Jinja template (``chat_template``, and ``chat_template_kwargs.chat_template``, which 0.7.3
  merges over it) is rendered without a work bound (CVE-2025-61620): refused unless the operator allows it;
- ``chat_template_kwargs`` is unpacked into the template call's own keyword arguments, so a key such as
  ``tokenize`` changes what the server does (CVE-2025-62426): only the names the operator allows pass, each
  with a scalar value, never a name of the call's own parameters;
- ``mm_processor_kwargs`` goes to the model's processor (CVE-2026-114053: ``code_revision`` picks the code it
  imports): only allowed names pass, none by default;
- ``n`` and ``best_of`` have no upper bound (CVE-2026-34756): a JSON integer up to a bound, nothing else;
- a guided-decoding field (``guided_json``, ``guided_regex``, ``guided_grammar``, ``guided_choice``,
  ``guided_whitespace_pattern``, ``response_format``) is compiled and cached without bound (CVE-2025-32381,
  CVE-2025-29770): each at most a bound of bytes.

The rules hold for every body on every path (``/v1/chat/completions``, ``/v1/completions``, ``/tokenize``, ...).
A refusal is an OpenAI-style 400 whose ``param`` names the field. The bounds come from the JSON file beside this
module (gpubox_vllm_guard.json, written by the vllm_service role from its variables); without it the defaults
below apply, which are the role's defaults. A file that is not valid stops vLLM at start, naming the key.

The body is read the way FastAPI reads it for vLLM's request models (``json.loads`` of the raw bytes, whatever
the Content-Type; a duplicate key's last value wins), so an escaped key such as ``"chat\\u005ftemplate"`` is seen
as what the model sees. A body that does not parse, or is not an object, passes on: the route refuses it itself.
vLLM adds this middleware outermost, before its API-key check: a refused body without a key gets this 400, not a
401; the front door's body cap bounds what is parsed. Header size is not bounded here: the HTTP parser has read
the headers before any ASGI code runs (the front door's nginx refuses an oversized header, CVE-2025-48956).

Runs inside the vLLM environment (Python 3.10 on Ubuntu 22.04): standard library only.
"""

from __future__ import annotations

import json
import os

# Where vLLM 0.7.3 takes a template from the request (vllm/entrypoints/openai/protocol.py and
# serving_engine.py: the request's chat_template, then chat_template_kwargs merged over the call's kwargs).
TEMPLATE_FIELD = "chat_template"
KWARGS_FIELD = "chat_template_kwargs"
MM_KWARGS_FIELD = "mm_processor_kwargs"
COUNT_FIELDS = ("n", "best_of")
GUIDED_FIELDS = (
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
    "guided_whitespace_pattern",
    "response_format",
)
# Parameters of the call chat_template_kwargs is unpacked into (vLLM 0.7.3's apply_hf_chat_template and
# transformers' PreTrainedTokenizerBase.apply_chat_template): a request key with one of these names would
# change what the server does, not fill a template variable, so no setting can allow it.
# tests/vllm073 checks the list against the signatures of the pinned versions.
TEMPLATE_CALL_PARAMETERS = frozenset(
    {
        "tokenizer",
        "conversation",
        "chat_template",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "trust_remote_code",
    }
)
# Keyword arguments of transformers' from_pretrained that choose what code or files are loaded: never
# allowed in mm_processor_kwargs (CVE-2026-114053 is code_revision).
PROCESSOR_LOAD_PARAMETERS = frozenset(
    {"revision", "code_revision", "trust_remote_code", "token", "cache_dir", "local_files_only", "force_download"}
)
# The longest string a kwargs value may be (a template variable such as a reasoning effort, not a document).
MAX_KWARG_TEXT = 256
CONFIG_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpubox_vllm_guard.json")
# The vllm_service role's defaults (roles/vllm_service/defaults/main.yml; tests/unit/test_vllm_guard.py compares).
DEFAULTS = {
    "allow_request_chat_template": False,  # vllm_service_allow_request_chat_template
    "chat_template_kwargs_allowed": ["enable_thinking"],  # vllm_service_chat_template_kwargs_allowed
    "mm_processor_kwargs_allowed": [],  # vllm_service_mm_processor_kwargs_allowed
    "max_n": 8,  # vllm_service_max_n
    "max_guided_decoding_bytes": 16384,  # vllm_service_max_guided_decoding_bytes
}
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class GuardConfigError(ValueError):
    """The guard's settings are not valid; the message names the key (and the role variable)."""


def check_config(raw: object) -> dict:
    """The settings with defaults filled in, or GuardConfigError naming the first bad key."""
    if not isinstance(raw, dict):
        raise GuardConfigError(f"{CONFIG_FILE}: the settings must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise GuardConfigError(f"{CONFIG_FILE}: unknown setting(s) {unknown}; known: {sorted(DEFAULTS)}")
    config = {**DEFAULTS, **raw}
    role = "vllm_service_"
    if not isinstance(config["allow_request_chat_template"], bool):
        raise GuardConfigError(f"{role}allow_request_chat_template must be true or false")
    for key in ("max_n", "max_guided_decoding_bytes"):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GuardConfigError(f"{role}{key} must be a whole number of at least 1, got {value!r}")
    for key, reserved in (
        ("chat_template_kwargs_allowed", TEMPLATE_CALL_PARAMETERS),
        ("mm_processor_kwargs_allowed", PROCESSOR_LOAD_PARAMETERS),
    ):
        names = config[key]
        if not isinstance(names, list) or not all(isinstance(name, str) and name for name in names):
            raise GuardConfigError(f"{role}{key} must be a list of names, got {names!r}")
        bad = sorted(set(names) & reserved)
        if bad:
            raise GuardConfigError(
                f"{role}{key} names {bad}: these are parameters of the call the kwargs go to, not template or"
                " processor variables; remove them"
            )
    return config


def load_config(path: str = CONFIG_FILE) -> dict:
    """The settings from ``path`` (the role writes it), or the defaults when there is no such file."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except FileNotFoundError:
        return dict(DEFAULTS)
    except ValueError as err:
        raise GuardConfigError(f"{path}: not JSON ({err})") from None
    return check_config(raw)


class Refusal:
    """Why a body is refused: the field (OpenAI's ``param``), a code and a sentence."""

    __slots__ = ("code", "field", "message")

    def __init__(self, field: str, code: str, message: str) -> None:
        self.field, self.code, self.message = field, code, message

    def __repr__(self) -> str:
        return f"Refusal({self.field!r}, {self.code!r})"


def _size(value: object) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))


def _kwargs_refusal(data: dict, field: str, allowed: list, config: dict) -> Refusal | None:
    kwargs = data.get(field)
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        return None  # vLLM's request model refuses a non-object itself
    for key, value in kwargs.items():
        name = f"{field}.{key}"
        if field == KWARGS_FIELD and key == TEMPLATE_FIELD:
            if value is None or config["allow_request_chat_template"]:
                continue
            return _template_refusal(name)
        if key not in allowed:
            return Refusal(
                name,
                "request_kwargs_not_allowed",
                f"this server does not take {field} key {key!r}; it takes {sorted(allowed) or 'none'}. The box's"
                f" operator can allow template variables with vllm_service_{field}_allowed.",
            )
        scalar = value is None or isinstance(value, (bool, int, float))
        if not (scalar or (isinstance(value, str) and len(value) <= MAX_KWARG_TEXT)):
            return Refusal(
                name,
                "request_kwargs_value",
                f"{name} must be true, false, a number, null or a string of at most {MAX_KWARG_TEXT} characters.",
            )
    return None


def _template_refusal(field: str) -> Refusal:
    return Refusal(
        field,
        "request_chat_template",
        f"this server does not render a chat template sent with the request ({field}); it uses the model's own. "
        "The box's operator can allow it with vllm_service_allow_request_chat_template: true.",
    )


def refusal(body: bytes, config: dict | None = None) -> Refusal | None:
    """Why ``body`` is refused under ``config`` (the defaults when None), or None when it passes on."""
    config = DEFAULTS if config is None else config
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get(TEMPLATE_FIELD) is not None and not config["allow_request_chat_template"]:
        return _template_refusal(TEMPLATE_FIELD)
    found = _kwargs_refusal(data, KWARGS_FIELD, config["chat_template_kwargs_allowed"], config)
    found = found or _kwargs_refusal(data, MM_KWARGS_FIELD, config["mm_processor_kwargs_allowed"], config)
    if found:
        return found
    for field in COUNT_FIELDS:
        value = data.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value > config["max_n"]:
            return Refusal(
                field,
                "value_above_limit",
                f"{field} must be a whole number of at most {config['max_n']} on this server (it was {value!r:.40}); "
                "the box's operator sets the bound with vllm_service_max_n.",
            )
    for field in GUIDED_FIELDS:
        value = data.get(field)
        if value is None:
            continue
        size = _size(value)
        if size > config["max_guided_decoding_bytes"]:
            return Refusal(
                field,
                "guided_decoding_too_large",
                f"{field} is {size} bytes; this server takes at most {config['max_guided_decoding_bytes']}. The box's"
                " operator sets the bound with vllm_service_max_guided_decoding_bytes.",
            )
    return None


def refused_field(body: bytes, config: dict | None = None):
    """The dotted name of the field ``body`` is refused for, or None."""
    found = refusal(body, config)
    return found.field if found else None


def error_body(found: Refusal) -> bytes:
    """OpenAI's error object, as the front door's own errors (roles/front_door) answer too."""
    error = {"message": found.message, "type": "invalid_request_error", "param": found.field, "code": found.code}
    return json.dumps({"error": error}).encode()


class RequestTemplateGuard:
    """Pure ASGI middleware (``vllm --middleware gpubox_vllm_guard.RequestTemplateGuard``).

    The name is the one vLLM's command line carries (plugins/module_utils/vllm_cmdline.py); it guards more than
    templates now. The settings are read once, when vLLM builds its app.
    """

    def __init__(self, app, config: dict | None = None) -> None:
        self.app = app
        self.config = load_config() if config is None else check_config(config)

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
        found = refusal(body, self.config)
        if found is not None:
            payload = error_body(found)
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


def main(argv=None) -> int:
    """``python gpubox_vllm_guard.py --check JSON``: exit 2 naming the bad setting (the role's validation)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--check":
        print("usage: gpubox_vllm_guard.py --check SETTINGS_JSON", file=sys.stderr)
        return 2
    try:
        check_config(json.loads(args[1]))
    except (ValueError, GuardConfigError) as err:
        print(err, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
