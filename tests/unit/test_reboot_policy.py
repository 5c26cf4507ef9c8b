"""plugins/module_utils/reboot_policy.py: the reboot gate's decision, and the gate's use of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils.reboot_policy import (
    PACKAGE_MANAGER_REASON,
    RebootPolicyError,
    reboot_decision,
    reboot_message,
)

ROOT = Path(__file__).resolve().parents[2]
DRIVER = "NVIDIA driver or nouveau blacklist changed"


@pytest.mark.parametrize(
    ("inputs", "decision", "deferred_by"),
    [
        ({}, "none", None),
        ({"serving": True}, "none", None),
        # gpubox's own reason on a box that does not serve yet: the first converge of a bare box
        ({"own_reasons": [DRIVER]}, "rebooting", None),
        ({"pending_reasons": [DRIVER]}, "rebooting", None),
        # a serving box never reboots under a plain converge
        ({"own_reasons": [DRIVER], "serving": True}, "deferred", "serving"),
        ({"package_manager": True, "serving": True}, "deferred", "serving"),
        # unattended-upgrades alone does not reboot a box, serving or not
        ({"package_manager": True}, "deferred", "package_manager"),
        # ... and a pending record of it is not gpubox's own reason
        ({"pending_reasons": [PACKAGE_MANAGER_REASON]}, "none", None),
        ({"pending_reasons": [PACKAGE_MANAGER_REASON], "package_manager": True}, "deferred", "package_manager"),
        # always: the inventory says so, or rebuild.yml's converge of a drained box
        ({"own_reasons": [DRIVER], "serving": True, "policy": "always"}, "rebooting", None),
        ({"package_manager": True, "serving": True, "policy": "always"}, "rebooting", None),
        # a switch that says no outranks every policy
        ({"own_reasons": [DRIVER], "skip_causes": ["container"], "policy": "always"}, "skipped", None),
        (
            {"package_manager": True, "serving": True, "skip_causes": ["gpubox_reboot_skip", "container"]},
            "skipped",
            None,
        ),
    ],
)
def test_the_decision(inputs: dict, decision: str, deferred_by: str | None) -> None:
    record = reboot_decision(" boot-1\n", **inputs)
    assert record["decision"] == decision, record
    assert record["deferred_by"] == deferred_by
    assert record["boot_id"] == "boot-1"
    assert record["skipped_by"] == ((inputs.get("skip_causes") or [None])[0] if decision == "skipped" else None)
    assert record["policy"] == inputs.get("policy", "idle")


def test_reasons_are_merged_sorted_and_unique() -> None:
    record = reboot_decision("b", own_reasons=["z", DRIVER], pending_reasons=[DRIVER, "a"], package_manager=True)
    assert record["reasons"] == sorted({"z", DRIVER, "a", PACKAGE_MANAGER_REASON})


def test_a_record_without_reasons_is_the_same_whoever_writes_it() -> None:
    # reboot_record.yml (after the gate's own reboot) and the gate of the next run write the same file: changed=0.
    assert reboot_decision("b", skip_causes=["container"]) == reboot_decision(
        "b", skip_causes=["container"], serving=True, pending_reasons=[PACKAGE_MANAGER_REASON]
    )


@pytest.mark.parametrize(
    ("inputs", "needle"),
    [
        ({"policy": "sometimes"}, "gpubox_reboot_policy must be one of idle, always, got 'sometimes'"),
        ({"own_reasons": "driver"}, "gpubox_reboot_reasons must be a list of reasons"),
    ],
)
def test_bad_input_is_named(inputs: dict, needle: str) -> None:
    with pytest.raises(RebootPolicyError, match=needle):
        reboot_decision("b", **inputs)


@pytest.mark.parametrize(
    ("inputs", "needle"),
    [
        ({}, "No reboot needed."),
        ({"own_reasons": [DRIVER]}, "rebooting now."),
        ({"own_reasons": [DRIVER], "skip_causes": ["gpubox_reboot_skip"]}, "skipped: gpubox_reboot_skip is true."),
        ({"own_reasons": [DRIVER], "skip_causes": ["container"]}, "skipped: this box is a container."),
        ({"own_reasons": [DRIVER], "serving": True}, "deferred: this box is serving (vllm.service is active)."),
        ({"package_manager": True}, "deferred: only the package manager asks for it."),
    ],
)
def test_the_message_says_the_decision_and_what_carries_a_deferred_one_out(inputs: dict, needle: str) -> None:
    message = reboot_message(reboot_decision("b", **inputs))
    assert needle in message
    if "deferred" in needle:
        assert "playbooks/rebuild.yml" in message and "gpubox_reboot_policy: always" in message
        assert (ROOT / "playbooks" / "rebuild.yml").is_file()


def test_rebuild_converges_a_drained_box_with_policy_always() -> None:
    text = (ROOT / "playbooks" / "tasks" / "rebuild_turn.yml").read_text()  # the turn rebuild.yml includes
    assert "{'gpubox_reboot_policy': 'always'} | combine(gpubox_rebuild_extra_vars | default({}))" in text


def test_the_gate_and_the_record_decide_through_the_filter() -> None:
    gate = (ROOT / "roles" / "gpubox" / "tasks" / "reboot_gate.yml").read_text()
    record = (ROOT / "roles" / "gpubox" / "tasks" / "reboot_record.yml").read_text()
    assert gate.count("gpubox.gpubox.reboot_decision(") == 1 and record.count("gpubox.gpubox.reboot_decision(") == 1
    assert "policy=gpubox_reboot_policy" in gate and "policy=gpubox_reboot_policy" in record
