#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.model_store: a thin wrapper over module_utils/model_publish.py.

The options are declared once, in ARGUMENT_SPEC (validate-modules checks it against DOCUMENTATION),
and passed whole to model_publish.Request; the work is model_publish.run_model_store.
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_store
short_description: Download a ModelScope model with the real client, verify it, publish it atomically
description:
  - Reads the hub's file listing for I(model_id) at I(revision). When the live path C(<root>/<name>)
    already holds that commit (manifest equal to the listing, sizes equal, and sha256 equal when
    I(rehash)), nothing changes.
  - Otherwise checks free disk space, runs C(modelscope download) into the staging directory
    C(<root>/.staging/<name>@<commit>), verifies every file's size and sha256 against the listing,
    deletes and re-fetches files that fail (bounded by I(retries)), writes a manifest, sets ownership,
    renames the staging directory into C(<root>/.versions/) and swaps the C(<root>/<name>) symlink with
    one rename(2).
  - The client never runs as root. It runs as I(download_user), which can write only its staging
    directory; under systemd it is a transient service sandboxed to that directory
    (C(gpubox-model-fetch-<name>.service)), stopped with everything it started when the module ends,
    fails or is stopped. Publishing moves exactly the listed, verified files out of staging (each a
    regular file reached without a symlink); anything else the client wrote is reported in
    I(refused_files) and never published.
  - On failure the live path is untouched and the staging directory is kept, so a re-run resumes.
    Every failure, including an operating-system error such as a full disk, names the path and the fix.
options:
  model_id:
    description: ModelScope id, OWNER/NAME.
    type: str
    required: true
  revision:
    description: Branch, tag or commit to fetch (the role passes gpubox_model_revision).
    type: str
    required: true
  endpoint:
    description: Hub base URL, https unless I(allow_http).
    type: str
    default: https://www.modelscope.cn
  allow_http:
    description:
      - Accept a plain http I(endpoint) (a LAN mirror). Then every live file is re-hashed against the
        manifest on every run (I(rehash) is forced on).
    type: bool
    default: false
  download_user:
    description: Unprivileged user the client runs as (the role creates it); never root.
    type: str
    required: true
  root:
    description: Store root directory (the role passes gpubox_model_root).
    type: path
    required: true
  name:
    description: Directory name under I(root); default the last part of I(model_id).
    type: str
  modelscope_bin:
    description: Path of the C(modelscope) CLI of the serving environment.
    type: path
    required: true
  owner:
    description: Owner of published files and directories.
    type: str
    default: root
  group:
    description: Group of published files and directories (files 0644, directories 0755).
    type: str
    default: root
  rehash:
    description: Re-hash the live files (sha256) instead of trusting the manifest and the sizes.
    type: bool
    default: false
  timeout:
    description: Seconds the client may run in total before it is stopped (staging is kept).
    type: int
    default: 14400
  progress_file:
    description: JSON file rewritten every second with bytes done/total while the module runs.
    type: path
  retries:
    description: Extra client runs after a failed or unverifiable download.
    type: int
    default: 2
  keep_versions:
    description: Version directories kept for this model, the live one included.
    type: int
    default: 2
  reserve_bytes:
    description: Bytes that must stay free on I(root) after the download (the role passes model_store_reserve_bytes).
    type: int
    required: true
  ca_bundle:
    description: PEM file of CAs to trust for the endpoint (a private mirror).
    type: path
  expected_config:
    description:
      - The config.json facts the model must have (the capacity catalog's entry or the inventory's
        gpubox_model_config). A download whose config.json disagrees fails before it is published.
    type: dict
  content_sha256:
    description:
      - The content the model lock pins for this model and revision (the lock entry's content_sha256,
        the sha256 over the model id, commit and every file's path, size and sha256). A listing whose
        content differs is refused before anything changes, whatever channel it came over.
    type: str
  lock_file:
    description: The model lock file named in the refusal (gpubox_model_lock_file).
    type: str
  pin_file:
    description:
      - The box's own content pins, a JSON file only root writes (the role passes C(/var/lib/gpubox/model-pins.json)),
        holding the content of every model commit this box published. A listing that names a pinned commit with
        other content is refused before anything changes; a published commit without a pin gets one.
    type: path
attributes:
  check_mode:
    support: full
    description: Can run in check_mode and return changed status prediction without modifying target.
    details: Reads the listing, the live manifest and the free space; reports whether it would download.
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Ensure Qwen2.5-7B-Instruct is published under /data/models.
  gpubox.gpubox.model_store:
    model_id: Qwen/Qwen2.5-7B-Instruct
    revision: master
    root: /data/models
    reserve_bytes: 1073741824
    download_user: gpubox-fetch
    modelscope_bin: /opt/gpubox/venv/bin/modelscope
"""

RETURN = r"""
path:
  description: The live path (a symlink).
  type: str
  returned: always
version_path:
  description: The version directory the live path points at.
  type: str
  returned: success
commit:
  description: Commit id the hub resolved the revision to.
  type: str
  returned: always
revision:
  description: The revision asked for.
  type: str
  returned: always
manifest_sha256:
  description: Digest of the published manifest.
  type: str
  returned: success
content_sha256:
  description: Digest of the listing's content, what the model lock pins.
  type: str
  returned: success
total_bytes:
  description: Size of the model by the listing.
  type: int
  returned: always
files:
  description: Number of files in the model.
  type: int
  returned: always
downloaded:
  description: Whether the client was run.
  type: bool
  returned: always
attempts:
  description: Client runs made.
  type: int
  returned: always
client_version:
  description: modelscope version beside modelscope_bin, when the client ran.
  type: str
  returned: always
sandbox:
  description:
    - How the client ran, C(systemd) (a sandboxed transient service) or C(user) (a child process as
      I(download_user)).
  type: str
  returned: always
refused_files:
  description: Files the client wrote that are not in the verified listing; never published.
  type: list
  returned: always
repaired:
  description: Live files a re-hash found damaged; a new version replaced them.
  type: list
  returned: always
removed_versions:
  description: Old version directories pruned.
  type: list
  returned: always
"""

# Ansible modules keep their imports below the documentation blocks.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils.model_publish import (  # noqa: E402
    IntegrityError,
    ModelStoreError,
    Request,
    run_model_store,
)

ARGUMENT_SPEC = {
    "model_id": {"type": "str", "required": True},
    "revision": {"type": "str", "required": True},
    "endpoint": {"type": "str", "default": "https://www.modelscope.cn"},
    "allow_http": {"type": "bool", "default": False},
    "download_user": {"type": "str", "required": True},
    "root": {"type": "path", "required": True},
    "name": {"type": "str"},
    "modelscope_bin": {"type": "path", "required": True},
    "owner": {"type": "str", "default": "root"},
    "group": {"type": "str", "default": "root"},
    "rehash": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 14400},
    "progress_file": {"type": "path"},
    "retries": {"type": "int", "default": 2},
    "keep_versions": {"type": "int", "default": 2},
    "reserve_bytes": {"type": "int", "required": True},
    "ca_bundle": {"type": "path"},
    "expected_config": {"type": "dict"},
    "content_sha256": {"type": "str"},
    "lock_file": {"type": "str"},
    "pin_file": {"type": "path"},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = run_model_store(Request(**module.params, check_mode=module.check_mode))
    except IntegrityError as exc:
        module.fail_json(msg=str(exc), problems=[problem.__dict__ for problem in exc.problems])
    except ModelStoreError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result.as_dict())


if __name__ == "__main__":
    main()
