"""What every box of a fleet runs, side by side, and where a box drifts.

``compare(rows, desired)`` takes one flat mapping of facts per box (kernel, driver build, CUDA, vLLM,
model commit, ...; ``None`` where the box does not say) and, per box, the values the inventory
asks for (only the fields it states). A value drifts when it differs from the desired one, or, when
more than half of the boxes that report the field agree on a value, from that majority. A box that
lacks a value the majority has drifts too ("missing"). ``markdown(report)`` renders the table with
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
)
FIELD_NAMES = tuple(field[0] for field in FIELDS)
# Columns shown whole: the GPU column is read for its problems ("healthy (but: kernel log unreadable since ...)",
# "unhealthy: Xid 79 on ..."), which a shortened cell would cut out.
WHOLE = frozenset({"gpu_health"})


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


def compare(rows: Mapping[str, Mapping[str, Any]], desired: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
    """Per box and field: the value and the reasons it drifts; plus the majority and a flat list."""
    if not isinstance(rows, Mapping):
        raise TypeError("rows must map each box to its facts")
    desired = desired or {}
    hosts = sorted(rows)
    majorities = {f: majority([rows[h].get(f) for h in hosts]) for f in FIELD_NAMES} if len(hosts) > 1 else {}
    report: dict[str, Any] = {"fields": [list(f) for f in FIELDS], "majority": majorities, "hosts": {}, "drift": []}
    for host in hosts:
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
    lines.append(f"{len(report['drift'])} drifting value(s)." if report["drift"] else "No drift.")
    return "\n".join(lines) + "\n"
