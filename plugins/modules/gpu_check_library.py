#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.gpu_check_library: install the parser of the boot-time GPU check."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_check_library
short_description: Install the collection's GPU output parser as the library of the boot-time GPU check
description:
  - Writes the source of the collection's module_utils C(gpu_parsers.py), exactly as it reached the
    host inside this module's own payload, to I(dest). The boot-time check C(gpubox-gpu-check) imports
    it from there (its C(--lib) directory), so the check and the M(gpubox.gpubox.gpu_facts) module
    parse nvidia-smi with the same code, and no role reads files outside its own directory.
  - The file is replaced atomically (a temporary file in the same directory, then rename(2)) and only
    when its content differs. When I(mode) is not given the file gets C(0644).
  - The directory of I(dest) must exist (in check mode a missing directory reports C(changed)).
  - With I(library=model_manifest) it writes the collection's C(model_manifest.py) instead, the
    manifest re-hash of the model store, run on the box by the optional C(gpubox-model-verify.service)
    (roles/model_store), the same code the M(gpubox.gpubox.model_verify) module runs.
  - With I(library=gpu_metrics) it writes C(gpu_metrics.py), the parser and Prometheus renderer of the
    box's GPU metrics collector C(gpubox-gpu-metrics) (roles/metrics).
  - With I(library=tenant_metrics) it writes C(tenant_metrics.py), the access-log parser and Prometheus renderer of
    the front door's per-tenant counts collector C(gpubox-tenant-metrics) (roles/metrics).
options:
  library:
    description:
      - Which of the collection's stdlib-only module_utils to write.
    type: str
    choices: [gpu_metrics, gpu_parsers, model_manifest, tenant_metrics]
    default: gpu_parsers
  dest:
    description:
      - Path of the library file. Name it after I(library) (C(gpu_parsers.py), C(model_manifest.py)), the
        module name its user imports or runs.
    type: path
    required: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.files
attributes:
  check_mode:
    support: full
    details: Compares the content and the file attributes; reports whether it would write.
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Ensure the GPU output parser is installed for the check
  gpubox.gpubox.gpu_check_library:
    dest: /usr/local/lib/gpubox/gpu_parsers.py
    owner: root
    group: root
    mode: "0644"
  notify: gpubox gpu check changed
"""

RETURN = r"""
dest:
  description: The library file.
  type: str
  returned: always
  sample: /usr/local/lib/gpubox/gpu_parsers.py
sha256:
  description: sha256 of the library's content (the collection's module_utils file).
  type: str
  returned: always
size:
  description: Size of the library in bytes.
  type: int
  returned: always
"""

# Ansible modules keep their imports below the documentation blocks.
import hashlib  # noqa: E402
import os  # noqa: E402
import pkgutil  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

# Imported so that the files travel to the host in this module's payload; their source is what is written.
from ansible_collections.gpubox.gpubox.plugins.module_utils import (  # noqa: E402
    gpu_metrics,
    gpu_parsers,
    model_manifest,
    tenant_metrics,
)

LIBRARIES = {
    "gpu_parsers": gpu_parsers,
    "model_manifest": model_manifest,
    "gpu_metrics": gpu_metrics,
    "tenant_metrics": tenant_metrics,
}

DEFAULT_MODE = "0644"


def library_source(library: str = "gpu_parsers") -> bytes:
    """The bytes of the library's .py as shipped with this module (read through its package's loader)."""
    package, _sep, name = LIBRARIES[library].__name__.rpartition(".")
    data = pkgutil.get_data(package, name + ".py")
    if not data:
        raise OSError(f"the source of {LIBRARIES[library].__name__} is not in this module's payload")
    return data


def read_current(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def write_atomically(module: AnsibleModule, dest: str, content: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.", dir=os.path.dirname(dest))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        module.atomic_move(tmp, dest, unsafe_writes=module.params["unsafe_writes"])
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "library": {"type": "str", "choices": sorted(LIBRARIES), "default": "gpu_parsers"},
        },
        add_file_common_args=True,
        supports_check_mode=True,
    )
    dest = module.params["dest"]
    if module.params["mode"] is None:
        module.params["mode"] = DEFAULT_MODE
    try:
        content = library_source(module.params["library"])
    except OSError as exc:
        module.fail_json(msg=str(exc))
    directory = os.path.dirname(dest)
    if not os.path.isdir(directory):
        if module.check_mode:  # a dry run: the task that creates the directory only said it would
            module.exit_json(changed=True, dest=dest, sha256=hashlib.sha256(content).hexdigest(), size=len(content))
        module.fail_json(msg=f"the directory of dest {dest} does not exist; create {directory} first")
    if os.path.isdir(dest):
        module.fail_json(
            msg=f"dest {dest} is a directory; give the library's file path (…/{module.params['library']}.py)"
        )
    try:
        changed = read_current(dest) != content
        if changed and not module.check_mode:
            write_atomically(module, dest, content)
    except OSError as exc:
        module.fail_json(msg=f"cannot write {dest}: {exc}")
    if os.path.exists(dest):  # in check mode a missing file has no attributes to compare
        file_args = module.load_file_common_arguments(module.params, path=dest)
        changed = module.set_fs_attributes_if_different(file_args, changed)
    module.exit_json(changed=changed, dest=dest, sha256=hashlib.sha256(content).hexdigest(), size=len(content))


if __name__ == "__main__":
    main()
