"""plugins/action/converge_box.py: the inner run's steps reach the outer run's output while it still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.action.converge_box import step_line
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]

# Stands in for the inner ansible-playbook: prints a task, then waits until the outer run's output has
# shown that task (the test creates the file when it reads the line), then prints the next and its recap.
INNER = r"""
import os, sys, time
go = sys.argv[1]
print("PLAY [Converge] " + "*" * 20, flush=True)
print("TASK [nvidia_driver : Install the driver] " + "*" * 20, flush=True)
print("ok: [box1]", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.1)
print("TASK [after the wait: " + ("seen" if os.path.exists(go) else "NOT SEEN") + "]", flush=True)
print("fatal: [box1]: FAILED! => {}", flush=True)
print("box1                       : ok=1    changed=0    unreachable=0    failed=1", flush=True)
sys.exit(3)
"""

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - gpubox.gpubox.converge_box:
        label: box1
        argv: {argv}
      register: inner
      failed_when: false
    - ansible.builtin.copy:
        content: >-
          {{{{ {{'rc': inner.rc, 'lines': inner.stdout_lines | length, 'changed': inner.changed}} | to_json }}}}
        dest: {result}
        mode: "0644"
"""


def test_each_step_is_shown_while_the_inner_run_still_runs(tmp_path: Path) -> None:
    go = tmp_path / "seen"
    (tmp_path / "inner.py").write_text(INNER)
    argv = [sys.executable, str(tmp_path / "inner.py"), str(go)]
    (tmp_path / "play.yml").write_text(PLAY.format(argv=json.dumps(argv), result=tmp_path / "result.json"))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", PYTHONUNBUFFERED="1")
    cmd = [str(ansible_vars.tool("ansible-playbook")), "-i", "localhost,", str(tmp_path / "play.yml")]
    cmd += ["-e", json.dumps({"ansible_connection": "local", "ansible_python_interpreter": sys.executable})]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen_at = None
    out = []
    for line in proc.stdout:
        out.append(line)
        if "] TASK [nvidia_driver : Install the driver]" in line and seen_at is None:
            seen_at = time.monotonic()
            go.write_text("")  # the inner run may go on: its first task reached this output before it ended
    assert proc.wait(timeout=300) == 0, "".join(out)
    text = "".join(out)
    assert seen_at is not None, text
    assert "[box1      0 s] PLAY [Converge]" in text
    assert "TASK [after the wait: seen]" in text  # the step was shown before the inner run ended
    assert "[box1" in text and "fatal: [box1]: FAILED! => {}" in text and "box1                       : ok=1" in text
    assert "ok: [box1]\n" not in text.split("TASK [after the wait")[0].split("PLAY [localhost]")[1]  # results: no
    assert json.loads((tmp_path / "result.json").read_text()) == {"rc": 3, "lines": 6, "changed": True}


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("TASK [gpubox : Reboot] ********\n", "TASK [gpubox : Reboot]"),
        ("\x1b[0;32mPLAY [Serving] ****\x1b[0m\n", "PLAY [Serving]"),
        ("RUNNING HANDLER [vllm_service : restart vllm] ***\n", "RUNNING HANDLER [vllm_service : restart vllm]"),
        ("FAILED - RETRYING: [box1]: Wait (3 retries left).\n", "FAILED - RETRYING: [box1]: Wait (3 retries left)."),
        ("ok: [box1]\n", None),
        ("changed: [box1] => (item=x)\n", None),
        ("Wednesday 02 December 2026  14:51:36 +0000 (0:00:00.071)       0:00:07.689 ****\n", None),
        ("\n", None),
    ],
)
def test_which_lines_are_steps(line: str, shown: str | None) -> None:
    assert step_line(line) == shown
