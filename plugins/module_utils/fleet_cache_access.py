"""The fleet's LAN cache (roles/fleet_cache): who may use it, and which model files it never evicts.

Pure functions, used by the filters ``gpubox.gpubox.fleet_cache_clients`` and
``gpubox.gpubox.fleet_cache_pinned`` (plugins/filter/fleet_cache_filters.py) and so by the role's
validation and templates. Every problem is one line naming the variable (or the box, or the lock file)
and the fix.

**Clients.** By default only the fleet's boxes may use the cache: the hosts of ``gpu_boxes`` as the
inventory knows them. A box's address is its ``ansible_host`` (or its inventory name) when that is an
IP address other than loopback (loopback is a tunnel or a forwarded port, as molecule's, not where the
box connects from); otherwise the addresses the box itself reports as its default IPv4 (and IPv6) in its
gathered facts. The networks of ``fleet_cache_allowed_networks`` are added on purpose by the operator.
A network wider than the widest private range of its family (10.0.0.0/8, fc00::/7) takes in public
addresses, and a /0 every address: the cache would be an open proxy, so both are refused.

**Pinned models.** Each entry of the model lock (``OWNER/NAME@REV`` -> commit, content sha256, files,
total_bytes: plugins/module_utils/lock_file.py) gets a cache zone of its own, bounded by what the lock
says the commit holds; nothing but that commit's files can enter it, so no other traffic can evict them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import lock_file, net_checks
from ansible_collections.gpubox.gpubox.plugins.module_utils.hub_listing import is_commit

EXTRA = "fleet_cache_allowed_networks"
BOXES = "gpu_boxes"
# The widest private range of each family (RFC 1918's 10.0.0.0/8, RFC 4193's fc00::/7): anything wider
# also holds public addresses.
WIDEST_PREFIX = {4: 8, 6: 7}
MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# Room per stored file above its bytes: nginx's header in the file (key, status line, upstream headers,
# at most proxy_buffer_size) and the file system's block rounding (nginx counts blocks).
FILE_OVERHEAD = 1024 * 1024


@dataclass(frozen=True)
class BoxSeen:
    """What the controller knows of one box: its ansible_host (None: its inventory name is) and its facts."""

    name: str
    ansible_host: str | None = None
    default_ipv4: str | None = None
    default_ipv6: str | None = None
    # Why its facts could not be read (unreachable, failed), when they could not.
    problem: str = ""


def _address(text: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        address = ipaddress.ip_address(text.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def _host_net(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    return f"{address}/{address.max_prefixlen}"


def box_addresses(box: BoxSeen) -> list[str]:
    """The addresses (CIDR, one host each) to admit for one box; [] when none is known."""
    inventory = _address(box.ansible_host or box.name)
    if inventory is not None and not inventory.is_loopback and not inventory.is_unspecified:
        return [_host_net(inventory)]
    out: list[str] = []
    for text in (box.default_ipv4, box.default_ipv6):
        address = _address(text)
        if address is None or address.is_unspecified or address.is_link_local:
            continue
        if _host_net(address) not in out:
            out.append(_host_net(address))
    return out


def extra_networks(value: Any, name: str = EXTRA) -> list[str]:
    """The operator's networks, normalized; net_checks.NetworkError when one is not a network or is so wide
    that it takes in public addresses (a /0 takes in every address)."""
    nets = net_checks.networks(name, value)
    for index, text in enumerate(nets):
        net = ipaddress.ip_network(text)
        widest = WIDEST_PREFIX[net.version]
        if net.prefixlen < widest:
            what = "every address" if net.prefixlen == 0 else "public addresses too"
            raise net_checks.NetworkError(
                f"{name}[{index}] is {text}, which admits {what}: the cache would be an open proxy for them. "
                f"List the boxes' own networks (none wider than /{widest} for IPv{net.version}), or leave "
                f"{name} empty to admit the boxes of {BOXES} only"
            )
    return nets


def clients(boxes: Iterable[BoxSeen], extra: Any, name: str = EXTRA) -> dict[str, Any]:
    """Who may use the cache: {networks, ipv4, ipv6, boxes: {box: [addresses]}, errors}.

    ``networks`` lists the boxes' addresses (sorted by box) then the extra networks, each once; this
    host's loopback is not in it (the templates always admit it). ``errors`` is [] or one line per problem.
    """
    errors: list[str] = []
    per_box: dict[str, list[str]] = {}
    for box in sorted(boxes, key=lambda b: b.name):
        found = box_addresses(box)
        per_box[box.name] = found
        if not found:
            given = box.ansible_host if box.ansible_host not in (None, "") else box.name
            why = f": {box.problem}" if box.problem else ""
            errors.append(
                f"{BOXES} host {box.name} has no address the cache can admit: its ansible_host {str(given)[:60]!r} "
                f"is not an IP address of the box (a name, or loopback) and its facts name no default IPv4"
                f"{why}. Fix: set ansible_host of {box.name} to its IP address, or make it reachable so that "
                "its facts can be gathered"
            )
    try:
        extra_nets = extra_networks(extra, name)
    except net_checks.NetworkError as exc:
        errors.append(str(exc))
        extra_nets = []
    networks: list[str] = []
    for net in [n for found in per_box.values() for n in found] + extra_nets:
        if net not in networks:
            networks.append(net)
    if not per_box and not extra_nets and not errors:
        errors.append(
            f"{name} is empty and group {BOXES} has no hosts: nothing but this host's loopback could use the "
            f"cache. Fix: put the boxes in {BOXES}, or list the networks that may use it in {name}, "
            "e.g. [10.0.0.0/24]"
        )
    return {"networks": networks, **net_checks.split_families(networks), "boxes": per_box, "errors": errors}


# --------------------------------------------------------------------------- pinned models


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def zone_id(model: str, commit: str) -> str:
    """A stable name for the zone of one pinned commit (its directory and nginx zone name end with it)."""
    return hashlib.sha256(f"{model.casefold()}@{commit}".encode()).hexdigest()[:16]


def pinned(locks: Mapping[str, str]) -> dict[str, Any]:
    """The pinned commits of the model lock files ``locks`` ({path: text}): {zones, unsized, errors}.

    Each zone: {id, model, commit, files, bytes, max_size (bytes: the lock's total plus room per file),
    keys (the lock keys that name it)}; one per (model, commit), sorted. ``unsized``: lock keys whose entry
    carries no files/total_bytes (written before the lock recorded them): not pinned here, with a line
    saying so. ``errors``: a lock that cannot be read, an entry that is not OWNER/NAME@REVISION.
    """
    zones: dict[str, dict[str, Any]] = {}
    unsized: list[str] = []
    errors: list[str] = []
    for path, text in sorted(locks.items()):
        try:
            entries = lock_file.parse_lock(text, path)
        except lock_file.LockError as exc:
            errors.append(f"gpubox_model_lock_file: {exc}")
            continue
        for key, entry in sorted(entries.items()):
            model = key.rsplit("@", 1)[0]
            if not MODEL_RE.fullmatch(model):
                errors.append(
                    f"gpubox_model_lock_file: the model lock {path} has the entry {key[:80]!r}, whose model is not "
                    "OWNER/NAME (letters, digits, . _ -): remove it and run make lock-models"
                )
                continue
            files, total = _count(entry.get("files")), _count(entry.get("total_bytes"))
            if files is None or total is None:
                unsized.append(
                    f"{key} in {path} has no files/total_bytes (written before the lock recorded them): the cache "
                    "keeps it with other traffic, where it can be evicted. Fix: make lock-models"
                )
                continue
            ident = zone_id(model, entry["commit"])
            zone = zones.setdefault(
                ident,
                {"id": ident, "model": model, "commit": entry["commit"], "files": 0, "bytes": 0, "keys": []},
            )
            zone["files"], zone["bytes"] = max(zone["files"], files), max(zone["bytes"], total)
            zone["keys"].append(key)
    out = []
    for ident in sorted(zones):
        zone = zones[ident]
        out.append({**zone, "max_size": zone["bytes"] + (zone["files"] + 1) * FILE_OVERHEAD})
    return {"zones": out, "unsized": unsized, "errors": errors}


def pinned_key_regex(zone: Mapping[str, Any]) -> str:
    """The nginx regex (case-insensitive: ~*) on "$uri|$arg_Revision" for a zone's files."""
    model = str(zone["model"])
    if not MODEL_RE.fullmatch(model) or not is_commit(zone["commit"]):
        raise ValueError(f"not a pinned zone: {model!r}@{zone.get('commit')!r}")
    return "^/api/v1/models/" + re.escape(model) + "/repo\\|" + str(zone["commit"]) + "$"
