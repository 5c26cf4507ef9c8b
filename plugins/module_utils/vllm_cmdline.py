"""Render the command line of vLLM's OpenAI-compatible server from a serving profile, per stack (gpubox_stack).

vLLM 0.7.3 (pinned-0.7.3) and vLLM 0.32.0 (lts-580) share the entry point and every fact's flag; the role knob
vllm_service_disable_log_requests renders --disable-log-requests on 0.7.3 and, inverted, --enable-log-requests on
0.32.0, which has no --disable-log-requests (desired_state_schema.KNOB_FLAGS).

Pure functions, no Ansible imports: the filter plugin (plugins/filter/gpubox_filters.py) wraps them,
tests/unit/test_vllm_args.py tests them, and tests/engines feeds their output to each stack's real
vLLM argument parser.

The command line is rendered from the desired state (the gpubox_* facts), each checked by
state_checks.py, the one validator preflight uses too, so every error names the variable to fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import desired_state_schema as schema
from ansible_collections.gpubox.gpubox.plugins.module_utils import speculative_config, state_checks

# Every flag rendered from a fact or a role knob comes from the one table (desired_state_schema.py), in its
# command-line order; a value flag is left out when null or equal to vLLM's own default (the flag's omit).
RENDERED_FLAGS = frozenset(state_checks.RENDERED_FLAGS)
SECRET_FLAGS = frozenset(state_checks.SECRET_FLAGS)

# Characters systemd passes through unquoted in ExecStart= (no whitespace, quotes, backslash,
# specifier '%', variable '$' or ';' command separator).
_SYSTEMD_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
_HOST = re.compile(r"^[A-Za-z0-9.:_-]{1,253}$")
# roles/vllm_service/files/gpubox_vllm_guard.py, loaded by vLLM's own --middleware flag: it refuses a request
# that brings its own chat template (CVE-2025-61620; roles/python_env/files/advisories.yml).
REQUEST_TEMPLATE_GUARD = "gpubox_vllm_guard.RequestTemplateGuard"


class VllmProfileError(ValueError):
    """A fact or knob that cannot be rendered; the message names the variable."""


def _fact(state: Mapping[str, Any], name: str) -> Any:
    value, error = state_checks.check(name, state.get(name, state_checks.UNSET))
    if error:
        raise VllmProfileError(error)
    return value


def _text(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def vllm_args(
    state: Mapping[str, Any],
    host: str = "0.0.0.0",
    disable_log_requests: bool = True,
    refuse_request_chat_template: bool = False,
) -> list[str]:
    """Return the arguments for ``python -m vllm.entrypoints.openai.api_server`` of the state's stack's vLLM.

    ``state`` maps gpubox_* fact names to values (the gpubox.gpubox.desired_state lookup's result, or
    the inventory's variables); every fact is checked by state_checks, the one validator, so an error
    names the variable. ``host`` is vllm_service_host; ``disable_log_requests`` the role's knob;
    ``refuse_request_chat_template`` loads REQUEST_TEMPLATE_GUARD (the role: unless
    vllm_service_allow_request_chat_template).
    """
    if not isinstance(state, Mapping):
        raise VllmProfileError(f"the desired state must be a mapping of gpubox_* facts, got {type(state).__name__}.")
    if not isinstance(host, str) or not _HOST.match(host):
        raise VllmProfileError(f"vllm_service_host must be an address or host name, got {host!r}.")
    if not isinstance(disable_log_requests, bool):
        raise VllmProfileError(
            f"vllm_service_disable_log_requests must be true or false, got {disable_log_requests!r}."
        )
    knobs = {
        "--host": host,
        "--disable-log-requests": disable_log_requests,
        "--enable-log-requests": disable_log_requests,
    }
    args: list[str] = []
    # The stack's own release decides which flags exist (desired_state_schema.Flag.stacks).
    for flag, name in schema.command_line(_fact(state, "gpubox_stack")):
        if flag.name == "--model":
            root, model_id = _fact(state, "gpubox_model_root"), _fact(state, "gpubox_model_id")
            args += ["--model", f"{root}/{model_id.rsplit('/', 1)[1]}"]
            continue
        value = _fact(state, name) if name else knobs[flag.name]
        if flag.renders == "switch":
            if bool(value) is not flag.inverted:
                args.append(flag.name)
        elif isinstance(value, Mapping):  # a JSON flag (--speculative-config): compact, keys sorted
            if name == "gpubox_speculative_config":  # a draft or EAGLE head: its published local path
                value = speculative_config.vllm_config(value, _fact(state, "gpubox_model_root"))
            args += [flag.name, json.dumps(dict(value), sort_keys=True, separators=(",", ":"))]
        elif value is not None and value not in flag.omit:
            args += [flag.name, _text(value)]
    if not isinstance(refuse_request_chat_template, bool):
        raise VllmProfileError(
            "vllm_service_allow_request_chat_template must be true or false, "
            f"got something that renders as {refuse_request_chat_template!r}."
        )
    if refuse_request_chat_template:
        args += ["--middleware", REQUEST_TEMPLATE_GUARD]
    args += _fact(state, "gpubox_vllm_extra_args")
    return args


def systemd_quote_arg(arg: str, variables: bool = True) -> str:
    """Quote one argument for a systemd ExecStart= line.

    systemd splits ExecStart= on whitespace, honours double quotes with C-style backslash escapes,
    expands ``$VAR``/``${VAR}`` (``$$`` is a literal ``$``) and ``%`` specifiers (``%%`` is a
    literal ``%``) even inside quotes; see systemd.service(5) "Command lines". Environment=
    assignments expand specifiers but not variables: pass ``variables=False`` for them.
    """
    text = str(arg)
    if "\x00" in text:
        raise VllmProfileError(f"an ExecStart argument contains a NUL byte: {text!r}.")
    text = text.replace("%", "%%")
    if variables:
        text = text.replace("$", "$$")
    if _SYSTEMD_SAFE.match(text):
        return text
    escaped = (
        text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
    )
    return f'"{escaped}"'


def systemd_quote(args: Sequence[Any], variables: bool = True) -> str:
    """Join arguments into one ExecStart= fragment (Environment=: variables=False), quoted for systemd."""
    if isinstance(args, (str, bytes)):
        raise VllmProfileError(f"systemd_quote expects a list of arguments, got the string {args!r}.")
    return " ".join(systemd_quote_arg(str(arg), variables) for arg in args)
