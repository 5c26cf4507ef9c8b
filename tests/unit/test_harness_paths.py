"""Every path into molecule/shared or harness/ that a script, play or Makefile names exists (the simulators moved
from molecule/shared to harness/; a name left behind fails only deep in a scenario, as day2_model_suite.py's did)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# "molecule/shared/x", "harness/x" anywhere; in molecule's own files also a literal "shared/x" (a path joined onto
# molecule/). Elsewhere a bare shared/ is the brief's folder beside the repo (../shared/docs), not the harness.
NAMED = re.compile(r"(?<![\w/.-])(molecule/shared|harness)/([A-Za-z0-9_][\w.-]*)")
JOINED = re.compile(r"[\"'](shared)/([A-Za-z0-9_][\w.-]*)")


def named_paths(text: str, in_molecule: bool = True) -> list[str]:
    """The molecule/shared/<x> and harness/<x> paths ``text`` names (first component under them only)."""
    found = NAMED.findall(text) + (JOINED.findall(text) if in_molecule else [])
    return [f"{'harness' if top == 'harness' else 'molecule/shared'}/{name.rstrip('.')}" for top, name in found]


def test_the_scanner_finds_a_path_joined_onto_molecule_and_a_full_one() -> None:
    text = 'HUB = HERE.parent / "shared/hub"\ncp molecule/shared/fakegpu/x harness/live_proxies.py'
    assert sorted(named_paths(text)) == ["harness/live_proxies.py", "molecule/shared/fakegpu", "molecule/shared/hub"]
    assert named_paths(text, in_molecule=False) == ["molecule/shared/fakegpu", "harness/live_proxies.py"]
    assert named_paths("a/shared/x and sub/harness/y") == []


def test_every_path_into_the_harness_exists() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    kinds = (".py", ".yml", ".yaml", ".sh", ".j2", "Makefile", ".cfg", ".toml")
    missing = []
    for rel in tracked:
        if not rel.endswith(kinds) or rel == "tests/unit/test_harness_paths.py":
            continue
        for path in named_paths((ROOT / rel).read_text(errors="replace"), rel.startswith("molecule/")):
            if not (ROOT / path).exists():
                missing.append(f"{rel}: {path}")
    assert missing == []
