"""Action plugin gpubox.gpubox.converge_box: run a playbook command on the controller, showing its steps as
they happen.

playbooks/rebuild.yml runs site.yml for one box as its own ansible-playbook process (its comment says why).
``ansible.builtin.command`` would print that run's output only when it ends, and a turn that reboots a box
or downloads 30 GB says nothing for half an hour. This plugin runs the same argv and, while it runs, shows
each play and task the inner run starts, each failure and its recap, as one line prefixed with the box
and the seconds since the turn began (``display.display`` from a worker reaches the run's output at once).
The result is the command module's: rc, stdout, stdout_lines, start, end, delta; the task's own
``failed_when`` / ``changed_when`` decide what they mean.

    - gpubox.gpubox.converge_box:
        argv: [ansible-playbook, site.yml, --limit, box1]
        label: box1
"""

from __future__ import annotations

import datetime
import re
import subprocess
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

# What a default-callback run prints at each step: the start of a play or task, a failure, the recap.
STEP = re.compile(r"^(PLAY \[|TASK \[|RUNNING HANDLER \[|fatal: |failed: |FAILED - RETRYING: |PLAY RECAP|\S+\s+: ok=)")
_STARS = re.compile(r"\s*\*+\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def step_line(line: str) -> str | None:
    """The line to show for one line of the inner run's output, or None (results, diffs, blank lines)."""
    text = _ANSI.sub("", line.rstrip("\n"))
    if not STEP.match(text):
        return None
    return _STARS.sub("", text)[:300]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("argv", "label"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        argv = self._task.args.get("argv")
        label = str(self._task.args.get("label") or "")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise AnsibleActionFail("converge_box: argv must be a non-empty list of strings (the command to run)")
        started, t0 = datetime.datetime.now(), time.monotonic()
        lines: list[str] = []
        try:
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                errors="replace", bufsize=1,
            )  # fmt: skip
        except OSError as exc:
            raise AnsibleActionFail(f"converge_box: cannot run {argv[0]}: {exc}") from exc
        with proc:
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                step = step_line(line)
                if step is not None:
                    display.display(f"  [{label} {time.monotonic() - t0:6.0f} s] {step}")
            rc = proc.wait()
        ended = datetime.datetime.now()
        result.update(
            rc=rc,
            stdout="\n".join(lines),
            stdout_lines=lines,
            stderr="",
            stderr_lines=[],
            cmd=argv,
            start=str(started),
            end=str(ended),
            delta=str(ended - started),
            changed=True,
            failed=rc != 0,
            msg="" if rc == 0 else f"non-zero return code {rc}",
        )
        return result
