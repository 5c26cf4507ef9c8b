"""roles/python_env/files/advisories.yml against the vLLM 0.7.3 pins, and docs/security.md's table generated from it.

The checker and generator live in roles/python_env/files/advisories.py (run it with --check / --write); the pins are
read by the role's own gpubox_pins.parse_pins, so the test sees exactly what the role installs.
"""

from __future__ import annotations

import datetime
import importlib.util
from pathlib import Path

import pytest
import yaml

FILES = Path(__file__).resolve().parents[2] / "roles" / "python_env" / "files"

_spec = importlib.util.spec_from_file_location("gpubox_advisories", FILES / "advisories.py")
assert _spec and _spec.loader
advisories = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(advisories)
_guard_spec = importlib.util.spec_from_file_location(
    "gpubox_vllm_guard_for_advisories", FILES.parents[1] / "vllm_service" / "files" / "gpubox_vllm_guard.py"
)
assert _guard_spec and _guard_spec.loader
guard = importlib.util.module_from_spec(_guard_spec)
_guard_spec.loader.exec_module(guard)


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
    locked = advisories.lock_pins(advisories.LOCK.read_text(encoding="utf-8"))
    assert block == advisories.render_block(data, {**locked, **pins}, advisories.load_reviews()), (
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
    one = ["--stack", "pinned-0.7.3", "--readme", str(readme)]
    assert advisories.main(["--check", *one]) == 1
    assert advisories.main(["--write", *one]) == 0
    assert advisories.main(["--check", *one]) == 0
    assert advisories.main(["--check", "--readme", str(readme)]) == 1  # every stack: lts-580's block is missing
    assert readme.read_text(encoding="utf-8").endswith(f"{advisories.END}\n\nrest\n")


# --- the class: every pinned distribution reviewed within 90 days -----------------------------------------------------

REVIEWED = datetime.date(2026, 12, 4)  # the day the committed table was reviewed (issue 31)


@pytest.fixture(scope="module")
def locked() -> dict[str, str]:
    return advisories.lock_pins(advisories.LOCK.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def reviews() -> dict:
    return advisories.load_reviews()


def test_every_pin_of_the_lock_is_reviewed_within_90_days_today(reviews: dict, locked: dict) -> None:
    """The real check, on the day it runs: a pin not reviewed for 90 days fails `make test`."""
    assert advisories.review_problems(reviews, locked, datetime.date.today()) == []


def test_the_lock_is_the_whole_pin_set(locked: dict, pins: dict) -> None:
    # transitive pins (from the constraints) are in the lock, the requirements' own too
    assert len(locked) > 100
    assert {name: version for name, version in pins.items() if version} == {
        name: locked[name] for name, version in pins.items() if version
    }
    assert locked["vllm"] == "0.7.3" and locked["xgrammar"] == "0.1.11" and locked["ray"] == "2.40.0"


def test_control_the_committed_table_passes_on_its_review_day_and_90_days_later(reviews: dict, locked: dict) -> None:
    assert advisories.review_problems(reviews, locked, REVIEWED) == []
    assert advisories.review_problems(reviews, locked, REVIEWED + datetime.timedelta(days=90)) == []


def test_a_review_older_than_90_days_fails(reviews: dict, locked: dict) -> None:
    found = advisories.review_problems(reviews, locked, REVIEWED + datetime.timedelta(days=91))
    assert len(found) == len(locked), found[:3]
    assert all("more than 90" in line for line in found)


def test_a_new_pin_in_the_lock_without_a_review_fails(reviews: dict, locked: dict) -> None:
    lock = advisories.LOCK.read_text(encoding="utf-8") + "new-package==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"
    grown = advisories.lock_pins(lock)
    assert grown["new-package"] == "1.0"
    found = advisories.review_problems(reviews, grown, REVIEWED)
    assert len(found) == 1 and "new-package==1.0 is pinned but not reviewed" in found[0], found


def test_a_new_version_of_a_reviewed_pin_fails(reviews: dict, locked: dict) -> None:
    found = advisories.review_problems(reviews, {**locked, "vllm": "0.7.4"}, REVIEWED)
    assert len(found) == 1 and "vllm==0.7.4 is pinned but not reviewed (the review is of vllm==0.7.3)" in found[0]


def test_a_review_of_a_pin_that_is_gone_fails(reviews: dict, locked: dict) -> None:
    smaller = {name: version for name, version in locked.items() if name != "zipp"}
    found = advisories.review_problems(reviews, smaller, REVIEWED)
    assert found == ["reviewed: zipp==3.21.0 is no longer pinned; remove it"]


@pytest.mark.parametrize(
    ("when", "expected"),
    [("2026-12-04", "is not a date"), (datetime.date(2026, 12, 5), "after today"), (None, "is not a date")],
)
def test_a_review_date_must_be_a_past_date(when: object, expected: str) -> None:
    found = advisories.review_problems({"alpha==1.0": when}, {"alpha": "1.0"}, REVIEWED)
    assert len(found) == 1 and expected in found[0], found


def test_cli_judges_the_review_dates_on_the_given_day(tmp_path: Path) -> None:
    readme = tmp_path / "security.md"
    readme.write_text(advisories.README.read_text(encoding="utf-8"), encoding="utf-8")
    assert advisories.main(["--check", "--readme", str(readme), "--today", "2027-03-04"]) == 0
    assert advisories.main(["--check", "--readme", str(readme), "--today", "2027-03-05"]) == 1
    lock = tmp_path / "lock.txt"
    lock.write_text(advisories.LOCK.read_text(encoding="utf-8") + "new-package==1.0 --hash=sha256:" + "0" * 64 + "\n")
    args = ["--check", "--readme", str(readme), "--today", "2026-12-04"]
    assert advisories.main(args) == 0  # control: the committed lock
    assert advisories.main([*args, "--stack", "pinned-0.7.3", "--lock", str(lock)]) == 1
    with pytest.raises(SystemExit) as exited:  # --lock names one stack's file: without --stack it is refused
        advisories.main([*args, "--lock", str(lock)])
    assert exited.value.code == 2


def test_issue_31_advisories_are_listed(data: list[dict]) -> None:
    ids = {entry["id"]: entry["package"] for entry in data}
    for ident, package in {
        "CVE-2025-48956": "vllm",
        "CVE-2025-62426": "vllm",
        "CVE-2025-48887": "vllm",
        "CVE-2025-46722": "vllm",
        "CVE-2026-34756": "vllm",
        "CVE-2026-41523": "vllm",
        "CVE-2026-47155": "vllm",
        "CVE-2025-32381": "xgrammar",
        "CVE-2025-62593": "ray",
        "CVE-2025-3777": "transformers",
        "CVE-2025-3933": "transformers",
        "CVE-2025-1194": "transformers",
        "CVE-2025-2099": "transformers",
        "CVE-2025-2953": "torch",
        "CVE-2025-3730": "torch",
    }.items():
        assert ids.get(ident) == package, ident


# --- one table per stack (issue 33): lts-580's pins against the same advisories -------------------------------------


def test_every_stack_passes_its_check_on_the_review_day() -> None:
    for stack in advisories.stacks.NAMES:
        found, current, wanted = advisories.check_stack(stack, advisories.README.read_text(encoding="utf-8"), REVIEWED)
        assert found == [], (stack, found)
        assert current == wanted, f"{stack}: run advisories.py --write"


def test_lts_580_lists_every_advisory_of_its_pinned_packages_with_the_shared_facts() -> None:
    path, pin_files, lock = advisories.stack_paths("lts-580")
    shared = {entry["id"]: entry for entry in advisories.load_advisories()}
    entries = advisories.load_advisories(path)
    pins = {**advisories.lock_pins(lock.read_text(encoding="utf-8")), **advisories.load_pins(pin_files)}
    assert pins["vllm"] == "0.32.0"
    listed = {entry["id"] for entry in entries}
    for ident, entry in shared.items():
        assert (ident in listed) is (advisories.canonical(entry["package"]) in pins), ident
    for entry in entries:
        for key in ("package", "affected", "what", "url"):
            assert entry[key] == shared[entry["id"]][key], (entry["id"], key)
    assert all(entry["status"] == "fixed-by-pin" for entry in entries)


def test_control_lts_580_entries_judged_against_vllm_073_are_open() -> None:
    path, pin_files, lock = advisories.stack_paths("lts-580")
    pins = {**advisories.lock_pins(lock.read_text(encoding="utf-8")), **advisories.load_pins(pin_files)}
    found = advisories.problems(advisories.load_advisories(path), {**pins, "vllm": "0.7.3"})
    assert any("CVE-2026-48746" in line and "no risk is accepted" in line for line in found), found


def test_a_shared_entry_whose_id_is_not_in_the_shared_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "base.yml").write_text("advisories: []\n", encoding="utf-8")
    (tmp_path / "stack.yml").write_text(
        "shared: base.yml\nadvisories:\n  - id: CVE-0000-0001\n    status: fixed-by-pin\n", encoding="utf-8"
    )
    found = advisories.problems(advisories.load_advisories(tmp_path / "stack.yml"), {})
    assert found == ["CVE-0000-0001: missing package, affected, what, url"], found


# --- issue 48: an advisory a release we could pin fixes is a failure, not an accepted risk ---------------------------

DECIDED = datetime.date(2026, 12, 7)


def _vllm_entry(**fields: object) -> dict:
    """An accepted risk of vLLM 0.32.0 that 0.33.0 (the committed proposal's lock) fixes; synthetic, not a real id."""
    base = {"id": "CVE-0000-0048", "package": "vllm", "affected": ["<0.33.0"], "fixed_in": "0.33.0"}
    return _entry(**{**base, "status": "accepted-risk", "reason": "r", "mitigation": "m", **fields})


@pytest.fixture(scope="module")
def lts_pins() -> dict[str, str]:
    _, pin_files, lock = advisories.stack_paths("lts-580")
    return {**advisories.lock_pins(lock.read_text(encoding="utf-8")), **advisories.load_pins(pin_files)}


def test_a_release_we_could_pin_is_a_committed_lock_on_the_stacks_driver_branch() -> None:
    releases = advisories.pinnable("lts-580")
    assert [(release, where) for release, where, _ in releases] == [
        ("0.33.0", "proposal stack-proposal-vllm-0.33.0.yml, constraints-vllm-0.33.0.hashes.txt")
    ]
    assert releases[0][2]["vllm"] == "0.33.0" and releases[0][2]["torch"] == "2.14.0"
    # vLLM 0.32.0 (lts-580) and 0.33.0 are CUDA 13 pin sets on R580: none is a release pinned-0.7.3 (R535) could pin
    assert advisories.pinnable("pinned-0.7.3") == []


def test_control_a_lock_on_the_same_branch_counts_and_one_on_another_does_not(tmp_path: Path) -> None:
    for name, branch, release in (("a", "535", "0.8.5"), ("b", "580", "0.9.0"), ("c", "535", "0.7.2")):
        (tmp_path / f"stack-proposal-vllm-{name}.yml").write_text(
            f"stack:\n  driver_branch: '{branch}'\n  vllm: {release}\n  constraints: c-{name}.txt\n", encoding="utf-8"
        )
        (tmp_path / f"c-{name}.hashes.txt").write_text(f"vllm=={release} --hash=sha256:{'0' * 64}\n", encoding="utf-8")
    found = advisories.pinnable("pinned-0.7.3", tmp_path)
    assert [(release, where) for release, where, _ in found] == [
        ("0.8.5", "proposal stack-proposal-vllm-a.yml, c-a.hashes.txt")  # not b (R580), not c (older than 0.7.3)
    ]


def test_an_advisory_a_pinnable_release_fixes_fails_naming_it_the_stack_and_the_release(lts_pins: dict) -> None:
    entry = _vllm_entry()
    assert advisories.problems([entry], lts_pins) == []  # control: the accepted-risk rule alone lets it stand
    found = advisories.fixable_problems([entry], lts_pins, "lts-580", advisories.pinnable("lts-580"), DECIDED)
    assert len(found) == 1, found
    assert found[0].startswith("CVE-0000-0048: vllm==0.32.0 of stack lts-580 is in the affected range ['<0.33.0']")
    assert "vLLM 0.33.0, a release we could pin (proposal stack-proposal-vllm-0.33.0.yml" in found[0]
    assert "fixes it with vllm==0.33.0: move lts-580 to vLLM 0.33.0" in found[0]


@pytest.mark.parametrize(
    "fields",
    [
        {"affected": ["<0.34.0"], "fixed_in": "0.34.0"},  # only a release we cannot pin (0.34.0) fixes it
        {"affected": ["==0.32.0"], "fixed_in": None, "range_verified": False},  # no fixing release known
        {"affected": [">=0.33.0,<0.34.0"], "fixed_in": "0.34.0"},  # the pin is outside: nothing to move for
    ],
)
def test_control_no_failure_when_no_release_we_could_pin_fixes_it(fields: dict, lts_pins: dict) -> None:
    entry = _vllm_entry(**fields)
    assert advisories.fixable_problems([entry], lts_pins, "lts-580", advisories.pinnable("lts-580"), DECIDED) == []


def _lts_table(tmp_path: Path, entry: dict) -> Path:
    """lts-580's committed reviews with one more advisory entry (its own facts: no shared file in tmp_path)."""
    path = tmp_path / "advisories-lts.yml"
    reviews = advisories.load_reviews(advisories.stack_paths("lts-580")[0])
    path.write_text(yaml.safe_dump({"advisories": [entry], "reviewed": reviews}), encoding="utf-8")
    return path


def test_the_stack_check_fails_until_the_move_and_a_pending_move_holds_30_days(tmp_path: Path) -> None:
    text = advisories.README.read_text(encoding="utf-8")
    path = _lts_table(tmp_path, _vllm_entry())
    found, _, _ = advisories.check_stack("lts-580", text, DECIDED, advisories_path=path)
    assert len(found) == 1 and "of stack lts-580" in found[0] and "move lts-580 to vLLM 0.33.0" in found[0], found
    move = {"since": DECIDED, "to": "0.33.0", "reason": "the canary of 0.33.0 runs first; its parser is unchecked"}
    path = _lts_table(tmp_path, _vllm_entry(move_pending=move))
    day_30, day_31 = DECIDED + datetime.timedelta(days=30), DECIDED + datetime.timedelta(days=31)
    found, _, block = advisories.check_stack("lts-580", text, day_30, advisories_path=path)
    assert found == []
    assert "MOVE PENDING to vLLM 0.33.0 since 2026-12-07: the canary of 0.33.0 runs first" in block
    found, _, _ = advisories.check_stack("lts-580", text, day_31, advisories_path=path)
    assert len(found) == 2 and "expired 2027-01-06" in found[0] and "move lts-580 to vLLM 0.33.0" in found[1], found


@pytest.mark.parametrize(
    ("move", "fields", "expected"),
    [
        ({"to": "0.33.0", "reason": "issue 48"}, {}, "is not a date"),
        ({"since": DECIDED, "to": "0.33.0", "reason": "issue 48"}, {}, "a reason in words"),
        ({"since": DECIDED, "to": "0.33.0", "reason": "see #48"}, {}, "a reason in words"),
        ({"since": DECIDED, "to": "0.33.0", "reason": " "}, {}, "a reason in words"),
        ({"since": DECIDED, "reason": "waiting for the canary"}, {}, "names no release"),
        ({"since": DECIDED + datetime.timedelta(days=1), "to": "0.33.0", "reason": "r r"}, {}, "after today"),
        ({"since": DECIDED, "to": "0.33.0", "reason": "r r"}, {"status": "fixed-by-pin"}, "belongs to an accepted"),
        ("soon", {}, "must be a mapping"),
    ],
)
def test_a_move_pending_needs_a_date_a_release_and_a_reason_in_words(
    move: object, fields: dict, expected: str, lts_pins: dict
) -> None:
    entry = _vllm_entry(move_pending=move, **fields)
    found = advisories.fixable_problems([entry], lts_pins, "lts-580", advisories.pinnable("lts-580"), DECIDED)
    assert any(expected in line for line in found), found
    assert any("move lts-580 to vLLM 0.33.0" in line for line in found), found  # a bad move_pending holds nothing


# --- 2026-12-07: four vLLM advisories a colleague found, judged against what each record states ----------------------

FOUND_2026_12_07 = {
    "CVE-2026-105757": "accepted-risk",  # PYSEC-2026-4199: < 0.30.0
    "PYSEC-2026-4325": "accepted-risk",  # < 0.30.0
    "CVE-2026-105760": "fixed-by-pin",  # the CVE record's range starts at 0.23.0rc2
    "PYSEC-2026-4198": "accepted-risk",  # record not read: the range recorded is the pin
}


def test_the_four_vllm_advisories_of_2026_12_07_are_listed_with_their_verdicts(data: list[dict], pins: dict) -> None:
    found = {entry["id"]: entry for entry in data if entry["id"] in FOUND_2026_12_07}
    assert {ident: entry["status"] for ident, entry in found.items()} == FOUND_2026_12_07
    assert all(found[ident]["package"] == "vllm" for ident in FOUND_2026_12_07)
    assert found["PYSEC-2026-4198"]["range_verified"] is False and "fixed_in" not in found["PYSEC-2026-4198"]
    open_ones = [ident for ident, status in FOUND_2026_12_07.items() if status == "accepted-risk"]
    assert all(advisories.affected(found[ident], pins["vllm"]) for ident in open_ones)
    assert not advisories.affected(found["CVE-2026-105760"], pins["vllm"])


def _named_without_their_risks(data: list[dict], pins: dict, ids) -> list[str]:
    """The advisories the check names once ``ids`` lose their accepted risks (marked fixed by the pin): a control."""
    stripped = [{**entry, "status": "fixed-by-pin"} if entry["id"] in ids else entry for entry in data]
    return sorted(line.split(":", 1)[0] for line in advisories.problems(stripped, pins))


def test_control_without_their_accepted_risks_the_check_fails_and_a_range_from_0_would_reach_0_7_3(
    data: list[dict], pins: dict
) -> None:
    named = _named_without_their_risks(data, pins, FOUND_2026_12_07)
    assert named == ["CVE-2026-105757", "PYSEC-2026-4198", "PYSEC-2026-4325"]
    glmga = next(entry for entry in data if entry["id"] == "CVE-2026-105760")
    found = advisories.problems([{**glmga, "affected": ["<0.30.0"]}], pins)  # the text's reading, not the range's
    assert len(found) == 1 and "no risk is accepted" in found[0], found


# --- 2026-12-07, second pass: the seven records the first pass named in the reviewed: notes -------------------------

FOUND_2026_12_07_SECOND = {
    "PYSEC-2026-4000": "accepted-risk",  # < 0.30.0: bad_words; 0.7.3's server has no such field
    "PYSEC-2026-4184": "accepted-risk",  # "through 0.29.0": media read before their limits; text-only models
    "CVE-2026-105754": "accepted-risk",  # < 0.30.0: /inference/v1/generate, not in 0.7.3, 404 at the front door
    "CVE-2026-105756": "accepted-risk",  # < 0.30.0: cache_salt with LMCache-MP, neither in 0.7.3
    "CVE-2026-114051": "accepted-risk",  # < 0.31.0: /inference/v1/generate again
    "CVE-2026-92365": "accepted-risk",  # VulDB, up to 0.29.0: thinking_budget_state.py, not in 0.7.3
    "CVE-2026-105775": "accepted-risk",  # VulDB, up to 0.31.0: conv_ssm_forward, not in 0.7.3
}
VULDB_NO_FIX = ("CVE-2026-92365", "CVE-2026-105775")


def test_the_seven_vllm_records_of_the_second_pass_are_listed_with_their_verdicts(data: list[dict], pins: dict) -> None:
    found = {entry["id"]: entry for entry in data if entry["id"] in FOUND_2026_12_07_SECOND}
    assert {ident: entry["status"] for ident, entry in found.items()} == FOUND_2026_12_07_SECOND
    assert all(entry["package"] == "vllm" and advisories.affected(entry, pins["vllm"]) for entry in found.values())
    assert all("fixed_in" not in found[ident] for ident in (*VULDB_NO_FIX, "PYSEC-2026-4184"))  # none stated


def test_control_without_the_second_pass_accepted_risks_the_check_names_all_seven(data: list[dict], pins: dict) -> None:
    assert _named_without_their_risks(data, pins, FOUND_2026_12_07_SECOND) == sorted(FOUND_2026_12_07_SECOND)


def _lts_580_entries(fixed: dict) -> dict:
    """lts-580's table by id, every one of ``fixed`` in it as fixed by the pin."""
    path, _, _ = advisories.stack_paths("lts-580")
    entries = {entry["id"]: entry for entry in advisories.load_advisories(path)}
    assert all(entries[ident]["status"] == "fixed-by-pin" for ident in fixed)
    return entries


def _lts_580_named_if(entries: dict, ids, lts_pins: dict, **said) -> list[str]:
    """The advisories the check names on lts-580 had the records of ``ids`` said ``said`` (a control)."""
    found = advisories.problems([{**entries[ident], **said} for ident in ids], lts_pins)
    return sorted(line.split(":", 1)[0] for line in found)


def test_lts_580_is_outside_the_vuldb_ranges_only_as_stated_and_says_so(lts_pins: dict) -> None:
    entries = _lts_580_entries(FOUND_2026_12_07_SECOND)
    assert all("no fix" in entries[ident]["note"] for ident in VULDB_NO_FIX)
    # control: had the records named 0.32.0 as well (no fix is named), lts-580 would carry both open
    assert _lts_580_named_if(entries, VULDB_NO_FIX, lts_pins, affected=["<=0.32.0"]) == sorted(VULDB_NO_FIX)


# --- 2026-12-07, third pass: the records the second pass named, and CVE-2026-100654 --------------------------------

FOUND_2026_12_07_THIRD = {
    "CVE-2026-71486": "accepted-risk",  # < 0.26.0: derender endpoints, not in 0.7.3
    "CVE-2026-100649": "accepted-risk",  # < 0.29.0: PyNvVideoCodec decoder slots, not in 0.7.3
    "CVE-2026-100651": "accepted-risk",  # < 0.29.0: /inference/v1/generate, not in 0.7.3, 404 at the front door
    "PYSEC-2026-3985": "accepted-risk",  # < 0.28.0: LlavaOnevision2 loader, not in 0.7.3
    "PYSEC-2026-3997": "accepted-risk",  # < 0.28.0: negative token ids on pooling routes; open in part (completions)
    "PYSEC-2026-3998": "accepted-risk",  # < 0.29.0: allowed_token_ids vs the tokenizer's length; open for some models
    "PYSEC-2026-3996": "accepted-risk",  # < 0.30.0: P/D decode metadata; no disaggregation, max_tokens=0 refused
    "PYSEC-2026-3999": "accepted-risk",  # < 0.30.0: _bincount_kernel, not in 0.7.3; the token-id prompt part is open
    "PYSEC-2026-4004": "accepted-risk",  # pip-audit: fixed 0.30.0, one of CVE-2026-94622..94626 (kv_transfer_params)
    "PYSEC-2026-4005": "accepted-risk",
    "PYSEC-2026-4006": "accepted-risk",
    "PYSEC-2026-4007": "accepted-risk",
    "PYSEC-2026-4008": "accepted-risk",
    "CVE-2026-69147": "accepted-risk",  # < 0.28.0: request-chosen video backend, not in 0.7.3
    "CVE-2026-100654": "accepted-risk",  # < 0.29.0: stop_token_ids with min_tokens: reachable, now guarded
}
KV_TRANSFER_UNREAD = tuple(f"PYSEC-2026-{number}" for number in range(4004, 4009))
# Found reachable on 0.7.3, then closed by the request guard's token-id rule (token_id_out_of_vocabulary).
GUARDED_ON_0_7_3 = ("PYSEC-2026-3997", "PYSEC-2026-3998", "CVE-2026-100654")


def test_the_third_pass_records_are_listed_with_their_verdicts(data: list[dict], pins: dict) -> None:
    found = {entry["id"]: entry for entry in data if entry["id"] in FOUND_2026_12_07_THIRD}
    assert {ident: entry["status"] for ident, entry in found.items()} == FOUND_2026_12_07_THIRD
    assert all(entry["package"] == "vllm" and advisories.affected(entry, pins["vllm"]) for entry in found.values())
    # records not read keep their range marked unverified; the ones found reachable name the guard rule that closes them
    assert [ident for ident, entry in found.items() if entry.get("range_verified") is False] == list(KV_TRANSFER_UNREAD)
    assert all("token_id_out_of_vocabulary" in found[ident]["mitigation"] for ident in GUARDED_ON_0_7_3)
    assert guard.TOKEN_ID_LIST_FIELDS and guard.LOGIT_BIAS_FIELD  # the rule those mitigations name exists
    assert "PYSEC-2026-4198" in {entry["id"] for entry in data}  # still listed, still unassessed


def test_control_without_the_third_pass_accepted_risks_the_check_names_all(data: list[dict], pins: dict) -> None:
    assert _named_without_their_risks(data, pins, FOUND_2026_12_07_THIRD) == sorted(FOUND_2026_12_07_THIRD)


def test_lts_580_is_outside_the_third_pass_ranges_and_says_where_that_is_unchecked(lts_pins: dict) -> None:
    entries = _lts_580_entries(FOUND_2026_12_07_THIRD)
    assert all("not checked" in entries[ident]["note"] for ident in KV_TRANSFER_UNREAD)
    # control: had 0.30.0 not fixed them (the digest's reading: fix pull requests still open), lts-580 would be open
    named = _lts_580_named_if(entries, KV_TRANSFER_UNREAD, lts_pins, affected=["<=0.32.0"], fixed_in=None)
    assert named == sorted(KV_TRANSFER_UNREAD)
