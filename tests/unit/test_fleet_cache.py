"""The LAN cache (issue 8): gpubox_fleet_cache_url's one validator and what boxes derive from it."""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("http://10.0.0.5", "http://10.0.0.5"),
        ("http://cache.lan:8080/", "http://cache.lan:8080"),
        ("https://Cache.LAN", "https://cache.lan"),
        ("http://[fd00::5]:81", "http://[fd00::5]:81"),
    ],
)
def test_a_cache_url_is_normalized(value: str, expect: str) -> None:
    assert state_checks.check("gpubox_fleet_cache_url", value) == (expect, None)


@pytest.mark.parametrize("value", ["", None, "null"])
def test_no_cache_is_no_error_and_no_endpoint(value: Any) -> None:
    normalized, error = state_checks.check("gpubox_fleet_cache_url", value)
    assert error is None and normalized is None
    assert state_checks.fleet_cache_endpoints(normalized) == {"apt_proxy": "", "pypi_index": "", "model_endpoint": ""}


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("ftp://cache.lan", "over http or https only"),
        ("cache.lan:3142", "over http or https only"),
        ("http://", "over http or https only"),
        ("http://user:pw@cache.lan", "carries credentials"),  # pragma: allowlist secret (a refused test input)
        ("http://token@cache.lan", "carries credentials"),
        ("http://cache.lan/mirror", "a path, query or fragment is not supported"),
        ("http://cache.lan/?x=1", "a path, query or fragment is not supported"),
        ("http://cache.lan:99999", "not a URL"),
        (3142, "must be a URL string"),
    ],
)
def test_a_bad_cache_url_gets_one_line_naming_the_variable(value: Any, expect: str) -> None:
    _, error = state_checks.check("gpubox_fleet_cache_url", value)
    assert error is not None and error.startswith("gpubox_fleet_cache_url ") and expect in error
    assert "\n" not in error
    if isinstance(value, str) and "pw" in value:
        assert "pw" not in error  # the password is never echoed


def test_the_validate_entry_point_reports_it() -> None:
    state = state_checks.validate({"gpubox_fleet_cache_url": "ftp://x"})
    assert any(e.startswith("gpubox_fleet_cache_url ") for e in state.errors)


def test_endpoints_derived_from_the_url() -> None:
    assert state_checks.fleet_cache_endpoints("http://10.231.94.10:8080") == {
        "apt_proxy": "http://10.231.94.10:3142/",
        "pypi_index": "http://10.231.94.10:8080/index/",
        "model_endpoint": "http://10.231.94.10:8080",
    }
    assert state_checks.fleet_cache_endpoints("https://[fd00::5]")["apt_proxy"] == "http://[fd00::5]:3142/"


def test_a_cache_on_a_gpu_box_is_refused_naming_it() -> None:
    boxes = {"box-a": ["10.0.0.11"], "box-b": ["10.0.0.12"]}
    problem = state_checks.fleet_cache_host_problem("http://10.0.0.12:8080", boxes)
    assert problem is not None and "box-b" in problem and problem.startswith("gpubox_fleet_cache_url ")
    assert "box-a" in (state_checks.fleet_cache_host_problem("http://BOX-A", boxes) or "")
    assert state_checks.fleet_cache_host_problem("http://10.0.0.5", boxes) is None
    assert state_checks.fleet_cache_host_problem(None, boxes) is None


def test_nothing_is_derived_from_a_refused_url() -> None:
    state = state_checks.validate({"gpubox_fleet_cache_url": "http://u:p@cache.lan"})  # pragma: allowlist secret
    assert state.public()["gpubox_fleet_cache"] == {"apt_proxy": "", "pypi_index": "", "model_endpoint": ""}


def test_bench_says_not_measured_without_the_scenarios_results(tmp_path) -> None:
    from bench import report as bench

    text = bench.fleet_bench_report(tmp_path)
    assert "No fleet run recorded here" in text and "3 boxes / 1 box" not in text


def test_bench_reports_the_fleet_waves_from_the_scenarios_record(tmp_path) -> None:
    """make bench's fleet section is computed from what molecule/fleet wrote, wave by wave."""
    import json

    from bench import report as bench

    wave = {"apt_upstream_bytes": "0", "pypi_upstream_bytes": "0", "models_upstream_bytes": "0"}
    converge = {
        "boxes": 3,
        "seconds": 900.0,
        "waves": [
            {**wave, "boxes": ["b1"], "seconds": "400", "upstream_bytes": "1000", "apt_upstream_bytes": "1000",
             "sent_bytes": "1000"},
            {**wave, "boxes": ["b2", "b3"], "seconds": "500", "upstream_bytes": "10", "sent_bytes": "2000"},
        ],
        "upstream_ratio_n_over_1": 1.01,
        "upstream_ratio_bound": 1.1,
        "note": "a note",
    }  # fmt: skip
    (tmp_path / "fleet.converge.json").write_text(json.dumps(converge))
    phase = {"streams": 80, "failed": 0, "truncated": 0, "ttft_p50_ms": 210.0, "ttft_p99_ms": 300.0}
    roll = {"seconds": "300", "clients": 32, "bound_busiest_over_mean": 1.25,
            "boxes": {"b1": {"drain": {"seconds": 12.5, "in_flight_at_drain": 9, "timed_out": False}}, "b2": {}},
            "load": {"steady": phase, "roll": {**phase, "ttft_p99_ms": 450.0}, "load_per_box": {"b1": 11.0},
                     "busiest_over_mean": 1.1, "session_share_on_own_box": 0.93}}  # fmt: skip
    on_disk = {"/opt/gpubox/venv": True, "/opt/gpubox/venv-lts-580": True}
    move = {"to": "lts-580", "back": "pinned-0.7.3", "seconds_back": 95.4,
            "boxes_back": [{"on_disk": on_disk}, {"on_disk": {**on_disk, "/opt/gpubox/venv-lts-580": False}}],
            "load_back": {"steady": phase, "roll": {**phase, "streams": 64}}}  # fmt: skip
    (tmp_path / "fleet.results.json").write_text(json.dumps({"rolling_rebuild": roll, "stack_move": move}))
    text = bench.fleet_bench_report(tmp_path)
    assert "moved the fleet to lts-580" in text and "back to pinned-0.7.3 with pip's index unreachable in 95 s" in text
    assert "streams 64, failed 0, truncated 0; boxes holding both environments after it: 1 of 2" in text
    assert "| 2 | b2, b3 | 500 | 10 | 0 | 0 | 0 | 2,000 |" in text
    assert "1 box (cold cache) 400 s; 2 boxes at once (warm cache) 500 s; all 3: 900 s" in text
    assert "3 boxes / 1 box: **1.0100**" in text and "added 10 bytes" in text
    assert "| roll | 80 | 0 | 0 | 210.0 | 450.0 |" in text
    assert "steady state: 1.50x" in text and "b1 12.5 s (9 in flight)" in text
    assert "busiest / mean **1.1** (bound 1.25)" in text and "**0.93**" in text
