"""roles/python_env/files/advisories.yml against the vLLM 0.7.3 pins, and docs/security.md's table generated from it.

The checker and generator live in roles/python_env/files/advisories.py (run it with --check / --write); the pins are
read by the role's own gpubox_pins.parse_pins, so the test sees exactly what the role installs.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

FILES = Path(__file__).resolve().parents[2] / "roles" / "python_env" / "files"

_spec = importlib.util.spec_from_file_location("gpubox_advisories", FILES / "advisories.py")
assert _spec and _spec.loader
advisories = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(advisories)


@pytest.fixture(scope="module")
def data() -> list[dict]:
    return advisories.load_advisories()


@pytest.fixture(scope="module")
def pins() -> dict[str, str | None]:
    return advisories.load_pins()


def test_no_pinned_version_is_affected_without_an_accepted_risk(data: list[dict], pins: dict) -> None:
    assert advisories.problems(data, pins) == []


def test_readme_table_is_what_the_data_generates(data: list[dict], pins: dict) -> None:
    text = advisories.README.read_text(encoding="utf-8")
    block = advisories.readme_block(text)
    assert block is not None, "docs/security.md lacks the generated advisory block"
    assert block == advisories.render_block(data, pins), (
        "docs/security.md's advisory table is stale: .venv/bin/python roles/python_env/files/advisories.py --write"
    )
    section = text.split("## Security advisories of the pinned stack", 1)[1].split("\n## ", 1)[0]
    assert block in section


def test_pins_are_read_from_the_role_files(pins: dict) -> None:
    assert pins["vllm"] == "0.7.3"
    assert pins["torch"] == "2.5.1"
    assert pins["jinja2"] is not None


def test_the_issue_packages_are_off_their_advisories(data: list[dict], pins: dict) -> None:
    # The issue's list: each is covered by the data and no longer inside an advisory's range.
    for name in ("jinja2", "h11", "urllib3", "requests", "protobuf", "aiohttp"):
        entries = [entry for entry in data if advisories.canonical(entry["package"]) == name]
        assert entries, f"no advisory recorded for {name}"
        assert not [e["id"] for e in entries if advisories.affected(e, pins[name])], name
    jinja = next(entry for entry in data if entry["id"] == "CVE-2025-27516")
    assert not advisories.affected(jinja, pins["jinja2"]), "the chat_template sandbox escape is open again"


def _entry(**fields: object) -> dict:
    base = {
        "id": "CVE-0000-0001",
        "package": "alpha",
        "affected": ["<2.0"],
        "fixed_in": "2.0",
        "what": "w",
        "url": "https://example.invalid/a",
        "status": "fixed-by-pin",
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(
    ("entry", "pins", "expected"),
    [
        (_entry(), {"alpha": "2.0"}, ""),
        (_entry(), {"alpha": "1.9"}, "no risk is accepted"),
        (_entry(affected=[">=3.0,<3.2", "<1.5"]), {"alpha": "1.4"}, "no risk is accepted"),
        (_entry(affected=["<2.0"]), {"alpha": "1.9rc1"}, "no risk is accepted"),  # pre-releases count
        (_entry(status="accepted-risk", reason="r", mitigation="m"), {"alpha": "1.9"}, ""),
        (_entry(status="accepted-risk", reason=" ", mitigation="m"), {"alpha": "1.9"}, "without a reason"),
        (_entry(status="accepted-risk", reason="r"), {"alpha": "1.9"}, "without a mitigation"),
        (_entry(status="accepted-risk", reason="r", mitigation="m"), {"alpha": "2.1"}, "stale"),
        (_entry(), {"beta": "1.0"}, "no exact pin"),
        (_entry(affected=["<<2"]), {"alpha": "1.0"}, "Invalid specifier"),
        (_entry(status="ignored"), {"alpha": "1.0"}, "is not one of"),
        (_entry(url=""), {"alpha": "1.0"}, "missing url"),
        (_entry(), {"alpha": "2.5.1+cu124"}, ""),  # a local build is its public version
    ],
)
def test_checker_rules(entry: dict, pins: dict, expected: str) -> None:
    found = advisories.problems([entry], pins)
    if expected:
        assert len(found) == 1 and expected in found[0], found
    else:
        assert found == []


def test_duplicate_ids_are_refused() -> None:
    assert any("listed twice" in line for line in advisories.problems([_entry(), _entry()], {"alpha": "2.0"}))


def test_render_marks_unverified_ranges_and_accepted_risks() -> None:
    table = advisories.render_table(
        [_entry(range_verified=False), _entry(id="CVE-0000-0002", status="accepted-risk", reason="r", mitigation="m")],
        {"alpha": "1.0"},
    )
    assert "range not checked" in table
    assert "accepted risk: r. Mitigation: m" in table


def test_cli_check_and_write(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{advisories.BEGIN}\nold\n{advisories.END}\n\nrest\n", encoding="utf-8")
    assert advisories.main(["--check", "--readme", str(readme)]) == 1
    assert advisories.main(["--write", "--readme", str(readme)]) == 0
    assert advisories.main(["--check", "--readme", str(readme)]) == 0
    assert readme.read_text(encoding="utf-8").endswith(f"{advisories.END}\n\nrest\n")
