"""What every box of a fleet runs, side by side, and where a box drifts.

``compare(rows, desired)`` takes one flat mapping of facts per box (kernel, driver build, CUDA, vLLM,
model commit, ...; ``None`` where the box does not say), per box the values the inventory asks for
(only the fields it states), and optionally per box its peer group: the boxes the inventory asks to be
alike (playbooks/fleet_report.yml: the same stack on the same GPUs). A value drifts when it differs
from the desired one, or, when more than half of the box's peers that report the field agree on a
value, from that majority: a 4 x RTX 4090 group's P2P verdict and planned KV tokens, or an lts-580
group's driver and vLLM, are not drift beside a 2 x RTX 3090 group on the pinned stack. Without peer
groups every box is a peer of every other. A box that lacks a value its majority has drifts too
("missing"). ``markdown(report)`` renders the table with
each drifting value marked. Used by playbooks/fleet_report.yml through the filters in
plugins/filter/fleet_drift.py; tests/unit/test_fleet_drift.py is its test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

# Field name -> column title, in the table's order.
FIELDS: tuple[tuple[str, str], ...] = (
    ("kernel", "kernel"),
    ("driver", "driver"),
    ("driver_held", "driver held"),
    ("cuda", "CUDA"),
    ("vllm", "vLLM"),
    ("torch", "torch"),
    ("model_id", "model"),
    ("model_commit", "commit"),
    ("manifest_sha256", "manifest sha256"),
    ("p2p", "P2P"),
    ("kv_tokens_planned", "KV tokens planned"),
    ("unit_state", "vllm unit"),
    ("unit_restarts", "NRestarts"),
    ("gpu_health", "GPU health"),
    ("gateway", "gateway"),
    ("canary", "last canary"),
)
# Fields that say where a box stands rather than what it runs: shown, never compared with the majority (a box in
# maintenance, playbooks/maintenance.yml, is not drift; nor is the last canary's verdict, playbooks/rebuild.yml).
NOT_COMPARED = frozenset({"gateway", "canary"})
FIELD_NAMES = tuple(field[0] for field in FIELDS)
# Columns shown whole: the GPU column is read for its problems ("healthy (but: kernel log unreadable since ...)",
# "unhealthy: Xid 79 on ..."), which a shortened cell would cut out.
WHOLE = frozenset({"gpu_health", "gateway", "canary"})


def _norm(value: Any) -> Any:
    """Values compared as the same when they print the same (facts arrive as str or int)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return value
    return str(value)


def majority(values: list[Any]) -> Any:
    """The value more than half of the non-empty ``values`` share, else None."""
    present = [v for v in (_norm(v) for v in values) if v is not None]
    if not present:
        return None
    value, count = Counter(present).most_common(1)[0]
    return value if count * 2 > len(present) else None


def _majorities(rows: Mapping[str, Mapping[str, Any]], hosts: list[str]) -> dict[str, Any]:
    if len(hosts) < 2:
        return {}
    return {f: majority([rows[h].get(f) for h in hosts]) for f in FIELD_NAMES if f not in NOT_COMPARED}


def compare(
    rows: Mapping[str, Mapping[str, Any]],
    desired: Mapping[str, Mapping[str, Any]] | None = None,
    peers: Mapping[str, Any] | None = None,
    maintenance: list[Mapping[str, Any]] | None = None,
) -> dict:
    """Per box and field: the value and the reasons it drifts; plus the majority and a flat list.

    ``peers`` maps a box to its peer group's name (a box it does not name is in a group of its own
    name); the report's ``majority`` is then per group under ``peers`` (group -> boxes and majority),
    and its top-level ``majority`` is the whole fleet's only when there is one group."""
    if not isinstance(rows, Mapping):
        raise TypeError("rows must map each box to its facts")
    if peers is not None and not isinstance(peers, Mapping):
        raise TypeError("peers must map each box to its peer group's name")
    desired = desired or {}
    if maintenance is not None:  # None: no gateway was read, the column stays empty
        held = {str(m.get("box")): m for m in maintenance if isinstance(m, Mapping)}
        rows = {
            h: {**row, "gateway": _maintenance_cell(held[h]) if h in held else "in its pool"}
            if isinstance(row, Mapping)
            else row
            for h, row in rows.items()
        }
    hosts = sorted(rows)
    group_of = {h: str(peers.get(h, h)) if peers is not None else "" for h in hosts}
    groups: dict[str, list[str]] = {}
    for host in hosts:
        groups.setdefault(group_of[host], []).append(host)
    group_majority = {g: _majorities(rows, members) for g, members in groups.items()}
    report: dict[str, Any] = {
        "fields": [list(f) for f in FIELDS],
        "majority": group_majority[group_of[hosts[0]]] if len(groups) == 1 else {},
        "hosts": {},
        "drift": [],
    }
    if peers is not None:
        report["peers"] = {g: {"hosts": members, "majority": group_majority[g]} for g, members in groups.items()}
    for host in hosts:
        majorities = group_majority[group_of[host]]
        out = {}
        for field in FIELD_NAMES:
            value = _norm(rows[host].get(field))
            reasons = []
            want = (desired.get(host) or {}).get(field)
            if want is not None and _norm(want) != value:
                reasons.append(f"desired {_norm(want)}")
            common = majorities.get(field)
            if common is not None and value != common:
                reasons.append(f"majority {common}" if value is not None else f"missing (majority {common})")
            out[field] = {"value": value, "drift": reasons}
            report["drift"].extend(f"{host}: {field} is {value}: {r}" for r in reasons)
        report["hosts"][host] = out
    return report


def _maintenance_cell(entry: Mapping[str, Any]) -> str:
    reason = str(entry.get("reason") or "").strip()
    return f"in maintenance since {entry.get('since', '?')}" + (f" ({reason})" if reason else "")


def _cell(cell: Mapping[str, Any], whole: bool = False) -> str:
    text = "-" if cell["value"] is None else str(cell["value"])
    if len(text) > 24 and not whole:
        text = text[:12] + "..." + text[-8:]
    text = text.replace("|", "\\|")
    return f"**{text}** (DRIFT: {'; '.join(cell['drift'])})".replace("|", "\\|") if cell["drift"] else text


def markdown(report: Mapping[str, Any]) -> str:
    """The report as one Markdown table (a row per box), drifting values in bold with the reason."""
    titles = [field[1] for field in report["fields"]]
    lines = ["| box | " + " | ".join(titles) + " |", "|---" * (len(titles) + 1) + "|"]
    for host, cells in report["hosts"].items():
        lines.append(f"| {host} | " + " | ".join(_cell(cells[f], f in WHOLE) for f, _title in report["fields"]) + " |")
    lines.append("")
    groups = report.get("peers") or {}
    if len(groups) > 1:
        named = "; ".join(f"{g}: {', '.join(v['hosts'])}" for g, v in groups.items())
        lines.append(f"Each box is compared with its peers' majority ({named}).")
    lines.append(f"{len(report['drift'])} drifting value(s)." if report["drift"] else "No drift.")
    return "\n".join(lines) + "\n"
