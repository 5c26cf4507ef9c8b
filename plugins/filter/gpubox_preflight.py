"""Ansible filter around the preflight checks (plugins/module_utils/gpubox_preflight.py).

Controller-side plugins cannot import custom module_utils through ``ansible.module_utils``, so the
sibling directory is put on sys.path and the pure-Python modules are imported by name (as
plugins/filter/gpubox_capacity.py does).
"""

from __future__ import annotations

import os
import sys
from typing import Any

_MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _MODULE_UTILS not in sys.path:
    sys.path.insert(0, _MODULE_UTILS)

import gpubox_preflight as _preflight  # noqa: E402


def gpubox_preflight(host: dict, config: dict) -> dict:
    """Check a box against its inventory: {errors, warnings, plan, table}. Bad input never raises."""
    return _preflight.preflight(host, config)


class FilterModule:
    """gpubox preflight filter."""

    def filters(self) -> dict[str, Any]:
        return {"gpubox_preflight": gpubox_preflight}
