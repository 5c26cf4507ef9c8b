#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Documentation of the action plugin gpubox.gpubox.converge_box (plugins/action/converge_box.py): the
plugin runs on the controller and has no module part."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: converge_box
short_description: Run a playbook command on the controller and show its plays and tasks as they start
description:
  - Runs I(argv) on the controller, like M(ansible.builtin.command) delegated to localhost, and while it runs
    shows each play and task the inner run starts, each failure, retry and recap line, prefixed with I(label)
    and the seconds since it began. playbooks/rebuild.yml converges a box with it.
  - Standard output and standard error are read together, as one stream, into C(stdout).
options:
  argv:
    description: The command and its arguments (no shell).
    type: list
    elements: str
    required: true
  label:
    description: What each shown line starts with (the box's name).
    type: str
    default: ""
attributes:
  check_mode:
    support: none
    description: >-
      Runs the command in check mode too; give the task C(check_mode=false), and pass C(--check) in I(argv).
  diff_mode:
    support: none
    description: Pass C(--diff) in I(argv).
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Converge one box with site.yml.
  gpubox.gpubox.converge_box:
    label: "{{ inventory_hostname }}"
    argv: [ansible-playbook, site.yml, --limit, "{{ inventory_hostname }}"]
  check_mode: false
  register: inner
  failed_when: false
"""

RETURN = r"""
rc:
  description: The command's exit status.
  type: int
  returned: always
stdout:
  description: Standard output and standard error, read together.
  type: str
  returned: always
stdout_lines:
  description: C(stdout) split into lines.
  type: list
  elements: str
  returned: always
"""
