#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.model_store_progress: one look at a background model_store job."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_store_progress
short_description: Read the progress of a background gpubox.gpubox.model_store job, and whether it has ended
description:
  - Reads the progress file the model_store module rewrites every second and the job's async results
    file. Returns C(state) C(running) only while the job can still make progress; C(done) or
    C(failed) as the store wrote them; C(ended) when the job's results file holds its final result;
    C(gone) when the process that writes the progress file no longer exists (killed) while the file
    still says running, or when the box has booted since the job started (I(boot_id) differs; a
    reboot or power cut ended the job, and took the progress file in /run with it).
  - A poll loop that stops on any state but C(running) therefore ends within one interval of the job
    ending, however it ended, and never waits for a dead job.
options:
  progress_file:
    description: The model_store module's I(progress_file).
    type: path
    required: true
  results_file:
    description: The C(results_file) that an async task registers (the job's status file).
    type: path
    required: true
  boot_id:
    description: The box's C(/proc/sys/kernel/random/boot_id) when the job started; empty to skip that check.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Reads only.
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Report the model download's progress until it ends.
  gpubox.gpubox.model_store_progress:
    progress_file: /run/gpubox-model-store.json
    results_file: "{{ job.results_file }}"
  register: progress
  until: progress.state != 'running'
  retries: 960
  delay: 15
"""

RETURN = r"""
state:
  description: running, done, failed, ended or gone.
  type: str
  returned: always
message:
  description: The progress line (bytes, files, phase) or why the job is considered over.
  type: str
  returned: always
"""

import json  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils.model_publish import process_start  # noqa: E402


def read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def current_boot_id() -> str:
    try:
        with open(BOOT_ID, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def job_state(progress: dict | None, results: dict | None, started_boot: str = "", boot: str = "") -> tuple[str, str]:
    """(state, message) from the two files and the boot ids; pure, for the tests."""
    if results is not None and (results.get("finished") == 1 or "started" not in results):
        return "ended", "the job has ended"
    if started_boot and boot and started_boot.strip() != boot.strip():
        return "gone", "the box has restarted since the model store job started (a reboot or power cut ended it)"
    if progress is None:
        return "running", "waiting for the first progress report"
    state = str(progress.get("state") or "running")
    message = str(progress.get("message") or progress.get("phase") or state)
    if state != "running":
        return state, message
    pid, started = progress.get("pid"), progress.get("pid_start")
    if isinstance(pid, int) and pid > 0 and started and process_start(pid) != started:
        return "gone", f"the model store process {pid} is gone while it reported: {message}"
    return "running", message


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "progress_file": {"type": "path", "required": True},
            "results_file": {"type": "path", "required": True},
            "boot_id": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    state, message = job_state(
        read_json(module.params["progress_file"]),
        read_json(module.params["results_file"]),  # type path: already expanded
        module.params["boot_id"],
        current_boot_id(),
    )
    module.exit_json(changed=False, state=state, message=message)


if __name__ == "__main__":
    main()
