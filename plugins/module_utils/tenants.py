"""The tenants of a box's front door: who may call the API, with which keys, within which limits.

``gpubox_tenants`` (the inventory, its keys from Ansible Vault) is a list of tenants, each
``{name, keys, requests_per_s, burst, streams, body_max, models}``; the limits may be left out (DEFAULTS), and
``models`` (the served model names the tenant may use, at the gateway and at each box's front door) left out or
null means every model.
An empty list is one tenant, ``default``, whose one key is ``gpubox_api_key``, so an inventory written
before tenants existed keeps working. One typed parser (:func:`parse`) checks the list for preflight
(state_checks), the front door and the gateway alike; every problem is one line naming
``gpubox_tenants[i].field`` and the fix, and no line ever quotes a key.

The front door (roles/front_door) renders from the parsed tenants: a root-only map of
``Authorization: Bearer <key>`` to the tenant's name (:func:`nginx_key_map`: one case-sensitive regular
expression per tenant, because nginx's string keys in a map match case-insensitively), and, in its public
file, one request-rate zone, one stream count and one body cap per tenant, keyed on the tenant's name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

# The key alphabet and length of gpubox_api_key (state_checks); nothing here needs quoting in nginx's
# configuration or in HAProxy's pattern file, and only '.' and '+' mean something in a regular expression.
KEY_CHARS = r"A-Za-z0-9._~+/=:@,-"
KEY_MIN = 16
KEY_MAX = 512
_KEY_RE = re.compile(rf"^[{KEY_CHARS}]{{{KEY_MIN},{KEY_MAX}}}$")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_SIZE_RE = re.compile(r"^[1-9][0-9]{0,9}[kKmMgG]?$")
_INT_TEXT = re.compile(r"^[0-9]{1,9}$")

DEFAULT_NAME = "default"
# The limits of a tenant that does not give its own: the front door's limits before tenants existed (20
# requests/s with a burst of 40 per key, bodies up to 4m), and as many streams as vLLM runs at once by default
# (--max-num-seqs 256), so one tenant alone can still fill the engine.
DEFAULTS: dict[str, Any] = {"requests_per_s": 20, "burst": 40, "streams": 256, "body_max": "4m"}
# (low, high, example) of each integer limit.
_RANGES: dict[str, tuple[int, int, str]] = {
    "requests_per_s": (1, 100000, "20"),
    "burst": (0, 1000000, "40"),
    "streams": (1, 65535, "256"),  # nginx: "connection limit must be less 65536"
}
FIELDS = ("name", "keys", *DEFAULTS, "models")
# A served model name (state_checks' gpubox_served_model_name, vLLM --served-model-name).
SERVED_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+/-]{0,127}$")
KEY_FIX = "generate one with `openssl rand -base64 32` and keep it in Ansible Vault"


class TenantError(ValueError):
    """The tenants cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Tenant:
    """One tenant: its name, its keys (secrets) and its limits."""

    name: str
    keys: tuple[str, ...]
    requests_per_s: int
    burst: int
    streams: int
    body_max: str
    # The served model names this tenant may use; None: every model.
    models: tuple[str, ...] | None = None

    def may_use(self, served_name: str) -> bool:
        return self.models is None or served_name in self.models

    def limits(self) -> dict[str, Any]:
        """Everything but the keys (what a fact, a report or a public file may hold)."""
        out = {k: v for k, v in asdict(self).items() if k != "keys"}
        out["body_max_bytes"] = size_bytes(self.body_max)
        out["key_count"] = len(self.keys)
        out["models"] = None if self.models is None else list(self.models)
        return out


def size_bytes(size: str) -> int:
    """Bytes of an nginx size (1k = 1024; a checked size)."""
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(size[-1:].lower(), 1)
    return int(size.rstrip("kKmMgG")) * scale


def _int_field(where: str, field: str, value: Any) -> tuple[int | None, str | None]:
    low, high, example = _RANGES[field]
    if isinstance(value, str) and _INT_TEXT.match(value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        return None, f"{where}.{field} must be a whole number {low}-{high}, got {type(value).__name__}: e.g. {example}"
    if not low <= value <= high:
        return None, f"{where}.{field} must be {low}-{high}, got {value}: e.g. {example}"
    return value, None


def _one(where: str, item: Any, problems: list[str]) -> Tenant | None:
    if not isinstance(item, Mapping):
        problems.append(
            f"{where} must be a mapping {{name, keys, requests_per_s, burst, streams, body_max}}, "
            f"got {type(item).__name__}: e.g. {{name: team-a, keys: ['{{{{ vault_team_a_key }}}}']}}"
        )
        return None
    start = len(problems)
    unknown = sorted(str(k) for k in item if k not in FIELDS)
    if unknown:
        problems.append(f"{where} has unknown keys {unknown}: use only {', '.join(FIELDS)}")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        shown = repr(name)[:40] if isinstance(name, str) else type(name).__name__
        problems.append(
            f"{where}.name is {shown}: give 1-32 of a-z, 0-9, '_' and '-' starting with a letter or digit, e.g. team-a"
        )
    keys = item.get("keys")
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence) or not keys:
        problems.append(f"{where}.keys must be a non-empty list of keys (one per line in YAML): {KEY_FIX}")
        keys = []
    for k, key in enumerate(keys):
        # A key is a secret: its position is named, never its value.
        if not isinstance(key, str) or not _KEY_RE.match(key):
            problems.append(
                f"{where}.keys[{k}] must be {KEY_MIN} to {KEY_MAX} characters of letters, digits and "
                f"{KEY_CHARS[9:]} (the value is not shown): {KEY_FIX}"
            )
    if len(set(keys)) != len(keys) and all(isinstance(k, str) for k in keys):
        problems.append(f"{where}.keys lists one key twice: list each key once")
    values: dict[str, Any] = {}
    for field, default in DEFAULTS.items():
        value = item.get(field)
        if value is None:
            values[field] = default
        elif field == "body_max":
            text = value.strip() if isinstance(value, str) else str(value) if isinstance(value, int) else ""
            if isinstance(value, bool) or not _SIZE_RE.match(text):
                problems.append(
                    f"{where}.body_max is {str(value)[:20]!r}: write an nginx size above 0, e.g. 1m or 512k"
                )
            values[field] = text
        else:
            values[field], problem = _int_field(where, field, value)
            if problem:
                problems.append(problem)
    models = _models(where, item.get("models"), problems)
    if len(problems) > start:
        return None
    return Tenant(name=name, keys=tuple(keys), **values, models=models)


def _models(where: str, value: Any, problems: list[str]) -> tuple[str, ...] | None:
    """A tenant's ``models``: None (every model) or a non-empty list of served model names, each once."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or not value:
        problems.append(
            f"{where}.models must be a non-empty list of served model names (gpubox_served_model_name of the boxes "
            "serving them), or left out for every model: e.g. [qwen14b]"
        )
        return None
    for m, model in enumerate(value):
        if not isinstance(model, str) or not SERVED_NAME_RE.match(model):
            shown = repr(model)[:40] if isinstance(model, str) else type(model).__name__
            problems.append(
                f"{where}.models[{m}] is {shown}: give a served model name (letters, digits and ._:@+/-, starting "
                "with a letter or digit), e.g. qwen14b"
            )
    if len(set(map(str, value))) != len(value):
        problems.append(f"{where}.models lists one model twice: list each model once")
    return tuple(value)


def parse(value: Any, api_key: Any = None, name: str = "gpubox_tenants") -> list[Tenant]:
    """The tenants of ``value`` (the inventory's list), checked; an empty list is one tenant ``default``
    whose key is ``api_key`` (gpubox_api_key). Raises TenantError with every problem."""
    if value is None or value == "":
        value = []
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
        raise TenantError(
            [f"{name} must be a list of tenants {{name, keys, ...}}, got {type(value).__name__}: use [] for one tenant"]
        )
    if not value:
        if not isinstance(api_key, str) or not _KEY_RE.match(api_key):
            raise TenantError(
                [f"{name} is empty, so its one tenant '{DEFAULT_NAME}' uses gpubox_api_key, which is not a valid key: "
                 "set vault_gpubox_api_key in Ansible Vault"]
            )  # fmt: skip
        return [Tenant(name=DEFAULT_NAME, keys=(api_key,), **DEFAULTS)]
    problems: list[str] = []
    out = [t for i, item in enumerate(value) if (t := _one(f"{name}[{i}]", item, problems)) is not None]
    names: dict[str, int] = {}
    owner: dict[str, str] = {}
    for i, tenant in enumerate(out):
        if tenant.name in names:
            problems.append(f"{name}: two tenants are named {tenant.name}: give each tenant its own name")
        names[tenant.name] = i
        for key in tenant.keys:
            if key in owner and owner[key] != tenant.name:
                problems.append(
                    f"{name}: one key belongs to both {owner[key]} and {tenant.name} (the value is not shown): "
                    "a key names one tenant; give each its own"
                )
            owner.setdefault(key, tenant.name)
    if problems:
        raise TenantError(problems)
    problem = api_key_problem(out, api_key, name)
    if problem:
        raise TenantError([problem])
    return out


def api_key_problem(tenants: Sequence[Tenant], api_key: Any, name: str = "gpubox_tenants") -> str | None:
    """None, or the error when gpubox_api_key (valid, given) is none of the tenants' keys: readiness, the serving
    report and `make demo` call the front door with it, which would refuse them."""
    if not isinstance(api_key, str) or not api_key or any(api_key in t.keys for t in tenants):
        return None
    return (
        f"gpubox_api_key (vault_gpubox_api_key) is none of {name}' keys, and readiness, the serving report and make "
        "demo call the front door with it: add it to the keys of one tenant (e.g. a tenant named ops) or set "
        "vault_gpubox_api_key to one of the tenants' keys"
    )


def problems(value: Any, api_key: Any = None, name: str = "gpubox_tenants") -> list[str]:
    """Every problem of ``value`` as one line each ([] when the tenants can be served)."""
    try:
        parse(value, api_key, name)
    except TenantError as exc:
        return exc.problems
    return []


def _regex_literal(key: str) -> str:
    # Keys hold only KEY_CHARS: '.' and '+' are the only ones a regular expression reads as operators.
    return "".join(f"[{ch}]" if ch in ".+" else ch for ch in key)


def nginx_key_map(tenants: Sequence[Tenant]) -> list[tuple[str, str]]:
    """(map source, tenant name) lines of nginx's ``map $http_authorization``: one case-sensitive regular
    expression per tenant, anchored at both ends, matching ``Bearer <key>`` exactly as vLLM compares it.
    nginx matches a map's plain strings case-insensitively (it lowercases both sides), which would let a
    key in the wrong case in; a regular expression with ``~`` is case-sensitive."""
    return [(f"~^Bearer ({'|'.join(_regex_literal(k) for k in t.keys)})$", t.name) for t in tenants]


def public(tenants: Sequence[Tenant]) -> list[dict[str, Any]]:
    """The tenants without their keys: name, limits and how many keys each has."""
    return [t.limits() for t in tenants]


def default_public() -> list[dict[str, Any]]:
    """The one default tenant's public view, for a state whose tenants could not be read."""
    return [
        {
            "name": DEFAULT_NAME,
            **DEFAULTS,
            "body_max_bytes": size_bytes(DEFAULTS["body_max"]),
            "key_count": 1,
            "models": None,
        }
    ]


def of_state(values: Mapping[str, Any]) -> list[Tenant]:
    """The tenants the front door serves, keys included, from the desired state's checked values
    (state_checks.validate; the default tenant when gpubox_tenants is []); [] when they cannot be read
    (validate() says why)."""
    listed, key = values.get("gpubox_tenants"), values.get("gpubox_api_key")
    try:
        if isinstance(listed, list) and listed:
            return [
                Tenant(
                    **{**t, "keys": tuple(t["keys"]), "models": None if t.get("models") is None else tuple(t["models"])}
                )
                for t in listed
            ]
        return parse([], key)
    except (TenantError, TypeError, KeyError):
        return []


def limits_of_state(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The tenants without their keys (name, limits, key_count): what tasks, facts and public files may hold.
    The default tenant's limits when the tenants cannot be read (validate() refuses the state then)."""
    return public(of_state(values)) or default_public()
