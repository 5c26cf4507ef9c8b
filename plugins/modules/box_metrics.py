#!/usr/bin/python
# Copyright: gpubox developers
# Apache License 2.0 (see galaxy.yml); this file is not GPL-licensed.
"""Ansible module gpubox.gpubox.box_metrics: write the box's metrics for node-exporter's textfile collector."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: box_metrics
short_description: Write what a gpubox box runs as a node-exporter textfile (.prom)
description:
  - Builds the metrics C(gpubox_info) (labels driver, cuda, vllm, model, commit, p2p),
    C(gpubox_model_verified), C(gpubox_kv_cache_blocks_planned) and C(gpubox_kv_cache_blocks_actual) from
    the local facts the gpubox roles publish, the capacity planner's block count and vLLM's own metrics
    text, and writes them in the Prometheus text format to I(dest).
  - What the box does not know is left out (a host-layer-only box has no model and no vLLM).
  - The file is replaced in one rename(2) from C(.<name>.tmp) in the same directory, only when its content
    or mode differs; node-exporter reads only C(*.prom) files, so it never reads a half-written one.
options:
  dest:
    description: The .prom file in node-exporter's textfile directory; its directory must exist.
    type: path
    required: true
  local_facts:
    description: The box's C(ansible_local) facts.
    type: dict
    required: true
  planned_gpu_blocks:
    description: KV-cache blocks the capacity planner expects (preflight's plan); omit when unknown.
    type: int
  vllm_metrics:
    description: The text of vLLM's C(/metrics) (its C(vllm:cache_config_info) gives the real block count).
    type: str
  model_root:
    description: >-
      gpubox_model_root; C(gpubox_model_root_info{path,mountpoint}) names the mount point holding it, which the
      dashboard's disk panel joins C(node_filesystem_avail_bytes) on. Omit to leave the metric out.
    type: path
  mode:
    description: Mode of the file.
    type: raw
    default: "0644"
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports whether it would write.
  diff_mode:
    support: none
  platform:
    platforms: posix
author:
  - gpubox developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Ensure the box's metrics are written for node-exporter
  gpubox.gpubox.box_metrics:
    dest: /var/lib/prometheus/node-exporter/gpubox.prom
    local_facts: "{{ ansible_facts.ansible_local }}"
    planned_gpu_blocks: "{{ gpubox_preflight.plan.gpu_blocks }}"
"""

RETURN = r"""
dest:
  description: The .prom file.
  type: str
  returned: always
names:
  description: The metric names written.
  type: list
  elements: str
  returned: always
  sample: [gpubox_info, gpubox_kv_cache_blocks_planned]
text:
  description: The file's content.
  type: str
  returned: always
"""

# Ansible modules keep their imports below the documentation blocks.
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils import node_textfile  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dest": {"type": "path", "required": True},
            "local_facts": {"type": "dict", "required": True},
            "planned_gpu_blocks": {"type": "int"},
            "vllm_metrics": {"type": "str"},
            "model_root": {"type": "path"},
            "mode": {"type": "raw", "default": "0644"},
        },
        supports_check_mode=True,
    )
    params = module.params
    dest = params["dest"]
    try:
        mode = int(str(params["mode"]), 8)
    except ValueError:
        module.fail_json(msg=f"mode {params['mode']!r} is not an octal mode such as '0644'")
    directory = os.path.dirname(dest)
    if not os.path.isdir(directory):
        module.fail_json(msg=f"the directory of dest {dest} does not exist; create {directory} first")
    try:
        metrics = node_textfile.collect(
            params["local_facts"], params["planned_gpu_blocks"], params["vllm_metrics"], params["model_root"]
        )
        text = node_textfile.render(metrics)
    except node_textfile.MetricsError as exc:
        module.fail_json(msg=str(exc))
    names = sorted({m.name for m in metrics})
    if module.check_mode:
        try:
            with open(dest, encoding="utf-8") as handle:
                changed = handle.read() != text
        except FileNotFoundError:
            changed = True
    else:
        try:
            changed = node_textfile.write_textfile(dest, text, mode)
        except OSError as exc:
            module.fail_json(msg=f"cannot write {dest}: {exc}")
    module.exit_json(changed=changed, dest=dest, names=names, text=text)


if __name__ == "__main__":
    main()
