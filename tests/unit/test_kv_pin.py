"""The box pins the KV cache budget vLLM measured at a unit's first start for its later starts (kv_pin.py).

The figures are vLLM 0.32.0's own start-up lines (vllm/v1/worker/gpu_worker.py: "Available KV cache memory" and the
"Replace gpu_memory_utilization config with `--kv-cache-memory=N`" suggestion) and the CPU engine's.
"""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import kv_pin, vllm_startup
from harness import ansible_vars

UNIT = "a" * 40
OTHER_UNIT = "b" * 40
LTS = {"gpubox_stack": "lts-580", "gpubox_kv_cache_memory_bytes": None}
GPU_LOG = """Model loading took 14.2474 GiB memory and 12.1 seconds
Available KV cache memory: 6.01 GiB
Free memory on device (23.20/23.57 GiB) on startup. Desired GPU memory utilization is (0.92, 21.68 GiB). Actual \
usage is 14.40 GiB for consumed memory (weights + non-torch), 1.12 GiB for peak activation, and 0.00 GiB for \
CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=6297440256` (5.86 GiB) to fit into \
requested memory, or `--kv-cache-memory=7100000000` (6.61 GiB) to fully utilize gpu memory. Current kv cache memory \
in use is 6.01 GiB.
GPU KV cache size: 569,878 tokens
"""
CPU_LOG = "Explicitly set (1.0/23.54) GiB for KV cache on node 0.\nCPU KV cache size: 524,288 tokens\n"


def test_the_pin_is_vllms_own_figure_to_fit_the_requested_memory_else_its_available_cache() -> None:
    gpu = vllm_startup.measured(GPU_LOG)
    assert gpu["kv_cache_memory_suggested"] == 6297440256
    assert vllm_startup.pin_bytes(gpu) == 6297440256  # exact, vLLM's margin kept
    # control: without the suggestion (an older release, the CPU engine) the logged budget in GiB
    assert vllm_startup.pin_bytes({"kv_cache_gib": 6.01}) == int(6.01 * 2**30)
    assert vllm_startup.pin_bytes(vllm_startup.measured(CPU_LOG)) == 2**30
    assert vllm_startup.pin_bytes({}) is None and vllm_startup.pin_bytes({"kv_cache_gib": 0.0}) is None


def test_a_start_that_measured_writes_the_pin_and_a_later_run_keeps_it() -> None:
    measured = vllm_startup.measured(GPU_LOG)
    before = kv_pin.decide(LTS, None, UNIT)
    assert before["action"] == "none"
    after = kv_pin.decide(LTS, before["fact"], UNIT, measured, "2026-12-07T01:00:00Z")
    assert after["action"] == "write"
    fact = after["fact"]
    assert fact == {"bytes": 6297440256, "unit_checksum": UNIT, "measured_at": "2026-12-07T01:00:00Z", "gib": 5.86}
    assert kv_pin.env_line(fact) == "GPUBOX_KV_CACHE_PIN=" + f"--kv-cache-memory-bytes={6297440256}"
    # the next run of the same unit keeps it, before the restart and after (never re-measured from a pinned start)
    assert kv_pin.decide(LTS, fact, UNIT) == {"action": "keep", "fact": fact, "why": "pinned"}
    assert kv_pin.decide(LTS, fact, UNIT, vllm_startup.measured(CPU_LOG), "later")["action"] == "keep"


@pytest.mark.parametrize(
    ("state", "fact_unit", "why"),
    [
        (LTS, OTHER_UNIT, "another unit"),  # the model, environment or flags changed: measured again
        ({**LTS, "gpubox_kv_cache_memory_bytes": 13900000000}, UNIT, "the inventory pins"),
        ({"gpubox_stack": "pinned-0.7.3", "gpubox_kv_cache_memory_bytes": None}, UNIT, "no --kv-cache-memory-bytes"),
    ],
)
def test_a_pin_that_no_longer_applies_is_dropped_before_the_restart(state, fact_unit, why) -> None:
    fact = {"bytes": 2**30, "unit_checksum": fact_unit, "measured_at": "x", "gib": 1.0}
    decision = kv_pin.decide(state, fact, UNIT)
    assert decision["action"] == "drop" and decision["fact"] is None and why in decision["why"]
    # control: the same pin of this very unit on the box that pins for itself is kept
    assert kv_pin.decide(LTS, {**fact, "unit_checksum": UNIT}, UNIT)["action"] == "keep"


@pytest.mark.parametrize(
    "fact", [{"bytes": "1"}, {"bytes": 0, "unit_checksum": UNIT}, {"bytes": 5, "unit_checksum": "x"}]
)
def test_a_damaged_pin_fact_is_dropped_not_trusted(fact) -> None:
    assert kv_pin.decide(LTS, fact, UNIT)["action"] == "drop"


def test_no_figure_in_the_log_pins_nothing() -> None:
    assert kv_pin.decide(LTS, None, UNIT, {}, "now")["action"] == "none"
    assert kv_pin.decide(LTS, None, None, vllm_startup.measured(GPU_LOG), "now")["action"] == "none"


def test_the_report_line_says_the_box_pinned_it_or_what_to_pin() -> None:
    measured = vllm_startup.measured(GPU_LOG)
    fact = kv_pin.decide(LTS, None, UNIT, measured, "2026-12-07T01:00:00Z")["fact"]
    assert "pinned by the box for later starts: 6297440256 bytes" in vllm_startup.compared({}, measured, fact)
    assert "gpubox_kv_cache_memory_bytes: 6297440256" in vllm_startup.compared({}, measured)  # control: no pin


@pytest.mark.parametrize(("stack", "pins"), [("lts-580", True), ("pinned-0.7.3", False)])
def test_the_unit_reads_the_pin_only_on_a_stack_whose_vllm_has_the_flag(stack: str, pins: bool) -> None:
    argument = ansible_vars.render(
        f"unit-pin-{stack}",
        "__vllm_service_kv_pin_argument",
        roles=("gpubox", "vllm_service"),
        groups=("gpu_2x3090",),
        extra_vars={"gpubox_stack": stack},
    )
    assert argument == ("$GPUBOX_KV_CACHE_PIN" if pins else "")
    # an explicit pin in the inventory renders the flag itself; the box then pins nothing
    assert kv_pin.argument({"gpubox_stack": stack, "gpubox_kv_cache_memory_bytes": 2**33}) == ""
