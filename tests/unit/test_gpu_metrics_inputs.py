"""roles/metrics refuses a bad metrics_gpu_kernel_log_unhealthy_after_sec before any change (tasks/validate.yml,
which preflight runs too, and the argument spec), naming the variable.

Runs the role's validate entry point with ansible-playbook on a local host.
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
- hosts: box
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: metrics
        tasks_from: validate
"""


def validate(tmp_path: Path, value: object) -> subprocess.CompletedProcess[str]:
    box = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    box["metrics_gpu_kernel_log_unhealthy_after_sec"] = value
    (tmp_path / "hosts.json").write_text(json.dumps({"all": {"hosts": {"box": box}}}))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.json")]
    return subprocess.run([*argv, str(tmp_path / "play.yml")], env=env, cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize("value", [-1, 0, 900])
def test_never_at_once_or_a_grace_pass(tmp_path: Path, value: int) -> None:
    done = validate(tmp_path, value)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-2, "metrics_gpu_kernel_log_unhealthy_after_sec=-2 must be seconds (0 at once) or -1 (never)"),
        ("soon", "metrics_gpu_kernel_log_unhealthy_after_sec"),  # the argument spec: not an int
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(tmp_path: Path, value: object, expected: str) -> None:
    done = validate(tmp_path, value)
    assert done.returncode != 0 and expected in done.stdout + done.stderr, done.stdout + done.stderr
