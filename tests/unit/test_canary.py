"""The canary's verdict (plugins/module_utils/canary.py): each fault class fails it, naming why; the healthy canary
passes; too little traffic never passes; a window that cannot be read is refused."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import canary

TTFT_LES = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
GAP_LES = (0.025, 0.05, 0.1, 0.2, 0.5)


def hist_text(name: str, les: tuple[float, ...], observations: list[float], model: str = "tiny") -> str:
    """A histogram as vLLM's prometheus_client writes it, from observations."""
    lines = [f"# TYPE {name} histogram"]
    for le in (*les, float("inf")):
        count = sum(1 for o in observations if o <= le)
        shown = "+Inf" if le == float("inf") else repr(le)
        lines.append(f'{name}_bucket{{le="{shown}",model_name="{model}"}} {count}.0')
    lines.append(f'{name}_count{{model_name="{model}"}} {float(len(observations))}')
    lines.append(f'{name}_sum{{model_name="{model}"}} {sum(observations)}')
    return "\n".join(lines) + "\n"


def metrics(ttfts: list[float], gaps: list[float], gap_name: str = "vllm:time_per_output_token_seconds") -> str:
    return hist_text("vllm:time_to_first_token_seconds", TTFT_LES, ttfts) + hist_text(gap_name, GAP_LES, gaps)


def stat(**boxes: tuple[int, int]) -> dict:
    return {
        box: {"status": "UP", "requests": answers, "errors": errors, "in_flight": 0}
        for box, (answers, errors) in boxes.items()
    }


def judge(canary_ttft=0.08, canary_gap=0.04, canary_answers=40, canary_errors=0, greedy=None, same=True, **settings):
    before = {"box1": metrics([0.08] * 10, [0.04] * 50), "box2": metrics([0.08] * 10, [0.04] * 50)}
    after = {
        "box1": metrics([0.08] * 10 + [canary_ttft] * canary_answers, [0.04] * 50 + [canary_gap] * 200),
        "box2": metrics([0.08] * 10 + [0.08] * 300, [0.04] * 50 + [0.04] * 1500),
    }
    return canary.verdict(
        "box1",
        ["box2"],
        {
            "before": stat(box1=(5, 0), box2=(30, 0)),
            "after": stat(box1=(5 + canary_answers, canary_errors), box2=(330, 1)),
        },
        {box: {"before": before[box], "after": after[box]} for box in before},
        greedy,
        same,
        settings,
    )


def test_a_canary_like_the_rest_passes_with_its_figures() -> None:
    got = judge(greedy={"box1": ["a b", "c d"], "box2": ["a b", "c d"]})
    assert got["verdict"] == "pass", got
    assert got["figures"]["answers"] == {"canary": 40, "rest": 300}
    assert got["figures"]["ttft_p99_s"]["canary"] == pytest.approx(got["figures"]["ttft_p99_s"]["rest"], rel=0.01)
    assert got["figures"]["greedy"] == {"prompts": 2, "differ": 0, "compared_with": "box2"}


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        ({"canary_errors": 5}, "error rate 12.50% (5 of 40)"),
        ({"canary_ttft": 0.4}, "time to first token p99 0.497 s against the rest's 0.0995 s"),
        ({"canary_gap": 0.09}, "mean time between tokens"),
        ({"greedy": {"box1": ["a b", "x y"], "box2": ["a b", "c d"]}}, "greedy answers differ from box2's on 1 of 2"),
        ({"canary_answers": 3}, "too little traffic to judge: the canary answered 3 request(s)"),
    ],
)
def test_each_fault_fails_the_canary_naming_it(fault: dict, said: str) -> None:
    got = judge(**fault)
    assert got["verdict"] == "fail", got
    assert any(said in reason for reason in got["reasons"]), got["reasons"]


def test_the_bounds_are_settings() -> None:
    # the same faults within looser bounds pass (the control of each threshold)
    assert judge(canary_errors=5, max_error_rate_increase=0.2)["verdict"] == "pass"
    assert judge(canary_ttft=0.4, ttft_p99_ratio=6)["verdict"] == "pass"
    assert judge(canary_answers=3, min_requests=3)["verdict"] == "pass"
    greedy = {"box1": ["a b", "x y"], "box2": ["a b", "c d"]}
    assert judge(greedy=greedy, greedy_tolerance=0.5)["verdict"] == "pass"


def test_other_weights_show_the_greedy_difference_without_judging_it() -> None:
    got = judge(greedy={"box1": ["x"], "box2": ["y"]}, same=False)
    assert got["verdict"] == "pass", got
    assert got["figures"]["greedy"]["judged"] is False and got["figures"]["greedy"]["differ"] == 1


def test_the_gap_is_read_under_either_releases_name() -> None:
    text = metrics([0.08], [0.04], gap_name="vllm:inter_token_latency_seconds")
    assert canary.histogram(text, canary.GAP)["count"] == 1.0
    assert canary.histogram(text, ("vllm:no_such_metric",)) is None


def test_a_window_that_cannot_be_read_is_refused() -> None:
    with pytest.raises(canary.CanaryError, match="engine restarted"):
        canary.window(
            canary.histogram(metrics([0.1] * 5, []), canary.TTFT), canary.histogram(metrics([0.1], []), canary.TTFT)
        )
    with pytest.raises(canary.CanaryError, match="HAProxy restarted"):
        canary.verdict(
            "box1",
            ["box2"],
            {"before": stat(box1=(9, 0), box2=(9, 0)), "after": stat(box1=(1, 0), box2=(9, 0))},
            {},
            None,
            True,
        )
    with pytest.raises(canary.CanaryError, match="no other box"):
        canary.verdict("box1", [], {"before": {}, "after": {}}, {}, None, True)


def test_quantile_reads_the_histogram_as_prometheus_does() -> None:
    hist = canary.histogram(metrics([0.02] * 98 + [0.3, 2.0], []), canary.TTFT)
    # 98 in (0.01, 0.05]: the median is halfway up that bucket; the 99th is the one in (0.25, 0.5]: its top
    assert canary.quantile(hist, 0.5) == pytest.approx(0.01 + 0.04 * 50 / 98)
    assert canary.quantile(hist, 0.99) == pytest.approx(0.5)
    assert canary.quantile(hist, 1.0) == pytest.approx(2.5)
    beyond = canary.histogram(metrics([20.0], []), canary.TTFT)  # only +Inf holds it: the highest finite bound
    assert canary.quantile(beyond, 0.99) == 2.5
    assert canary.quantile(None, 0.99) is None


GOOD = {
    "seconds": 300,
    "share_percent": 10,
    "min_requests": 20,
    "max_error_rate_increase": 0.01,
    "ttft_p99_ratio": 1.5,
    "gap_ratio": 1.25,
    "greedy_tolerance": 0.0,
    "prompts": ["hello"],
}


def test_the_settings_are_checked_naming_each_variable() -> None:
    assert canary.setting_problems(GOOD) == []
    assert canary.setting_problems({**GOOD, "seconds": "300"}) == []  # as the inventory's strings come
    bad = canary.setting_problems({**GOOD, "share_percent": 0, "min_requests": 2.5, "gap_ratio": "fast", "prompts": []})
    assert [p.split(" is ")[0].split(" must")[0] for p in bad] == [
        "gpubox_canary_share_percent",
        "gpubox_canary_min_requests",
        "gpubox_canary_gap_ratio",
        "gpubox_canary_prompts",
    ], bad
    assert canary.setting_problems({**GOOD, "seconds": True}) != []  # a boolean is no number of seconds


def test_each_pool_with_two_boxes_in_the_run_gets_its_first_one_as_canary() -> None:
    stats = {
        "b1": {"pool": "pool_tiny"},
        "b2": {"pool": "pool_tiny"},
        "b3": {"pool": "pool_big"},
        "b4": {"pool": "pool_tiny"},
    }
    assert canary.choose(stats, ["b2", "b1", "b3", "b4"]) == {"b2": {"pool": "pool_tiny", "rest": ["b1", "b4"]}}
    assert canary.choose(stats, ["b1", "b3"]) == {}  # one box of a pool in the run: nothing to compare it with
    assert canary.choose(stats, ["b1", "b9"]) == {}  # a box the gateway does not know is no pool's


def test_the_filters_judge_from_each_boxs_facts_and_an_operator_overrules() -> None:
    from ansible_collections.gpubox.gpubox.plugins.filter import canary_filters as f

    fact = {"gpubox_front_door": {"model_id": "m", "model_commit": "A"}}
    hostvars = {
        "box1": {"ansible_local": fact, "gpubox_rebuild_greedy": ["a", "b"],
                 "gpubox_rebuild_canary": {"verdict": "observing"},
                 "gpubox_rebuild_window_start": metrics([0.08] * 10, [0.04] * 50)},
        "box2": {"ansible_local": fact, "gpubox_rebuild_greedy": ["a", "b"],
                 "gpubox_rebuild_window_start": metrics([0.08] * 10, [0.04] * 50),
                 "vllm_service_canary_metrics": metrics([0.08] * 60, [0.04] * 300)},
    }  # fmt: skip
    canaries = {"box1": {"pool": "pool_tiny", "rest": ["box2"]}}
    assert f.canary_observed(canaries, hostvars, ["box1", "box2"]) == canaries
    assert f.canary_observed(canaries, hostvars, ["box2"]) == {}
    assert f.canary_greedy_failed(canaries, hostvars) == []
    start, end = stat(box1=(0, 0), box2=(0, 0)), stat(box1=(30, 0), box2=(50, 0))
    end_metrics = metrics([0.08] * 40, [0.04] * 200)
    args = ("box1", ["box2"], start, end, hostvars, end_metrics)
    settings = {**GOOD, "prompts": ["p1", "p2"]}
    assert f.canary_verdict({"pool": "pool_tiny"}, *args, {}, settings)["verdict"] == "pass"
    stopped = f.canary_verdict({"pool": "pool_tiny"}, *args, {"box1": "stop"}, settings)
    assert stopped["verdict"] == "fail" and stopped["reasons"][0] == "stopped by an operator"
    # an engine that answers otherwise: failed at once, and then only a promotion passes it
    hostvars["box1"]["gpubox_rebuild_greedy"] = ["a", "c"]
    assert f.canary_greedy_failed(canaries, hostvars) == ["box1"]
    # ... unless the declared tolerance allows it: then the window is waited for, as the verdict would pass it
    tolerant = {**settings, "greedy_tolerance": 0.5}
    assert f.canary_greedy_failed(canaries, hostvars, tolerant) == []
    assert "greedy" not in " ".join(f.canary_verdict({"pool": "pool_tiny"}, *args, {}, tolerant)["reasons"])
    assert f.canary_greedy_failed(canaries, hostvars, {**settings, "greedy_tolerance": 0.4}) == ["box1"]
    assert f.canary_verdict({"pool": "pool_tiny"}, *args, {}, settings)["verdict"] == "fail"
    promoted = f.canary_verdict({"pool": "pool_tiny"}, *args, {"box1": "promote"}, settings)
    assert promoted["verdict"] == "pass" and promoted["decided_by"].startswith("promoted by an operator")
    # a box of the comparison whose window could not be read: no pass but by an operator's word
    hostvars["box2"]["gpubox_rebuild_window_error"] = "Read vLLM's own metrics.: Connection refused"
    unread = f.canary_verdict({"pool": "pool_tiny"}, *args, {}, settings)
    assert unread["verdict"] == "fail" and unread["reasons"][0].startswith("the window could not be read on box2")
    del hostvars["box2"]["gpubox_rebuild_window_error"]
    # a new model commit: the greedy difference is shown, not judged
    hostvars["box1"]["ansible_local"] = {"gpubox_front_door": {"model_id": "m", "model_commit": "B"}}
    assert f.canary_greedy_failed(canaries, hostvars) == []
    # the roll leaves box2 out while its pool's canary has not passed
    assert f.canary_blocking(canaries, "box2", hostvars) == ["box1"]
    hostvars["box1"]["gpubox_rebuild_canary"] = {"verdict": "pass"}
    assert f.canary_blocking(canaries, "box2", hostvars) == []
