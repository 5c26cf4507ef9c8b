"""TEST ONLY: the one reader of the Markdown tables the tests hold the docs to (README's topology table, docs/facts.md's
models, docs/day-two.md's support dates)."""

from __future__ import annotations


def table(text: str, heading: str) -> list[dict[str, str]]:
    """The first table after the line ``heading`` of a Markdown text: one dict per row, keyed by the header's cells
    in their order (cells are split at " | ", so a cell may hold a bare "|")."""
    lines = text.split(f"\n{heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    header, body = rows[0], rows[2:]  # rows[1] is the |---| line
    return [dict(zip(header, cells, strict=True)) for cells in body]
