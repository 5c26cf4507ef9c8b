"""The canary's verdict (playbooks/rebuild.yml, issue 48): a pool's change lands on one box first.

The canary box serves the change beside the rest of its pool, with a bounded share of the pool's live traffic, for
``gpubox_canary_seconds``. What each side did in that window is read twice, at its start and at its end:

- at the gateway, HAProxy's per-server counters (roles/llm_gateway/files/haproxy_runtime.py ``stat``): the HTTP
  answers by class and the errors (5xx answers, and the responses and connections that failed);
- on each box, vLLM's own ``/metrics``: the histograms of the time to the first token and of the time between
  tokens (vLLM 0.7.3 vllm/engine/metrics.py and 0.32 vllm/v1/metrics/loggers.py both write
  ``vllm:time_to_first_token_seconds``; the gap between tokens is ``vllm:time_per_output_token_seconds`` in 0.7.3
  and ``vllm:inter_token_latency_seconds`` in 0.32, read whichever the box writes);
- and once, a fixed set of greedy prompts (temperature 0) sent to the canary and to one other box of the pool:
  with the same model weights (only the stack or vLLM's flags changed) their answers must be the same text, but
  for the declared tolerance.

``verdict`` compares the canary with the rest and says pass or fail with every reason; too little traffic on the
canary to judge is a failure too (a canary is never promoted blind; an operator can promote it by hand).
"""

from __future__ import annotations

import math
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils.node_textfile import parse_samples

TTFT = ("vllm:time_to_first_token_seconds",)
GAP = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")

# The defaults of the judge's settings (playbooks/rebuild.yml's gpubox_canary_* variables).
DEFAULTS: dict[str, float] = {
    "min_requests": 20,  # answers the canary must give in the window before it can be judged
    "max_error_rate_increase": 0.01,  # the canary's error rate may exceed the rest's by this much
    "ttft_p99_ratio": 1.5,  # the canary's TTFT p99 at most this many times the rest's
    "gap_ratio": 1.25,  # the canary's mean time between tokens at most this many times the rest's (tokens/s)
    "greedy_tolerance": 0.0,  # the share of greedy prompts whose answers may differ
}


class CanaryError(ValueError):
    """Input the judge cannot read; the message names it."""


def histogram(text: str, names: tuple[str, ...]) -> dict[str, Any] | None:
    """The first of ``names`` found in a Prometheus text exposition, summed over its label sets: {"buckets":
    [(le, cumulative count), ...] sorted by le, "sum": float, "count": float}; None when the box writes none."""
    samples = parse_samples(text)
    for name in names:
        buckets: dict[float, float] = {}
        total = {"sum": 0.0, "count": 0.0}
        found = False
        for sample, labels, value in samples:
            try:
                number = float(value)
            except ValueError:
                continue
            if sample == name + "_bucket" and "le" in labels:
                le = math.inf if labels["le"] in ("+Inf", "Inf") else float(labels["le"])
                buckets[le] = buckets.get(le, 0.0) + number
                found = True
            elif sample in (name + "_sum", name + "_count"):
                total[sample[len(name) + 1 :]] += number
                found = True
        if found:
            return {"buckets": sorted(buckets.items()), "sum": total["sum"], "count": total["count"]}
    return None


def window(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a histogram counted between two readings (a restart in between, a counter going down, is refused: the
    window cannot be read)."""
    if before is None or after is None:
        return None if after is None else after
    old = dict(before["buckets"])
    buckets = [(le, count - old.get(le, 0.0)) for le, count in after["buckets"]]
    delta = {"buckets": buckets, "sum": after["sum"] - before["sum"], "count": after["count"] - before["count"]}
    if delta["count"] < 0 or any(pair[1] < 0 for pair in buckets):
        raise CanaryError("a box's histogram went down during the window (its engine restarted): judge again")
    return delta


def quantile(hist: dict[str, Any] | None, q: float) -> float | None:
    """The q-quantile as Prometheus' histogram_quantile reads it: linear within the bucket that holds it (from the
    bucket below's bound, or 0); in the +Inf bucket, the highest finite bound. None without observations."""
    if not hist or hist["count"] <= 0:
        return None
    rank = q * hist["count"]
    lower, below = 0.0, 0.0
    for le, count in hist["buckets"]:
        if count >= rank:
            if math.isinf(le):
                return lower
            inside = count - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = le, count
    return lower


def mean(hist: dict[str, Any] | None) -> float | None:
    if not hist or hist["count"] <= 0:
        return None
    return hist["sum"] / hist["count"]


def _merge(hists: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    found = [h for h in hists if h]
    if not found:
        return None
    buckets: dict[float, float] = {}
    for h in found:
        for le, count in h["buckets"]:
            buckets[le] = buckets.get(le, 0.0) + count
    return {
        "buckets": sorted(buckets.items()),
        "sum": sum(h["sum"] for h in found),
        "count": sum(h["count"] for h in found),
    }


def _answers(before: dict[str, Any], after: dict[str, Any], server: str) -> tuple[int, int]:
    """(answers, errors) of one server between two ``haproxy_runtime.py stat`` readings."""
    if server not in after:
        raise CanaryError(f"the gateway's stats have no server {server}")
    old = before.get(server, {})
    answers = int(after[server].get("requests", 0)) - int(old.get("requests", 0))
    errors = int(after[server].get("errors", 0)) - int(old.get("errors", 0))
    if answers < 0 or errors < 0:
        raise CanaryError("the gateway's counters went down during the window (HAProxy restarted): judge again")
    return answers, errors


def _rate(errors: int, answers: int) -> float:
    return errors / answers if answers else 0.0


def verdict(
    canary: str,
    rest: list[str],
    stats: dict[str, dict[str, Any]],
    metrics: dict[str, dict[str, str]],
    greedy: dict[str, list[str]] | None,
    same_weights: bool,
    settings: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Pass or fail for ``canary`` against the boxes ``rest`` of its pool.

    stats: {"before": stat, "after": stat} of haproxy_runtime.py ``stat`` over the pool; metrics: {box: {"before":
    text, "after": text}} of each box's vLLM /metrics; greedy: {box: [answer per prompt]} of the canary and one other
    box (None: not asked); same_weights: the canary serves the model commit the rest serves (the greedy answers must
    then match). Returns {"verdict": "pass"|"fail", "reasons": [...], "figures": {...}}."""
    conf = {**DEFAULTS, **(settings or {})}
    if not rest:
        raise CanaryError(f"the canary {canary} has no other box of its pool to be compared with")
    reasons: list[str] = []
    figures: dict[str, Any] = {"canary": canary, "rest": list(rest)}

    answers, errors = _answers(stats["before"], stats["after"], canary)
    rest_counts = [_answers(stats["before"], stats["after"], box) for box in rest]
    rest_answers, rest_errors = sum(pair[0] for pair in rest_counts), sum(pair[1] for pair in rest_counts)
    figures["answers"] = {"canary": answers, "rest": rest_answers}
    figures["error_rate"] = {
        "canary": round(_rate(errors, answers), 4),
        "rest": round(_rate(rest_errors, rest_answers), 4),
    }
    if answers < int(conf["min_requests"]):
        reasons.append(
            f"too little traffic to judge: the canary answered {answers} request(s) in the window, fewer than"
            f" gpubox_canary_min_requests ({int(conf['min_requests'])}); promote it by hand if that is expected"
        )
    if errors and _rate(errors, answers) > _rate(rest_errors, rest_answers) + float(conf["max_error_rate_increase"]):
        reasons.append(
            f"error rate {figures['error_rate']['canary']:.2%} ({errors} of {answers}) against the rest's"
            f" {figures['error_rate']['rest']:.2%}, above the allowed increase"
            f" (gpubox_canary_max_error_rate_increase {float(conf['max_error_rate_increase']):.2%})"
        )

    def hists(box: str, names: tuple[str, ...]) -> dict[str, Any] | None:
        texts = metrics.get(box) or {}
        return window(histogram(texts.get("before", ""), names), histogram(texts.get("after", ""), names))

    ttft_canary = quantile(hists(canary, TTFT), 0.99)
    ttft_rest = quantile(_merge([hists(box, TTFT) for box in rest]), 0.99)
    figures["ttft_p99_s"] = {"canary": ttft_canary, "rest": ttft_rest}
    if ttft_canary is not None and ttft_rest is not None and ttft_canary > ttft_rest * float(conf["ttft_p99_ratio"]):
        reasons.append(
            f"time to first token p99 {ttft_canary:.3g} s against the rest's {ttft_rest:.3g} s, more than"
            f" gpubox_canary_ttft_p99_ratio ({conf['ttft_p99_ratio']}) times it"
        )
    gap_canary = mean(hists(canary, GAP))
    gap_rest = mean(_merge([hists(box, GAP) for box in rest]))
    figures["gap_mean_s"] = {"canary": gap_canary, "rest": gap_rest}
    if gap_canary is not None and gap_rest is not None and gap_canary > gap_rest * float(conf["gap_ratio"]):
        reasons.append(
            f"mean time between tokens {gap_canary:.4f} s against the rest's {gap_rest:.4f} s (tokens/s"
            f" {1 / gap_canary:.1f} against {1 / gap_rest:.1f}), more than gpubox_canary_gap_ratio"
            f" ({conf['gap_ratio']}) times it"
        )
    if ttft_canary is None and answers >= int(conf["min_requests"]):
        reasons.append("the canary's vLLM wrote no time-to-first-token histogram in the window: it cannot be judged")

    if greedy is not None:
        figures["greedy"], reason = greedy_judged(canary, greedy, same_weights, conf["greedy_tolerance"])
        if reason:
            reasons.append(reason)
    return {"verdict": "fail" if reasons else "pass", "reasons": reasons, "figures": figures}


def greedy_judged(
    canary: str, greedy: dict[str, list[str]], same_weights: bool, tolerance: float
) -> tuple[dict[str, Any], str | None]:
    """(figures, the reason the canary fails or None) of its greedy answers against one other box's: with the same
    weights, at most ``tolerance`` (gpubox_canary_greedy_tolerance) of the prompts may be answered otherwise; a new
    model commit's difference is shown, not judged. The verdict and the rebuild's early check (a canary failed before
    its window) both judge by this."""
    others = [box for box in greedy if box != canary]
    if canary not in greedy or not others:
        raise CanaryError("the greedy answers need the canary's and one other box's")
    mine, theirs = greedy[canary], greedy[others[0]]
    if len(mine) != len(theirs):
        raise CanaryError("the canary and the other box answered a different number of greedy prompts")
    differ = [i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b]
    figures: dict[str, Any] = {"prompts": len(mine), "differ": len(differ), "compared_with": others[0]}
    if not same_weights:
        figures["judged"] = False  # a new model commit may answer otherwise: shown, not judged
        return figures, None
    if mine and len(differ) / len(mine) > float(tolerance):
        return figures, (
            f"greedy answers differ from {others[0]}'s on {len(differ)} of {len(mine)} prompt(s) (first: prompt"
            f" {differ[0] + 1}: {mine[differ[0]][:80]!r} against {theirs[differ[0]][:80]!r}); with the same"
            f" weights they must match (gpubox_canary_greedy_tolerance {tolerance})"
        )
    return figures, None


# The window's own settings beside the judge's (playbooks/rebuild.yml's gpubox_canary_* variables): name, low, high.
WINDOW = {"seconds": (0, 86400), "share_percent": (1, 100)}
NUMBERS = {
    "min_requests": (0, 10**9),
    "max_error_rate_increase": (0.0, 1.0),
    "ttft_p99_ratio": (1.0, 1000.0),
    "gap_ratio": (1.0, 1000.0),
    "greedy_tolerance": (0.0, 1.0),
}


def setting_problems(settings: dict[str, Any]) -> list[str]:
    """What is wrong with the canary's settings, each naming its variable and the range it takes."""
    problems = []
    for key, (low, high) in {**WINDOW, **NUMBERS}.items():
        value = settings.get(key)
        integer = key in WINDOW or key == "min_requests"
        try:
            number = float(str(value))
            if integer and number != int(number):
                raise ValueError
        except (TypeError, ValueError):
            number = None
        if number is None or not low <= number <= high or isinstance(value, bool):
            kind = "a whole number" if integer else "a number"
            problems.append(f"gpubox_canary_{key} is {str(value)[:20]!r}: give {kind} from {low} to {high}")
    prompts = settings.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) and p.strip() for p in prompts):
        problems.append(
            "gpubox_canary_prompts must be a list of one or more prompts (text) the canary is asked greedily"
        )
    return problems


def choose(stats: dict[str, dict[str, Any]], run: list[str]) -> dict[str, dict[str, Any]]:
    """Each pool's canary: {box: {"pool", "rest"}} for every pool (a backend of the gateway's stats) with two boxes or
    more in ``run`` (the run's boxes in their order, maintenance aside); its first box is the canary."""
    pools: dict[str, list[str]] = {}
    for box in run:
        if box in stats:
            pools.setdefault(str(stats[box]["pool"]), []).append(box)
    return {boxes[0]: {"pool": pool, "rest": boxes[1:]} for pool, boxes in pools.items() if len(boxes) > 1}
