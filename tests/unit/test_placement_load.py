"""bench/placement_load.py: one reader of the prefix-cache counters for the real engine and the stand-in, the
figures it takes from them, and the section bench/report.py writes with the issue's goal. The run itself starts
nginx, HAProxy and vllm-router (python bench/placement_load.py); these need none."""

from __future__ import annotations

import json
from pathlib import Path

from bench import placement_load
from bench import report as bench
from harness.engine_standin.standin import PrefixCache, Stats

ROOT = Path(__file__).resolve().parents[2]
# vLLM 0.32.0 for CPUs' own /metrics lines (bench/placement_load.py --real-engine, 2026-12-06): two requests of
# 490 tokens, the second hitting 384
REAL = (ROOT / "tests" / "fixtures" / "metrics" / "vllm032-prefix-cache.txt").read_text()


def test_one_reader_for_the_real_engines_counters_and_the_stand_ins() -> None:
    assert placement_load.metric(REAL, "vllm:prefix_cache_queries_total") == 980
    assert placement_load.metric(REAL, "vllm:prefix_cache_hits_total") == 384  # not its _created, nor external_
    stats = Stats()
    stats.cache = PrefixCache(capacity=8)
    stats.cache.admit([str(i) for i in range(40)])
    stats.cache.admit([str(i) for i in range(40)])
    text = stats.text("tiny")
    assert placement_load.metric(text, "vllm:prefix_cache_queries_total") == 80
    assert placement_load.metric(text, "vllm:prefix_cache_hits_total") == 32
    # the same series as the real engine's: name and labels
    real_series = {line.split(" ")[0] for line in REAL.splitlines() if line.startswith("vllm:prefix_cache_")}
    assert {line.split(" ")[0] for line in text.splitlines() if line.startswith("vllm:prefix_cache_")} <= real_series
    assert placement_load.metric("", "vllm:prefix_cache_hits_total") == 0  # control: no counter, nothing read


def box(t: float, queries: float, hits: float, running: float) -> dict:
    return {"t": t, "queries": queries, "hits": hits, "running": running}


def test_figures_count_from_the_end_of_the_warm_up() -> None:
    samples = [
        {"a": box(0, 0, 0, 9), "b": box(0, 0, 0, 9)},  # the warm-up: not counted
        {"a": box(10, 100, 0, 3), "b": box(10, 100, 50, 1)},
        {"a": box(11, 300, 150, 3), "b": box(11, 200, 100, 1)},
    ]
    lines = [{"t": 5, "status": 200, "whole": True, "got": 3, "ttft_s": 9.0},
             {"t": 10, "status": 200, "whole": True, "got": 3, "ttft_s": 0.1}]  # fmt: skip
    figures = placement_load.figures(lines, samples, samples[-1], start=10)
    assert figures["hit_rate"] == round((150 + 50) / (200 + 100), 3)
    assert figures["hit_rate_per_box"] == {"a": 0.75, "b": 0.5}
    assert figures["load_per_box"] == {"a": 3, "b": 1} and figures["busiest_over_mean"] == 1.5
    assert figures["streams"] == 1 and figures["ttft_p50_ms"] == 100.0


def test_where_the_streams_went_per_application_and_per_chat() -> None:
    def line(t: float, session: str, box: str, status: int = 200) -> dict:
        return {"t": t, "session": session, "box": box, "status": status}

    # users 1 and 17 are application 1 of 16, user 2 application 2
    lines = [line(1, "user-47-1", "b3"), line(10, "user-47-1", "b1"), line(11, "user-47-17", "b1"),
             line(12, "user-47-2", "b2"), line(13, "user-47-17", "b1"), line(14, "user-47-2", "x", 502)]  # fmt: skip
    apps = placement_load.where(lines, 10, lambda s: placement_load.application(16, s))
    assert apps == {"own_box_share": 1.0, "apps_per_box": {"b1": 1, "b2": 1}}
    # control: one of application 1's streams on another box; by session (a chat each), user 1 and 17 are two
    lines.append(line(15, "user-47-1", "b3"))
    assert placement_load.where(lines, 10, lambda s: placement_load.application(16, s)) == {
        "own_box_share": 0.8, "apps_per_box": {"b1": 1, "b2": 1, "b3": 0}}  # fmt: skip
    assert placement_load.where(lines, 10) == {"own_box_share": 0.8}


def record(prefix_hit: float, busiest: float) -> dict:
    row = {"streams": 100, "failed": 0, "truncated": 0, "ttft_p50_ms": 60.0, "ttft_p99_ms": 90.0}
    return {
        "command": "python bench/placement_load.py", "when": "2026-12-06T18:00:00Z", "machine": "2 CPUs",
        "haproxy": "HAProxy version 2.6", "vllm_router": "0.1.17",
        "load": {"seconds": 25, "warmup": 5, "clients": 24, "tokens": "16-48", "system_prompts": 12,
                 "system_words": 500},
        "stand_in": {"ttft_ms": 50, "itl_ms": 20, "prefill_ms_per_token": 0.2, "cache_blocks": 160, "block_size": 16},
        "results": {"shared-prompts": {
            "session-hash": {**row, "hit_rate": 0.4, "busiest_over_mean": 1.1},
            "prefix-aware": {**row, "hit_rate": prefix_hit, "busiest_over_mean": busiest},
        }},
    }  # fmt: skip


def test_the_section_tables_each_policy_and_says_whether_the_goal_is_met(tmp_path: Path) -> None:
    path = tmp_path / "placement-load.json"
    path.write_text(json.dumps(record(0.9, 1.2)))
    text = bench.placement_load_report(path, tmp_path / "none.json", tmp_path / "none.json")
    assert "| session-hash | 100 | 0 | 0.40 | 60.00 | 90.00 | 1.10 |" in text
    assert "| prefix-aware | 100 | 0 | 0.90 | 60.00 | 90.00 | 1.20 |" in text
    assert "met (2.25x" in text and "NOT met" not in text
    # controls: too few hits, or a box over the bound
    path.write_text(json.dumps(record(0.7, 1.2)))
    assert "NOT met (1.75x" in bench.placement_load_report(path, tmp_path / "none.json", tmp_path / "none.json")
    path.write_text(json.dumps(record(0.9, 1.3)))
    assert "NOT met (2.25x" in bench.placement_load_report(path, tmp_path / "none.json", tmp_path / "none.json")


def test_the_section_is_replaced_alone_and_added_once(tmp_path: Path) -> None:
    before = "# A\nkept\n\n# make test: time per scenario and phase\nkept too\n"
    section = bench.placement_load_report(tmp_path / "none.json", tmp_path / "none.json", tmp_path / "none.json")
    once = bench.replace_section(before, bench.PLACEMENT_HEADING, section, "# make test: time per scenario")
    assert once.count(bench.PLACEMENT_HEADING) == 1 and "kept\n" in once and once.endswith("kept too\n")
    assert bench.replace_section(once, bench.PLACEMENT_HEADING, section, "# make test: time per scenario") == once


def test_with_several_draws_the_goal_takes_their_mean_and_every_draws_busiest_box(tmp_path: Path) -> None:
    data = record(0.9, 1.2)
    data["load"]["seeds"] = [47, 48]
    shared = data["results"]["shared-prompts"]
    shared["session-hash"] |= {"draws": [{"hit_rate": 0.4, "busiest_over_mean": 1.1}] * 2, "hit_rate_mean": 0.4}
    shared["prefix-aware"] |= {
        "draws": [{"hit_rate": 0.9, "busiest_over_mean": 1.2}, {"hit_rate": 0.5, "busiest_over_mean": 1.2}],
        "hit_rate_mean": 0.7,
    }
    path = tmp_path / "placement-load.json"
    path.write_text(json.dumps(data))
    text = bench.placement_load_report(path, tmp_path / "none.json", tmp_path / "none.json")
    assert "| prefix-aware | 100 | 0 | 0.90 | 60.00 | 90.00 | 1.20 | 0.90 (1.20), 0.50 (1.20); 0.70 |" in text
    assert "NOT met (1.75x" in text  # the first draw alone (0.9) would meet it
    shared["prefix-aware"]["draws"][1]["busiest_over_mean"] = 1.3
    shared["prefix-aware"]["draws"][1]["hit_rate"] = 0.9
    shared["prefix-aware"]["hit_rate_mean"] = 0.9
    path.write_text(json.dumps(data))
    assert "NOT met (2.25x" in bench.placement_load_report(
        path, tmp_path / "none.json", tmp_path / "none.json"
    )  # the second draw's box


def test_a_second_run_of_draws_is_tabled_under_the_first(tmp_path: Path) -> None:
    data = record(0.9, 1.2)
    data["load"]["seeds"] = [48, 49]
    data["results"]["shared-prompts"]["prefix-aware"] |= {
        "draws": [{"hit_rate": 0.9, "busiest_over_mean": 1.2}, {"hit_rate": 0.5, "busiest_over_mean": 1.3}],
        "hit_rate_mean": 0.7,
    }
    (tmp_path / "main.json").write_text(json.dumps(record(0.9, 1.2)))
    (tmp_path / "draws.json").write_text(json.dumps(data))
    text = bench.placement_load_report(tmp_path / "main.json", tmp_path / "none.json", tmp_path / "draws.json")
    assert "seeds 48, 49" in text
    assert "| shared-prompts | prefix-aware | 0.90 (1.20), 0.50 (1.30) | 0.70 |" in text
    assert "| shared-prompts | session-hash | 0.40 (1.10) | 0.40 |" in text
    assert "met (2.25x" in text  # the goal stays the main run's


def test_where_the_streams_went_is_tabled_when_recorded(tmp_path: Path) -> None:
    data = record(0.7, 1.2)
    data["load"]["seeds"] = [47, 48]
    prefix = data["results"]["shared-prompts"]["prefix-aware"]
    apps = [{"b1": 8, "b2": 5, "b3": 3}, {"b1": 6, "b2": 5, "b3": 5}]
    draws = [{"hit_rate": 0.7, "busiest_over_mean": 1.2, "own_box_share": 0.8, "apps_per_box": a} for a in apps]
    prefix |= {"own_box_share": 0.8, "apps_per_box": apps[0], "draws": draws, "hit_rate_mean": 0.7}
    path = tmp_path / "placement-load.json"
    path.write_text(json.dumps(data))
    text = bench.placement_load_report(path, tmp_path / "none.json", tmp_path / "none.json")
    assert (
        "| prefix-aware | 100 | 0 | 0.70 | 60.00 | 90.00 | 1.20 | 0.80 | 0.70 (1.20; 8/5/3), 0.70 (1.20; 6/5/5); 0.70 |"
        in text
    )
    assert "| session-hash | 100 | 0 | 0.40 | 60.00 | 90.00 | 1.10 | - | ; - |" in text  # recorded by neither
