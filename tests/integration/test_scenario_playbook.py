"""harness.ansible_vars.scenario_playbook: a scenario's tests run ansible-playbook against its inventory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.ansible_vars import json_report, scenario_playbook

PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.debug:
        msg: "{{ inventory_hostname }} {{ greeting | default('none') }} {{ other | default('none') }}"
"""


def test_the_scenarios_inventory_limit_extra_vars_and_callback_reach_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = tmp_path / "inventory.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    inventory.write_text(json.dumps({"all": {"hosts": {"box-a": local, "box-b": local}}}))
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAY)
    monkeypatch.setenv("MOLECULE_INVENTORY_FILE", str(inventory))
    run = scenario_playbook(playbook, "greeting=hello", "other=2", callback="json", limit="box-b")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json_report(run.stdout)
    hosts = result["plays"][0]["tasks"][0]["hosts"]
    assert list(hosts) == ["box-b"]
    assert hosts["box-b"]["msg"] == "box-b hello 2"
