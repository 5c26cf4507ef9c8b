"""Ansible reads this checkout's ansible.cfg and resolves gpubox.gpubox from it wherever pytest starts.

The collection loader is installed before any test module imports ``ansible_collections.gpubox``, so
plain imports and Ansible's plugin lookups (filters, lookups by FQCN) see the same package.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))

from ansible.plugins.loader import init_plugin_loader  # noqa: E402

init_plugin_loader(prefix_collections_path=[str(ROOT / "collections")])


import pytest  # noqa: E402

from harness.policy import skip_refusal  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """A skip fails its test unless its reason says the dependency is optional (harness/policy.py)."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        refusal = skip_refusal(str(report.longrepr[2]))
        if refusal is not None:
            report.outcome = "failed"
            report.longrepr = f"{item.nodeid}: {refusal}"
