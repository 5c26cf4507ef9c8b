#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.model_verify: re-hash the live model against its manifest.

Read-only; the hashing and the manifest are model_publish's (verify_dir, read_manifest).
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_verify
short_description: Re-hash the live model of the model store against its manifest, file by file
description:
  - Resolves the live path C(<root>/<name>) to its version directory, reads the manifest the store
    wrote when it published it (its own digest checked), and re-hashes every listed file (size and
    sha256). Changes nothing; a damaged model is repaired by a normal run of the model_store role
    with C(model_store_rehash) (an http endpoint always re-hashes).
options:
  root:
    description: Store root (gpubox_model_root).
    type: path
    required: true
  name:
    description: Directory name of the model under I(root) (gpubox_model_name).
    type: str
    required: true
attributes:
  check_mode:
    support: full
    description: Can run in check_mode and return changed status prediction without modifying target.
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Re-hash the live model.
  gpubox.gpubox.model_verify:
    root: /data/models
    name: Qwen2.5-7B-Instruct
  register: verify
"""

RETURN = r"""
ok:
  description: Every listed file is present with its size and sha256.
  type: bool
  returned: always
path:
  description: The live path.
  type: str
  returned: always
version_path:
  description: The version directory it points at (empty when there is none).
  type: str
  returned: always
commit:
  description: The commit the manifest names.
  type: str
  returned: always
files:
  description: One item per listed file, C(path), C(ok) and C(status) (C(ok), or what is wrong).
  type: list
  returned: always
problems:
  description: One line per damaged or missing file, or what is wrong with the live path or manifest.
  type: list
  returned: always
bytes_hashed:
  description: Bytes read and hashed.
  type: int
  returned: always
"""

from pathlib import Path  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils.model_manifest import verify_live  # noqa: E402
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_publish import (  # noqa: E402
    ModelStoreError,
    StoreLayout,
)


def verify(root: str, name: str) -> dict:
    layout = StoreLayout(Path(root), name)  # refuses a relative root or a name that is not one component
    return verify_live(layout.root, layout.name)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"root": {"type": "path", "required": True}, "name": {"type": "str", "required": True}},
        supports_check_mode=True,
    )
    try:
        result = verify(module.params["root"], module.params["name"])
    except ModelStoreError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"reading the live model failed at {exc.filename}: {exc.strerror}")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
