"""The commands and YAML snippets the README's "Deploy to a real box" section and docs/day-two.md's "Changes
to the inventory" section show, read from those files: tests/integration/test_readme_commands.py checks each one,
molecule/serving/operator_suite.py runs them against a box.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = (("README.md", "## Deploy to a real box"), ("docs/day-two.md", "## Changes to the inventory"))


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def blocks(text: str) -> list[list[str]]:
    """Indented code blocks (4+ spaces more than the surrounding text), as lists of lines."""
    found: list[list[str]] = []
    current: list[str] = []
    base = 0
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if not stripped:
            if current:
                found.append(current)
                current = []
            continue
        if current and indent >= base + 4:
            current.append(line)
        elif not current and re.match(r"^(- |\w|\*\*)", stripped) and indent < base + 4:
            base = indent + 2 if stripped.startswith("- ") else (base if indent > 0 else 0)
        elif indent >= base + 4:
            current.append(line)
    if current:
        found.append(current)
    return [textwrap.dedent("\n".join(b)).splitlines() for b in found]


def readme_code(sections: tuple[tuple[str, str], ...] = SECTIONS) -> tuple[list[str], list[str]]:
    """(shell commands, YAML snippet lines) shown in ``sections`` ((file, heading) pairs; default both)."""
    commands, snippets = [], []
    for name, heading in sections:
        text = (ROOT / name).read_text()
        for block in blocks(section(text, heading)):
            if ":" in block[0].split()[0]:  # a YAML snippet: `gpu-box:`
                snippets.extend(block)
            else:
                commands.extend(re.sub(r"\s+#.*$", "", line).strip() for line in block)
    return commands, snippets
