#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.model_lock: a thin wrapper over module_utils/lock_file.py."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_lock
short_description: Record the commit a model's branch or tag was resolved to in the inventory's lock file
description:
  - Adds (or with I(replace), updates) one entry per item of I(resolved) in the lock file I(path),
    keyed C(OWNER/NAME@REVISION), holding the commit the hub's listing named and its content
    (C(content_sha256), C(files), C(total_bytes)). A revision that is already a commit id gets an entry
    only for its content. The file is written whole (temp file, rename) and only when an entry changes.
  - Each item is an answer of the hub as one box got it. An answer that came through the LAN cache (its
    C(endpoint) is the item's C(cache_endpoint)) or over plain http (unless the item's C(allow_http)) is
    refused, and so are boxes whose answers for one key differ (commit or content); the message names each
    answer and its boxes, and nothing is written.
  - Runs where the lock file lives, the controller (delegated to localhost).
options:
  path:
    description: The lock file (gpubox_model_lock_file).
    type: path
    required: true
  resolved:
    description:
      - Items with C(model_id), C(revision), C(commit), C(content_sha256), C(files), C(total_bytes) (read from
        the hub), C(endpoint) (where the listing came from), C(host) (the box that asked), C(cache_endpoint) (the
        LAN cache that box uses, '' for none) and C(allow_http) (model_store_lock_allow_http).
    type: list
    elements: dict
    required: true
  replace:
    description: Update entries that exist (make lock-models); false adds only missing ones (a converge).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Can run in check_mode and return changed status prediction without modifying target.
  diff_mode:
    support: none
    description: Reports the changed keys instead of a diff.
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Lock what the hub resolved master to.
  gpubox.gpubox.model_lock:
    path: inventories/production/models.lock.json
    resolved:
      - {model_id: Qwen/Qwen2.5-7B-Instruct, revision: master, commit: "{{ result.commit }}", endpoint: https://www.modelscope.cn,
         content_sha256: "{{ result.content_sha256 }}", host: "{{ inventory_hostname }}", cache_endpoint: ""}
  delegate_to: localhost
"""

RETURN = r"""
changed_keys:
  description: The C(OWNER/NAME@REVISION) entries written.
  type: list
  returned: always
entries:
  description: Every entry of the lock after the run.
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils.lock_file import (  # noqa: E402
    LockError,
    merge_lock,
    read_lock,
    write_lock,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "resolved": {"type": "list", "elements": "dict", "required": True},
            "replace": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        entries, changed = merge_lock(read_lock(path), module.params["resolved"], module.params["replace"])
        if changed and not module.check_mode:
            write_lock(path, entries)
    except LockError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(
            msg=f"writing the model lock {path} failed: {exc.strerror}; check that its directory is writable"
        )
    module.exit_json(changed=bool(changed), changed_keys=changed, entries=entries)


if __name__ == "__main__":
    main()
