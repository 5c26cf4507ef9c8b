"""Filters that render vLLM 0.7.3's command line for the vllm_service role.

    {{ profile | gpubox_vllm_args }}                 -> list of arguments
    {{ [exe, '-m', mod] + args | gpubox_systemd_args }} -> one ExecStart= string, quoted for systemd
    {{ ['NAME=value'] | gpubox_systemd_args(variables=false) }} -> one Environment= assignment

The logic lives in plugins/module_utils/gpubox_vllm.py (pure, unit-tested).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ansible.errors import AnsibleFilterError

# Controller-side plugins cannot import a project's module_utils through Ansible's loader, so the
# sibling directory is put on sys.path once.
_MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
if _MODULE_UTILS not in sys.path:
    sys.path.insert(0, _MODULE_UTILS)

from gpubox_vllm import VllmProfileError, systemd_quote, vllm_args  # noqa: E402


def gpubox_vllm_args(profile: Mapping[str, Any]) -> list[str]:
    try:
        return vllm_args(profile)
    except VllmProfileError as exc:
        raise AnsibleFilterError(f"gpubox_vllm_args: {exc}") from exc


def gpubox_systemd_args(args: Sequence[Any], variables: bool = True) -> str:
    try:
        return systemd_quote(args, variables)
    except VllmProfileError as exc:
        raise AnsibleFilterError(f"gpubox_systemd_args: {exc}") from exc


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpubox_vllm_args": gpubox_vllm_args, "gpubox_systemd_args": gpubox_systemd_args}
