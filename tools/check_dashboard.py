#!/usr/bin/env python3
"""Check a Grafana dashboard against the metric names a scrape really returned.

    python tools/check_dashboard.py DASHBOARD.json --names NAMES.txt [--skip-prefix vllm:]

NAMES.txt holds one metric name per line: the sample names of a real scrape (histograms as their
_bucket/_sum/_count series). The dashboard must be JSON with panels, and every panel query (each
target's `expr`, in rows and nested panels too) must name only metrics in NAMES.txt. A query whose top
level is `A or B` names alternatives (one metric under the names of two vLLM versions): it passes when
every metric of one alternative is in NAMES.txt; checked against the scrapes of both versions, each
alternative is proven by one of them. --skip-prefix leaves out the metrics of a source that scrape did
not cover (e.g. vLLM's, on a box without vLLM); it may be given more than once.

Exit status: 0 when every name is found, 1 when a query names a missing metric (each listed with its
panel), 2 when the dashboard or names file is unusable.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# PromQL words that look like identifiers but are not metric names.
KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "atan2", "inf", "nan",
}  # fmt: skip
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")
_GRAFANA_VAR = re.compile(r"\$\{?\w+(?::\w+)?\}?")
_DURATION = re.compile(r"^\d")
_OR = re.compile(r"\bor\b")


@dataclass(frozen=True)
class Query:
    panel: str
    expr: str


class DashboardError(Exception):
    """The dashboard or the names file cannot be checked (exit 2)."""


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, labels and strings left out)."""
    text = _GRAFANA_VAR.sub("5m", expr)
    text = _STRING.sub('""', text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word, call = match.group(1), match.group(2)
        if call or word in KEYWORDS or _DURATION.match(word):
            continue
        names.add(word)
    return names


def alternatives(expr: str) -> list[str]:
    """The operands of ``expr``'s top-level `or` (outside brackets and strings); [expr] when there is none."""
    text = _STRING.sub(lambda m: "_" * len(m.group(0)), expr)
    depth, cuts = 0, []
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and _OR.match(text, i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "_:")):
            cuts.append(i)
    parts, start = [], 0
    for cut in cuts:
        parts.append(expr[start:cut])
        start = cut + 2
    parts.append(expr[start:])
    return [part.strip() for part in parts]


def _panels(panels: list) -> Iterator[dict]:
    for panel in panels or []:
        if isinstance(panel, dict):
            yield panel
            yield from _panels(panel.get("panels") or [])


def queries(dashboard: dict) -> list[Query]:
    """Every target expression of every panel (rows' nested panels included)."""
    if not isinstance(dashboard, dict) or not isinstance(dashboard.get("panels"), list):
        raise DashboardError("not a Grafana dashboard: no top-level 'panels' list")
    out = []
    for panel in _panels(dashboard["panels"]):
        title = str(panel.get("title") or f"panel {panel.get('id', '?')}")
        for target in panel.get("targets") or []:
            expr = target.get("expr") if isinstance(target, dict) else None
            if isinstance(expr, str) and expr.strip():
                out.append(Query(title, expr))
    return out


def missing(dashboard: dict, names: set[str], skip_prefixes: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(panel, metric) for every metric a query names that is not in ``names``."""
    found = queries(dashboard)
    if not found:
        raise DashboardError("the dashboard has no panel queries")
    out = []
    for query in found:
        lacking = []
        for alternative in alternatives(query.expr):
            lack = [n for n in sorted(metric_names(alternative)) if n not in names and not n.startswith(skip_prefixes)]
            if not lack:
                break
            lacking += lack
        else:
            out += [(query.panel, name) for name in lacking]
    return out


def read_names(path: Path) -> set[str]:
    names = {line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}
    if not names:
        raise DashboardError(f"{path}: no metric names (one per line expected)")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dashboard", type=Path)
    ap.add_argument("--names", type=Path, required=True, help="scraped metric names, one per line")
    ap.add_argument("--skip-prefix", action="append", default=[], help="leave out metrics with this prefix")
    args = ap.parse_args(argv)
    try:
        try:
            dashboard = json.loads(args.dashboard.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DashboardError(f"{args.dashboard}: not readable JSON: {exc}") from exc
        try:
            names = read_names(args.names)
        except OSError as exc:
            raise DashboardError(f"{args.names}: {exc}") from exc
        problems = missing(dashboard, names, tuple(args.skip_prefix))
    except DashboardError as exc:
        print(f"check_dashboard: {exc}", file=sys.stderr)
        return 2
    checked = len(queries(dashboard))
    for panel, name in problems:
        print(f"check_dashboard: panel {panel!r} queries {name}, which the scrape ({args.names}) did not return")
    if problems:
        return 1
    print(f"check_dashboard: {checked} queries of {args.dashboard.name} name only scraped metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
