"""roles/llm_gateway refuses bad input (tasks/validate.yml, run first by the role), naming the variable.

Runs the role's validate entry point with ansible-playbook on an inventory of local hosts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PLAYBOOK = """
- hosts: gw
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: llm_gateway
        tasks_from: validate
"""


def validate(
    tmp_path: Path, gw_vars: dict, gpu_boxes: tuple[str, ...] = ("b1", "b2")
) -> subprocess.CompletedProcess[str]:
    inventory = {
        "all": {
            "hosts": {"plain": {}},
            "children": {
                "gpu_boxes": {"hosts": {b: {} for b in gpu_boxes}},
                "llm_gateways": {"hosts": {"gw": {"ansible_connection": "local", **gw_vars}}},
            },
        }
    }
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(tmp_path / "hosts.json"),
        str(tmp_path / "play.yml"),
    ]
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_a_good_pool_passes(tmp_path):
    done = validate(
        tmp_path, {"llm_gateway_backends": ["b1", "b2"], "llm_gateway_backend_addresses": {"b1": "10.0.0.1"}}
    )
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize(
    ("gw_vars", "expected"),
    [
        ({}, "llm_gateway_backends is empty"),
        ({"llm_gateway_backends": ["b1", "nope"]}, "llm_gateway_backends: nope is not a host of this inventory"),
        ({"llm_gateway_backends": ["plain"]}, "llm_gateway_backends: plain is not in group gpu_boxes"),
        ({"llm_gateway_backends": ["b1", "b1"]}, "llm_gateway_backends names a box twice"),
        ({"llm_gateway_backends": ["b1"], "llm_gateway_port": 0}, "llm_gateway_port is 0"),
        ({"llm_gateway_backends": ["b1"], "llm_gateway_port": 70000}, "llm_gateway_port is 70000"),
        (
            {"llm_gateway_backends": ["b1"], "llm_gateway_affinity_header": "X Session"},
            "llm_gateway_affinity_header is X Session",
        ),
        ({"llm_gateway_backends": ["b1"], "llm_gateway_check_fall": 0}, "llm_gateway_check_fall must be 1-10"),
        (
            {"llm_gateway_backends": ["b1"], "llm_gateway_backend_addresses": {"b2": "10.0.0.2"}},
            "b2 is not in llm_gateway_backends",
        ),
        (
            {"llm_gateway_backends": ["b1"], "llm_gateway_tls_certificate": "-----BEGIN CERTIFICATE-----"},
            "given together",
        ),
    ],
)
def test_bad_input_is_refused(tmp_path, gw_vars, expected):
    done = validate(tmp_path, gw_vars)
    assert done.returncode != 0
    assert expected in done.stdout
    assert "Nothing was changed" in done.stdout


def test_a_gateway_that_is_a_gpu_box_is_refused(tmp_path):
    done = validate(tmp_path, {"llm_gateway_backends": ["b1"]}, gpu_boxes=("b1", "gw"))
    assert done.returncode != 0 and "the gateway host gw is in gpu_boxes" in done.stdout
