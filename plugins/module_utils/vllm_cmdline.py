"""Render the command line of vLLM 0.7.3's OpenAI-compatible server from a serving profile.

Pure functions, no Ansible imports: the filter plugin (plugins/filter/gpubox_vllm.py) wraps them,
tests/unit/test_vllm_args.py tests them, and tests/vllm073/ feeds their output to the real 0.7.3
argument parser.

The profile is a dict whose keys are the role variables without their ``vllm_service_`` prefix
(``tensor_parallel_size`` for ``vllm_service_tensor_parallel_size``), so every error names the
variable the user has to fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

VAR_PREFIX = "vllm_service_"

# Flags this renderer owns. An extra argument repeating one of them would silently win over the
# profile (argparse keeps the last value), so it is refused instead.
RENDERED_FLAGS: frozenset[str] = frozenset(
    {
        "--model",
        "--served-model-name",
        "--host",
        "--port",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--gpu-memory-utilization",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--dtype",
        "--quantization",
        "--kv-cache-dtype",
        "--block-size",
        "--enforce-eager",
        "--disable-log-requests",
    }
)
# Short aliases vLLM 0.7.3 defines for rendered flags.
FLAG_ALIASES: dict[str, str] = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-q": "--quantization",
}

# Rendered flags whose variable is not simply the flag name with underscores.
_FLAG_VARIABLE: dict[str, str] = {"--model": "model_dir"}

SECRET_FLAGS: frozenset[str] = frozenset({"--api-key"})

# Characters systemd passes through unquoted in ExecStart= (no whitespace, quotes, backslash,
# specifier '%', variable '$' or ';' command separator).
_SYSTEMD_SAFE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


class VllmProfileError(ValueError):
    """A serving profile value that cannot be rendered; the message names the variable."""


def _var(key: str) -> str:
    return f"{VAR_PREFIX}{key}"


def _is_unset(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() in ("", "None", "null"))


def _require(profile: Mapping[str, Any], key: str) -> Any:
    if key not in profile or _is_unset(profile[key]):
        raise VllmProfileError(f"{_var(key)} is required for the vLLM command line but is empty or unset.")
    return profile[key]


def _as_int(profile: Mapping[str, Any], key: str, minimum: int, maximum: int | None = None) -> int:
    value = _require(profile, key)
    if isinstance(value, bool):
        raise VllmProfileError(f"{_var(key)} must be an integer, got the boolean {value!r}.")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise VllmProfileError(f"{_var(key)} must be an integer, got {value!r}.") from None
    if number < minimum or (maximum is not None and number > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise VllmProfileError(f"{_var(key)} must be >= {minimum}{upper}, got {number}.")
    return number


def _as_optional_int(profile: Mapping[str, Any], key: str, minimum: int) -> int | None:
    if _is_unset(profile.get(key)):
        return None
    return _as_int(profile, key, minimum)


def _as_fraction(profile: Mapping[str, Any], key: str) -> float:
    value = _require(profile, key)
    try:
        number = float(str(value).strip())
    except ValueError:
        raise VllmProfileError(f"{_var(key)} must be a number in (0, 1], got {value!r}.") from None
    if not 0.0 < number <= 1.0:
        raise VllmProfileError(f"{_var(key)} must be in (0, 1], got {number}.")
    return number


def _as_bool(profile: Mapping[str, Any], key: str, default: bool) -> bool:
    value = profile.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise VllmProfileError(f"{_var(key)} must be a boolean, got {value!r}.")


def _as_word(profile: Mapping[str, Any], key: str) -> str:
    value = str(_require(profile, key)).strip()
    if not value or any(ch.isspace() for ch in value):
        raise VllmProfileError(f"{_var(key)} must be a single word without whitespace, got {value!r}.")
    return value


def _flag_name(arg: str) -> str:
    name = arg.split("=", 1)[0]
    return FLAG_ALIASES.get(name, name)


def check_extra_args(extra: Sequence[Any]) -> list[str]:
    """Return extra arguments as strings; refuse secrets and flags the profile already renders."""
    if isinstance(extra, (str, bytes)) or not isinstance(extra, Sequence):
        raise VllmProfileError(
            f"{_var('extra_args')} must be a list of strings (one argument per item), got {extra!r}."
        )
    args = [str(item) for item in extra]
    for arg in args:
        name = _flag_name(arg)
        if name in SECRET_FLAGS:
            raise VllmProfileError(
                f"{_var('extra_args')} contains {name}: the API key must never be on the command line "
                "(it would show in ps and the journal). Set vllm_service_api_key (from "
                "vault_gpubox_api_key); the unit passes it as VLLM_API_KEY from /etc/gpubox/vllm.env."
            )
        if name in RENDERED_FLAGS:
            raise VllmProfileError(
                f"{_var('extra_args')} contains {name}, which is rendered from its own variable; "
                f"set {_var(_FLAG_VARIABLE.get(name, name.lstrip('-').replace('-', '_')))} instead."
            )
    return args


def vllm_args(profile: Mapping[str, Any]) -> list[str]:
    """Return the arguments for ``python -m vllm.entrypoints.openai.api_server`` (vLLM 0.7.3).

    Required keys: model_dir, served_model_name, host, port, tensor_parallel_size,
    gpu_memory_utilization, max_model_len, max_num_seqs, dtype.
    Optional keys: pipeline_parallel_size (1), max_num_batched_tokens, quantization,
    kv_cache_dtype ("auto"), block_size, enforce_eager (False), disable_log_requests (True),
    extra_args ([]).
    """
    if not isinstance(profile, Mapping):
        raise VllmProfileError(f"the vLLM serving profile must be a mapping, got {type(profile).__name__}.")

    args: list[str] = [
        "--model",
        _as_word(profile, "model_dir"),
        "--served-model-name",
        _as_word(profile, "served_model_name"),
        "--host",
        _as_word(profile, "host"),
        "--port",
        str(_as_int(profile, "port", 1, 65535)),
        "--tensor-parallel-size",
        str(_as_int(profile, "tensor_parallel_size", 1)),
    ]
    pipeline = _as_optional_int(profile, "pipeline_parallel_size", 1) or 1
    if pipeline > 1:
        args += ["--pipeline-parallel-size", str(pipeline)]
    args += [
        "--gpu-memory-utilization",
        format(_as_fraction(profile, "gpu_memory_utilization"), "g"),
        "--max-model-len",
        str(_as_int(profile, "max_model_len", 1)),
        "--max-num-seqs",
        str(_as_int(profile, "max_num_seqs", 1)),
    ]
    batched = _as_optional_int(profile, "max_num_batched_tokens", 1)
    if batched is not None:
        args += ["--max-num-batched-tokens", str(batched)]
    args += ["--dtype", _as_word(profile, "dtype")]
    if not _is_unset(profile.get("quantization")):
        args += ["--quantization", _as_word(profile, "quantization")]
    kv_cache_dtype = profile.get("kv_cache_dtype")
    if not _is_unset(kv_cache_dtype) and str(kv_cache_dtype).strip() != "auto":
        args += ["--kv-cache-dtype", _as_word(profile, "kv_cache_dtype")]
    block_size = _as_optional_int(profile, "block_size", 1)
    if block_size is not None:
        args += ["--block-size", str(block_size)]
    if _as_bool(profile, "enforce_eager", False):
        args.append("--enforce-eager")
    if _as_bool(profile, "disable_log_requests", True):
        args.append("--disable-log-requests")
    args += check_extra_args(profile.get("extra_args") or [])
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
