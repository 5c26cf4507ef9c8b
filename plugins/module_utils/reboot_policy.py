"""The reboot gate's one decision (roles/gpubox/tasks/reboot_gate.yml): reboot now, or why not.

Pure function, no Ansible imports: the filter gpubox.gpubox.reboot_decision wraps it and
tests/unit/test_reboot_policy.py tests it. The record it returns is written as the local fact
gpubox_reboot (/etc/ansible/facts.d/gpubox_reboot.fact), so a later run knows what is still pending.

The policy (gpubox_reboot_policy):
- ``idle`` (the default): a converge reboots for gpubox's own host-layer reasons (this run's, or an
  earlier run's still pending in this boot) on a box that is not serving (vllm.service not active).
  A serving box, and a reboot only the package manager asks for (/var/run/reboot-required, e.g. after
  unattended-upgrades), are not rebooted: the decision is ``deferred`` and says by what. The reasons
  stay pending; playbooks/rebuild.yml drains the box at the gateway and runs its converge with
  ``always``, so the reboot happens when no request can be lost.
- ``always``: any reason reboots now (the inventory says so, or the box is drained).
Switches that say no (gpubox_reboot_skip, a container) outrank both: the decision is ``skipped``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

POLICIES = ("idle", "always")
PACKAGE_MANAGER_REASON = "/var/run/reboot-required exists"


class RebootPolicyError(ValueError):
    """An input the gate cannot decide on; the message names the variable."""


def _reasons(name: str, value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise RebootPolicyError(f"{name} must be a list of reasons, got {str(value)[:60]!r}")
    return [str(reason) for reason in value]


def reboot_decision(
    boot_id: str,
    own_reasons: Any = (),
    pending_reasons: Any = (),
    package_manager: bool = False,
    skip_causes: Any = (),
    serving: bool = False,
    policy: str = "idle",
) -> dict[str, Any]:
    """The record of one decision: {boot_id, reasons, decision, skip_causes, skipped_by, deferred_by}.

    ``own_reasons``: this run's (gpubox_reboot_reasons); ``pending_reasons``: the record's of this boot
    (the package manager's line in it is dropped: the file is looked at again); ``package_manager``:
    /var/run/reboot-required exists; ``skip_causes``: the switches saying no, in the order they outrank
    each other; ``serving``: vllm.service is active. decision: none | skipped | deferred | rebooting.
    """
    if policy not in POLICIES:
        raise RebootPolicyError(f"gpubox_reboot_policy must be one of {', '.join(POLICIES)}, got {str(policy)[:40]!r}")
    own = set(_reasons("gpubox_reboot_reasons", own_reasons))
    own |= set(_reasons("the pending reasons", pending_reasons)) - {PACKAGE_MANAGER_REASON}
    reasons = sorted(own | ({PACKAGE_MANAGER_REASON} if package_manager else set()))
    causes = _reasons("the skip causes", skip_causes)
    deferred_by = None
    if not reasons:
        decision = "none"
    elif causes:
        decision = "skipped"
    elif policy == "always":
        decision = "rebooting"
    elif serving:
        decision, deferred_by = "deferred", "serving"
    elif not own:
        decision, deferred_by = "deferred", "package_manager"
    else:
        decision = "rebooting"
    return {
        "boot_id": str(boot_id).strip(),
        "reasons": reasons,
        "decision": decision,
        "skip_causes": causes,
        "skipped_by": causes[0] if decision == "skipped" else None,
        "deferred_by": deferred_by,
        "policy": policy,
    }


def reboot_message(record: dict[str, Any]) -> str:
    """One line for the run's output: the decision, its reasons, and what carries a deferred reboot out."""
    decision = record.get("decision")
    if decision == "none":
        return "No reboot needed."
    head = f"Reboot needed ({'; '.join(record.get('reasons') or [])}); "
    if decision == "rebooting":
        return head + "rebooting now."
    if decision == "skipped":
        return head + (
            "skipped: gpubox_reboot_skip is true." if record.get("skipped_by") == "gpubox_reboot_skip"
            else "skipped: this box is a container."
        )  # fmt: skip
    why = (
        "this box is serving (vllm.service is active)" if record.get("deferred_by") == "serving"
        else "only the package manager asks for it"
    )  # fmt: skip
    return head + (
        f"deferred: {why}. It stays pending; playbooks/rebuild.yml reboots the box after draining it at the gateway "
        "(or set gpubox_reboot_policy: always to reboot in a plain converge)."
    )
