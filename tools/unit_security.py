#!/usr/bin/env python3
"""Render every gpubox systemd unit and measure its exposure with `systemd-analyze security --offline=yes`.

Each unit template is rendered the way a run renders it: the play's role defaults and vars, the
inventory's group_vars for a host of a topology group, templated by Ansible's own Templar (the
`ansible_local` facts are empty, as on a box before its first model). The exposure is systemd's own
score (0.0 = locked down, 10.0 = fully exposed) for the rendered file on this machine's systemd.

    python tools/unit_security.py [--group gpu_2x3090] [--max 2.5]

Exit status 1 when a unit scores above --max.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = ROOT / "inventories" / "production"
# unit name -> (roles of the play that renders it, template path)
UNITS: dict[str, tuple[tuple[str, ...], str]] = {
    "vllm.service": (("gpubox", "vllm_service"), "roles/vllm_service/templates/vllm.service.j2"),
    "gpubox-gpu-check.service": (("gpubox", "gpu_tuning"), "roles/gpu_tuning/templates/gpubox-gpu-check.service.j2"),
    # The LAN cache host's PyPI proxy (roles/fleet_cache; rendered the same way, though it runs on the cache host).
    "gpubox-pypi-cache.service": (("fleet_cache",), "roles/fleet_cache/templates/gpubox-pypi-cache.service.j2"),
    "gpubox-model-verify.service": (
        ("gpubox", "model_store"),
        "roles/model_store/templates/gpubox-model-verify.service.j2",
    ),
    "gpubox-gpu-metrics.service": (("gpubox", "metrics"), "roles/metrics/templates/gpubox-gpu-metrics.service.j2"),
    "gpubox-tenant-metrics.service": (
        ("gpubox", "metrics"),
        "roles/metrics/templates/gpubox-tenant-metrics.service.j2",
    ),
}
# Drop-ins gpubox puts on a packaged unit: (roles, drop-in template, the packaged unit's lines the score
# depends on: it runs as its own user). Scored as the packaged lines followed by the drop-in.
DROP_INS: dict[str, tuple[tuple[str, ...], str, str]] = {
    "prometheus-node-exporter.service": (
        ("gpubox", "metrics"),
        "roles/metrics/templates/prometheus-node-exporter-hardening.conf.j2",
        "[Service]\nUser=prometheus\nExecStart=/usr/bin/prometheus-node-exporter\n",
    ),
    # Debian's/Ubuntu's nginx.service runs the master as root (no User=).
    "nginx.service": (
        ("gpubox", "front_door"),
        "roles/front_door/templates/nginx-hardening.conf.j2",
        "[Service]\nType=forking\nPIDFile=/run/nginx.pid\n"
        "ExecStart=/usr/sbin/nginx -g 'daemon on; master_process on;'\n",
    ),
    # The fleet's gateway (not on a box): Debian's haproxy.service runs its master as root.
    "haproxy.service": (
        ("llm_gateway",),
        "roles/llm_gateway/templates/hardening.conf.j2",
        "[Service]\nExecStart=/usr/sbin/haproxy -Ws -f /etc/haproxy/haproxy.cfg -p /run/haproxy.pid\nType=notify\n",
    ),
}
# The model store's transient unit (systemd-run): its properties are model_publish.sandbox_properties,
# scored as a unit file with the ExecStart the store gives it.
FETCH_UNIT = "gpubox-model-fetch-example.service"
# The ceiling issue 9 sets for every gpubox unit.
MAX_EXPOSURE = 2.5
_OVERALL = re.compile(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Exposure:
    unit: str
    score: float
    report: str


def render_units(group: str = "gpu_2x3090", host: str = "unit-security-box") -> dict[str, str]:
    """{unit name: rendered unit file} for a host of ``group`` of the production inventory."""
    os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.play import Play
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar, trust_as_template
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    from ansible.vars.manager import VariableManager

    if AnsibleCollectionConfig.collection_finder is None:  # pytest's conftest may have set it up already
        init_plugin_loader(prefix_collections_path=[str(ROOT / "collections")])
    out = {}
    jobs = [(unit, roles, template, "") for unit, (roles, template) in UNITS.items()]
    jobs += [(unit, roles, template, packaged) for unit, (roles, template, packaged) in DROP_INS.items()]
    for unit, roles, template, packaged in jobs:
        loader = DataLoader()
        loader.set_basedir(str(ROOT))
        inv = InventoryManager(loader=loader, sources=[str(INVENTORY)])
        inv.add_host(host, group=group)
        vm = VariableManager(loader=loader, inventory=inv)
        vm._extra_vars = {"ansible_managed": "Ansible managed", "ansible_facts": {}}
        play_data = {"hosts": host, "gather_facts": False, "roles": list(roles)}
        play = Play.load(play_data, variable_manager=vm, loader=loader)
        variables = vm.get_vars(play=play, host=inv.get_host(host))
        templar = Templar(loader=loader, variables=variables)
        out[unit] = packaged + templar.template(trust_as_template((ROOT / template).read_text()))
    out[FETCH_UNIT] = fetch_unit()
    return out


def fetch_unit() -> str:
    """The model download's transient unit as a unit file: the properties the store passes to systemd-run."""
    from ansible_collections.gpubox.gpubox.plugins.module_utils import model_publish

    staging = Path("/data/models/.staging/example@0123456789abcdef")
    props = model_publish.sandbox_properties(staging, "gpubox-fetch", 14400)
    argv = ["/opt/gpubox/venv/bin/modelscope", "download", "--model", "Owner/example", "--local_dir", str(staging)]
    return "[Service]\n" + "\n".join(props) + "\nExecStart=" + " ".join(argv) + "\n"


def parse_exposure(report: str) -> float:
    """The overall exposure number of a `systemd-analyze security` report."""
    match = _OVERALL.search(report)
    if not match:
        raise ValueError(f"no 'Overall exposure level' line in systemd-analyze output:\n{report}")
    return float(match.group(1))


def exposure(unit: str, text: str) -> Exposure:
    """Write ``text`` as ``unit`` into a private directory and score it offline."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / unit
        path.write_text(text)
        proc = subprocess.run(
            ["systemd-analyze", "security", "--offline=yes", "--no-pager", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
    report = proc.stdout + proc.stderr
    return Exposure(unit, parse_exposure(report), report)


def measure(group: str = "gpu_2x3090") -> list[Exposure]:
    return [exposure(unit, text) for unit, text in render_units(group).items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group", default="gpu_2x3090")
    ap.add_argument("--max", type=float, default=MAX_EXPOSURE)
    ap.add_argument("--verbose", action="store_true", help="print systemd-analyze's full table")
    ap.add_argument("--json", action="store_true", help="print {unit: exposure} as JSON")
    args = ap.parse_args(argv)
    results = measure(args.group)
    if args.json:
        print(json.dumps({r.unit: r.score for r in results}))
    for result in results if not args.json else []:
        if args.verbose:
            print(result.report)
        print(f"{result.unit:<34} exposure {result.score:.1f}")
    worst = max(r.score for r in results)
    return 1 if worst > args.max else 0


if __name__ == "__main__":
    sys.exit(main())
