"""Jinja2 filters of the fleet's LAN cache (roles/fleet_cache): thin wrappers over
plugins/module_utils/fleet_cache_access.py.

    {{ groups['gpu_boxes'] | gpubox.gpubox.fleet_cache_clients(hostvars, fleet_cache_allowed_networks, gathered) }}
        -> {networks, ipv4, ipv6, boxes: {box: [addresses]}, errors}
    {{ {path: text, ...} | gpubox.gpubox.fleet_cache_pinned }}   -> {zones, unsized, errors}
    {{ zone | gpubox.gpubox.fleet_cache_pinned_regex }}          -> nginx regex on "$uri|$arg_Revision"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.gpubox.plugins.module_utils import fleet_cache_access as access


def _problems(gathered: Any) -> dict[str, str]:
    """{box: why its facts could not be read} from a registered loop of delegated setup tasks."""
    out: dict[str, str] = {}
    results = gathered.get("results", []) if isinstance(gathered, Mapping) else []
    for result in results:
        if not isinstance(result, Mapping) or not (result.get("unreachable") or result.get("failed")):
            continue
        why = "unreachable" if result.get("unreachable") else "its facts could not be gathered"
        msg = " ".join(str(result.get("msg") or "").split())[:160]
        out[str(result.get("item"))] = f"{why} ({msg})" if msg else why
    return out


def fleet_cache_clients(boxes: Any, hostvars: Any, extra: Any, gathered: Any = None) -> dict[str, Any]:
    """Who may use the cache: the boxes' addresses (ansible_host, else their default IPv4/IPv6 facts) and the
    operator's extra networks, with one line per problem."""
    if isinstance(boxes, (str, bytes)) or not hasattr(boxes, "__iter__"):
        raise AnsibleFilterError("fleet_cache_clients: give the list of box names (groups['gpu_boxes'])")
    problems = _problems(gathered)
    seen = []
    for name in boxes:
        hv = hostvars.get(name) or {}
        facts = hv.get("ansible_facts") or {}
        seen.append(
            access.BoxSeen(
                name=str(name),
                ansible_host=str(hv.get("ansible_host") or name),
                default_ipv4=(facts.get("default_ipv4") or {}).get("address"),
                default_ipv6=(facts.get("default_ipv6") or {}).get("address"),
                problem=problems.get(str(name), ""),
            )
        )
    return access.clients(seen, extra)


def fleet_cache_pinned(locks: Any) -> dict[str, Any]:
    """The model lock's pinned commits as cache zones: {zones, unsized, errors}."""
    if not isinstance(locks, Mapping):
        raise AnsibleFilterError("fleet_cache_pinned: give {lock file path: its text}")
    return access.pinned({str(k): str(v) for k, v in locks.items()})


def fleet_cache_pinned_regex(zone: Any) -> str:
    try:
        return access.pinned_key_regex(zone)
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"fleet_cache_pinned_regex: {exc}") from exc


class FilterModule:
    """gpubox fleet cache filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "fleet_cache_clients": fleet_cache_clients,
            "fleet_cache_pinned": fleet_cache_pinned,
            "fleet_cache_pinned_regex": fleet_cache_pinned_regex,
        }
