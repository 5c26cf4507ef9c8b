"""roles/metrics refuses a bad metrics_gpu_kernel_log_unhealthy_after_sec before any change (tasks/validate.yml,
which preflight runs too, and the argument spec), naming the variable.

Runs the role's validate entry point with ansible-playbook once, on an inventory of local hosts, one host per
value, and reads each host's result from the json callback.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from harness import ansible_vars

PLAYBOOK = """
- hosts: boxes
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: metrics
        tasks_from: validate
    - name: passed
      ansible.builtin.debug:
        msg: passed
"""

GOOD = [-1, 0, 900]
BAD: list[tuple[object, str]] = [
    (-2, "metrics_gpu_kernel_log_unhealthy_after_sec=-2 must be seconds (0 at once) or -1 (never)"),
    ("soon", "metrics_gpu_kernel_log_unhealthy_after_sec"),  # the argument spec: not an int
]


def host(value: object) -> str:
    return f"box{[*GOOD, *(v for v, _ in BAD)].index(value)}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    boxes = {host(v): {**local, "metrics_gpu_kernel_log_unhealthy_after_sec": v} for v in [*GOOD, *(v for v, _ in BAD)]}
    inventory = {"all": {"children": {"boxes": {"hosts": boxes}}}}
    runs = ansible_vars.run_playbook(inventory, PLAYBOOK, tmp_path_factory.mktemp("gpu-metrics-inputs"))
    assert set(boxes) <= set(runs), f"hosts without a result: {set(boxes) - set(runs)}"
    return runs


@pytest.mark.parametrize("value", GOOD)
def test_never_at_once_or_a_grace_pass(runs: dict[str, dict[str, Any]], value: int) -> None:
    run = runs[host(value)]
    assert ansible_vars.first_failure(run) is None, run["results"]
    assert [r["msg"] for r in run["results"] if r["task"] == "passed"] == ["passed"]


@pytest.mark.parametrize(("value", "expected"), BAD)
def test_a_bad_value_is_refused_naming_the_variable(
    runs: dict[str, dict[str, Any]], value: object, expected: str
) -> None:
    run = runs[host(value)]
    failed = ansible_vars.first_failure(run)
    assert failed is not None and expected in failed.get("msg", ""), run["results"]
    assert not any(r["task"] == "passed" for r in run["results"]), "a task ran after the refusal"
