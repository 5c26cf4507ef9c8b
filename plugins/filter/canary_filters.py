"""Jinja2 filters of a pool's canary (playbooks/rebuild.yml): thin wrappers over plugins/module_utils/canary.py.

{{ settings | gpubox.gpubox.canary_setting_problems }} -> [problem naming its gpubox_canary_* variable, ...]
{{ stats | gpubox.gpubox.canary_choice(run_boxes) }} -> {canary: {pool, rest}}
{{ asked | gpubox.gpubox.canary_decisions(canaries) }} -> {canary: promote|stop}
{{ observed | gpubox.gpubox.canary_greedy_failed(hostvars, settings) }} -> [canary its greedy answers already fail]
{{ {'pool': p} | gpubox.gpubox.canary_verdict(canary, rest, stats_start, stats_end, hostvars, metrics_end,
                                               decisions, settings) }} -> {pool, verdict, reasons, figures, decided_by}
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.gpubox.plugins.module_utils import canary


def canary_setting_problems(settings: dict) -> list[str]:
    return canary.setting_problems(settings if isinstance(settings, dict) else {})


def canary_choice(stats: dict, run: list) -> dict:
    if not isinstance(stats, dict) or not isinstance(run, list):
        raise AnsibleFilterError("canary_choice: give the gateway's stats ({server: {pool, ...}}) and the run's boxes")
    return canary.choose(stats, [str(box) for box in run])


def _greedy(box: str, rest: list[str], hostvars: Any) -> tuple[dict[str, list[str]], bool]:
    """The greedy answers of the canary and of the first other box, and whether they serve the same weights."""
    other = rest[0]

    def serving(name: str) -> tuple[Any, Any]:
        fact = (hostvars[name].get("ansible_local") or {}).get("gpubox_front_door") or {}
        return fact.get("model_id"), fact.get("model_commit")

    answers = {name: list(hostvars[name].get("gpubox_rebuild_greedy") or []) for name in (box, other)}
    return answers, serving(box) == serving(other)


def _canary_of(hostvars: Any, box: str) -> dict:
    try:
        found = hostvars[box].get("gpubox_rebuild_canary")
    except KeyError:
        return {}
    return found if isinstance(found, dict) else {}


def canary_observed(canaries: dict, hostvars: Any, hosts: list) -> dict:
    """The canaries of ``canaries`` ({canary: {pool, rest}}) in this play whose window runs (their turn passed)."""
    return {
        box: entry
        for box, entry in canaries.items()
        if box in hosts and _canary_of(hostvars, box).get("verdict") == "observing"
    }


def canary_blocking(canaries: dict, box: str, hostvars: Any) -> list[str]:
    """The canaries of ``box``'s pool that did not pass (the box is then not rolled in this run)."""
    return [
        canary_box
        for canary_box, entry in canaries.items()
        if box in entry.get("rest", []) and _canary_of(hostvars, canary_box).get("verdict") != "pass"
    ]


def canary_greedy_failed(observed: dict, hostvars: Any, settings: dict | None = None) -> list[str]:
    """The canaries whose greedy answers already fail them, as the verdict will judge them (canary.greedy_judged,
    with the settings' greedy_tolerance): no window to wait for. Answers that cannot be compared are left to the
    verdict, which says why."""
    tolerance = {**canary.DEFAULTS, **(settings if isinstance(settings, dict) else {})}["greedy_tolerance"]
    failed = []
    for box, entry in observed.items():
        answers, same = _greedy(box, entry["rest"], hostvars)
        try:
            _figures, reason = canary.greedy_judged(box, answers, same, tolerance)
        except canary.CanaryError:
            continue
        if reason:
            failed.append(box)
    return failed


def canary_verdict(
    base: dict,
    box: str,
    rest: list,
    stats_start: dict,
    stats_end: dict,
    hostvars: Any,
    metrics_end: str,
    asked: dict,
    settings: dict,
) -> dict:
    """The canary's verdict: an operator's decision when there is one, else the judge's over the window."""
    out = dict(base)
    decided = (asked or {}).get(box)
    metrics = {box: {"before": hostvars[box].get("gpubox_rebuild_window_start") or "", "after": metrics_end}}
    for other in rest:
        metrics[other] = {
            "before": hostvars[other].get("gpubox_rebuild_window_start") or "",
            "after": hostvars[other].get("vllm_service_canary_metrics") or "",
        }
    unread = [f"{name}: {hostvars[name]['gpubox_rebuild_window_error']}" for name in (box, *rest)
              if hostvars[name].get("gpubox_rebuild_window_error")]  # fmt: skip
    answers, same = _greedy(box, list(rest), hostvars)
    judge = {k: v for k, v in settings.items() if k in canary.DEFAULTS}
    try:
        judged = canary.verdict(
            box, list(rest), {"before": stats_start, "after": stats_end}, metrics, answers, same, judge
        )
    except canary.CanaryError as exc:
        judged = {"verdict": "fail", "reasons": [f"the window could not be read: {exc}"], "figures": {}}
    out.update(judged)
    if unread:  # a box of the comparison could not be read: never a pass but by an operator's word
        out.update(
            verdict="fail", reasons=[*(f"the window could not be read on {u}" for u in unread), *judged["reasons"]]
        )
    if decided == "promote":
        out.update(verdict="pass", decided_by="promoted by an operator (playbooks/canary.yml)")
    elif decided == "stop":
        out.update(verdict="fail", decided_by="stopped by an operator (playbooks/canary.yml)")
        out["reasons"] = ["stopped by an operator", *out["reasons"]]
    return out


class FilterModule:
    """gpubox canary filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "canary_setting_problems": canary_setting_problems,
            "canary_choice": canary_choice,
            "canary_greedy_failed": canary_greedy_failed,
            "canary_observed": canary_observed,
            "canary_blocking": canary_blocking,
            "canary_verdict": canary_verdict,
        }
