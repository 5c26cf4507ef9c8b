"""playbooks/rebuild.yml refuses bad input before any change, naming the variable.

Runs the real playbook with ansible-playbook on an inventory of local hosts: the checks run in the
first play, so a refused run never reaches a box's turn (no drain, no converge).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]

INVENTORY = {
    "all": {
        "children": {
            "gpu_boxes": {"hosts": {"b1": {"ansible_connection": "local"}, "b2": {"ansible_connection": "local"}}},
            "llm_gateways": {"hosts": {"gw": {"llm_gateway_backends": ["b1", "b2"]}}},
        }
    }
}


def rebuild(tmp_path: Path, *extra: str, inventory: dict | None = None) -> subprocess.CompletedProcess[str]:
    inv = tmp_path / "hosts.json"
    inv.write_text(json.dumps(inventory or INVENTORY))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    argv = [
        str(ansible_vars.tool("ansible-playbook")),
        "-i",
        str(inv),
        str(ROOT / "playbooks" / "rebuild.yml"),
    ]
    return subprocess.run([*argv, *extra], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["-e", "gpubox_rebuild_serial=0"], "gpubox_rebuild_serial is 0"),
        (["-e", "gpubox_rebuild_serial=3"], "gpubox_rebuild_serial is 3"),
        (["-e", "gpubox_rebuild_serial=0%"], "gpubox_rebuild_serial is 0%"),
        (["-e", "gpubox_rebuild_serial=two"], "gpubox_rebuild_serial is two"),
        (["-e", "gpubox_rebuild_max_fail_percentage=101"], "gpubox_rebuild_max_fail_percentage is 101"),
        (["-e", "gpubox_rebuild_max_fail_percentage=-1"], "gpubox_rebuild_max_fail_percentage is -1"),
        (["-e", "gpubox_rebuild_gateway=b1"], "gpubox_rebuild_gateway: b1 is a GPU box"),
        (["-e", "gpubox_rebuild_gateway=nowhere"], "gpubox_rebuild_gateway: nowhere is not a host of this inventory"),
        (["-e", "gpubox_rebuild_canary=maybe"], "gpubox_rebuild_canary is maybe: give true"),
        (
            ["-e", "gpubox_canary_share_percent=0"],
            "gpubox_canary_share_percent is '0': give a whole number from 1 to 100",
        ),
        (["-e", "gpubox_canary_seconds=soon"], "gpubox_canary_seconds is 'soon'"),
        (
            ["-e", "gpubox_canary_greedy_tolerance=2"],
            "gpubox_canary_greedy_tolerance is '2': give a number from 0.0 to 1.0",
        ),
        (["-e", '{"gpubox_canary_prompts": []}'], "gpubox_canary_prompts must be a list of one or more prompts"),
    ],
)
def test_bad_input_is_refused_before_any_turn(tmp_path, extra, expected):
    done = rebuild(tmp_path, *extra)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert expected in out and "Nothing was changed" in out
    assert "Drain the box" not in out  # no turn began


def test_no_gateway_and_unknown_backends_are_refused(tmp_path):
    inventory = json.loads(json.dumps(INVENTORY))
    del inventory["all"]["children"]["llm_gateways"]
    done = rebuild(tmp_path, inventory=inventory)
    assert done.returncode != 0 and "no gateway host: set gpubox_rebuild_gateway" in done.stdout
    inventory = json.loads(json.dumps(INVENTORY))
    inventory["all"]["children"]["llm_gateways"]["hosts"]["gw"]["llm_gateway_backends"] = ["b1"]
    done = rebuild(tmp_path, inventory=inventory)
    assert done.returncode != 0 and "llm_gateway_backends of the gateway gw lacks b2" in done.stdout
