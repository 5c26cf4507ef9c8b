#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.model_root: a thin wrapper over store_layout.root_path_problems."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_root
short_description: Check, read-only, that no user but root can swap the model store at a path
description:
  - Walks I(root) by its real path, one component at a time without following a link unchecked (the same
    code the model store runs before it creates anything); every existing directory above it must be root's
    and not writable by group or others (sticky allowed), and a symlink on the way (I(root) itself included)
    is followed only when it is root's in a root-owned directory that group and others cannot write.
  - Returns the problems found, each naming the path and the fix; changes nothing. Preflight runs it.
options:
  root:
    description: The store root (gpubox_model_root), an absolute path.
    type: path
    required: true
attributes:
  check_mode:
    support: full
    description: Can run in check_mode and return changed status prediction without modifying target.
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check that no user but root can swap the model store.
  gpubox.gpubox.model_root:
    root: /data/models
  register: model_root
"""

RETURN = r"""
problems:
  description: What would let another user swap the store (empty when none), each naming the path and the fix.
  type: list
  elements: str
  returned: always
"""

from pathlib import Path  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils.store_layout import root_path_problems  # noqa: E402


def main() -> None:
    module = AnsibleModule(argument_spec={"root": {"type": "path", "required": True}}, supports_check_mode=True)
    root = Path(module.params["root"])
    if not root.is_absolute():
        module.fail_json(msg=f"root must be an absolute path (gpubox_model_root), got {str(root)!r}")
    module.exit_json(changed=False, problems=root_path_problems(root))


if __name__ == "__main__":
    main()
