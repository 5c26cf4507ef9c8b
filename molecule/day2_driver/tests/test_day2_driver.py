"""Verify day two of the host layer: what day2.py recorded at each step, and the box at the end.

Each step is a real ansible-playbook run (molecule/day2_driver/day2.py); the reboots are SIMULATED
(simulate_reboot.yml). Every assertion reads what the roles produced on the box or what the run
reported; a pin change that does nothing, a reboot reason on every run, a decision on a cached fact or
a failing dry run each fails one of them.
"""

import json

import pytest

PIN_A = "535.261.03-1"
PIN_B = "535.309.01-0+deb12u1"
NAMED = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1", "firmware-nvidia-gsp"]


@pytest.fixture(scope="module")
def day2(host):
    return json.loads(host.file("/var/lib/gpubox-sim/day2-driver.json").content_string)


def _ok(step):
    assert step["rc"] == 0, step["output_tail"]
    assert step["recap"] is not None and step["recap"]["failed"] == 0, step["output_tail"]


def _at(step, pin):
    """Every installed package of the driver build is at ``pin``, held, pinned, blacklisted."""
    box = step["box"]
    pkgs = box["driver_packages"]
    for name in NAMED:
        assert any(p.split(":")[0] == name for p in pkgs), (name, pkgs)
    assert len(pkgs) >= len(NAMED), pkgs
    assert set(pkgs.values()) == {pin}, pkgs  # every package of the source, not only the named ones
    for name in pkgs:
        assert name in box["held"] or name.split(":")[0] in box["held"], (name, box["held"])
    assert f"Pin: version {pin}" in box["pref"]
    for prefix in ("nvidia-", "libnvidia-", "libcuda"):
        assert f'"{prefix}"' in box["uu_blacklist"], box["uu_blacklist"]


def _settled(step, pin):
    """A run after the (simulated) reboot into ``pin``: nothing changed, no reboot reason."""
    _ok(step)
    assert step["recap"]["changed"] == 0, step["output_tail"]
    gate = step["box"]["gate"]
    assert gate["reasons"] == [] and gate["decision"] == "none", gate
    assert step["box"]["loaded_module"] == pin.split("-")[0]
    _at(step, pin)


def _driver_command(step):
    """The run was docs/day-two.md's driver move: --tags driver, nothing more."""
    cmd = step["cmd"]
    return "--tags" in cmd and cmd[cmd.index("--tags") + 1] == "driver"


def test_the_last_run_after_the_moves_is_the_whole_host_layer_and_changes_nothing(day2):
    # the moves ran only the driver's tag; this run proves no other role of the host layer was left work
    step = day2["steps"]["after_reboot_back_a"]
    assert "--tags" not in step["cmd"], step["cmd"]
    _settled(step, PIN_A)


def _driver_reasons(gate, old, new):
    return [r for r in gate["reasons"] if new in r and old.split("-")[0] in r]


def test_dry_run_on_the_converged_box_changes_nothing(day2):
    step = day2["steps"]["check_converged"]
    _ok(step)
    assert step["recap"]["changed"] == 0, step["output_tail"]
    assert "--check" in step["cmd"] and "--diff" in step["cmd"]


def test_pin_the_archive_lacks_is_refused_by_preflight_before_any_change(day2):
    step = day2["steps"]["bad_pin"]
    assert step["rc"] != 0
    assert step["recap"]["changed"] == 0
    out = step["output_tail"]
    assert f"nvidia_driver_version={day2['bad_pin']} is not offered" in out, out
    assert PIN_A in out and PIN_B in out, out  # the versions the archive offers are listed
    assert "gpubox preflight refused this box" in out
    _at(step, PIN_A)


def test_run_after_reboot_into_first_pin_is_settled(day2):
    # the second run of the whole host layer on the box (the scenario's idempotence check)
    step = day2["steps"]["after_reboot_a"]
    assert "--tags" not in step["cmd"], step["cmd"]
    _settled(step, PIN_A)


def test_decision_on_live_loaded_module_not_the_fact_cache(day2):
    # the fact cache (ansible.cfg) described the box of the run before: its reboot record said
    # nothing is pending; then, behind Ansible's back, module 535.309.01 was loaded
    cached = day2["steps"]["stale_cache_before"]
    assert cached["cached_kernel"], cached  # the cache was there to be (mis)used
    assert cached["cached_reboot_record"]["decision"] == "none", cached
    step = day2["steps"]["stale_facts"]
    _ok(step)
    gate = step["box"]["gate"]
    assert _driver_reasons(gate, PIN_B, PIN_A), gate  # installed A, loaded 535.309.01: decided live
    assert gate["decision"] == "skipped", gate


@pytest.mark.parametrize(
    ("move", "settle", "old", "new"),
    [
        ("upgrade", "after_reboot_b", PIN_A, PIN_B),
        ("downgrade", "after_reboot_back_a", PIN_B, PIN_A),
    ],
)
def test_pin_change_moves_every_package_and_asks_one_reboot(day2, move, settle, old, new):
    step = day2["steps"][move]
    _ok(step)
    assert step["recap"]["changed"] > 0
    assert _driver_command(step), step["cmd"]  # the command docs/day-two.md gives for a driver move
    _at(step, new)
    gate = step["box"]["gate"]
    # one decision (the container skips it: gpubox_reboot_skip first), one reason naming both builds
    assert gate["decision"] == "skipped" and gate["skipped_by"] == "gpubox_reboot_skip", gate
    assert len(_driver_reasons(gate, old, new)) == 1, gate
    # after the simulated reboot into the new build: changed=0, no reason
    _settled(day2["steps"][settle], new)


def test_box_ends_on_the_first_pin_held(host):
    for name in NAMED:
        assert host.package(name).version == PIN_A, name
    held = host.check_output("apt-mark showhold").split()
    for name in NAMED:
        assert name in held or f"{name}:amd64" in held, name


# The branch move (issue 33 item 6): Debian 12's real 535 packages (source nvidia-graphics-drivers) and its real
# tesla-470 ones (source nvidia-graphics-drivers-tesla-470, names that carry the branch).
PIN_470 = "470.256.02-1~deb12u1"
SRC_535 = "nvidia-graphics-drivers"
SRC_470 = "nvidia-graphics-drivers-tesla-470"
NAMED_470 = [
    "nvidia-tesla-470-kernel-dkms",
    "nvidia-tesla-470-smi",
    "libnvidia-tesla-470-cuda1",
    "libnvidia-tesla-470-ml1",
]


def _on_470(step):
    """The tesla-470 build installed and held, every package at PIN_470; not one 535 package in any state."""
    box = step["box"]
    sources = box["driver_sources"]
    tesla = sources.get(SRC_470, {})
    for name in NAMED_470:
        assert any(p.split(":")[0] == name for p in tesla), (name, tesla)
    for name, (version, state) in tesla.items():
        assert (version, state) == (PIN_470, "hi"), (name, version, state)  # installed and held
    assert SRC_535 not in sources, sources[SRC_535]  # not even "rc" (conffiles of a removed package)
    assert box["driver_packages"] == {}, box["driver_packages"]
    assert f"Pin: version {PIN_470}" in box["pref"]
    assert box["nvidia_alternative"] == "/usr/lib/nvidia/tesla-470", box["nvidia_alternative"]


def _no_470_left(step):
    assert SRC_470 not in step["box"]["driver_sources"], step["box"]["driver_sources"][SRC_470]


def test_a_branch_the_archive_lacks_is_refused_by_preflight_before_any_change(day2):
    step = day2["steps"]["refuse_branch"]
    assert step["rc"] != 0
    assert step["recap"]["changed"] == 0
    out = step["output_tail"]
    branch = day2["bad_branch"][0]
    assert f"nvidia_driver_branch='{branch}' is not a branch Debian 12's archive carries" in out, out
    assert "Fix: set nvidia_driver_branch to one of 470, 535" in out, out
    assert "gpubox preflight refused this box" in out
    _at(step, PIN_A)
    _no_470_left(step)


def test_branch_move_to_470_purges_535_in_the_same_transaction_and_asks_one_reboot(day2):
    step = day2["steps"]["branch_470"]
    _ok(step)
    assert step["recap"]["changed"] > 0
    assert _driver_command(step), step["cmd"]
    assert "nvidia_driver_branch=470" in step["cmd"], step["cmd"]
    _on_470(step)
    gate = step["box"]["gate"]
    assert gate["decision"] == "skipped" and gate["skipped_by"] == "gpubox_reboot_skip", gate
    assert len(_driver_reasons(gate, PIN_A, PIN_470)) == 1, gate


def test_after_the_reboot_into_470_nothing_changes(day2):
    step = day2["steps"]["after_reboot_470"]
    _ok(step)
    assert step["recap"]["changed"] == 0, step["output_tail"]
    gate = step["box"]["gate"]
    assert gate["reasons"] == [] and gate["decision"] == "none", gate
    assert step["box"]["loaded_module"] == PIN_470.split("-")[0]  # the simulated reboot loaded the 470 build
    _on_470(step)


def test_branch_move_back_to_535_purges_470_and_asks_one_reboot(day2):
    step = day2["steps"]["branch_back_535"]
    _ok(step)
    assert step["recap"]["changed"] > 0
    assert _driver_command(step), step["cmd"]
    _at(step, PIN_A)
    _no_470_left(step)  # not even "rc"
    # the purge of tesla-470's alternative left Debian's 535 one in place (research run: /usr/lib/nvidia/current)
    assert step["box"]["nvidia_alternative"] == "/usr/lib/nvidia/current", step["box"]["nvidia_alternative"]
    rows_535 = step["box"]["driver_sources"][SRC_535]
    assert all(row == [PIN_A, "hi"] for row in rows_535.values()), rows_535  # installed and held, none "rc"
    gate = step["box"]["gate"]
    assert gate["decision"] == "skipped", gate
    assert len(_driver_reasons(gate, PIN_470, PIN_A)) == 1, gate


def test_after_the_reboot_back_into_535_the_box_is_settled(day2):
    step = day2["steps"]["settled"]
    _settled(step, PIN_A)
    _no_470_left(step)
