#!/usr/bin/env python3
"""Plan vLLM 0.7.3 GPU memory for one topology group of the production inventory, offline.

    python tools/plan.py gpu_2x3090

Reads inventories/production/group_vars/gpu_boxes.yml and <GROUP>.yml (plain YAML, no Ansible run,
no box needed), takes the model's facts from the catalog, prints the plan table and exits 1 with the
errors when the profile does not fit (2 for a usage error).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent

from ansible_collections.gpubox.gpubox.plugins.module_utils import capacity_planner
from ansible_collections.gpubox.gpubox.plugins.module_utils import model_catalog


def load_filter_plugin() -> Any:
    """The Ansible filter plugin, loaded by path under its own name (it shares gpubox_capacity's)."""
    path = ROOT / "plugins" / "filter" / "gpubox_capacity.py"
    spec = importlib.util.spec_from_file_location("gpubox_capacity_filter", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


GROUP_VARS = ROOT / "inventories" / "production" / "group_vars"
SHARED_GROUP = "gpu_boxes"


def topology_groups(group_vars: Path = GROUP_VARS) -> list[str]:
    return sorted(p.stem for p in group_vars.glob("*.yml") if p.stem != SHARED_GROUP)


def load_group_vars(group: str, group_vars: Path = GROUP_VARS) -> dict[str, Any]:
    groups = topology_groups(group_vars)
    if group not in groups:
        raise SystemExit(f"unknown group {group!r}: choose one of {', '.join(groups)} ({group_vars})")
    merged: dict[str, Any] = {}
    for name in (SHARED_GROUP, group):
        merged.update(yaml.safe_load((group_vars / f"{name}.yml").read_text()) or {})
    return merged


def planner_inputs(hostvars: dict[str, Any]) -> tuple[dict, dict, dict]:
    """Map inventory variables to plan() inputs (the one mapping lives in INVENTORY_NAMES)."""
    gpu, serving = capacity_planner.inventory_inputs(hostvars)
    return model_catalog.planned_model(hostvars), gpu, serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plan vLLM GPU memory for an inventory group.")
    parser.add_argument("group", help="topology group, e.g. gpu_2x3090")
    args = parser.parse_args(argv)
    try:
        hostvars = load_group_vars(args.group)
        model, gpu, serving = planner_inputs(hostvars)
    except model_catalog.UnknownModelError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    except SystemExit as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    filters = load_filter_plugin()
    result = filters.gpubox_plan(model, gpu, serving)
    print(f"{args.group}: {hostvars['gpubox_model_id']} on {gpu['count']} x {gpu['name']}")
    print(filters.gpubox_plan_table(result))
    return 0 if result["fits"] else 1


if __name__ == "__main__":
    sys.exit(main())
