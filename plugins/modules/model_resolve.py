#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.model_resolve: the commit a revision names now, from the hub's listing.

Read-only; the listing is model_publish's (fetch_listing, parse_listing).
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_resolve
short_description: Ask the ModelScope hub which commit a model's revision names now
description:
  - Reads the hub's file listing of I(model_id) at I(revision) (the same request the model store
    makes) and returns the commit it names. Changes nothing. Runs on the box, which reaches the hub
    the way its downloads do (endpoint, CA bundle).
options:
  model_id:
    description: ModelScope id, OWNER/NAME.
    type: str
    required: true
  revision:
    description: Branch, tag or commit.
    type: str
    required: true
  endpoint:
    description: Hub base URL, https unless I(allow_http).
    type: str
    default: https://www.modelscope.cn
  allow_http:
    description: Accept a plain http I(endpoint) (a LAN mirror).
    type: bool
    default: false
  ca_bundle:
    description: PEM file of CAs to trust for the endpoint.
    type: path
attributes:
  check_mode:
    support: full
    description: Can run in check_mode and return changed status prediction without modifying target.
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Which commit is master now?
  gpubox.gpubox.model_resolve:
    model_id: Qwen/Qwen2.5-7B-Instruct
    revision: master
  register: resolved
"""

RETURN = r"""
commit:
  description: The commit the hub's listing names (a content id when it names none; such a one is never locked).
  type: str
  returned: success
total_bytes:
  description: Size of the model at that commit.
  type: int
  returned: success
files:
  description: Number of files at that commit.
  type: int
  returned: success
content_sha256:
  description: >-
    Digest of the listing's content (model id, commit, every file's path, size, sha256), what the
    model lock pins.
  type: str
  returned: success
"""

from urllib.parse import urlsplit  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils.model_publish import (  # noqa: E402
    ModelStoreError,
    fetch_listing,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "model_id": {"type": "str", "required": True},
            "revision": {"type": "str", "required": True},
            "endpoint": {"type": "str", "default": "https://www.modelscope.cn"},
            "allow_http": {"type": "bool", "default": False},
            "ca_bundle": {"type": "path"},
        },
        supports_check_mode=True,
    )
    p = module.params
    scheme = urlsplit(p["endpoint"]).scheme
    if scheme != "https" and not (scheme == "http" and p["allow_http"]):
        module.fail_json(msg=f"endpoint {p['endpoint']!r} must be https (or http with allow_http, a LAN mirror)")
    try:
        listing = fetch_listing(p["endpoint"], p["model_id"], p["revision"], timeout=120.0, cafile=p["ca_bundle"])
    except ModelStoreError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(
        changed=False,
        commit=listing.commit,
        total_bytes=listing.total_size,
        files=len(listing.files),
        content_sha256=listing.content_sha256,
    )


if __name__ == "__main__":
    main()
