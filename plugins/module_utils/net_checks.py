"""Network lists (CIDR) of the front door, the firewall and the scrape networks: one checker.

Pure functions on the standard library's ``ipaddress``: state_checks.py uses :func:`networks` for the
fact ``gpubox_scrape_networks``; the filter ``gpubox.gpubox.network_errors`` uses it for the roles'
own network knobs (firewall, front_door). Every problem is one line naming the variable and the fix.
"""

from __future__ import annotations

import ipaddress
from typing import Any


class NetworkError(ValueError):
    """A network list that cannot be used; the message names the variable and the fix."""


def networks(name: str, value: Any) -> list[str]:
    """Normalize a list of networks ('10.0.0.0/8', '192.0.2.7' = /32, '2001:db8::/32') or raise NetworkError.

    Host bits must be zero ('10.1.2.3/8' is refused, naming the network it probably means), so a typo
    does not silently open a larger or different range.
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise NetworkError(
            f"{name} must be a list of networks in CIDR notation, got {str(value)[:60]!r}: e.g. ['10.0.0.0/8']"
        )
    out: list[str] = []
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise NetworkError(f"{name}[{index}] must be a network in CIDR notation, got {item!r}: e.g. 10.0.0.0/8")
        text = item.strip()
        try:
            net = ipaddress.ip_network(text, strict=True)
        except ValueError:
            try:
                loose = ipaddress.ip_network(text, strict=False)
            except ValueError:
                raise NetworkError(
                    f"{name}[{index}] is {text!r}, not a network in CIDR notation: e.g. 10.0.0.0/8 or 2001:db8::/32"
                ) from None
            raise NetworkError(
                f"{name}[{index}] is {text!r}, which has host bits set: write {loose} (or the address alone for /32)"
            ) from None
        if str(net) not in out:
            out.append(str(net))
    return out


def split_families(nets: list[str]) -> dict[str, list[str]]:
    """{'ipv4': [...], 'ipv6': [...]} of already normalized networks (nftables matches each family apart)."""
    out: dict[str, list[str]] = {"ipv4": [], "ipv6": []}
    for net in nets:
        out["ipv6" if ":" in net else "ipv4"].append(net)
    return out


def _port(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise NetworkError(f"{where} must be a port number 1-65535, got {str(value)[:20]!r}")
    port = int(str(value).strip())
    if not 1 <= port <= 65535:
        raise NetworkError(f"{where} must be a port number 1-65535, got {port}")
    return port


def port_rules(name: str, value: Any) -> list[dict[str, Any]]:
    """Normalize a list of {port, proto (tcp|udp, default tcp), networks, comment} or raise NetworkError."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise NetworkError(f"{name} must be a list of {{port, proto, networks, comment}}, got {str(value)[:60]!r}")
    out = []
    for index, rule in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(rule, dict) or "port" not in rule or "networks" not in rule:
            raise NetworkError(
                f"{where} must be a mapping with port and networks, e.g. {{port: 8080, networks: [10.0.0.0/8]}}"
            )
        unknown = sorted(set(rule) - {"port", "proto", "networks", "comment"})
        if unknown:
            raise NetworkError(f"{where} has unknown keys {unknown}: use port, proto, networks, comment")
        proto = rule.get("proto", "tcp")
        if proto not in ("tcp", "udp"):
            raise NetworkError(f"{where}.proto must be tcp or udp, got {str(proto)[:20]!r}")
        comment = str(rule.get("comment", ""))
        if any(ch in comment for ch in "\n\r\x00"):
            raise NetworkError(f"{where}.comment must be one line")
        out.append(
            {
                "port": _port(f"{where}.port", rule["port"]),
                "proto": proto,
                "networks": networks(f"{where}.networks", rule["networks"]),
                "comment": comment,
            }
        )
    return out


def ports(name: str, value: Any) -> list[int]:
    """Normalize a list of port numbers or raise NetworkError."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise NetworkError(f"{name} must be a list of port numbers, got {str(value)[:60]!r}: e.g. [9100]")
    return [_port(f"{name}[{index}]", item) for index, item in enumerate(value)]


def ssh_connection(text: Any) -> dict[str, Any]:
    """OpenSSH's SSH_CONNECTION on the box ('client address, client port, box address, box port') as
    {'client': address, 'port': the box's port}, or {} when it is not that (another connection, or unset)."""
    fields = str(text or "").split()
    if len(fields) != 4 or not fields[3].isdigit():
        return {}
    try:
        client = ipaddress.ip_address(fields[0].split("%", 1)[0])
    except ValueError:
        return {}
    port = int(fields[3])
    if not 1 <= port <= 65535:
        return {}
    mapped = getattr(client, "ipv4_mapped", None)
    return {"client": str(mapped or client), "port": port}


def lockout_errors(name: str, value: Any, client: Any) -> list[str]:
    """[] when the networks ``value`` (the knob ``name``) admit ``client``, the address Ansible is connected
    from; else one line naming the knob and the fix. Networks that do not parse are network_errors' to report."""
    if not client:
        return []
    try:
        nets = networks(name, value)
        address = ipaddress.ip_address(str(client))
    except (NetworkError, ValueError):
        return []
    if any(address in ipaddress.ip_network(net) for net in nets):
        return []
    return [
        f"{name} ({', '.join(nets) or 'empty'}) does not admit {address}, the address Ansible is connected from "
        f"(SSH_CONNECTION): the firewall would lock this controller out. Add {address} or its network to {name}."
    ]
