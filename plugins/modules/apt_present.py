#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Documentation of the action plugin gpubox.gpubox.apt_present (plugins/action/apt_present.py): the plugin
asks dpkg on the box with one shell command, or runs ansible.builtin.apt; it has no module part."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_present
short_description: Make sure distribution packages are installed, asking dpkg before apt
description:
  - Takes the arguments of M(ansible.builtin.apt). When they only ask for packages to be present (by name,
    optionally C(:arch) and C(=exact-version)) and dpkg shows every one installed or held, without an error
    flag, at that version, the task is ok and unchanged and apt does not run.
  - In every other case (a package missing or at another version, a half-installed one, a wildcard or a
    version relation, C(update_cache=true), another state, an option that does more than install) it runs
    M(ansible.builtin.apt) with the same arguments and returns its result.
  - With nothing to install it reads no package index, so C(cache_valid_time) refreshes nothing then.
options:
  name:
    description: The packages, as M(ansible.builtin.apt) takes them.
    type: list
    elements: str
    aliases: [package, pkg]
  state:
    description: Only C(present) is answered by dpkg; any other state goes to M(ansible.builtin.apt).
    type: str
    default: present
  cache_valid_time:
    description: Passed to M(ansible.builtin.apt) when it runs.
    type: int
  install_recommends:
    description: Passed to M(ansible.builtin.apt) when it runs.
    type: bool
  allow_downgrade:
    description: Passed to M(ansible.builtin.apt) when it runs.
    type: bool
  update_cache:
    description: When true, M(ansible.builtin.apt) always runs.
    type: bool
extends_documentation_fragment: []
attributes:
  check_mode:
    support: full
    description: dpkg's answer changes nothing; apt runs in check mode otherwise.
  diff_mode:
    support: none
    description: Nothing to compare; apt's own diff is not asked for.
author:
  - gpubox developers (!UNKNOWN)
notes:
  - Every other option of M(ansible.builtin.apt) is passed to it, and makes it run.
"""

EXAMPLES = r"""
- name: Ensure nginx and the TLS tooling are installed.
  gpubox.gpubox.apt_present:
    name: [nginx, ssl-cert]
    state: present
    cache_valid_time: 3600
"""

RETURN = r"""
packages:
  description: The package names dpkg showed installed as asked (only when apt did not run).
  type: list
  elements: str
  returned: when dpkg answered
msg:
  description: C(installed as asked (dpkg)) when dpkg answered; apt's message otherwise.
  type: str
  returned: always
"""
