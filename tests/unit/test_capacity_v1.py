"""The capacity planner's V1 engine model (engine="v1", the lts stack's vLLM) and its calibration on public V1 logs."""

from __future__ import annotations

import statistics

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import capacity_planner, capacity_v1, model_catalog
from bench import report as bench

LLAMA = "LLM-Research/Meta-Llama-3.1-8B-Instruct"
CASES = bench.load_cases(bench.CALIBRATION_V1_DIR)


def _serving(**over) -> dict:
    base = {"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "gpu_memory_utilization": 0.9,
            "max_model_len": 8192, "max_num_seqs": 8}  # fmt: skip
    return {**base, **over}


def _gpu(mib: int = 24576, count: int = 2, name: str = "GPU") -> dict:
    return {"name": name, "memory_total_mib": mib, "count": count}


def test_the_default_engine_is_v0_and_its_plan_is_unchanged() -> None:
    model = model_catalog.catalog_model(LLAMA)
    assert capacity_planner.plan(model, _gpu(), _serving()) == capacity_planner.plan(model, _gpu(), _serving(), "v0")
    assert capacity_planner.plan(model, _gpu(), _serving())["cudagraph_gib"] == 0.0


def test_an_unknown_engine_is_refused_by_name() -> None:
    result = capacity_planner.plan(model_catalog.catalog_model(LLAMA), _gpu(), _serving(), engine="V2")
    assert not result["fits"] and result["errors"][0].startswith("engine must be one of v0, v1, got 'V2'")


def test_v1_leaves_nccl_out_of_the_budget_and_counts_cuda_graphs_in_it() -> None:
    model = model_catalog.catalog_model(LLAMA)
    v0 = capacity_planner.plan(model, _gpu(), _serving())
    v1 = capacity_planner.plan(model, _gpu(), _serving(), "v1")
    assert v0["non_torch_gib"] == pytest.approx(0.25) and v1["non_torch_gib"] == pytest.approx(0.10)
    assert v1["cudagraph_gib"] == capacity_planner.V1_CUDAGRAPH_GIB
    eager = capacity_planner.plan(model, _gpu(), _serving(enforce_eager=True), "v1")
    outside = capacity_planner.plan(model, _gpu(), _serving(cudagraph_in_budget=False), "v1")
    measured = capacity_planner.plan(model, _gpu(), _serving(cudagraph_gib=1.5), "v1")
    assert eager["cudagraph_gib"] == outside["cudagraph_gib"] == 0.0 and measured["cudagraph_gib"] == 1.5
    # Same activation (both ask for 8192 batched tokens): the KV budgets differ by the non-torch and graph terms.
    assert v1["kv_cache_gib_per_gpu"] == pytest.approx(
        outside["kv_cache_gib_per_gpu"] - capacity_planner.V1_CUDAGRAPH_GIB
    )
    assert measured["kv_cache_gib_per_gpu"] < v1["kv_cache_gib_per_gpu"] < outside["kv_cache_gib_per_gpu"]


@pytest.mark.parametrize(
    ("mib", "name", "tokens", "seqs"),
    [
        (24576, "NVIDIA GeForce RTX 4090", 2048, 256),
        (81559, "NVIDIA H100 80GB HBM3", 8192, 1024),
        # vLLM leaves an A100 on the small defaults whatever its memory (the 0.10.1.1 A100 80GB logs in
        # tests/data/calibration_v1/ print max_num_batched_tokens=2048).
        (81559, "NVIDIA A100-SXM4-80GB", 2048, 256),
    ],
)
def test_v1_defaults_follow_the_gpu_and_chunked_prefill_is_on(mib: int, name: str, tokens: int, seqs: int) -> None:
    serving = _serving(max_model_len=32768, max_num_seqs=None, tensor_parallel_size=1)
    result = capacity_planner.plan(model_catalog.catalog_model(LLAMA), _gpu(mib, 1, name), serving, "v1")
    assert result["max_num_batched_tokens"] == tokens
    assert result["sampler_peak_gib"] == pytest.approx((38 * seqs * 128256 + tokens * 4096 * 2) / 2**30)


@pytest.mark.parametrize(("key", "value"), [("cudagraph_in_budget", "yes"), ("cudagraph_gib", -1)])
def test_bad_v1_serving_values_are_refused_by_name(key: str, value: object) -> None:
    result = capacity_planner.plan(model_catalog.catalog_model(LLAMA), _gpu(), _serving(**{key: value}), "v1")
    assert not result["fits"] and result["errors"][0].startswith(f"serving {key} must be")


def test_every_v1_case_has_a_source_and_its_facts() -> None:
    assert CASES, "no V1 calibration case"
    for case in CASES:
        assert case["source"].startswith("https://github.com/") and case["engine"] == "V1", case["id"]
        assert {"gpu", "model", "serving", "logged"} <= set(case) and "kv_cache_gib" in case["compare"], case["id"]


def test_no_v1_calibration_verdict_is_wrong() -> None:
    assert [r["id"] for r in map(bench.compare_case, CASES) if not r["verdict"]["ok"]] == []


def _median_kv_error(cases: list[dict]) -> float:
    return statistics.median(
        e for e in (bench.kv_relative_error(bench.compare_case(c)) for c in cases) if e is not None
    )


@pytest.mark.xfail(
    strict=True,
    reason="issue 33's goal is not met yet: median 5.3% over 6 V1 cases. Five vLLM 0.10.1.1 logs are planned "
    "0.8-0.9 GiB low where FlashInfer's sampler ran (the model's sampler term is V0's, sized for the native "
    "sort); the 0.8.x case is planned 22% high (its budget also subtracts the CUDA context and other non-torch memory)",
)
def test_v1_median_kv_error_meets_the_goal_over_at_least_five_cases() -> None:
    assert len(CASES) >= 5
    assert _median_kv_error(CASES) <= bench.V1_KV_GOAL


def test_the_goal_check_can_pass_and_fail() -> None:
    # Control: the same check on the V0 set (3 KV cases at 0.3% median) passes and on a broken V1 case fails.
    v0 = [c for c in bench.load_cases() if "kv_cache_gib" in c["compare"] and c["logged"]["kv_cache_gib"] > 0]
    assert _median_kv_error(v0) <= bench.V1_KV_GOAL
    # Broken: the first case with its gpu_memory_utilization moved by 0.2 (down where it can go down), whatever it is.
    first = CASES[0]["serving"]
    moved = first["gpu_memory_utilization"] + (-0.2 if first["gpu_memory_utilization"] > 0.4 else 0.2)
    broken = {**CASES[0], "serving": {**first, "gpu_memory_utilization": moved}}
    assert _median_kv_error([broken]) > bench.V1_KV_GOAL


def test_the_planner_takes_the_v1_terms_from_capacity_v1(monkeypatch: pytest.MonkeyPatch) -> None:
    # One place for the V1 model: the planner's names are capacity_v1's, and changing capacity_v1 changes the plan.
    assert capacity_planner.V1_CUDAGRAPH_GIB == capacity_v1.CUDAGRAPH_GIB
    assert capacity_v1.non_torch_gib() == capacity_planner.V1_NON_TORCH_GIB
    model = model_catalog.catalog_model(LLAMA)
    before = capacity_planner.plan(model, _gpu(), _serving(), "v1")
    monkeypatch.setattr(capacity_v1, "CUDAGRAPH_GIB", capacity_v1.CUDAGRAPH_GIB + 1.0)
    after = capacity_planner.plan(model, _gpu(), _serving(), "v1")
    assert after["kv_cache_gib_per_gpu"] == pytest.approx(before["kv_cache_gib_per_gpu"] - 1.0)
    assert capacity_planner.plan(model, _gpu(), _serving()) == capacity_planner.plan(model, _gpu(), _serving(), "v0")


def test_only_the_v1_section_of_results_md_is_rewritten() -> None:
    results = (bench.ROOT / "bench" / "results.md").read_text()
    section = bench.v1_report(CASES)
    # results.md holds the section as bench/report.py renders it now, and splicing it back changes nothing.
    assert section.lstrip("\n") in results
    assert bench.replace_v1_section(results, section) == results
    # Control: a changed section replaces the old one and nothing else.
    changed = bench.replace_v1_section(results, section.replace("Goal (issue 33)", "GOAL"))
    assert changed != results and changed.count("GOAL") == 1
    assert len(changed) == len(results) - len("Goal (issue 33)") + len("GOAL")
    head, tail = results.split(bench.V1_HEADING)
    assert changed.startswith(head) and changed.endswith(tail[tail.index("\n# ") :])
    with pytest.raises(SystemExit, match="no V1 calibration section"):
        bench.replace_v1_section("# Other\n", section)
