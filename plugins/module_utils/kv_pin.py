"""The box pins its own KV cache budget (stdlib only; issue 45 item 5).

vLLM sizes its KV cache at every start from the memory its profiling run finds free (gpu_memory_utilization x the
card, less what the weights, the activation peak and the rest took). Under ``Restart=always`` a restart while another
process still holds GPU memory (a leaked worker, another tenant's job) then gets a smaller pool, silently: fewer
concurrent sequences, more preemption, nothing in any alert. So on a stack whose vLLM has ``--kv-cache-memory-bytes``
(the desired-state schema's flag row says which) and with ``gpubox_kv_cache_memory_bytes`` left null, the box pins
the budget its first start measured, for every later start of the same unit:

* After a start that profiled, vllm_service reads the figure vLLM logged (vllm_startup.measured): the exact value vLLM
  itself suggests for ``--kv-cache-memory`` "to fit into requested memory" where it logs one (vLLM 0.32's
  vllm/v1/worker/gpu_worker.py), else its "Available KV cache memory" in GiB. It records the local fact
  gpubox_kv_pin (the bytes, the unit's checksum, when) and the environment file the unit reads
  (``GPUBOX_KV_CACHE_PIN=--kv-cache-memory-bytes=N``, expanded by systemd into ExecStart's arguments; absent: no
  argument). The running engine already has exactly that budget: nothing restarts.
* A later start of the same unit (systemd's restart, a reboot) starts with the pin; where the memory is no longer
  there, vLLM fails to allocate it and says so instead of serving a smaller pool.
* Any change to the unit (model version, environment, flags, the profile) drops the pin before the restart, so the
  new configuration is measured again and pinned again. An explicit gpubox_kv_cache_memory_bytes wins and drops it.

vLLM 0.32's own startup plan (``VLLM_ENABLE_STARTUP_PLAN``, vllm/v1/worker/startup_plan.py) persists the same
figure but re-profiles when the card has less free memory than when it was recorded: the silent shrink this avoids.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import desired_state_schema, vllm_startup

ENV_VAR = "GPUBOX_KV_CACHE_PIN"
VARIABLE = "gpubox_kv_cache_memory_bytes"
_GIB = 1024**3
_SHA = re.compile(r"^[0-9a-f]{40,64}$")


def _flag() -> desired_state_schema.Flag:
    row = next(row for row in desired_state_schema.ROWS if row.name == VARIABLE)
    if row.flag is None:
        raise ValueError(f"the schema renders no flag for {VARIABLE}")
    return row.flag


def eligible(state: Any) -> bool:
    """Whether the box pins for itself: its stack's vLLM has the flag and the inventory pins nothing."""
    if not isinstance(state, dict):
        return False
    return state.get(VARIABLE) is None and _flag().in_stack(str(state.get("gpubox_stack", "")))


def _valid(fact: Any) -> bool:
    return (
        isinstance(fact, dict)
        and isinstance(fact.get("bytes"), int)
        and not isinstance(fact.get("bytes"), bool)
        and fact["bytes"] > 0
        and isinstance(fact.get("unit_checksum"), str)
        and bool(_SHA.match(fact["unit_checksum"]))
    )


def decide(state: Any, fact: Any, unit_checksum: Any, measured: Any = None, now: str = "") -> dict[str, Any]:
    """What to do with the pin: {"action": "keep" | "drop" | "write" | "none", "fact": the pin to hold, "why"}.

    Before the restart (``measured`` None) a pin of another unit, or of a box that no longer pins for itself, is
    dropped. After the start (``measured``: vllm_startup.measured of the running invocation) a box without a pin
    writes the one vLLM measured."""
    has = fact not in (None, {}, "")
    if not eligible(state):
        if has:
            why = (
                "the inventory pins the budget"
                if isinstance(state, dict) and state.get(VARIABLE)
                else ("the stack's vLLM has no --kv-cache-memory-bytes")
            )
            return {"action": "drop", "fact": None, "why": why}
        return {"action": "none", "fact": None, "why": "not pinned by the box"}
    if has and (not _valid(fact) or fact["unit_checksum"] != unit_checksum):
        return {"action": "drop", "fact": None, "why": "measured for another unit: measured again at the next start"}
    if has:
        return {"action": "keep", "fact": fact, "why": "pinned"}
    if measured is None:
        return {"action": "none", "fact": None, "why": "measured after the start"}
    pin = vllm_startup.pin_bytes(measured)
    if pin is None or not isinstance(unit_checksum, str) or not _SHA.match(unit_checksum):
        return {"action": "none", "fact": None, "why": "vLLM logged no KV cache figure to pin"}
    return {
        "action": "write",
        "fact": {"bytes": pin, "unit_checksum": unit_checksum, "measured_at": now, "gib": round(pin / _GIB, 2)},
        "why": "measured at this start",
    }


def argument(state: Any) -> str:
    """What the unit's ExecStart ends with: the variable systemd expands into the pin's arguments (none while the
    environment file is absent), or "" where the box does not pin for itself."""
    return f"${ENV_VAR}" if eligible(state) else ""


def env_line(fact: dict[str, Any]) -> str:
    """The environment file's line: the argument systemd expands into ExecStart."""
    return f"{ENV_VAR}={_flag().name}={int(fact['bytes'])}"
