#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.serving_snapshot: a thin wrapper over module_utils/layer_snapshot.py."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_snapshot
short_description: Keep a box's serving layer before a canary's change, and put it back
description:
  - With I(state=saved), copies each of I(files) (bytes, mode, owner) and records each of I(links)' targets into
    I(dest), written whole, with a manifest of what existed (playbooks/rebuild.yml, before a canary's turn).
  - With I(state=restored), puts every kept file back whole (renamed over the path), removes a file that did not
    exist, and points each link back at its old target; refused, before any change, when a link's old target is
    gone (nothing is downloaded). Reports the paths it changed.
options:
  dest:
    description: The snapshot's directory on the box.
    type: path
    required: true
  files:
    description: Absolute paths of regular files to keep (a missing one is recorded as missing).
    type: list
    elements: path
    default: []
  links:
    description: Absolute paths of symlinks whose targets to keep.
    type: list
    elements: path
    default: []
  state:
    description: C(saved) keeps, C(restored) puts back.
    type: str
    choices: [saved, restored]
    required: true
attributes:
  check_mode:
    support: full
    description: Can run in check_mode and return changed status prediction without modifying target.
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Keep the serving layer before the canary's change.
  gpubox.gpubox.serving_snapshot:
    dest: /var/lib/gpubox/canary/previous
    files: [/etc/systemd/system/vllm.service, /etc/gpubox/vllm.env]
    links: [/data/models/qwen]
    state: saved
"""

RETURN = r"""
changed_paths:
  description: The paths a restore changed (or would change in check mode); with I(state=saved), the kept paths.
  type: list
  elements: str
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils import layer_snapshot as serving_snapshot  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "files": {"type": "list", "elements": "path", "default": []},
            "links": {"type": "list", "elements": "path", "default": []},
            "state": {"type": "str", "choices": ["saved", "restored"], "required": True},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["state"] == "saved":
            kept = [*params["files"], *params["links"]]
            if not module.check_mode:
                serving_snapshot.save(params["dest"], params["files"], params["links"])
            module.exit_json(changed=True, changed_paths=kept)
        if module.check_mode:
            _manifest, changes = serving_snapshot.plan(params["dest"])
        else:
            changes = serving_snapshot.restore(params["dest"])
    except (OSError, serving_snapshot.SnapshotError) as exc:
        module.fail_json(msg=f"serving snapshot in {params['dest']}: {exc}")
    module.exit_json(changed=bool(changes), changed_paths=changes)


if __name__ == "__main__":
    main()
