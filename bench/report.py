#!/usr/bin/env python3
"""Calibration bench for the capacity planner.

For every public start-up log in tests/data/calibration/*.yml, print and write the planner's
prediction next to vLLM's logged numbers (weights, activation, non-torch, KV GiB, GPU blocks), the
error per case, the KV error per class (dense bf16/fp16, quantized, failures) with each class's median
and the median over all cases, and each case's verdict (starts / does not start / refused), then the same
medians with each modelled term (sampler live set, rotary cache) left out in turn, then time plan()
itself. It also scores every gpubox systemd unit with `systemd-analyze security` (tools/unit_security.py),
the fleet's figures (molecule/fleet: the LAN cache's upstream bytes per wave of boxes, the rolls under load),
and the wall time of each molecule scenario and of each of its phases in the run of record of `make test`
(bench/scenario-times.json, a copy of the times.json tools/run_scenarios.py writes; --record-times copies it),
and the harness's figures measured by hand (bench/harness-figures.json, each with its date and commit).

A case whose memory line was printed by a non-driver rank (``logged_rank: worker``) is compared with
that rank's plan: the MLP live set as its activation peak (only the driver samples) and the KV cache that
leaves. ``gpu_blocks`` is always the minimum over the ranks, the driver's.

    python bench/report.py --out bench/results.md
    python bench/report.py --record-times   # .cache/molecule-logs/times.json -> bench/scenario-times.json
    python bench/report.py --v1-only --out bench/results.md   # rewrite only the V1 calibration section there
    python bench/report.py --placement-only --out bench/results.md   # only bench/placement_load.py's section
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import capacity_planner, model_catalog
from bench import families

ROOT = Path(__file__).resolve().parent.parent
CALIBRATION_DIR = ROOT / "tests" / "data" / "calibration"
CALIBRATION_V1_DIR = ROOT / "tests" / "data" / "calibration_v1"
V1_KV_GOAL = 0.03  # issue 33: median |KV GiB error| <= 3 % on the V1 calibration set

GIB = 1024**3
# logged key -> planner key
FIELDS = {
    "weights_gib": "weights_gib_per_gpu",
    "activation_peak_gib": "activation_peak_gib",
    "non_torch_gib": "non_torch_gib",
    "kv_cache_gib": "kv_cache_gib_per_gpu",
    "gpu_blocks": "gpu_blocks",
}


def load_cases(directory: Path = CALIBRATION_DIR) -> list[dict[str, Any]]:
    cases = []
    for path in sorted(directory.glob("*.yml")):
        case = yaml.safe_load(path.read_text())
        case["id"] = path.stem
        cases.append(case)
    return cases


def case_inputs(case: dict[str, Any]) -> tuple[dict, dict, dict]:
    """Planner inputs for a calibration case. The GPU total is the logged cudaMemGetInfo total."""
    spec = case["model"]
    serving = dict(case["serving"])
    tp_pp = serving["tensor_parallel_size"] * serving["pipeline_parallel_size"]
    model = model_catalog.catalog_model(spec["catalog_id"]) if "catalog_id" in spec else dict(spec["config"])
    for key in ("max_position_embeddings", "quantization"):
        if key in spec:
            model[key] = spec[key]
    model.setdefault("quantization", None)
    for key in ("attention", "kv_lora_rank"):
        if key in spec:
            model[key] = spec[key]
    if "weights_bytes" in spec:
        model["weights_bytes"] = spec["weights_bytes"]
    if "weights_bytes_from_logged_gib_per_gpu" in spec:
        model["weights_bytes"] = int(spec["weights_bytes_from_logged_gib_per_gpu"] * GIB * tp_pp)
    gpu = {
        "name": case["gpu"]["name"],
        "count": case["gpu"]["count"],
        "memory_total_mib": case["gpu"]["total_gpu_memory_gib_logged"] * 1024,
        "memory_reserved_mib": 0,
    }
    return model, gpu, serving


def case_class(case: dict[str, Any]) -> str:
    """The case's classes: quantized or dense bf16/fp16, and failures when vLLM did not start (or the
    planner must refuse); a quantized checkpoint that failed counts in both."""
    kind = "quantized" if case["model"].get("quantization") else "dense bf16/fp16"
    failed = case.get("expect_fits") is False or case.get("expect_refusal")
    return f"{kind}, failures" if failed else kind


def predicted_value(plan: dict[str, Any], field: str, worker: bool) -> Any:
    value = plan[FIELDS[field]]
    if worker and field == "activation_peak_gib":
        return plan["mlp_peak_gib"]
    if worker and field == "kv_cache_gib":
        return value + plan["activation_peak_gib"] - plan["mlp_peak_gib"]
    return value


def verdict(case: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """What vLLM did (or what the planner must do) against what the plan says."""
    if case.get("expect_refusal"):
        refused = any(case["expect_refusal"] in e for e in plan["errors"])
        return {"expected": "refused", "planned": "refused" if refused else "planned", "ok": refused}
    if "expect_fits" in case:
        expected = "starts" if case["expect_fits"] else "does not start"
        planned = "starts" if plan["fits"] else "does not start"
        return {"expected": expected, "planned": planned, "ok": expected == planned}
    return {"expected": "-", "planned": "starts" if plan["fits"] else "does not start", "ok": True}


def compare_case(case: dict[str, Any]) -> dict[str, Any]:
    """Predicted vs logged for the fields the case marks comparable."""
    predicted = capacity_planner.plan(*case_inputs(case), engine=str(case.get("engine", "V0")).lower())
    worker = case.get("logged_rank") == "worker"
    rows = {}
    for field in case.get("compare", []):
        logged = case["logged"][field]
        if predicted["errors"] and not predicted["kv_bytes_per_token_per_gpu"]:
            continue  # refused before any memory was planned
        value = predicted_value(predicted, field, worker and field != "gpu_blocks")
        rows[field] = {"logged": logged, "predicted": value, "error": value - logged}
    return {
        "id": case["id"],
        "class": case_class(case),
        "plan": predicted,
        "rows": rows,
        "verdict": verdict(case, predicted),
    }


def kv_relative_error(result: dict[str, Any]) -> float | None:
    row = result["rows"].get("kv_cache_gib")
    if not row or not row["logged"] or row["logged"] <= 0:
        return None
    return abs(row["error"]) / row["logged"]


def time_plan(repeat: int = 2000) -> float:
    model = model_catalog.catalog_model("Qwen/Qwen2.5-14B-Instruct")
    gpu = {"name": "NVIDIA GeForce RTX 3090", "count": 2, "memory_total_mib": 24576}
    serving = {
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "gpu_memory_utilization": 0.92,
        "max_model_len": 8192,
        "max_num_seqs": 8,
    }
    start = time.perf_counter()
    for _ in range(repeat):
        capacity_planner.plan(model, gpu, serving)
    return (time.perf_counter() - start) / repeat


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


CLASSES = ("dense bf16/fp16", "quantized", "failures")


def report(
    results: list[dict[str, Any]],
    per_call_s: float | None,
    title: str = "vLLM 0.7.3 V0 model",
    directory: str = "tests/data/calibration/",
) -> str:
    lines = [
        f"# Capacity planner calibration ({title} vs public start-up logs)",
        "",
        "Generated by `python bench/report.py`. GiB per GPU; error = predicted - logged. Sources: each case's",
        f"`source` in {directory}.",
        "",
        "| case | class | quantity | logged | predicted | error |",
        "|---|---|---|---:|---:|---:|",
    ]
    abs_errors: dict[str, list[float]] = {f: [] for f in FIELDS}
    for result in results:
        for field, row in result["rows"].items():
            lines.append(
                f"| {result['id']} | {result['class']} | {field} | {fmt(row['logged'])} | "
                f"{fmt(row['predicted'])} | {fmt(row['error'])} |"
            )
            if row["logged"] is not None:
                abs_errors[field].append(abs(row["error"]))
    lines += ["", "| quantity | cases | median abs error |", "|---|---:|---:|"]
    for field, errors in abs_errors.items():
        if errors:
            lines.append(f"| {field} | {len(errors)} | {fmt(float(statistics.median(errors)))} |")
    lines += [
        "",
        "KV cache error by class (GiB per GPU; a quantized case that failed counts in both):",
        "",
        "| class | cases | median abs KV error | max abs KV error | KV error per case |",
        "|---|---:|---:|---:|---|",
    ]
    for name in CLASSES:
        members = [
            r
            for r in results
            if name in r["class"].split(", ")
            and "kv_cache_gib" in r["rows"]
            and r["rows"]["kv_cache_gib"]["logged"] is not None
        ]
        errors = [abs(r["rows"]["kv_cache_gib"]["error"]) for r in members]
        median = fmt(float(statistics.median(errors))) if errors else "-"
        worst = fmt(float(max(errors))) if errors else "-"
        per_case = ", ".join(f"{r['id']} {r['rows']['kv_cache_gib']['error']:+.2f}" for r in members) or "-"
        lines.append(f"| {name} | {len(errors)} | {median} | {worst} | {per_case} |")
    if abs_errors["kv_cache_gib"]:
        every = abs_errors["kv_cache_gib"]
        lines.append(f"| all | {len(every)} | {fmt(float(statistics.median(every)))} | {fmt(float(max(every)))} | - |")
    lines += ["", "| case | class | vLLM | plan | verdict |", "|---|---|---|---|---|"]
    for result in results:
        v = result["verdict"]
        mark = "ok" if v["ok"] else "WRONG"
        lines.append(f"| {result['id']} | {result['class']} | {v['expected']} | {v['planned']} | {mark} |")
    wrong = sum(not r["verdict"]["ok"] for r in results)
    lines += ["", f"Wrong verdicts: {wrong} of {len(results)} cases."]
    rel = [r for r in (kv_relative_error(x) for x in results) if r is not None]
    if rel:
        lines += [f"Median relative KV-cache error: {statistics.median(rel) * 100:.1f}% over {len(rel)} cases."]
    if per_call_s is not None:
        lines += ["", f"plan() microbenchmark: {per_call_s * 1e6:.1f} µs per call (mean of 2000 calls).", ""]
    return "\n".join(lines)


def v1_report(cases: list[dict[str, Any]]) -> str:
    """The V1 engine model against public V1 start-up logs, with the issue's goal and whether it is met."""
    results = [compare_case(case) for case in cases]
    text = report(results, None, "vLLM V1 engine model", "tests/data/calibration_v1/")
    rel = [r for r in (kv_relative_error(x) for x in results) if r is not None]
    median = statistics.median(rel) if rel else None
    wrong = sum(not r["verdict"]["ok"] for r in results)
    met = median is not None and median <= V1_KV_GOAL and wrong == 0 and len(rel) >= 5
    verdict = "met" if met else "NOT met"
    shown_median = "-" if median is None else f"{median * 100:.1f}%"
    return (
        "\n" + text + "\n\n"
        f"Goal (issue 33): median relative KV error <= {V1_KV_GOAL * 100:.0f}% over at least 5 cases, "
        f"no wrong verdict: {verdict} (median {shown_median} over {len(rel)} case(s), {wrong} wrong verdict(s)).\n"
    )


V1_HEADING = "# Capacity planner calibration (vLLM V1 engine model"


def replace_v1_section(text: str, section: str) -> str:
    """``text`` (a results.md) with its V1 calibration section, up to the next top-level heading, replaced by
    ``section`` (what v1_report returns); the other sections (load benches, scenario times) stay as they are."""
    start = text.find(V1_HEADING)
    if start < 0:
        raise SystemExit(f"no V1 calibration section ({V1_HEADING}...) in the file: run bench/report.py --out once")
    end = text.find("\n# ", start + len(V1_HEADING))
    end = len(text) if end < 0 else end
    return text[:start] + section.lstrip("\n") + text[end:]


# Modelled terms whose share of the KV error the ablation shows: planner function -> what it stands for.
ABLATED_TERMS = {
    "sampler_peak_bytes": "sampler live set (driver's top-k/top-p pass over max_num_seqs x vocab)",
    "rotary_cache_bytes": "rotary cos/sin cache in the weights",
}


def class_kv_medians(results: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median absolute KV error per class and over all cases."""
    medians: dict[str, float | None] = {}
    for name in (*CLASSES, "all"):
        errors = [
            abs(r["rows"]["kv_cache_gib"]["error"])
            for r in results
            if "kv_cache_gib" in r["rows"]
            and r["rows"]["kv_cache_gib"]["logged"] is not None
            and (name == "all" or name in r["class"].split(", "))
        ]
        medians[name] = float(statistics.median(errors)) if errors else None
    return medians


def ablation_report(cases: list[dict[str, Any]]) -> str:
    """The median KV error per class with each modelled term left out in turn (the term returns 0)."""
    header = " | ".join((*CLASSES, "all"))
    lines = [
        "",
        "Median abs KV error per class (GiB) with one modelled term left out, to show what each term buys:",
        "",
        f"| planner | {header} | max abs, all | wrong verdicts |",
        "|---|" + "---:|" * (len(CLASSES) + 3),
    ]
    variants = [("as shipped", None), *((f"without {label}", name) for name, label in ABLATED_TERMS.items())]
    for label, name in variants:
        original = getattr(capacity_planner, name) if name else None
        if name:
            setattr(capacity_planner, name, lambda *args: 0)
        try:
            results = [compare_case(case) for case in cases]
        finally:
            if name:
                setattr(capacity_planner, name, original)
        medians = class_kv_medians(results)
        wrong = sum(not r["verdict"]["ok"] for r in results)
        cells = " | ".join(fmt(medians[c]) for c in (*CLASSES, "all"))
        worst = max(
            (abs(r["rows"]["kv_cache_gib"]["error"]) for r in results if "kv_cache_gib" in r["rows"]), default=None
        )
        lines.append(f"| {label} | {cells} | {fmt(worst)} | {wrong} |")
    return "\n".join(lines) + "\n"


def unit_exposure_report() -> str:
    """`systemd-analyze security --offline=yes` exposure of every gpubox unit, per topology."""
    # A process of its own: rendering needs Ansible's collection loader, which this process (that
    # imported the collection as a plain package) cannot install any more.
    from tools import unit_security

    lines = [
        "",
        "# Exposure of the gpubox systemd units",
        "",
        "`systemd-analyze security --offline=yes` on each rendered unit (tools/unit_security.py; this",
        f"machine's systemd; 0 = locked down, 10 = exposed; ceiling {unit_security.MAX_EXPOSURE}, held by",
        "tests/unit/test_unit_security.py).",
        "",
        "| topology | unit | exposure |",
        "|---|---|---:|",
    ]
    for group in ("gpu_2x3090", "gpu_4x4090"):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "unit_security.py"), "--group", group, "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        if not proc.stdout.strip():
            raise SystemExit(f"tools/unit_security.py --group {group} failed:\n{proc.stderr}")
        for unit, score in json.loads(proc.stdout).items():
            lines.append(f"| {group} | {unit} | {score:.1f} |")
    return "\n".join(lines) + "\n"


def fleet_bench_report(logs: Path = ROOT / ".cache" / "molecule-logs") -> str:
    """Figures of the last molecule/fleet run, read from what it wrote (never made up here)."""
    lines = ["", "# Fleet (molecule/fleet, last run on this machine)", ""]
    converge, results = logs / "fleet.converge.json", logs / "fleet.results.json"
    if not converge.is_file() and not results.is_file():
        return "\n".join([*lines, "No fleet run recorded here (run: python tools/run_scenarios.py fleet).", ""])
    if converge.is_file():
        c = json.loads(converge.read_text())
        waves = c["waves"]
        if waves:
            lines += [
                f"Fresh fleet of {c['boxes']} boxes through the LAN cache on the gateway host, site.yml in waves:",
                "",
                "| wave | boxes | wall time (s) | upstream bytes | apt | PyPI | models | bytes sent to boxes |",
                "|---:|---|---:|---:|---:|---:|---:|---:|",
            ]
            for i, w in enumerate(waves, 1):
                lines.append(
                    f"| {i} | {', '.join(w['boxes'])} | {float(w['seconds']):.0f} | {int(w['upstream_bytes']):,} | "
                    f"{int(w['apt_upstream_bytes']):,} | {int(w['pypi_upstream_bytes']):,} | "
                    f"{int(w['models_upstream_bytes']):,} | {int(w['sent_bytes']):,} |"
                )
            one, rest = waves[0], waves[1:]
            n_rest = sum(len(w["boxes"]) for w in rest)
            lines += [
                "",
                f"- converge wall time: 1 box (cold cache) {float(one['seconds']):.0f} s; "
                + "; ".join(f"{len(w['boxes'])} boxes at once (warm cache) {float(w['seconds']):.0f} s" for w in rest)
                + f"; all {c['boxes']}: {float(c['seconds']):.0f} s",
                f"- upstream bytes, {c['boxes']} boxes / 1 box: **{float(c['upstream_ratio_n_over_1']):.4f}** "
                f"(bound {c['upstream_ratio_bound']}; the other {n_rest} boxes added "
                f"{sum(int(w['upstream_bytes']) for w in rest):,} bytes)",
                f"- {c.get('note', '')}",
            ]
    if results.is_file():
        r = json.loads(results.read_text())
        roll = r.get("rolling_rebuild") or {}
        if roll.get("load"):
            lines += fleet_load_lines(roll)
        move = r.get("stack_move") or {}
        if move.get("load_back"):
            lines += stack_move_lines(move)
        down = r.get("box_down") or {}
        if down:
            lines.append(
                f"- a box whose vLLM stopped without a drain (the health check took it out and back): "
                f"requests {down['requests']}, failed {down['failed']} (bound {down['bound']}: the one in flight)"
            )
        gpu = r.get("gpu_fault") or {}
        if gpu:
            lines.append(
                f"- a box whose GPU logged a fatal Xid (79, injected into the collector's test hook): the gateway took "
                f"it out {float(gpu['seconds_to_down']):.1f} s after its collector ran (health check every "
                f"{gpu['check_interval_ms']} ms, down after {gpu['check_fall']} failures); requests {gpu['requests']}, "
                f"failed {gpu['failed']} (bound {gpu['bound']})"
            )
        turn = r.get("failed_turn") or {}
        if turn:
            lines.append(f"- rebuild with a failing box: requests {turn['requests']}, failed {turn['failed']}")
    return "\n".join(lines) + "\n"


def stack_move_lines(move: dict) -> list[str]:
    """Steps (c) and (h) of molecule/fleet: the fleet moved to another stack by the roll of (c), and back."""
    back = move["load_back"]["roll"]
    kept = sum(all(box["on_disk"].values()) for box in move["boxes_back"])
    return [
        f"- stack move: the roll above moved the fleet to {move['to']}; the same command moved it back to "
        f"{move['back']} with pip's index unreachable in {float(move['seconds_back']):.0f} s under the same load: "
        f"streams {back['streams']}, failed {back['failed']}, truncated {back['truncated']}; "
        f"boxes holding both environments after it: {kept} of {len(move['boxes_back'])}",
    ]


def fleet_load_lines(roll: dict) -> list[str]:
    """Step (c) of molecule/fleet: the rolling rebuild under streaming load (harness/stream_load.py)."""
    load = roll["load"]
    lines = [
        "",
        f"Rolling rebuild (rebuild.yml, one box a turn, HAProxy and nginx reloaded during it) under {roll['clients']} "
        "streaming clients (3-8 s chats through the gateway, the engine stand-in on every box; 10 clients share one "
        f"session): {float(roll['seconds']):.0f} s.",
        "",
        "| phase | streams | failed | truncated | TTFT p50 (ms) | TTFT p99 (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("steady", "roll"):
        p = load[name]
        lines.append(
            f"| {name} | {p['streams']} | {p['failed']} | {p['truncated']} | {p['ttft_p50_ms']} | {p['ttft_p99_ms']} |"
        )
    steady, during = load["steady"]["ttft_p99_ms"], load["roll"]["ttft_p99_ms"]
    ratio = f"{during / steady:.2f}x" if steady and during else "n/a"
    drains = "; ".join(
        f"{box} {row['drain']['seconds']} s ({row['drain']['in_flight_at_drain']} in flight"
        + (", TIMED OUT" if row["drain"].get("timed_out") else "")
        + ")"
        for box, row in roll["boxes"].items()
        if row.get("drain")
    )
    lines += [
        "",
        f"- p99 TTFT during the roll / steady state: {ratio} (goal: within 2x)",
        f"- drains (until the box's streams and any old HAProxy worker were done): {drains or 'not recorded'}",
        f"- load per box in the steady state (mean streams in flight): {load['load_per_box']}; busiest / mean "
        f"**{load['busiest_over_mean']}** (bound {roll['bound_busiest_over_mean']}); share of each session's streams "
        f"on its most frequent box: **{load['session_share_on_own_box']}** (goal: at least 0.9)"
        + (
            f"; without the hot session's: {load['session_share_without_hot']}"
            if load.get("session_share_without_hot") is not None
            else ""
        ),
    ]
    return lines


PROXY_LOAD = ROOT / "bench" / "proxy-load.json"


def by_level(results: dict[str, list[dict]]) -> list[tuple[int, str, dict]]:
    """(level, path, row) for every row, level by level, the paths in their order within a level."""
    levels = sorted({row["level"] for rows in results.values() for row in rows})
    return [(level, name, row) for level in levels for name, rows in results.items() for row in rows
            if row["level"] == level]  # fmt: skip


def added_ttft_lines(results: dict[str, list[dict]], source: str) -> list[str]:
    """What each path after "direct" adds to direct's p99 TTFT, level by level (rows with figures only)."""
    direct = {row["level"]: row for row in results.get("direct", []) if row.get("ttft_p99_ms") is not None}
    lines = []
    for name in list(results)[1:]:
        added = [
            (row["level"], row["ttft_p99_ms"] - direct[row["level"]]["ttft_p99_ms"])
            for row in results[name]
            if row["level"] in direct and row.get("ttft_p99_ms") is not None
        ]
        if added:
            text = ", ".join(f"{level}: {delta:+.1f}" for level, delta in added)
            lines.append(f"- {name} adds to direct p99 TTFT (ms, by level{source}): {text}.")
    return [*lines, ""]


PROXY_HEADING = "# Streams through the front door and the gateway (bench/proxy_load.py)"


def proxy_load_report(path: Path = PROXY_LOAD) -> str:
    """bench/proxy_load.py's run of record: direct, front door and gateway side by side (never made up here)."""
    lines = ["", PROXY_HEADING, ""]
    if not path.is_file():
        return "\n".join([*lines, f"No run recorded (run: make bench-load, which writes {shown(path)}).", ""])
    data = json.loads(path.read_text())
    standin = data["stand_in"]
    split = any("ttft_kept_p99_ms" in r for rows in data["results"].values() for r in rows)
    lines += [
        f"Command: `{data['command']}` ({data['when']}, {data['machine']}, {data['nginx']}). The engine is the",
        f"TEST ONLY stand-in (TTFT {standin['ttft_ms']:g} ms, ITL {standin['itl_ms']:g} ms, {standin['tokens']} tokens"
        f" a stream, {data['requests_per_client']} streams a client one after the other"
        + (f", {data['rounds']} rounds a level, the paths in turn" if data.get("rounds", 1) > 1 else "")
        + "); client, proxies and",
        "stand-in share the machine's cores. The stand-in's own TTFT and ITL are the floor every path starts from;",
        "TTFT counts from the request sent on an open connection (the connection's set-up is its own column)"
        + (
            "; first: each connection's first stream (a level's clients all start at once), kept: the later ones."
            if split
            else "."
        ),
        "",
        "| level | path | streams ok / sent | errors | truncated | most in flight | streams/s "
        "| TTFT p50 / p99 ms | ITL p50 / p99 ms | connect p50 / p99 ms |"
        + (" TTFT p99 ms: first / kept |" if split else ""),
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if split else ""),
    ]
    for level, name, r in by_level(data["results"]):
        lines.append(
            f"| {level} | {name} | {r['completed']} / {r['streams']} | {r['errors']} | {r['truncated']} "
            f"| {r['most_in_flight']} | {fmt(r['streams_per_s'])} | {fmt(r['ttft_p50_ms'])} / "
            f"{fmt(r['ttft_p99_ms'])} | {fmt(r['itl_p50_ms'])} / {fmt(r['itl_p99_ms'])} "
            f"| {fmt(r.get('connect_p50_ms'))} / {fmt(r.get('connect_p99_ms'))} |"
            + (f" {fmt(r.get('ttft_first_p99_ms'))} / {fmt(r.get('ttft_kept_p99_ms'))} |" if split else "")
        )
    held = ", ".join(f"{name} {n}" for name, n in data["most_streams_held"].items())
    lines += ["", f"Most concurrent streams held with 0 errors and 0 truncated: {held}.", ""]
    return "\n".join(
        [*lines, *added_ttft_lines(data["results"], ""), *gateway_goal_lines(data["results"]), *haproxy_lines(data)]
    )


PROXY_GOAL_LEVEL, PROXY_GOAL_MS = 32, 10.0


def paired_added(results: dict[str, list[dict]], name: str) -> tuple[float, float, str, str] | None:
    """What gateway path ``name`` adds to the front door's p99 TTFT at the goal's level, kept-alive and first streams:
    (kept, first, how it was read, each round's kept figure), or None without the figures."""
    rows = {path: next((r for r in results.get(path, []) if r["level"] == PROXY_GOAL_LEVEL), None)
            for path in ("front door", name)}  # fmt: skip
    front, gateway = rows["front door"], rows[name]
    if not (front and gateway and gateway.get("ttft_kept_p99_ms") is not None and front.get("ttft_kept_p99_ms")):
        return None
    rounds = [
        (g - f, gf - ff)
        for g, f, gf, ff in zip(
            gateway.get("ttft_kept_p99_rounds_ms", []),
            front.get("ttft_kept_p99_rounds_ms", []),
            gateway.get("ttft_first_p99_rounds_ms", []),
            front.get("ttft_first_p99_rounds_ms", []),
        )
        if None not in (g, f, gf, ff)
    ]
    if len(rounds) > 1:  # each round beside the front door's just before it; the median is what one spike moves least
        kept, first = statistics.median(k for k, _ in rounds), statistics.median(f for _, f in rounds)
        how = f"the median over {len(rounds)} rounds of the gateway's p99 less the front door's, round by round"
        each = f" (kept-alive, each round: {', '.join(f'{k:+.1f}' for k, _ in rounds)})"
    else:
        kept = gateway["ttft_kept_p99_ms"] - front["ttft_kept_p99_ms"]
        first = gateway["ttft_first_p99_ms"] - front["ttft_first_p99_ms"]
        how, each = "p99 over all streams", ""
    return kept, first, how, each


def gateway_goal_lines(results: dict[str, list[dict]]) -> list[str]:
    """Issue 47's goal: at 32 streams the gateway adds at most 10 ms to the front door's p99 TTFT, side by side;
    read on the streams of kept-alive connections (the steady state), with the connections' first streams beside;
    then the same figures for each variant of the gateway that ran beside it."""
    added = paired_added(results, "gateway")
    if added is None:
        return []
    kept, first, how, each = added
    met = kept <= PROXY_GOAL_MS
    lines = [
        f"Goal (issue 47): the gateway adds at most {PROXY_GOAL_MS:g} ms to the front door's p99 TTFT at"
        f" {PROXY_GOAL_LEVEL} streams: {'met' if met else 'NOT met'} on kept-alive connections ({kept:+.1f} ms);"
        f" each connection's first stream, all {PROXY_GOAL_LEVEL} at once: {first:+.1f} ms ({how}){each}.",
        "",
    ]
    variants = [(name, paired_added(results, name)) for name in results if name.startswith("gateway, ")]
    if variants := [(name, figures) for name, figures in variants if figures is not None]:
        lines += [f"The same figures for the gateway's variants at {PROXY_GOAL_LEVEL} streams, read the same way:", ""]
        lines += [f"- {name}: kept-alive {k:+.1f} ms, first streams {f:+.1f} ms{e}." for name, (k, f, _, e) in variants]
        lines.append("")
    return lines


def haproxy_lines(data: dict) -> list[str]:
    """Each gateway's HAProxy: what its environment was given, its minor page faults per stream and its peak
    resident memory, level by level (runs that recorded them)."""
    lines = []
    for name, rows in data["results"].items():
        rows = [r for r in rows if "haproxy_page_faults" in r]
        if not rows:
            continue
        given = data.get("haproxy_environment", {}).get(name)
        env = " ".join(f"{k}={v}" for k, v in sorted(given.items())) if given else "nothing"
        faults = ", ".join(f"{r['level']}: {r['haproxy_page_faults'] / max(r['streams'], 1):.0f}" for r in rows)
        peak = ", ".join(f"{r['level']}: {r['haproxy_peak_rss_kib'] / 1024:.0f}" for r in rows)
        lines.append(
            f"- {name}: its environment given `{env}`; page faults per stream (by level) {faults};"
            f" peak resident memory so far (MiB, after each level) {peak}."
        )
    if not lines:
        return []
    return ["HAProxy's minor page faults over each level's rounds (/proc, its own streams) and memory:", "", *lines, ""]


GUIDELLM_LOAD = ROOT / "bench" / "guidellm-load.json"


def guidellm_load_report(path: Path = GUIDELLM_LOAD) -> str:
    """bench/guidellm_load.py's run of record: guidellm's own figures for the three paths (never made up here)."""
    lines = ["", "# The three paths measured by guidellm (bench/guidellm_load.py)", ""]
    if not path.is_file():
        return "\n".join([*lines, f"No run recorded (run: make bench-load, which writes {shown(path)}).", ""])
    data = json.loads(path.read_text())
    standin, load = data["stand_in"], data["load"]
    lines += [
        f"Command: `{data['command']}` ({data['when']}, {data['machine']}, {data['client']}), its",
        f"concurrent profile for {load['seconds']:g} s a level; {load['output_tokens']} output tokens a request; the",
        f"engine is the TEST ONLY stand-in (TTFT {standin['ttft_ms']:g} ms, ITL {standin['itl_ms']:g} ms).",
        "Incomplete: requests cut when guidellm's time was up. guidellm's worker processes share the machine's",
        "cores with the proxies.",
        "",
        "| level | path | successful | errored | incomplete | requests/s | most concurrent "
        "| TTFT p50 / p99 ms | ITL p50 / p99 ms | latency p99 s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for level, name, r in by_level(data["results"]):
        if "error" in r:
            lines.append(f"| {level} | {name} | {r['error'][:80]} | | | | | | | |")
            continue
        lines.append(
            f"| {level} | {name} | {r['successful']} | {r['errored']} | {r['incomplete']} "
            f"| {fmt(r['requests_per_s'])} | {fmt(r['concurrency_max'])} | {fmt(r['ttft_p50_ms'])} / "
            f"{fmt(r['ttft_p99_ms'])} | {fmt(r['itl_p50_ms'])} / {fmt(r['itl_p99_ms'])} "
            f"| {fmt(r['latency_p99_s'])} |"
        )
    return "\n".join([*lines, "", *added_ttft_lines(data["results"], ", guidellm's figures")])


AFFINITY_LOAD = ROOT / "bench" / "affinity-load.json"


def affinity_load_report(path: Path = AFFINITY_LOAD) -> str:
    """bench/affinity_load.py's run of record: the load bound against session affinity, per factor."""
    lines = ["", "# Session affinity against the load bound (bench/affinity_load.py)", ""]
    if not path.is_file():
        return "\n".join([*lines, f"No run recorded (run: make bench-load, which writes {shown(path)}).", ""])
    data = json.loads(path.read_text())
    load = data["load"]
    lines += [
        f"Command: `{data['command']}` ({data['when']}, {data['machine']}, {data['haproxy']}). Three stand-in",
        f"boxes behind their front doors and the gateway; the fleet's client and mix ({load['clients']} clients,",
        f"{load['hot_clients']} of them in one session, the rest over {load['sessions']} sessions), {load['seconds']:g}"
        f" s per placement after {load['warmup']:g} s, {load['placements']} placements (the fleet's session names,",
        "then the same mix under other names). Each cell: the fleet's names / the worst placement / the mean.",
        "Goals (issue 22): busiest box at most 1.25x the mean; at least 0.9 of a session's streams on one box.",
        "",
        "| variant | streams | failed | truncated | busiest / mean | session share | share without the hot session |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in data["results"].items():

        def cell(key: str, r: dict = r) -> str:
            v = r.get(key)
            return f"{fmt(v['fleet_names'])} / {fmt(v['worst'])} / {fmt(v['mean'])}" if v else "-"

        lines.append(
            f"| {name} | {r['streams']} | {r['failed']} | {r['truncated']} | {cell('busiest_over_mean')} "
            f"| {cell('session_share_on_own_box')} | {cell('session_share_without_hot')} |"
        )
    return "\n".join([*lines, ""])


PLACEMENT_LOAD = ROOT / "bench" / "placement-load.json"
PLACEMENT_REAL_ENGINE = ROOT / "bench" / "placement-real-engine.json"
PLACEMENT_DRAWS = ROOT / "bench" / "placement-draws.json"  # the same bench, more draws of fewer policies
PLACEMENT_HEADING = "# Placement inside a pool against the prefix cache"
PLACEMENT_HIT_GOAL, PLACEMENT_BOUND = 2.0, 1.25  # issue 47: prefix-aware / session-hash hit rate; busiest / mean


def placement_load_report(
    path: Path = PLACEMENT_LOAD, real: Path = PLACEMENT_REAL_ENGINE, more: Path = PLACEMENT_DRAWS
) -> str:
    """bench/placement_load.py's run of record: hit rate, TTFT and balance per placement policy and workload."""
    lines = ["", f"{PLACEMENT_HEADING} (bench/placement_load.py)", ""]
    if not path.is_file():
        hint = f"No run recorded (run: python bench/placement_load.py, which writes {shown(path)})."
        return "\n".join([*lines, hint, ""])
    data = json.loads(path.read_text())
    load, box = data["load"], data["stand_in"]
    lines += [
        f"Command: `{data['command']}` ({data['when']}, {data['machine']}, {data['haproxy']}, vllm-router "
        f"{data.get('vllm_router') or '-'}). Three engine stand-ins (TEST ONLY) whose prefix cache is a model of vLLM",
        f"0.32's ({box['cache_blocks']} blocks of {box['block_size']} words per box, LRU; TTFT {box['ttft_ms']:g} ms +"
        f" {box['prefill_ms_per_token']:g} ms per uncached token), {load['clients']} closed-loop clients, "
        f"{load['seconds']:g} s per policy and workload, figures after {load['warmup']:g} s.",
        f"shared-prompts: {load['system_prompts']} system prompts of {load['system_words']} words, one per application,"
        f" each stream a new short question of one of {load.get('users', '-')} users; multi-turn:"
        f" {load.get('chats', '-')} chats at once that grow turn by turn (4-10 turns), each stream a turn of one."
        " The gateway's",
        "policies pass HAProxy and nginx with TLS; vllm-router's reach the router over plain HTTP, then the same",
        "nginx front doors over TLS: compare its TTFT with vllm-router-rr (the same path, round-robin), its hit rate",
        "and balance with all.",
        "failed: streams without a 200 or not whole.",
    ]
    seeds = load.get("seeds", [])
    if len(seeds) > 1:
        lines.append(
            f"Each policy ran {len(seeds)} draws (seeds {', '.join(map(str, seeds))}: the prompts' texts and session"
            " names, so where a hash puts them); a row's figures are the first draw's, the last column each draw's hit"
            " rate (busiest / mean) and their mean."
        )
    lines.append("")
    if any("own_box_share" in r for p in data["results"].values() for r in p.values()):
        lines += [
            "own box: of each application's (shared-prompts) or chat's (multi-turn) streams, the share on its most",
            "frequent box; apps per box: how many applications have each box as their most frequent (the hash's spread",
            "of the prompts).",
            "",
        ]
    for workload, policies in data["results"].items():
        draws = any("draws" in r for r in policies.values())
        own = any("own_box_share" in r for r in policies.values())
        lines += [
            f"{workload}:",
            "",
            "| policy | streams | failed | hit rate | TTFT p50 ms | TTFT p99 ms | busiest / mean |"
            + (" own box |" if own else "")
            + (" draws: hit rate (busiest / mean; apps per box); mean |" if draws else ""),
            "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if own else "") + ("---|" if draws else ""),
        ]
        for name, r in policies.items():
            row = (
                f"| {name} | {r['streams']} | {r['failed'] + r['truncated']} | {fmt(r['hit_rate'])} "
                f"| {fmt(r['ttft_p50_ms'])} | {fmt(r['ttft_p99_ms'])} | {fmt(r['busiest_over_mean'])} |"
            )
            if own:
                row += f" {fmt(r.get('own_box_share'))} |"
            if draws:
                row += f" {draw_cells(r.get('draws', []))}; {fmt(r.get('hit_rate_mean'))} |"
            lines.append(row)
        lines.append("")
    shared = data["results"].get("shared-prompts", {})
    prefix, session = shared.get("prefix-aware"), shared.get("session-hash")
    if prefix and session and session["hit_rate"] and prefix["busiest_over_mean"] is not None:
        # the mean over the draws where there are several; the busiest box over both workloads and every draw
        ratio = prefix.get("hit_rate_mean", prefix["hit_rate"]) / session.get("hit_rate_mean", session["hit_rate"])
        busiest = max(
            d["busiest_over_mean"]
            for p in data["results"].values()
            if "prefix-aware" in p
            for d in p["prefix-aware"].get("draws", [p["prefix-aware"]])
        )
        met = ratio >= PLACEMENT_HIT_GOAL and busiest <= PLACEMENT_BOUND
        over_draws = " and all draws" if len(seeds) > 1 else ""
        lines += [
            f"Goal (issue 47): prefix-aware at least {PLACEMENT_HIT_GOAL:g}x session-hash's hit rate on shared-prompts,"
            f" busiest box <= {PLACEMENT_BOUND:g}x the mean: {'met' if met else 'NOT met'} ({ratio:.2f}x;"
            f" prefix-aware's busiest / mean at most {busiest:.3f} over both workloads{over_draws}).",
            "",
        ]
    if more.is_file():
        lines += placement_draws_lines(json.loads(more.read_text()))
    if real.is_file():
        engine = json.loads(real.read_text())
        rounds = "; ".join(
            f"request {r['request']}: {r['hits']:g} of {r['queries']:g} tokens hit" for r in engine["rounds"]
        )
        lines += [
            f"The real engine (`{engine['command']}`, {engine['when']}): vLLM {engine['vllm']} for CPUs, the tiny test"
            f" model, one prompt twice, read by the same reader: {rounds} (vllm:prefix_cache_hits_total over"
            f" vllm:prefix_cache_queries_total); the stand-in's model predicts {engine['model_predicts_hits']} at the"
            f" CPU backend's block size ({engine['block_size']}).",
            "",
        ]
    return "\n".join(lines)


def draw_cells(draws: list[dict]) -> str:
    """Each draw's hit rate (busiest / mean; the applications per box, where recorded), comma-separated."""
    cells = []
    for d in draws:
        apps = "; " + "/".join(str(n) for n in d["apps_per_box"].values()) if d.get("apps_per_box") else ""
        cells.append(f"{fmt(d['hit_rate'])} ({fmt(d['busiest_over_mean'])}{apps})")
    return ", ".join(cells)


def placement_draws_lines(data: dict) -> list[str]:
    """A second run of bench/placement_load.py with several draws: each draw's hit rate and busiest box per policy."""
    seeds = data["load"].get("seeds", [])
    lines = [
        f"Draws (`{data['command']}`, {data['when']}, the defaults above, {data['load']['seconds']:g} s per load):"
        f" seeds {', '.join(map(str, seeds))}, each the prompts' texts and session names, so where a hash puts them.",
        "",
        "| workload | policy | hit rate per draw (busiest / mean; apps per box) | mean hit rate |",
        "|---|---|---|---:|",
    ]
    for workload, policies in data["results"].items():
        for name, r in policies.items():
            each = draw_cells(r.get("draws", [r]))
            lines.append(f"| {workload} | {name} | {each} | {fmt(r.get('hit_rate_mean', r['hit_rate']))} |")
    return [*lines, ""]


def replace_section(text: str, heading: str, section: str, before: str) -> str:
    """``text`` with its section under ``heading`` (up to the next top-level heading) replaced by ``section``, or
    ``section`` put before the heading ``before`` when it has none; the other sections stay as they are."""
    start = text.find(heading)
    if start < 0:
        start = end = text.find(before)
        if start < 0:
            raise SystemExit(f"neither {heading!r} nor {before!r} in the file: run bench/report.py --out once")
    else:
        end = text.find("\n# ", start + len(heading))
        end = len(text) if end < 0 else end + 1
    return text[:start] + section.lstrip("\n") + "\n" + text[end:]


SCENARIO_TIMES = ROOT / "bench" / "scenario-times.json"
MEASURED_TIMES = ROOT / ".cache" / "molecule-logs" / "times.json"
RECORD_HINT = "run `make molecule`, then `python bench/report.py --record-times`"


def shown(path: Path) -> str:
    """The path relative to the checkout when it lies inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def load_times(path: Path) -> dict[str, Any]:
    """times.json as tools/run_scenarios.py writes it, its shape checked (the message names the file)."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise SystemExit(f"{path}: not JSON ({err}); {RECORD_HINT}") from err
    if not isinstance(data, dict) or not isinstance(data.get("scenarios"), list):
        raise SystemExit(f"{path}: no list 'scenarios' (not a tools/run_scenarios.py times file); {RECORD_HINT}")
    for i, row in enumerate(data["scenarios"]):
        missing = [k for k in ("scenario", "result", "seconds", "phases") if k not in row]
        bad = [p for p in row.get("phases", []) if not {"phase", "seconds"} <= set(p)]
        if missing or bad:
            what = f"lacks {', '.join(missing)}" if missing else "has a phase without 'phase' and 'seconds'"
            raise SystemExit(f"{path}: scenarios[{i}] {what}; {RECORD_HINT}")
    return data


def phase_columns(scenarios: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """Table columns: (phase, nth time it ran in a scenario), in the order the scenarios ran them; a phase
    that runs twice (destroy, first and last) has a column for each time."""
    columns: list[tuple[str, int]] = []
    for row in scenarios:
        seen: dict[str, int] = {}
        after = -1
        for phase in row["phases"]:
            seen[phase["phase"]] = seen.get(phase["phase"], 0) + 1
            key = (phase["phase"], seen[phase["phase"]])
            if key not in columns:
                columns.insert(after + 1, key)
            after = columns.index(key)
    return columns


def phase_cells(row: dict[str, Any], columns: list[tuple[str, int]]) -> dict[tuple[str, int], float]:
    seen: dict[str, int] = {}
    cells: dict[tuple[str, int], float] = {}
    for phase in row["phases"]:
        seen[phase["phase"]] = seen.get(phase["phase"], 0) + 1
        cells[(phase["phase"], seen[phase["phase"]])] = float(phase["seconds"])
    return cells


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def scenario_times_report(path: Path = SCENARIO_TIMES) -> str:
    """Wall time of each molecule scenario of the run of record and of each of its phases (molecule
    actions), from the times tools/run_scenarios.py measured (never estimated)."""
    lines = ["", "# make test: time per scenario and phase", ""]
    if not path.is_file():
        lines.append(f"not measured: no {shown(path)} ({RECORD_HINT}).")
        return "\n".join(lines) + "\n"
    data = load_times(path)
    rows = data["scenarios"]
    columns = phase_columns(rows)
    names = [name if n == 1 else f"{name} #{n}" for name, n in columns]
    lines += [
        f"Seconds, from {shown(path)} (tools/run_scenarios.py, {data.get('jobs', '?')} scenarios at a",
        f"time, {data.get('started', '?')} to {data.get('finished', '?')}). A phase is one molecule action, timed",
        "from its `Executing` line to its `Executed` line; other = the scenario's wall time outside them",
        "(molecule's own start-up and bookkeeping). Scenarios in the order they started.",
        "",
        "| scenario | result | wall | " + " | ".join(names) + " | other |",
        "|---|---|---:|" + "---:|" * (len(columns) + 1),
    ]
    totals = dict.fromkeys(columns, 0.0)
    for row in rows:
        cells = phase_cells(row, columns)
        for key, value in cells.items():
            totals[key] += value
        other = float(row["seconds"]) - sum(cells.values()) if row["phases"] else None
        lines.append(
            f"| {row['scenario']} | {row['result']} | {seconds(float(row['seconds']))} | "
            + " | ".join(seconds(cells.get(key)) for key in columns)
            + f" | {seconds(other)} |"
        )
    wall = sum(float(row["seconds"]) for row in rows)
    other_all = wall - sum(totals.values())
    results = Counter(str(row["result"]) for row in rows)
    lines.append(
        f"| all | {', '.join(f'{n} {state}' for state, n in sorted(results.items()))} | {seconds(wall)} | "
        + " | ".join(seconds(totals[key]) for key in columns)
        + f" | {seconds(other_all)} |"
    )
    elapsed = elapsed_seconds(data)
    if elapsed is not None:
        lines += [
            "",
            f"Molecule step, first start to last end: {elapsed:.0f} s; sum of scenario wall times {wall:.0f} s.",
        ]
    return "\n".join(lines) + "\n"


def elapsed_seconds(data: dict[str, Any]) -> float | None:
    try:
        started = datetime.fromisoformat(str(data["started"]))
        finished = datetime.fromisoformat(str(data["finished"]))
    except (KeyError, ValueError):
        return None
    return (finished - started).total_seconds()


def record_times(source: Path = MEASURED_TIMES, dest: Path = SCENARIO_TIMES) -> None:
    """Make the last measured run (tools/run_scenarios.py's times.json) the run of record."""
    if not source.is_file():
        raise SystemExit(f"no {source}: run `make molecule` (tools/run_scenarios.py writes it) first")
    data = load_times(source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(data, indent=2) + "\n")


HARNESS_FIGURES = ROOT / "bench" / "harness-figures.json"


def harness_figures_report(path: Path = HARNESS_FIGURES) -> str:
    """The harness's figures measured by hand (bench/harness-figures.json), newest first, each with its source."""
    lines = ["", "# The harness: figures measured by hand", ""]
    if not path.is_file():
        return "\n".join([*lines, f"none recorded (no {shown(path)}).", ""])
    data = json.loads(path.read_text())
    rows = sorted(data["figures"], key=lambda f: f["measured"], reverse=True)
    lines += [
        f"{data['about']} Source: {shown(path)}.",
        "",
        "| measured | what | figure | commit |",
        "|---|---|---|---|",
    ]
    lines += [f"| {f['measured']} | {f['what']} | {f['figure']} | {f['commit']} |" for f in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the Markdown report here too")
    parser.add_argument(
        "--record-times",
        action="store_true",
        help=f"copy {MEASURED_TIMES.relative_to(ROOT)} to {SCENARIO_TIMES.relative_to(ROOT)}, print that section, stop",
    )
    parser.add_argument(
        "--v1-only",
        action="store_true",
        help="print only the V1 calibration section; with --out, replace that section of the file and keep the rest",
    )
    parser.add_argument(
        "--proxy-only",
        action="store_true",
        help="print only the proxy_load section; with --out, replace that section of the file, keep the rest",
    )
    parser.add_argument(
        "--placement-only",
        action="store_true",
        help="print only the placement section; with --out, replace (or add) that section of the file, keep the rest",
    )
    args = parser.parse_args(argv)
    if args.proxy_only:
        section = proxy_load_report()
        print(section)
        if args.out:
            args.out.write_text(replace_section(args.out.read_text(), PROXY_HEADING, section, PLACEMENT_HEADING))
        return 0
    if args.placement_only:
        section = placement_load_report()
        print(section)
        if args.out:
            text = args.out.read_text()
            args.out.write_text(replace_section(text, PLACEMENT_HEADING, section, "# make test: time per scenario"))
        return 0
    if args.v1_only:
        section = v1_report(load_cases(CALIBRATION_V1_DIR))
        print(section)
        if args.out:
            args.out.write_text(replace_v1_section(args.out.read_text(), section))
        return 0
    if args.record_times:
        record_times()
        print(scenario_times_report())
        return 0
    cases = load_cases()
    results = [compare_case(case) for case in cases]
    text = (
        report(results, time_plan())
        + ablation_report(cases)
        + v1_report(load_cases(CALIBRATION_V1_DIR))
        + families.report()
        + unit_exposure_report()
        + fleet_bench_report()
        + proxy_load_report()
        + guidellm_load_report()
        + affinity_load_report()
        + placement_load_report()
        + scenario_times_report()
        + harness_figures_report()
    )
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
