"""The driver's archive snapshot (plugins/module_utils/driver_snapshot.py, stacks.py's apt_snapshot, nvidia_driver).

A stack whose exact driver build the archive no longer carries names a dated snapshot of the archive: its value is
checked (format, the service's first day, never in the future), the role decides which snapshot a box uses (the
stack's for the stack's own version, nvidia_driver_apt_snapshot's, or none) with the expression validate.yml runs,
rendered here by Ansible's own templar, and renders an apt source signed-by the archive's keyring and a pin that lets
nothing but the pinned build come from the snapshot. The controls: a box without a snapshot renders the pin file
exactly as before, byte for byte, and gets no source. tests/integration/test_driver_snapshot_apt.py runs the same text
through real apt.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import driver_snapshot as ds
from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks
from harness.ansible_vars import render, render_template

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "nvidia_driver"
UTC = datetime.timezone.utc
NOW = datetime.datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)
PIN_535 = "535.274.02-0ubuntu0.22.04.1"
UBUNTU = {"distribution": "Ubuntu", "distribution_major_version": "22"}
DEBIAN = {"distribution": "Debian", "distribution_major_version": "12"}
# What the pin file held before snapshots existed (git show HEAD~:roles/nvidia_driver/templates/nvidia-driver.pref.j2,
# rendered): a box without a snapshot must get exactly this.
PREF_BEFORE = """# MANAGED
# Exact driver pin: every NVIDIA package that exists at {v} is taken at that
# version and no other (priority > 1000 also allows a deliberate downgrade when the pin moves back).
# A branch wildcard (535*) would not protect against transitional packages that move the branch.
Package: *nvidia* libcuda* libnv*
Pin: version {v}
Pin-Priority: 1001
"""


# --- the snapshot's value --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["20260101T000000Z", "20230301T000000Z", "20261206T120000Z", "", None])
def test_a_snapshot_time_the_service_serves_is_accepted(value: Any) -> None:
    assert ds.problem(value, "nvidia_driver_apt_snapshot", NOW) is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("2026-01-01", "not of the form YYYYMMDDTHHMMSSZ"),
        ("20260101", "not of the form YYYYMMDDTHHMMSSZ"),
        ("20260101T000000", "not of the form YYYYMMDDTHHMMSSZ"),
        ("20260101t000000z", "not of the form YYYYMMDDTHHMMSSZ"),
        (" 20260101T000000Z", "not of the form YYYYMMDDTHHMMSSZ"),
        ("20261301T000000Z", "not a date and time"),
        ("20260230T000000Z", "not a date and time"),
        ("20260101T246000Z", "not a date and time"),
        (20260101, "not a snapshot time (a string)"),
        ("20230228T235959Z", "before 20230301T000000Z"),
        ("20261206T120001Z", "in the future (now 20261206T120000Z)"),
        ("20991231T000000Z", "in the future"),
    ],
)
def test_a_bad_snapshot_is_one_line_naming_the_variable_and_the_fix(value: Any, says: str) -> None:
    line = ds.problem(value, "nvidia_driver_apt_snapshot", NOW)
    assert line is not None and "\n" not in line
    assert line.startswith(f"nvidia_driver_apt_snapshot is {value!r}")
    assert says in line
    assert "Fix: write a UTC time as YYYYMMDDTHHMMSSZ between 20230301T000000Z" in line


def test_control_the_future_refusal_follows_the_clock_not_the_value() -> None:
    value = "20261206T120001Z"
    assert ds.problem(value, "x", NOW) is not None
    assert ds.problem(value, "x", NOW + datetime.timedelta(seconds=1)) is None


def test_every_stacks_snapshot_is_valid_today_and_belongs_to_a_version_and_a_snapshot_service() -> None:
    named = 0
    for stack in stacks.STACKS.values():
        for distribution, snapshot in stack.apt_snapshot.items():
            named += 1
            assert ds.problem(snapshot, f"{stack.name} apt_snapshot[{distribution}]") is None
            assert stack.driver_versions.get(distribution), (
                f"{stack.name}: a snapshot for a distribution it pins nothing for"
            )
            role_vars = yaml.safe_load((ROLE / "vars" / f"{distribution}.yml").read_text())
            assert role_vars["__nvidia_driver_snapshot_service"], f"{distribution} has no snapshot service in the role"
    assert named == 1  # pinned-0.7.3 on Ubuntu 22.04 (its 535 build left jammy-updates)
    assert stacks.STACKS["pinned-0.7.3"].apt_snapshot == {"Ubuntu-22": "20260101T000000Z"}
    assert stacks.info("pinned-0.7.3")["apt_snapshot"] == {"Ubuntu-22": "20260101T000000Z"}
    assert stacks.info("lts-580")["apt_snapshot"] == {}


# --- which snapshot a box uses: validate.yml's own expression, rendered by Ansible ------------------------------------


def _validate_task(name: str) -> dict[str, Any]:
    tasks = yaml.safe_load((ROLE / "tasks" / "validate.yml").read_text())
    return next(task for task in tasks if task["name"] == name)


def _expression(text: str) -> str:
    text = text.strip()
    assert text.startswith("{{") and text.endswith("}}"), text
    return text[2:-2]


def _trusted(value: Any) -> Any:
    from ansible.template import trust_as_template

    if isinstance(value, str) and "{{" in value:
        return trust_as_template(value)
    if isinstance(value, list):
        return [_trusted(item) for item in value]
    return value


def decided(facts: dict[str, str], stack: str = stacks.DEFAULT, **role_vars: Any) -> dict[str, Any]:
    """The snapshot plan of a gpu_2x3090 box on ``facts``' distribution, as validate.yml decides it: its two set_fact
    expressions (the version, then the snapshot) over the role's defaults and the distribution's vars file."""
    version = _validate_task("Decide the driver version, Secure Boot handling and kernel flavour")
    snapshot = _validate_task(
        "Decide the archive snapshot the driver packages come from (the stack's, nvidia_driver_apt_snapshot's or none)"
    )
    distro = f"{facts['distribution']}-{facts['distribution_major_version']}.yml"
    extra: dict[str, Any] = yaml.safe_load((ROLE / "vars" / distro).read_text())
    extra.update(
        {
            "ansible_facts": facts,
            "gpubox_stack": stack,
            "_nvidia_driver_secure_boot_on": False,
            "_nvidia_driver_kernel_flavour": "generic",
            "_nvidia_driver_version": version["ansible.builtin.set_fact"]["_nvidia_driver_version"],
        }
    )
    extra.update(role_vars)
    # as include_vars and set_fact would hand them over: the role's own expressions are templates
    extra = {key: _trusted(value) for key, value in extra.items()}
    expression = _expression(snapshot["ansible.builtin.set_fact"]["_nvidia_driver_snapshot"])
    return render(
        "unit-gpu_2x3090", expression, roles=("gpubox", "nvidia_driver"), extra_vars=extra, groups=("gpu_2x3090",)
    )


def test_the_pinned_stack_on_ubuntu_takes_its_build_from_the_stacks_snapshot() -> None:
    plan = decided(UBUNTU)
    assert plan["problems"] == []
    assert plan["snapshot"] == "20260101T000000Z"
    assert plan["named_by"] == "gpubox_stack pinned-0.7.3's apt_snapshot (plugins/module_utils/stacks.py)"
    assert plan["uri"] == "https://snapshot.ubuntu.com/ubuntu/20260101T000000Z"
    assert plan["origin"] == "snapshot.ubuntu.com"
    # the archive's own keyring checks the snapshot's Release files; only the pocket and component of the driver
    debs = [
        "deb [signed-by=/usr/share/keyrings/ubuntu-archive-keyring.gpg] "
        f"https://snapshot.ubuntu.com/ubuntu/20260101T000000Z {suite} restricted"
        for suite in ("jammy-updates", "jammy-security")
    ]
    assert [line for line in plan["sources"].splitlines() if not line.startswith("#")] == debs
    assert 'Package: *\nPin: origin "snapshot.ubuntu.com"\nPin-Priority: -1\n' in plan["pin"]
    # the look-up asks that source, for the role's versioned packages (DKMS path: Secure Boot off)
    sources = "\n".join(debs)
    assert f"cat > \"$tmp/etc/sources.list\" <<'GPUBOX_SOURCES'\n{sources}\nGPUBOX_SOURCES\n" in plan["lookup"]
    assert (
        plan["lookup"]
        .rstrip()
        .endswith(
            "apt-cache madison nvidia-headless-no-dkms-535-server nvidia-utils-535-server libnvidia-compute-535-server "
            "nvidia-compute-utils-535-server nvidia-dkms-535-server"
        )
    )


@pytest.mark.parametrize(
    ("facts", "stack", "role_vars", "why"),
    [
        (UBUNTU, "lts-580", {}, "lts-580's 580 build is in jammy-updates: its row names no snapshot"),
        (DEBIAN, stacks.DEFAULT, {}, "bookworm carries 535.261.03-1: no snapshot for Debian 12"),
        (UBUNTU, stacks.DEFAULT, {"nvidia_driver_version": "535.309.01-0ubuntu0.22.04.1"}, "another build"),
        (UBUNTU, stacks.DEFAULT, {"nvidia_driver_apt_snapshot": "none"}, "turned off"),
    ],
    ids=["lts-580", "debian-12", "version-override", "none"],
)
def test_control_no_snapshot_where_the_stack_names_none_for_the_version_in_use(
    facts: dict[str, str], stack: str, role_vars: dict[str, Any], why: str
) -> None:
    plan = decided(facts, stack, **role_vars)
    assert (plan["snapshot"], plan["sources"], plan["pin"], plan["lookup"], plan["problems"]) == ("", "", "", "", []), (
        why
    )


def test_the_stacks_own_version_named_explicitly_keeps_its_snapshot() -> None:
    assert decided(UBUNTU, nvidia_driver_version=PIN_535)["snapshot"] == "20260101T000000Z"


def test_nvidia_driver_apt_snapshot_names_another_snapshot_for_any_version() -> None:
    plan = decided(UBUNTU, nvidia_driver_apt_snapshot="20251115T060000Z", nvidia_driver_version="535.261.03-0ubuntu1")
    assert (plan["snapshot"], plan["named_by"], plan["problems"]) == ("20251115T060000Z", ds.KNOB, [])
    assert "https://snapshot.ubuntu.com/ubuntu/20251115T060000Z jammy-updates restricted" in plan["sources"]
    assert "the driver packages at 535.261.03-0ubuntu1 come from here" in plan["sources"]


@pytest.mark.parametrize(
    ("facts", "value", "says"),
    [
        (UBUNTU, "2026-01-01", "nvidia_driver_apt_snapshot is '2026-01-01': not of the form YYYYMMDDTHHMMSSZ"),
        (UBUNTU, "20991231T000000Z", "nvidia_driver_apt_snapshot is '20991231T000000Z', in the future"),
        (DEBIAN, "20260101T000000Z", "Debian 12 has no archive snapshot service the driver role knows"),
    ],
    ids=["format", "future", "debian-12"],
)
def test_a_bad_snapshot_is_a_problem_before_any_change_and_renders_nothing(
    facts: dict[str, str], value: str, says: str
) -> None:
    plan = decided(facts, nvidia_driver_apt_snapshot=value)
    assert len(plan["problems"]) == 1 and says in plan["problems"][0], plan["problems"]
    assert "Fix:" in plan["problems"][0]
    assert (plan["sources"], plan["pin"], plan["lookup"]) == ("", "", "")


def test_a_bad_snapshot_in_a_stack_row_is_named_as_the_stacks() -> None:
    stack = {"name": "pinned-0.7.3", "driver_versions": {"Ubuntu-22": PIN_535}, "apt_snapshot": {"Ubuntu-22": "2026"}}
    plan = ds.decide("", stack, "Ubuntu-22", PIN_535, "https://snapshot.ubuntu.com/ubuntu/", [], [], "k", [], NOW)
    assert plan["problems"] == [
        "gpubox_stack pinned-0.7.3's apt_snapshot (plugins/module_utils/stacks.py) is '2026': not of the form "
        "YYYYMMDDTHHMMSSZ. Fix: write a UTC time as YYYYMMDDTHHMMSSZ between 20230301T000000Z (the first the "
        "snapshot service serves) and now, e.g. 20260101T000000Z."
    ]


# --- the pin file: the role's template, rendered as Ansible's template module renders it -----------------------------


def render_pref(version: str, snapshot: dict[str, Any]) -> str:
    variables = {
        "ansible_managed": "MANAGED",
        "_nvidia_driver_version": version,
        "__nvidia_driver_pin_globs": "*nvidia* libcuda* libnv*",
        "_nvidia_driver_snapshot": snapshot,
    }
    return render_template(ROLE / "templates" / "nvidia-driver.pref.j2", variables)


def test_control_without_a_snapshot_the_pin_file_is_what_it_was_byte_for_byte() -> None:
    for plan in (decided(UBUNTU, "lts-580"), decided(DEBIAN)):
        assert render_pref(PIN_535, plan) == PREF_BEFORE.format(v=PIN_535)


def test_with_the_snapshot_the_pin_file_adds_one_stanza_that_keeps_everything_else_of_its_host_away() -> None:
    text = render_pref(PIN_535, decided(UBUNTU))
    before = PREF_BEFORE.format(v=PIN_535)
    assert text.startswith(before + "\n")
    stanzas = [block for block in text.split("\n\n")]
    assert stanzas[-1] == (
        "# Nothing but the build above comes from snapshot.ubuntu.com (the archive snapshot 20260101T000000Z).\n"
        'Package: *\nPin: origin "snapshot.ubuntu.com"\nPin-Priority: -1\n'
    )


# --- other sources on the snapshot's host ----------------------------------------------------------------------------

# apt-cache policy's package-file lines (their form as apt 2.x prints them; the integration test reads real ones).
POLICY = """Package files:
 100 /var/lib/dpkg/status
     release a=now
 500 https://snapshot.ubuntu.com/ubuntu/20250530T223000Z jammy-updates/main amd64 Packages
     release v=22.04,o=Ubuntu,a=jammy-updates,n=jammy,l=Ubuntu,c=main,b=amd64
     origin snapshot.ubuntu.com
  -1 https://snapshot.ubuntu.com/ubuntu/20260101T000000Z jammy-updates/restricted amd64 Packages
     origin snapshot.ubuntu.com
 500 http://archive.ubuntu.com/ubuntu jammy-updates/restricted amd64 Packages
     origin archive.ubuntu.com
Pinned packages:
"""


def test_another_source_on_the_snapshot_host_is_found_and_the_snapshots_own_is_not() -> None:
    found = ds.foreign_sources(POLICY, "snapshot.ubuntu.com", "https://snapshot.ubuntu.com/ubuntu/20260101T000000Z")
    assert found == ["https://snapshot.ubuntu.com/ubuntu/20250530T223000Z jammy-updates/main"]


def test_control_a_box_whose_only_source_there_is_the_snapshot_has_none() -> None:
    ours = "\n".join(line for line in POLICY.splitlines() if "20250530T223000Z" not in line)
    assert ds.foreign_sources(ours, "snapshot.ubuntu.com", "https://snapshot.ubuntu.com/ubuntu/20260101T000000Z") == []
