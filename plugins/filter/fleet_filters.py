"""Jinja2 filters of the fleet report (playbooks/fleet_report.yml): thin wrappers over
plugins/module_utils/fleet_drift.py.

    {{ rows | gpubox.gpubox.fleet_drift(desired[, peers]) }}
        -> {hosts: {box: {field: {value, drift}}}, majority, drift[, peers: {group: {hosts, majority}}]}
    {{ report | gpubox.gpubox.fleet_drift_markdown }} -> the report as one Markdown table
    {{ facts | gpubox.gpubox.gateway_pools(keys) }} -> the gateway's pools, tenants' grants and key map
        (module_utils/gateway_pools.py; SECRET: its key_map, no_log only)
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.gpubox.plugins.module_utils import fleet_drift as drift
from ansible_collections.gpubox.gpubox.plugins.module_utils import gateway_pools as pools


def fleet_drift(
    rows: dict, desired: dict | None = None, peers: dict | None = None, maintenance: list | None = None
) -> dict:
    """Compare every box's facts with the inventory's desired values and its peer group's majority; ``maintenance``:
    the gateway's list of boxes in maintenance ({box, since, reason}), shown in the gateway column."""
    try:
        return drift.compare(rows, desired, peers, maintenance)
    except TypeError as exc:
        raise AnsibleFilterError(f"fleet_drift: {exc}") from exc


def fleet_drift_markdown(report: dict) -> str:
    """The report as one Markdown table, drifting values marked."""
    return drift.markdown(report)


def gateway_pools(boxes: dict, keys: dict, addresses: dict | None = None) -> dict:
    """The boxes behind the gateway by the model they serve, what each tenant may use, and the problems."""
    if not isinstance(boxes, dict) or not isinstance(keys, dict):
        raise AnsibleFilterError("gateway_pools: give {box: front door fact} and {box: keys file text}")
    return pools.pools(boxes, keys, addresses)


class FilterModule:
    """gpubox fleet report filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "fleet_drift": fleet_drift,
            "fleet_drift_markdown": fleet_drift_markdown,
            "gateway_pools": gateway_pools,
        }
