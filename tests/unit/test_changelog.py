"""CHANGELOG.md is in Keep a Changelog form, and its newest release is the version the repo carries.

Checked: the title, then `## [Unreleased]`, then releases `## [X.Y.Z] - YYYY-MM-DD` with versions strictly
descending and real dates never increasing; under each, only Keep a Changelog's section headings
(`### Added`, `Changed`, `Deprecated`, `Removed`, `Fixed`, `Security`), each once and with at least one
entry; no development diary (issue numbers). The newest release's version equals galaxy.yml's and
pyproject.toml's.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
RELEASE_RE = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$")
DIARY_RE = re.compile(r"\bissues? \d+|(?<![\w/])#\d+\b|\bstops? \d+", re.IGNORECASE)


def changelog_problems(text: str) -> tuple[list[str], str | None]:
    """What is wrong with a changelog's form, and its newest release's version (None without one)."""
    problems: list[str] = []
    lines = text.splitlines()
    if not lines or lines[0] != "# Changelog":
        problems.append("the first line must be '# Changelog'")
    heads = [(n, line) for n, line in enumerate(lines, 1) if line.startswith("## ")]
    if not heads or heads[0][1] != "## [Unreleased]":
        problems.append("the first release heading must be '## [Unreleased]'")
    releases: list[tuple[tuple[int, int, int], datetime.date, int]] = []
    for n, line in heads[1:]:
        m = RELEASE_RE.match(line)
        if not m:
            problems.append(f"line {n}: {line!r} is not '## [X.Y.Z] - YYYY-MM-DD'")
            continue
        try:
            date = datetime.date.fromisoformat(m.group(4))
        except ValueError:
            problems.append(f"line {n}: {m.group(4)} is not a real date")
            continue
        releases.append(((int(m.group(1)), int(m.group(2)), int(m.group(3))), date, n))
    for (newer, newer_date, _), (older, older_date, n) in zip(releases, releases[1:]):
        if not older < newer:
            problems.append(f"line {n}: version {'.'.join(map(str, older))} is not older than the one above it")
        if older_date > newer_date:
            problems.append(f"line {n}: {older_date} is later than the release above it ({newer_date})")
    # Sections: only Keep a Changelog's, once per release, each with an entry.
    bounds = [n for n, _ in heads] + [len(lines) + 1]
    for (start, head), end in zip(heads, bounds[1:]):
        seen: list[str] = []
        body = lines[start : end - 1]
        for i, line in enumerate(body):
            if line.startswith("### "):
                name = line[4:]
                if name not in SECTIONS:
                    problems.append(f"{head}: section {name!r} is not one of {', '.join(SECTIONS)}")
                if name in seen:
                    problems.append(f"{head}: section {name!r} twice")
                seen.append(name)
                following = next((rest for rest in body[i + 1 :] if rest.strip()), "")
                if not following.startswith("- "):
                    problems.append(f"{head}: section {name!r} has no entry")
            elif line.startswith("- ") and not seen:
                problems.append(f"{head}: an entry outside a section: {line[:60]!r}")
        if head != "## [Unreleased]" and not seen:
            problems.append(f"{head}: a release with no section")
    for n, line in enumerate(lines, 1):
        for m in DIARY_RE.finditer(line):
            problems.append(f"line {n}: {m.group(0)!r} (issue numbers belong in commit messages)")
    newest = ".".join(map(str, releases[0][0])) if releases else None
    return problems, newest


def carried_versions() -> dict[str, str]:
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return {"galaxy.yml": str(galaxy), "pyproject.toml": str(project)}


def test_the_changelog_is_well_formed() -> None:
    problems, _ = changelog_problems((ROOT / "CHANGELOG.md").read_text())
    assert not problems, "CHANGELOG.md:\n" + "\n".join(problems)


def test_one_version_in_galaxy_pyproject_and_the_newest_release() -> None:
    _, newest = changelog_problems((ROOT / "CHANGELOG.md").read_text())
    assert newest is not None, "CHANGELOG.md has no release"
    assert carried_versions() == {"galaxy.yml": newest, "pyproject.toml": newest}, (
        f"the newest release in CHANGELOG.md is {newest}: set galaxy.yml's version and pyproject.toml's to it"
    )


def md(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def test_the_checker_finds_each_fault() -> None:
    good = md("# Changelog", "", "## [Unreleased]", "", "## [0.2.0] - 2026-11-30", "", "### Added", "- b", "",
              "## [0.1.0] - 2026-11-30", "", "### Fixed", "- a")  # fmt: skip
    assert changelog_problems(good) == ([], "0.2.0")
    bad = md("# Changes", "", "## Unreleased", "- loose (issue 22)", "", "## [0.1.0] - 2026-11-31", "", "### Added",
             "- a", "", "## [0.2.0] - 2026-12-01", "", "### New", "- b", "", "### Fixed", "", "## 0.0.9", "",
             "## [0.0.8] - 2026-12-02", "", "### Added", "- c")  # fmt: skip
    problems, newest = changelog_problems(bad)
    assert newest == "0.2.0"
    for expected in (
        "the first line must be '# Changelog'",
        "the first release heading must be '## [Unreleased]'",
        "2026-11-31 is not a real date",
        "'## 0.0.9' is not '## [X.Y.Z] - YYYY-MM-DD'",
        "2026-12-02 is later than the release above it (2026-12-01)",
        "section 'New' is not one of",
        "section 'Fixed' has no entry",
        "an entry outside a section",
        "'issue 22' (issue numbers belong in commit messages)",
    ):
        assert any(expected in p for p in problems), (expected, problems)
    swapped = md("# Changelog", "", "## [Unreleased]", "", "## [0.1.0] - 2026-11-30", "", "### Added", "- a", "",
                 "## [0.2.0] - 2026-11-29", "", "### Added", "- b")  # fmt: skip
    assert changelog_problems(swapped)[0] == ["line 10: version 0.2.0 is not older than the one above it"]
