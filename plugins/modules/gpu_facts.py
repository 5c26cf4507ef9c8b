#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.gpu_facts: the GPU facts of a gpubox from nvidia-smi, or from sysfs without a driver."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts from nvidia-smi, falling back to the PCI view in sysfs
description:
  - Runs C(nvidia-smi -q -x), C(nvidia-smi topo -m), C(nvidia-smi topo -p2p r) and
    C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits) and returns what they say as the
    fact C(gpubox_gpu).
  - "When nvidia-smi is not installed, or is installed but fails (for example
    C(Failed to initialize NVML: Driver/library version mismatch) before the reboot that loads a new
    driver), the GPUs are found in sysfs instead (vendor 0x10de, class 0x0300xx or 0x0302xx) and the
    failure is reported in C(nvidia_smi_error). The module never changes anything."
  - Output that cannot be parsed fails the task with a message naming the command and the reason.
options:
  nvidia_smi:
    description: Name (looked up on PATH) or absolute path of the nvidia-smi executable.
    type: str
    default: nvidia-smi
  sysfs_root:
    description:
      - Directory that plays C(/) for reading C(sys/bus/pci/devices) and C(sys/module/nvidia/version).
        Tests point it at a fake tree.
    type: path
    default: /
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying target.
    support: full
    details: Only reads; runs the same in check mode.
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Gather the GPU facts.
  gpubox.gpubox.gpu_facts:

- name: Gather the GPU facts from a test tree.
  gpubox.gpubox.gpu_facts:
    nvidia_smi: /usr/bin/nvidia-smi
    sysfs_root: /srv/fake-root

- name: Assert that two GPUs are visible.
  ansible.builtin.assert:
    that: ansible_facts.gpubox_gpu.count == 2
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: complex
  contains:
    gpubox_gpu:
      description: What was seen of the GPUs.
      returned: always
      type: dict
      contains:
        source:
          description: C(nvidia-smi) when nvidia-smi answered, C(sysfs) when the PCI view was used.
          type: str
          sample: nvidia-smi
        driver_version:
          description: Driver version reported by nvidia-smi; null from sysfs.
          type: str
          sample: "535.261.03"
        cuda_version:
          description: Highest CUDA version the driver supports, per nvidia-smi; null from sysfs.
          type: str
          sample: "12.2"
        count:
          description: Number of GPUs.
          type: int
          sample: 2
        gpus:
          description:
            - One entry per GPU in nvidia-smi index order (PCI address order from sysfs), with keys
              C(index), C(pci_bus_id) (nvidia-smi form, 00000000:21:00.0), C(name), C(uuid),
              C(pci_device_id) (0x2204), C(memory_total_mib), C(persistence_mode) (bool),
              C(pcie_link_gen_current), C(pcie_link_gen_max), C(pcie_link_width_current),
              C(pcie_link_width_max), C(bar1_total_mib).
            - From sysfs, name is C(PCI 10de:<device>) and uuid, memory and persistence are null.
          type: list
          elements: dict
        links:
          description: Link type per GPU pair from C(nvidia-smi topo -m), keys C(i-j) with i < j.
          type: dict
          sample: {"0-1": "NV4"}
        p2p_read:
          description: Driver P2P read status per GPU pair from C(nvidia-smi topo -p2p r).
          type: dict
          sample: {"0-1": "OK"}
        loaded_module_version:
          description: Version of the loaded nvidia kernel module (sys/module/nvidia/version), or null.
          type: str
          sample: "535.261.03"
        nvidia_smi_path:
          description: The nvidia-smi that was run, or null when none was found.
          type: str
        nvidia_smi_error:
          description: Output of a failing nvidia-smi (the facts then come from sysfs), else null.
          type: str
          sample: "Failed to initialize NVML: Driver/library version mismatch"
"""

# Ansible modules keep their imports below the documentation blocks.
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils.gpu_parsers import (  # noqa: E402
    QUERY_FIELDS,
    GpuParseError,
    gpu_facts,
)


def _find_nvidia_smi(module: AnsibleModule, name: str) -> str | None:
    if os.path.isabs(name):
        return name if os.access(name, os.X_OK) else None
    return module.get_bin_path(name, required=False)


def _run(module: AnsibleModule, argv: list) -> tuple[int, str, str]:
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    return rc, out, err


def _failure_text(argv: list, rc: int, out: str, err: str) -> str:
    text = "\n".join(part.strip() for part in (out, err) if part and part.strip())
    return f"`{' '.join(argv)}` exited with status {rc}: {text or 'no output'}"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "sysfs_root": {"type": "path", "default": "/"},
        },
        supports_check_mode=True,
    )
    smi = _find_nvidia_smi(module, module.params["nvidia_smi"])
    root = module.params["sysfs_root"]
    outputs = {}
    error = None
    if smi is not None:
        commands = {
            "query_xml": [smi, "-q", "-x"],
            "topo_m": [smi, "topo", "-m"],
            "topo_p2p_r": [smi, "topo", "-p2p", "r"],
            "query_csv": [smi, "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"],
        }
        for key, argv in commands.items():
            rc, out, err = _run(module, argv)
            if rc != 0:
                error = _failure_text(argv, rc, out, err)
                if key == "query_xml":
                    break  # nvidia-smi does not work at all: use sysfs
                continue
            outputs[key] = out
    try:
        facts = gpu_facts(
            query_xml=outputs.get("query_xml"),
            topo_m=outputs.get("topo_m"),
            topo_p2p_r=outputs.get("topo_p2p_r"),
            query_csv=outputs.get("query_csv"),
            sysfs_root=root,
            nvidia_smi_error=error,
        )
    except GpuParseError as exc:
        module.fail_json(msg=f"{exc}. Run the command by hand to see its output; the parser is gpu_parsers.py.")
    facts["nvidia_smi_path"] = smi
    module.exit_json(changed=False, ansible_facts={"gpubox_gpu": facts})


if __name__ == "__main__":
    main()
