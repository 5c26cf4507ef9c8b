"""The suite's own rules (harness/policy.py): no sys.path edit outside a conftest.py, and no skip for a
missing server or tool unless docs/testing.md names it optional."""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.policy import skip_refusal, sys_path_edits

ROOT = Path(__file__).resolve().parents[2]

PLANTED = """import os, sys
sys.path.insert(0, "x")
sys.path.append(os.getcwd())
sys.path[:0] = ["a", "b"]
sys.path += ["c"]
sys.path = ["d"]
text = "sys.path.insert(0, 'a string is no edit')"
print(sys.path[0])
"""


def test_the_scanner_finds_each_form_of_edit_and_nothing_else() -> None:
    assert sys_path_edits(PLANTED) == [2, 3, 4, 5, 6]
    assert sys_path_edits("import sys\nfirst = sys.path[0]\npaths = list(sys.path)\n") == []


def test_no_tracked_python_edits_sys_path_outside_a_conftest() -> None:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [ROOT / name for name in tracked.stdout.split() if Path(name).name != "conftest.py"]
    assert len(files) > 100  # the repository's Python, not an empty listing
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in files
        if path.is_file()
        for line in sys_path_edits(path.read_text(), str(path))
    ]
    assert found == [], "import through the harness package (harness/__init__.py says how), not sys.path: " + ", ".join(
        found
    )


def test_a_skip_for_a_missing_tool_fails_and_an_optional_one_may_skip() -> None:
    assert skip_refusal("Skipped: nginx is not installed (apt-get install -y nginx)") is not None
    assert "molecule/shared/host-setup.sh" in skip_refusal("needs promtool (make promtool)")
    assert skip_refusal("Skipped: optional: no nvcc here (docs/testing.md)") is None
    assert skip_refusal("not applicable: no blocker known below 2.19") is None


def test_every_optional_skip_is_named_in_docs_testing() -> None:
    """docs/testing.md lists the dependencies a test may skip without (the README-level promise)."""
    doc = (ROOT / "docs" / "testing.md").read_text()
    for word in ("nvcc", "Python 3.12"):  # 3.12: the newest ansible-core's controller (test_ansible_core_floor)
        assert word in doc, f"docs/testing.md does not name the optional dependency {word}"
