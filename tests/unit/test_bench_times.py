"""make bench's section "make test: time per scenario and phase", from the times tools/run_scenarios.py writes."""

from __future__ import annotations

import datetime
import json
import re
import subprocess
from pathlib import Path

import pytest

from bench import report as bench


def phases(*pairs: tuple[str, float]) -> list[dict[str, object]]:
    return [{"phase": name, "seconds": s} for name, s in pairs]


TIMES = {
    "scenarios": [
        {"scenario": "fleet", "result": "passed", "seconds": 1200.4,
         "phases": phases(("destroy", 2.0), ("syntax", 5.0), ("create", 30.0), ("prepare", 100.0),
                          ("converge", 600.0), ("idempotence", 200.0), ("side_effect", 150.0),
                          ("verify", 50.0), ("destroy", 20.0))},
        {"scenario": "default", "result": "failed", "seconds": 400.0,
         "phases": phases(("destroy", 1.0), ("syntax", 4.0), ("create", 25.0), ("prepare", 80.0),
                          ("converge", 250.0))},
        {"scenario": "host_ubuntu", "result": "skipped", "seconds": 0.0, "phases": []},
    ],
    "jobs": 2,
    "started": "2026-12-01T10:00:00+00:00",
    "finished": "2026-12-01T10:30:00+00:00",
}  # fmt: skip


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "scenario-times.json"
    path.write_text(json.dumps(data))
    return path


def test_the_table_has_a_column_per_phase_run_and_a_row_per_scenario(tmp_path: Path) -> None:
    path = write(tmp_path, TIMES)
    text = bench.scenario_times_report(path)
    assert "# make test: time per scenario and phase" in text
    header = (
        "| scenario | result | wall | destroy | syntax | create | prepare | converge | idempotence | side_effect "
        "| verify | destroy #2 | other |"
    )
    assert header in text
    assert "| fleet | passed | 1200 | 2 | 5 | 30 | 100 | 600 | 200 | 150 | 50 | 20 | 43 |" in text
    assert "| default | failed | 400 | 1 | 4 | 25 | 80 | 250 | - | - | - | - | 40 |" in text
    assert "| host_ubuntu | skipped | 0 | - | - | - | - | - | - | - | - | - | - |" in text
    assert "| all | 1 failed, 1 passed, 1 skipped | 1600 | 3 | 9 | 55 | 180 | 850 | 200 | 150 | 50 | 20 | 83 |" in text
    assert "2 scenarios at a" in text and "first start to last end: 1800 s; sum of scenario wall times 1600 s" in text
    assert f"from {path} (tools/run_scenarios.py" in text
    assert bench.scenario_times_report(tmp_path / "absent.json").count("not measured") == 1
    assert "no bench/absent (run" in bench.scenario_times_report(bench.ROOT / "bench" / "absent")


def test_columns_follow_the_order_scenarios_ran_their_phases() -> None:
    rows = [
        {"phases": phases(("destroy", 1), ("converge", 1), ("destroy", 1))},
        {"phases": phases(("destroy", 1), ("prepare", 1), ("converge", 1), ("verify", 1), ("destroy", 1))},
    ]
    assert bench.phase_columns(rows) == [
        ("destroy", 1), ("prepare", 1), ("converge", 1), ("verify", 1), ("destroy", 2),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"scenarios": "x"}, "no list 'scenarios'"),
        ({"scenarios": [{"scenario": "default", "result": "passed", "seconds": 1}]}, "scenarios[0] lacks phases"),
        ({"scenarios": [{"scenario": "a", "result": "passed", "seconds": 1, "phases": [{"phase": "x"}]}]},
         "has a phase without"),
    ],
)  # fmt: skip
def test_a_malformed_file_is_named_with_the_fix(tmp_path: Path, data: object, says: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(SystemExit) as err:
        bench.scenario_times_report(path)
    assert str(path) in str(err.value) and says in str(err.value) and "--record-times" in str(err.value)


def test_record_times_copies_the_measured_run(tmp_path: Path) -> None:
    source, dest = tmp_path / "times.json", tmp_path / "bench" / "scenario-times.json"
    with pytest.raises(SystemExit, match="make molecule"):
        bench.record_times(source, dest)
    source.write_text(json.dumps(TIMES))
    bench.record_times(source, dest)
    assert json.loads(dest.read_text()) == TIMES


def test_results_md_ends_with_the_harness_figures_as_bench_writes_them() -> None:
    """bench/results.md's last section is bench/report.py's table of bench/harness-figures.json, so that
    `make bench` rewrites it unchanged; every figure has a date, a commit and both texts."""
    data = json.loads(bench.HARNESS_FIGURES.read_text())
    for figure in data["figures"]:
        assert set(figure) == {"measured", "commit", "what", "figure"}, figure
        datetime.date.fromisoformat(figure["measured"])
        assert re.fullmatch(r"[0-9a-f]{7,40}", figure["commit"]), figure
        known = subprocess.run(["git", "-C", str(bench.ROOT), "cat-file", "-e", figure["commit"] + "^{commit}"],
                               capture_output=True, check=False)  # fmt: skip
        assert known.returncode == 0, f"{figure['commit']} is not a commit of this repository: {figure}"
    results = (bench.ROOT / "bench" / "results.md").read_text()
    assert results.endswith(bench.harness_figures_report())
