"""The desired state of a gpubox: every fact a box is built from, and its one validator.

A fact (the GPUs expected, the model, the serving profile, the port, the key, the model root, the
environment prefix, ...) has ONE name, ``gpubox_*``, and ONE row in ``desired_state_schema.py`` (its type,
default, hint, flag), from which ``roles/gpubox/defaults/main.yml`` and ``meta/argument_specs.yml`` are
generated. This module holds no defaults: it knows how each fact is checked and normalized (FACTS: the
table's rows with their checkers). Preflight, every role that consumes a
fact (through the ``gpubox.gpubox.desired_state`` lookup or the modules), ``make plan`` and the
report use :func:`validate`, so nothing preflight accepts is refused later and nothing a role would
refuse gets past preflight.

Every problem comes back as one line naming the variable and the fix; no input raises.
Values from ``-e name=value`` arrive as strings: integer and number facts accept their decimal
spelling ("8001", "0.9"), never a float for an integer ("16.0"), a non-finite number or one
beyond the fact's range.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import desired_state_schema as schema

# vLLM 0.7.3's vocabulary comes from a leaf module (tests/unit/test_imports.py walks the imports: no cycle).
from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    model_catalog,
    net_checks,
    speculative_config,
    stacks,
    store_rules,
    tenants,
    value_text,
    vllm_words,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_words import BLOCK_SIZES

# The word lists the table's choice facts are checked against, still readable here.
DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS = vllm_words.DTYPES, vllm_words.KV_CACHE_DTYPES, vllm_words.QUANTIZATIONS

# The flags gpubox renders (plugins/module_utils/vllm_cmdline.py), and what sets each, in command-line order; and
# the single-dash aliases vLLM 0.7.3 defines for them (argparse also reads "-q awq" as "-qawq"). Both from the
# one table of the desired state (desired_state_schema.py).
RENDERED_FLAGS: dict[str, str] = schema.rendered_flags()
FLAG_ALIASES: dict[str, str] = schema.flag_aliases()
SECRET_FLAGS = ("--api-key",)
# vLLM 0.7.3 flags that change what GPU memory holds or how much a request may take, which the capacity
# planner and preflight do not model: refused in gpubox_vllm_extra_args, each with why and what to set instead
# (tests/vllm073 checks each is a real flag of vLLM 0.7.3's parser).
PLANNER_BLIND_FLAGS: dict[str, str] = {
    "--enable-chunked-prefill": "vLLM 0.7.3 turns it on by itself above 32768 tokens of context; set "
    "gpubox_max_num_batched_tokens (the profiling batch the planner sizes)",
    "--cpu-offload-gb": "it moves weights to host memory, which the planner's per-GPU weights do not count",
    "--swap-space": "it reserves host memory per GPU for preempted sequences, which preflight does not check; "
    "vLLM's default is 4 GiB",
    **dict.fromkeys(
        ("--enable-lora", "--max-loras", "--max-lora-rank", "--max-cpu-loras"),
        "LoRA adapters add weights and a profiling pass the planner does not model",
    ),
    "--num-gpu-blocks-override": "it replaces the KV-cache size the planner computes and preflight checks",
    "--speculative-model": "a draft model adds its weights and KV cache, which the planner sizes only from "
    "gpubox_speculative_config (lts-580), never from an extra argument",
}

# Directories the model store or the environment must never be (the store chmods its root) nor live
# under (pseudo and volatile filesystems, the OS itself).
SYSTEM_DIRS = frozenset(
    {"/", "/bin", "/boot", "/data", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt",
     "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/local", "/var", "/var/lib",
     "/var/tmp", "/dev/shm", "/var/log", "/var/cache"}
)  # fmt: skip
NO_TREE_UNDER = (
    "/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp", "/etc", "/boot", "/usr", "/bin", "/sbin", "/lib", "/root",
)  # fmt: skip

# The rules for an existing model store root and the directories above it (store_rules.py), read by preflight and
# the model store alike.
store_root_problem = store_rules.store_root_problem
store_ancestor_problem = store_rules.store_ancestor_problem


API_KEY_CHARS = r"A-Za-z0-9._~+/=:@,-"
API_KEY_MIN = 16
_API_KEY_RE = re.compile(rf"^[{API_KEY_CHARS}]{{{API_KEY_MIN},512}}$")
_MODEL_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9_])?"
_MODEL_ID_RE = re.compile(rf"^{_MODEL_PART}/{_MODEL_PART}$")
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_SERVED_NAME_RE = tenants.SERVED_NAME_RE  # one definition: a tenant's models name served models
_INT_TEXT = re.compile(r"^[+-]?\d{1,19}$")
_FLOAT_TEXT = re.compile(r"^[+-]?(\d{1,12}(\.\d{0,12})?|\.\d{1,12})$")
_UNSET_TEXT = ("", "none", "null", "~")


class Unset:
    """Marker for a fact that is absent from the variables."""


UNSET = Unset()


def _is_unset(value: Any) -> bool:
    return value is None or value is UNSET or (isinstance(value, str) and value.strip().lower() in _UNSET_TEXT)


# --------------------------------------------------------------------------- value checkers
# Each takes (name, value) and returns the normalized value or raises _Bad with the fix.


class _Bad(ValueError):
    pass


def _int(low: int, high: int, example: str) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        if isinstance(value, bool):
            raise _Bad(f"{name} must be an integer, got the boolean {value!r}: e.g. {example}")
        if isinstance(value, float):
            raise _Bad(
                f"{name} must be an integer, got the number {_short(value)}: "
                f"write it without a fraction, e.g. {example}"
            )
        if isinstance(value, str):
            text = value.strip()
            if not _INT_TEXT.match(text):
                raise _Bad(f"{name} must be an integer, got {_short(value)}: e.g. {example}")
            value = int(text)
        if not isinstance(value, int):
            raise _Bad(f"{name} must be an integer, got {type(value).__name__} {_short(value)}: e.g. {example}")
        if not low <= value <= high:
            raise _Bad(f"{name} must be between {low} and {high}, got {_short(value)}: e.g. {example}")
        return value

    return check


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise _Bad(f"{name} must be a number in (0, 1], got the boolean {value!r}: e.g. 0.9")
    if isinstance(value, str):
        text = value.strip()
        if not _FLOAT_TEXT.match(text):
            raise _Bad(f"{name} must be a number in (0, 1], got {_short(value)}: e.g. 0.9")
        value = float(text)
    if isinstance(value, int):
        value = float(value) if abs(value) < 2**53 else math.inf
    if not isinstance(value, float):
        raise _Bad(f"{name} must be a number in (0, 1], got {type(value).__name__} {_short(value)}: e.g. 0.9")
    if not math.isfinite(value) or not 0.0 < value <= 1.0:
        raise _Bad(f"{name} must be a number in (0, 1], got {_short(value)}: e.g. 0.9 (vLLM's default)")
    return value


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() == "true":
        return True
    if isinstance(value, str) and value.strip().lower() == "false":
        return False
    raise _Bad(f"{name} must be true or false, got {_short(value)}")


def _choice(choices: tuple[Any, ...], what: str) -> Callable[[str, Any], Any]:
    def check(name: str, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
        if isinstance(value, bool) or value not in choices:
            raise _Bad(f"{name} must be one of {', '.join(map(str, choices))} ({what}), got {_short(value)}")
        return value

    return check


def _stack(name: str, value: Any) -> str:
    try:
        return stacks.get(value.strip() if isinstance(value, str) else value).name
    except stacks.StackError:
        allowed = ", ".join(stacks.NAMES)
        raise _Bad(f"{name} must be one of {allowed}, got {_short(value)}: {stacks.allowed()}") from None


def _block_size(name: str, value: Any) -> int:
    number = _int(1, 1 << 16, "16")(name, value)
    if number not in BLOCK_SIZES:
        raise _Bad(
            f"{name} must be one of {', '.join(map(str, BLOCK_SIZES))} (CUDA paged attention in vLLM 0.7.3), "
            f"got {number}: leave it null for vLLM's 16"
        )
    return number


def _text(pattern: re.Pattern[str], fix: str) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise _Bad(f"{name} must be a string, got {type(value).__name__} {_short(value)}: {fix}")
        if not pattern.match(value):
            raise _Bad(f"{name} is {_short(value)}, which is not valid: {fix}")
        return value

    return check


def _model_id(name: str, value: Any) -> str:
    text = _text(
        _MODEL_ID_RE,
        "use the ModelScope id 'owner/name' (letters, digits, '.', '_', '-'; no '..', no other '/'), "
        "e.g. Qwen/Qwen2.5-14B-Instruct",
    )(name, value)
    if ".." in text:
        raise _Bad(f"{name} is {_short(value)}, which contains '..': use the ModelScope id 'owner/name'")
    return text


def _served_name(name: str, value: Any) -> str:
    if isinstance(value, str) and value.startswith("-"):
        raise _Bad(f"{name} is {_short(value)}, which vLLM's parser would read as a flag: use a name like qwen14b")
    return _text(
        _SERVED_NAME_RE,
        "use one word of letters, digits and ._:@+/- that starts with a letter or digit, e.g. qwen14b",
    )(name, value)


def _abs_dir(kind: str, example: str) -> Callable[[str, Any], str]:
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Bad(f"{name} must be an absolute directory path, got {_short(value)}: e.g. {example}")
        if not value.startswith("/"):
            raise _Bad(f"{name} is {_short(value)}, a relative path: use an absolute one, e.g. {example}")
        if any(ch in value for ch in "\x00\n\r\t") or any(part in (".", "..") for part in value.split("/")):
            raise _Bad(f"{name} is {_short(value)}: write it without '.', '..' or control characters, e.g. {example}")
        norm = posixpath.normpath(value)
        norm = "/" + norm.lstrip("/")
        if norm in SYSTEM_DIRS:
            raise _Bad(
                f"{name} is {norm}, a system directory that gpubox would take over ({kind}): use a directory "
                f"of its own, e.g. {example}"
            )
        for top in NO_TREE_UNDER:
            if norm.startswith(top + "/"):
                raise _Bad(
                    f"{name} is {norm}, under {top}, which is no place for {kind}: use a directory of its own, "
                    f"e.g. {example}"
                )
        return norm

    return check


def _api_key(name: str, value: Any) -> str:
    # The value is a secret: no message ever quotes it.
    if not isinstance(value, str) or not value:
        raise _Bad(
            f"{name} is empty: set vault_gpubox_api_key in Ansible Vault (`ansible-vault encrypt_string --name "
            f"vault_gpubox_api_key`); vLLM must not serve without an API key"
        )
    if not _API_KEY_RE.match(value):
        raise _Bad(
            f"{name} (from vault_gpubox_api_key) must be {API_KEY_MIN} to 512 characters of letters, digits and "
            f"{API_KEY_CHARS[9:]} (the value is not shown): generate one with `openssl rand -base64 32`"
        )
    return value


def _tenants(name: str, value: Any) -> list[dict[str, Any]]:
    """The tenants as listed (keys included); [] stays [] (the default tenant is gpubox_api_key's, added by
    :func:`tenants.of_state`). Whether gpubox_api_key is one of their keys is a cross-check."""
    if isinstance(value, (list, tuple)) and not value:
        return []
    try:
        return [asdict(t) for t in tenants.parse(value, None, name)]
    except tenants.TenantError as exc:
        raise _Bad("\n".join(exc.problems)) from None


def _model_config(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _Bad(f"{name} must be a mapping of config.json facts (or null for a catalog model), got {_short(value)}")
    try:
        return model_catalog.inventory_model("gpubox_model_id", value)
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise _Bad(str(exc)) from None


def _speculative_config(name: str, value: Any) -> dict[str, Any]:
    try:  # a draft's or EAGLE head's id and revision are checked as gpubox_model_id's and gpubox_model_revision's
        return speculative_config.parse(name, value, (_model_id, _CHECKERS["revision"]))
    except ValueError as exc:
        raise _Bad(str(exc)) from None


def stack_fact_flag_problems(values: Mapping[str, Any], stack: Any) -> list[str]:
    """Facts set for a flag the stack's vLLM release does not have (--speculative-config, --kv-cache-memory-bytes
    are 0.32's), each naming the stacks that have it."""
    if not isinstance(stack, str) or stack not in stacks.STACKS:
        return []
    problems = []
    for row in schema.ROWS:
        if not row.flag or not row.flag.stacks or stack in row.flag.stacks or values.get(row.name) is None:
            continue
        problems.append(
            f"{row.name} is set but gpubox_stack {stack} runs vLLM {stacks.STACKS[stack].vllm}, which has no "
            f"{row.flag.name}: set gpubox_stack: {' or '.join(row.flag.stacks)}, or {row.name}: null"
        )
    return problems


def _networks(name: str, value: Any) -> list[str]:
    try:
        return net_checks.networks(name, value)
    except net_checks.NetworkError as exc:
        raise _Bad(str(exc)) from None


def flag_problem(arg: str) -> str | None:
    """Why one extra vLLM argument is refused (None: it is fine).

    vLLM 0.7.3's FlexibleArgumentParser reads '--a_b' as '--a-b', and argparse accepts any unique
    prefix of a long flag ('--api-ke', '--max-model'), so a flag is refused when its spelling could
    be read as the API key or as a flag gpubox renders from a fact.
    """
    if not arg.startswith("-") or arg == "-" or arg == "--":
        return None
    head = arg.split("=", 1)[0]
    if head.startswith("--"):
        flag = "--" + head[2:].replace("_", "-")
        if len(flag) <= 2:
            return None
        for secret in SECRET_FLAGS:
            if secret.startswith(flag):
                return (
                    f"{arg!r} would be read by vLLM's parser as {secret}: the API key must never be on the "
                    "command line (ps, the journal); set vault_gpubox_api_key, the unit passes it as VLLM_API_KEY"
                )
        for rendered, source in RENDERED_FLAGS.items():
            if rendered.startswith(flag):
                return (
                    f"{arg!r} would be read by vLLM's parser as {rendered}, which gpubox renders: set {source} instead"
                )
        for blind, why in PLANNER_BLIND_FLAGS.items():
            if blind.startswith(flag):
                return f"{arg!r} would be read by vLLM's parser as {blind}, which the planner does not model: {why}"
        return None
    for alias, rendered in FLAG_ALIASES.items():
        if head.startswith(alias):
            return (
                f"{arg!r} is vLLM's {alias} ({rendered}), which gpubox renders: set {RENDERED_FLAGS[rendered]} instead"
            )
    return None


def _extra_args(name: str, value: Any) -> list[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise _Bad(f"{name} must be a list of strings, one argument per item, got {_short(value)}")
    out: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, (str, int, float)) or isinstance(item, bool):
            raise _Bad(f"{name}[{index}] must be a string, got {type(item).__name__} {_short(item)}")
        text = str(item)
        if "\x00" in text or "\n" in text:
            raise _Bad(f"{name}[{index}] contains a NUL or newline character: remove it")
        problem = flag_problem(text)
        if problem:
            raise _Bad(f"{name}[{index}]: {problem}")
        out.append(text)
    return out


def _lock_file(name: str, value: Any) -> str:
    """The model lock file on the controller: an absolute path of a file (empty: no lock)."""
    fix = "use an absolute path on the controller, e.g. inventories/production's models.lock.json, or '' for none"
    if not isinstance(value, str):
        raise _Bad(f"{name} must be a path, got {type(value).__name__} {_short(value)}: {fix}")
    if not value.startswith("/") or value.endswith("/") or any(ch in value for ch in "\x00\n\r"):
        raise _Bad(f"{name} is {_short(value)}, not an absolute file path: {fix}")
    return posixpath.normpath(value)


# --------------------------------------------------------------------------- the LAN cache (issue 8)
# gpubox_fleet_cache_url names the cache host (roles/fleet_cache) as scheme://host[:port]. Boxes derive
# every endpoint from it: the model hub and the PyPI index at that URL (nginx), apt's http proxy at the
# same host's apt-cacher-ng port. Fixed here, once, so the role and the boxes cannot disagree.
FLEET_CACHE_APT_PORT = 3142  # apt-cacher-ng's own default port (its Port: setting)
FLEET_CACHE_PYPI_PATH = "/index/"  # proxpi's simple index, behind the cache's nginx
_CACHE_URL_FIX = "use http://HOST[:PORT] of the host running roles/fleet_cache (no user, path or query), or '' for none"


def _cache_url(name: str, value: Any) -> str:
    """The LAN cache's base URL, normalized to scheme://host[:port] (no trailing slash)."""
    from urllib.parse import urlsplit

    if not isinstance(value, str):
        raise _Bad(f"{name} must be a URL string, got {type(value).__name__} {_short(value)}: {_CACHE_URL_FIX}")
    text = value.strip()
    try:
        url = urlsplit(text)
        port = url.port
        host = url.hostname
    except ValueError:
        raise _Bad(f"{name} is {_short(value)}, not a URL: {_CACHE_URL_FIX}") from None
    if url.scheme not in ("http", "https") or not host or any(ch in text for ch in " \t\n\r\x00"):
        raise _Bad(f"{name} is {_short(value)}: the cache is reached over http or https only. Fix: {_CACHE_URL_FIX}")
    if url.username is not None or url.password is not None:
        raise _Bad(
            f"{name} carries credentials ({url.scheme}://USER:...@{host}): they would land in apt's and pip's "
            f"configuration on every box. Fix: {_CACHE_URL_FIX}"
        )
    if url.path not in ("", "/") or url.query or url.fragment:
        raise _Bad(
            f"{name} is {_short(value)}: a path, query or fragment is not supported (the cache serves its "
            f"endpoints at fixed paths of its root). Fix: {_CACHE_URL_FIX}"
        )
    shown = f"[{host}]" if ":" in host else host
    return f"{url.scheme}://{shown}" + (f":{port}" if port is not None else "")


def fleet_cache_endpoints(url: str | None) -> dict[str, str]:
    """What a box uses for a (normalized) cache URL; all '' when there is no cache."""
    try:
        url = _cache_url("gpubox_fleet_cache_url", url) if url else None
    except _Bad:
        url = None  # reported by validate(); nothing is derived from a refused URL
    if not url:
        return {"apt_proxy": "", "pypi_index": "", "model_endpoint": ""}
    from urllib.parse import urlsplit

    host = urlsplit(url).netloc.rsplit("@", 1)[-1]
    host = host if host.startswith("[") else host.split(":")[0]
    return {
        "apt_proxy": f"http://{host}:{FLEET_CACHE_APT_PORT}/",
        "pypi_index": url + FLEET_CACHE_PYPI_PATH,
        "model_endpoint": url,
    }


def fleet_cache_host_problem(url: str | None, gpu_hosts: Mapping[str, Any]) -> str | None:
    """None, or the error when the cache URL names a GPU box: gpu_hosts maps each GPU box's inventory
    name to its addresses (ansible_host). A box serving the fleet's downloads would be rebuilt, drained
    and rebooted with the boxes it feeds."""
    if not url:
        return None
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    for box, addresses in sorted(gpu_hosts.items()):
        names = {str(box).lower()} | {str(a).lower() for a in (addresses or []) if a}
        if host in names:
            return (
                f"gpubox_fleet_cache_url {url} names the GPU box {box}: the cache must run on a host outside "
                "gpu_boxes (roles/fleet_cache on a plain Debian/Ubuntu host). Fix: point it at that host"
            )
    return None


def _gpu_name(name: str, value: Any) -> str:
    return _text(re.compile(r"^\S(.{0,126}\S)?$"), "use nvidia-smi's product name, e.g. 'NVIDIA GeForce RTX 3090'")(
        name, value
    )


_short = value_text.short


# --------------------------------------------------------------------------- the facts


@dataclass(frozen=True)
class Fact:
    """How one fact is checked. ``required``: null is an error (the topology group must set it)."""

    check: Callable[[str, Any], Any]
    required: bool = False
    hint: str = ""


# The checkers a row of the table names by its ``check`` (the generic ones are built from the row's fields).
_CHECKERS: dict[str, Callable[[str, Any], Any]] = {
    "gpu_name": _gpu_name,
    "model_id": _model_id,
    "revision": _text(_REVISION_RE, "use a ModelScope revision (a branch, tag or commit), e.g. master or v1.0.0"),
    "lock_file": _lock_file,  # the lock of moving revisions, on the controller (lock_file.py)
    "model_config": _model_config,
    "speculative_config": _speculative_config,
    "stack": _stack,
    "block_size": _block_size,
    "served_name": _served_name,
    "extra_args": _extra_args,
    "api_key": _api_key,
    "tenants": _tenants,  # plugins/module_utils/tenants.py: names, keys (secrets) and limits
    "model_root": _abs_dir("the model store", "/data/models"),
    "env_prefix": _abs_dir("the Python environment", "/opt/gpubox/venv"),
    "networks": _networks,
    "cache_url": _cache_url,  # the LAN cache host (roles/fleet_cache); unset or '' = every box goes upstream
    "fraction": _fraction,
    "bool": _bool,
}


def _checker(row: schema.Row) -> Callable[[str, Any], Any]:
    if row.check == "int":
        return _int(row.low, row.high, row.example)
    if row.check == "choice":
        flag = row.flag.name if row.flag else row.name
        return _choice(row.choices, f"vLLM 0.7.3 {flag}" + ("" if row.required else "; null for none"))
    return _CHECKERS[row.check]


# Every desired-state fact of the table, in its order: how it is checked, whether null is an error, the fix.
FACTS: dict[str, Fact] = {row.name: Fact(_checker(row), row.required, row.hint) for row in schema.FACT_ROWS}
SECRET_FACTS = schema.SECRET_FACTS


def check(name: str, value: Any) -> tuple[Any, str | None]:
    """Check one fact: (normalized value, None) or (value, the error line). Never raises on input."""
    fact = FACTS.get(name)
    if fact is None:
        return value, f"{name} is not a gpubox fact (known: {', '.join(sorted(FACTS))})"
    if _is_unset(value):
        if fact.required:
            return None, f"{name} is not set: {fact.hint}"
        return None, None
    try:
        return fact.check(name, value), None
    except _Bad as exc:
        return value, str(exc)
    except Exception as exc:
        return value, f"{name} could not be read ({type(exc).__name__}): {_short(value)}"


@dataclass
class State:
    """The checked desired state: normalized values, errors (one line each) and derived paths."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def model_name(self) -> str | None:
        model_id = self.values.get("gpubox_model_id")
        return model_id.rsplit("/", 1)[1] if isinstance(model_id, str) and "/" in model_id else None

    @property
    def model_dir(self) -> str | None:
        root, name = self.values.get("gpubox_model_root"), self.model_name
        return f"{root}/{name}" if isinstance(root, str) and name else None

    def public(self) -> dict[str, Any]:
        """The values without secrets, plus the derived names (what tasks and reports may show)."""
        out = {k: v for k, v in self.values.items() if k not in SECRET_FACTS}
        out["gpubox_api_key_set"] = "gpubox_api_key" in self.values and self.values["gpubox_api_key"] is not None
        out["gpubox_model_name"] = self.model_name
        out["gpubox_model_dir"] = self.model_dir
        out["gpubox_fleet_cache"] = fleet_cache_endpoints(self.values.get("gpubox_fleet_cache_url"))
        out["gpubox_tenant_limits"] = tenants.limits_of_state(self.values)
        # What the roles read of the stack (driver, CUDA, Python, pin files, engine); None when the name is wrong.
        stack = self.values.get("gpubox_stack")
        out["gpubox_stack_info"] = stacks.info(stack) if stack in stacks.STACKS else None
        out["errors"] = list(self.errors)
        return out


def stack_model_problem(model_id: Any, stack: Any) -> str | None:
    """A catalog model the stack's vLLM cannot serve (model_catalog's min_vllm), naming the stacks that serve it."""
    needed = model_catalog.min_vllm(model_id)
    if not needed or stack not in stacks.STACKS or stack in stacks.serving(needed):
        return None
    others = stacks.serving(needed)
    fix = (
        f"set gpubox_stack: {' or '.join(others)} (vLLM {stacks.STACKS[others[0]].vllm})" if others else "no stack does"
    )
    return (
        f"gpubox_model_id {model_id!r} needs vLLM >= {needed}, but gpubox_stack {stack} runs vLLM "
        f"{stacks.STACKS[stack].vllm}: {fix}, which serves it, or choose a model of the catalog this stack serves"
    )


def stack_flag_problems(extra_args: Any, stack: Any) -> list[str]:
    """Extra vLLM arguments the stack's release no longer has (desired_state_schema.REMOVED_FLAGS), by name."""
    removed = schema.REMOVED_FLAGS.get(stack, {}) if isinstance(stack, str) else {}
    if not removed or not isinstance(extra_args, list):
        return []
    found = []
    for arg in extra_args:
        if not isinstance(arg, str) or not arg.startswith("--") or flag_problem(arg):
            continue  # not a flag, or refused already (rendered, the key, planner-blind)
        flag = "--" + arg.split("=", 1)[0][2:].replace("_", "-")
        if flag in removed:
            found.append(
                f"gpubox_vllm_extra_args: {arg!r} does not exist in vLLM {stacks.STACKS[stack].vllm} (gpubox_stack "
                f"{stack}): {removed[flag]}"
            )
    return found


def stack_quantization_problem(quantization: Any, stack: Any) -> str | None:
    """A quantization method the stack's vLLM does not have (its release's words, Stack.words), by name."""
    known = stacks.STACKS[stack].words.quantizations if stack in stacks.STACKS else None
    if quantization is None or known is None or quantization in known:
        return None
    return (
        f"gpubox_model_quantization {quantization!r} is not a quantization method of vLLM {stacks.STACKS[stack].vllm} "
        f"(gpubox_stack {stack}): use one of {', '.join(known)}, or null for none"
    )


def _cross_checks(state: State) -> None:
    v = state.values
    stack = v.get("gpubox_stack")
    problem = stack_model_problem(v.get("gpubox_model_id"), stack)
    if problem:
        state.errors.append(problem)
    state.errors.extend(stack_flag_problems(v.get("gpubox_vllm_extra_args"), stack))
    quantization = stack_quantization_problem(v.get("gpubox_model_quantization"), stack)
    if quantization:
        state.errors.append(quantization)
    state.errors.extend(stack_fact_flag_problems(v, stack))
    state.errors.extend(speculative_config.store_problems(v))
    tp, pp, count = (
        v.get("gpubox_tensor_parallel_size"),
        v.get("gpubox_pipeline_parallel_size"),
        v.get("gpubox_gpu_count"),
    )
    if isinstance(tp, int) and isinstance(pp, int) and isinstance(count, int) and tp * pp > count:
        state.errors.append(
            f"gpubox_tensor_parallel_size x gpubox_pipeline_parallel_size = {tp * pp} GPUs but gpubox_gpu_count is "
            f"{count}: lower gpubox_tensor_parallel_size or fix the topology group"
        )
    batched, seqs = v.get("gpubox_max_num_batched_tokens"), v.get("gpubox_max_num_seqs")
    if isinstance(batched, int) and isinstance(seqs, int) and batched < seqs:
        state.errors.append(
            f"gpubox_max_num_batched_tokens ({batched}) must be >= gpubox_max_num_seqs ({seqs}) (vLLM 0.7.3 refuses "
            "it): raise it or leave it null"
        )
    door, port = v.get("gpubox_front_door_port"), v.get("gpubox_port")
    if v.get("gpubox_front_door_enabled") is True and isinstance(door, int) and door == port:
        state.errors.append(
            f"gpubox_front_door_port and gpubox_port are both {door}: nginx and vLLM cannot share a port; "
            "give the front door its own (e.g. 443)"
        )
    listed = v.get("gpubox_tenants")
    if isinstance(listed, list) and listed:
        if v.get("gpubox_front_door_enabled") is False:
            state.errors.append(
                "gpubox_tenants lists tenants but gpubox_front_door_enabled is false: vLLM 0.7.3 accepts one key and "
                "no limits, the front door is what tells tenants apart. Set gpubox_front_door_enabled true, or "
                "gpubox_tenants [] (one key, gpubox_api_key)"
            )
        served = tenants.of_state(v)  # [] when the list itself was refused (that error is reported already)
        problem = tenants.api_key_problem(served, v.get("gpubox_api_key")) if served else None
        if problem:
            state.errors.append(problem)
    root, prefix = v.get("gpubox_model_root"), v.get("gpubox_env_prefix")
    if (
        isinstance(root, str)
        and isinstance(prefix, str)
        and (root == prefix or root.startswith(prefix + "/") or prefix.startswith(root + "/"))
    ):
        state.errors.append(
            f"gpubox_model_root ({root}) and gpubox_env_prefix ({prefix}) overlap: keep the model store and the "
            "Python environment in separate directories"
        )


def validate(values: Mapping[str, Any]) -> State:
    """Check every fact of ``values`` (a mapping of variable names; absent facts count as unset)."""
    state = State()
    if not isinstance(values, Mapping):
        state.errors.append(f"the desired state must be a mapping of gpubox_* variables, got {type(values).__name__}")
        return state
    for name in FACTS:
        try:
            raw = values.get(name, UNSET)
        except Exception:
            raw = UNSET
        value, error = check(name, raw)
        state.values[name] = value
        if error:
            state.errors.extend(error.split("\n"))  # a list fact (gpubox_tenants) may have several problems
    # Unset, the environment is the stack's own (stacks.env_prefix): every reader, and the overlap check below,
    # sees the resolved prefix, never the raw variable.
    state.values["gpubox_env_prefix"] = stacks.env_prefix(
        state.values.get("gpubox_env_prefix"), state.values.get("gpubox_stack")
    )
    _cross_checks(state)
    return state
