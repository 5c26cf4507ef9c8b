"""bench/guidellm_load.py: the figures it reads from guidellm's own report (a real guidellm 0.3.1 report,
trimmed, in tests/fixtures/guidellm), and the section bench/report.py writes from a recorded run. The run
itself needs guidellm's own venv (made by the bench, not by a unit test): make bench-load."""

from __future__ import annotations

import json
from pathlib import Path

from bench import guidellm_load
from bench import report as bench

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "guidellm" / "concurrent-8-standin.json"


def test_figures_are_guidellms_own_from_its_report() -> None:
    report = json.loads(FIXTURE.read_text())
    figures = guidellm_load.figures(report)
    metrics = report["benchmarks"][0]["metrics"]
    ttft = metrics["time_to_first_token_ms"]["successful"]["percentiles"]
    assert (figures["successful"], figures["errored"], figures["incomplete"]) == (109, 0, 6)
    assert figures["ttft_p50_ms"] == round(ttft["p50"], 2) and figures["ttft_p99_ms"] == round(ttft["p99"], 2)
    assert figures["itl_p99_ms"] == round(metrics["inter_token_latency_ms"]["successful"]["percentiles"]["p99"], 2)
    assert figures["concurrency_max"] == 8 and figures["output_tokens_mean"] == 32.0
    # the stand-in's pace is the floor guidellm measures from: TTFT 50 ms, ITL 20 ms
    assert figures["ttft_p50_ms"] >= 50 and 20 <= figures["itl_p50_ms"] < 25


def test_the_report_tables_each_path_and_level_and_what_the_proxies_add(tmp_path: Path) -> None:
    row = guidellm_load.figures(json.loads(FIXTURE.read_text()))
    slower = {**row, "ttft_p99_ms": row["ttft_p99_ms"] + 7.5}
    record = {
        "command": "python bench/guidellm_load.py --levels 8", "when": "2026-12-03T00:00:00Z",
        "machine": "2 CPUs", "client": "guidellm version: 0.3.1", "stand_in": {"ttft_ms": 50, "itl_ms": 20},
        "load": {"seconds": 10, "prompt_tokens": 32, "output_tokens": 32},
        "results": {"direct": [{"level": 8, **row}], "front door": [{"level": 8, **slower}],
                    "gateway": [{"level": 8, "error": "guidellm exited 2: boom"}]},
    }  # fmt: skip
    path = tmp_path / "guidellm-load.json"
    path.write_text(json.dumps(record))
    text = bench.guidellm_load_report(path)
    assert "| 8 | direct | 109 | 0 | 6 |" in text
    assert "| 8 | gateway | guidellm exited 2: boom |" in text
    assert "- front door adds to direct p99 TTFT (ms, by level, guidellm's figures): 8: +7.5." in text
    assert "gateway adds" not in text  # no figures, no claim
    assert "No run recorded (run: make bench-load" in bench.guidellm_load_report(tmp_path / "none.json")


def test_a_finished_venv_is_kept_and_an_unfinished_one_is_made_again(tmp_path: Path, monkeypatch) -> None:
    calls: list[list[str]] = []
    monkeypatch.setattr(guidellm_load, "VENV", tmp_path / "venv")
    monkeypatch.setattr(guidellm_load.subprocess, "run", lambda argv, **kw: calls.append(argv))
    (tmp_path / "venv").mkdir()  # an install cut before its marker
    guidellm_load.ensure_venv()
    assert calls[0][:2] == ["rm", "-rf"] and any("guidellm==0.3.1" in argv for argv in calls)
    assert (tmp_path / "venv" / ".gpubox-installed").exists()
    calls.clear()
    assert guidellm_load.ensure_venv() == tmp_path / "venv" / "bin" / "guidellm" and calls == []
