"""Jinja2 filters of the fleet report (playbooks/fleet_report.yml): thin wrappers over
plugins/module_utils/fleet_drift.py.

    {{ rows | gpubox.gpubox.fleet_drift(desired[, peers]) }}
        -> {hosts: {box: {field: {value, drift}}}, majority, drift[, peers: {group: {hosts, majority}}]}
    {{ report | gpubox.gpubox.fleet_drift_markdown }} -> the report as one Markdown table
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from ansible_collections.gpubox.gpubox.plugins.module_utils import fleet_drift as drift


def fleet_drift(rows: dict, desired: dict | None = None, peers: dict | None = None) -> dict:
    """Compare every box's facts with the inventory's desired values and its peer group's majority."""
    try:
        return drift.compare(rows, desired, peers)
    except TypeError as exc:
        raise AnsibleFilterError(f"fleet_drift: {exc}") from exc


def fleet_drift_markdown(report: dict) -> str:
    """The report as one Markdown table, drifting values marked."""
    return drift.markdown(report)


class FilterModule:
    """gpubox fleet report filters."""

    def filters(self) -> dict[str, Any]:
        return {"fleet_drift": fleet_drift, "fleet_drift_markdown": fleet_drift_markdown}
