"""tools/run_scenarios.py: molecule's action lines are found and timed, and every line reaches the log."""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

import pytest

import run_scenarios
from run_scenarios import ActionMark, Phase, parse_action_line, phases_from_marks

# As molecule 26.10 writes them (molecule/logger.py section_logger), with PY_COLORS=0 and with colour.
PLAIN_START = "INFO     [default > converge] Executing"
PLAIN_END = "INFO     [default > converge] Executed: Successful"
PLAIN_FAILED = "ERROR    [fleet > side_effect] Executed: Failed"
COLOUR_START = (
    "\x1b[36mINFO    \x1b[0m \x1b[32mtopology_4x4090\x1b[0m ➜ \x1b[33midempotence\x1b[0m: \x1b[36mExecuting\x1b[0m"
)
COLOUR_END = (
    "\x1b[36mINFO    \x1b[0m \x1b[32mtopology_4x4090\x1b[0m ➜ \x1b[33midempotence\x1b[0m: "
    "\x1b[32mExecuted: Successful\x1b[0m"
)


@pytest.mark.parametrize(
    ("line", "mark"),
    [
        (PLAIN_START, ActionMark("default", "converge", "start")),
        (PLAIN_END + "\n", ActionMark("default", "converge", "end", "Successful")),
        (PLAIN_FAILED, ActionMark("fleet", "side_effect", "end", "Failed")),
        (COLOUR_START, ActionMark("topology_4x4090", "idempotence", "start")),
        (COLOUR_END, ActionMark("topology_4x4090", "idempotence", "end", "Successful")),
        ("WARNING  [default > dependency] Executed: Missing (no requirements file)",
         ActionMark("default", "dependency", "end", "Missing")),
    ],
)  # fmt: skip
def test_action_lines_are_recognised(line: str, mark: ActionMark) -> None:
    assert parse_action_line(line) == mark


@pytest.mark.parametrize(
    "line",
    [
        "TASK [Converge the host layer] *************************************************",
        "PLAY RECAP *********************************************************************",
        "gpubox-m-2x3090            : ok=112  changed=0    unreachable=0    failed=0",
        "INFO     [default > verify] Running testinfra tests",  # another molecule message in an action
        '    "msg": "INFO     [default > converge] Executing"',  # the words quoted inside Ansible output
        "",
    ],
)
def test_other_lines_are_not_action_lines(line: str) -> None:
    assert parse_action_line(line) is None


def marks(*rows: tuple[float, str]) -> list[tuple[float, ActionMark]]:
    out = []
    for at, line in rows:
        mark = parse_action_line(line)
        assert mark is not None, line
        out.append((at, mark))
    return out


def test_phases_are_timed_start_to_end_and_repeated_actions_kept() -> None:
    got = phases_from_marks(
        marks(
            (1.0, "INFO     [default > destroy] Executing"),
            (4.0, "INFO     [default > destroy] Executed: Successful"),
            (4.5, "INFO     [default > converge] Executing"),
            (104.55, "INFO     [default > converge] Executed: Successful"),
            (105.0, "INFO     [default > destroy] Executing"),
            (111.0, "INFO     [default > destroy] Executed: Successful"),
        ),
        "default",
        end=112.0,
    )
    assert got == [Phase("destroy", 3.0), Phase("converge", 100.0), Phase("destroy", 6.0)]


def test_an_action_without_end_lasts_until_the_next_one_or_the_exit() -> None:
    got = phases_from_marks(
        marks(
            (0.0, "INFO     [crash > create] Executing"),
            (10.0, "INFO     [crash > destroy] Executing"),
            (12.0, "INFO     [other > converge] Executing"),  # another scenario's line: not counted
        ),
        "crash",
        end=15.0,
    )
    assert got == [Phase("create", 10.0), Phase("destroy", 5.0)]


def test_times_record_shape() -> None:
    log = Path("x.log")
    results = [
        run_scenarios.Result("default", True, 300.04, log, phases=[Phase("converge", 200.0)]),
        run_scenarios.Result("crash", False, 50.0, log),
        run_scenarios.Result("host_ubuntu", True, 0.0, log, skipped="needs X"),
    ]
    t0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    t1 = datetime(2026, 1, 2, 4, 4, 5, tzinfo=timezone.utc)
    record = run_scenarios.times_record(results, 2, t0, t1)
    assert record == {
        "scenarios": [
            {"scenario": "default", "result": "passed", "seconds": 300.0,
             "phases": [{"phase": "converge", "seconds": 200.0}]},
            {"scenario": "crash", "result": "failed", "seconds": 50.0, "phases": []},
            {"scenario": "host_ubuntu", "result": "skipped", "seconds": 0.0, "phases": []},
        ],
        "jobs": 2,
        "started": "2026-01-02T03:04:05+00:00",
        "finished": "2026-01-02T04:04:05+00:00",
    }  # fmt: skip
    json.dumps(record)


FAKE_MOLECULE = """#!/bin/sh
echo "INFO     [refusals > syntax] Executing"
printf 'playbook: converge.yml\\r\\n'
echo "INFO     [refusals > syntax] Executed: Successful"
echo "INFO     [refusals > converge] Executing" >&2
echo "TASK [something] ***"
echo "ERROR    [refusals > converge] Executed: Failed"
printf 'no newline at the end'
exit 3
"""


def test_run_logs_every_line_and_times_the_actions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run() on a stand-in `molecule` (no scenario runs): output copied byte for byte, status kept."""
    fake = tmp_path / "bin" / "molecule"
    fake.parent.mkdir()
    fake.write_text(FAKE_MOLECULE)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    res = run_scenarios.run("refusals", tmp_path)
    assert not res.ok and res.state == "failed"
    assert [p.phase for p in res.phases] == ["syntax", "converge"]
    assert all(0 <= p.seconds <= res.seconds for p in res.phases)
    text = (tmp_path / "refusals.log").read_bytes()
    assert text.startswith(b"INFO     [refusals > syntax] Executing\nplaybook: converge.yml\r\n")
    assert b"INFO     [refusals > converge] Executing\n" in text
    assert text.endswith(b"Executed: Failed\nno newline at the end")


# What a failed scenario's log holds, in the formats ansible-core and molecule (requirements-dev.lock) print
# (captured from ansible-playbook runs of small playbooks with this repo's ansible.cfg).
def _log(action: str, body: str, state: str = "Failed") -> str:
    return (
        f"INFO     [s > create] Executing\nok: [localhost]\nINFO     [s > create] Executed: Successful\n"
        f"INFO     [s > {action}] Executing\n{body}\nERROR    [s > {action}] Executed: {state}\n"
    )


COMMAND_FAILED = (
    "TASK [Run the crash suite (molecule/serving/crash_suite.py)] *******************\n"
    '[ERROR]: Task failed: Module failed: non-zero return code\nfatal: [localhost]: FAILED! => {"changed": true, '
    '"msg": "non-zero return code", "rc": 1, "stderr": "crash_suite: box did not boot within 180s", '
    '"stderr_lines": ["crash_suite: box did not boot within 180s"], "stdout": "a\\nb", '
    '"stdout_lines": ["[crash] 01 apt-driver: struck=True", "[crash] 02 apt-cuda: struck=False"]}\n'
    "\nPLAY RECAP *****\nlocalhost : ok=0    changed=0    unreachable=0    failed=1"
)
ASSERT_FAILED = (
    "TASK [An assert] ***************************************************************\n"
    'fatal: [gpubox-m-box]: FAILED! => {\n    "assertion": false,\n    "changed": false,\n'
    '    "msg": "rebuild: 1 problem(s). Nothing was changed.\\n- gpubox_x is bad"\n}\n\nPLAY RECAP ****'
)
IGNORED = (
    "TASK [Probe that may fail] *****\n"
    'fatal: [gpubox-m-box]: FAILED! => {"changed": false, "msg": "expected"}\n...ignoring\n'
    "TASK [Next] *****\nok: [gpubox-m-box]\n"
)


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (
            _log("converge", COMMAND_FAILED),
            [
                "converge: localhost: TASK [Run the crash suite (molecule/serving/crash_suite.py)]",
                "  non-zero return code",
                "  crash_suite: box did not boot within 180s",
                "  [crash] 01 apt-driver: struck=True",
                "  [crash] 02 apt-cuda: struck=False",
            ],
        ),
        (
            _log("side_effect", IGNORED + ASSERT_FAILED),
            [
                "side_effect: gpubox-m-box: TASK [An assert]",
                "  rebuild: 1 problem(s). Nothing was changed.",
                "  - gpubox_x is bad",
            ],
        ),
        (
            _log("verify", IGNORED + "FAILED tests/test_a.py::test_one - AssertionError: 2 != 3\n1 failed, 9 passed"),
            ["verify: FAILED tests/test_a.py::test_one - AssertionError: 2 != 3"],
        ),
        (
            _log(
                "idempotence",
                IGNORED + "CRITICAL Idempotence test failed because of the following tasks:\n* [gpubox-m-box] => r : t",
            ),
            [
                "idempotence: CRITICAL Idempotence test failed because of the following tasks:",
                "  * [gpubox-m-box] => r : t",
            ],
        ),
        (_log("converge", IGNORED), ["converge: (no failed task or test in its log: see the lines above)"]),
    ],
    ids=["command", "assert-after-ignored", "pytest", "idempotence", "nothing-found"],
)
def test_why_a_scenario_failed_is_told_in_a_few_lines(log: str, expected: list[str]) -> None:
    assert run_scenarios.why_failed(log) == expected


def test_the_failed_action_is_the_one_told_not_a_later_one() -> None:
    """molecule runs destroy after a failed action: the failure told is the failed action's own."""
    log = _log("converge", COMMAND_FAILED) + "INFO     [s > destroy] Executing\nok: [localhost]\n"
    log += "INFO     [s > destroy] Executed: Successful\n"
    assert run_scenarios.why_failed(log)[0].startswith("converge: localhost: TASK [Run the crash suite")
