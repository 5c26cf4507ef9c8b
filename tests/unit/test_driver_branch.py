"""plugins/module_utils/driver_branch.py: the branch move plan from what dpkg lists.

The Debian package sets are what a Debian 12 container really held (the research run of issue 33 item 6:
bookworm's 535.261.03-1 installed as roles/nvidia_driver installs it, then trixie's 550.163.01-2).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import dpkg
from ansible_collections.gpubox.gpubox.plugins.module_utils import driver_branch as db

REPO = Path(__file__).resolve().parents[2]

U535 = "535.274.02-0ubuntu0.22.04.1"
U580 = "580.178.04-0ubuntu0.22.04.1"
D535 = "535.261.03-1"
D550 = "550.163.01-2"
D470 = "470.256.02-1~deb12u1"

# Ubuntu 22.04 with the role's 535-server DKMS set and what it pulls in.
UBUNTU_535 = {
    "nvidia-headless-no-dkms-535-server": U535,
    "nvidia-utils-535-server": U535,
    "libnvidia-compute-535-server:amd64": U535,
    "nvidia-compute-utils-535-server": U535,
    "nvidia-dkms-535-server": U535,
    "nvidia-kernel-common-535-server": U535,
    "nvidia-kernel-source-535-server": U535,
    "libnvidia-cfg1-535-server:amd64": U535,
    "nvidia-firmware-535-server-535.274.02": U535,
    "linux-headers-generic": "5.15.0.101.98",
    "linux-signatures-nvidia-5.15.0-101-generic": "5.15.0-101.111",
    "libc6:amd64": "2.35-0ubuntu3.8",
}
# Debian 12: the packages dpkg listed after the role's install of 535.261.03-1 (research run).
DEBIAN_535 = {
    "firmware-nvidia-gsp": D535,
    "glx-alternative-nvidia": "1.2.2",
    "libcuda1:amd64": D535,
    "libnvidia-cfg1:amd64": D535,
    "libnvidia-ml1:amd64": D535,
    "libnvidia-pkcs11-openssl3:amd64": D535,
    "libnvidia-ptxjitcompiler1:amd64": D535,
    "nvidia-alternative": D535,
    "nvidia-installer-cleanup": "20220217+3~deb12u1",
    "nvidia-kernel-common": "20220217+3~deb12u1",
    "nvidia-kernel-dkms": D535,
    "nvidia-kernel-support": D535,
    "nvidia-legacy-check": D535,
    "nvidia-modprobe": "535.309.01-0+deb12u1",
    "nvidia-persistenced": "535.171.04-1~deb12u1",
    "nvidia-smi": D535,
    "nvidia-support": "20220217+3~deb12u1",
    "libc6:amd64": "2.36-9+deb12u14",
}
# Debian 12 after the research run's move to bookworm's tesla-470 branch (dpkg "ii" rows).
DEBIAN_470 = {
    "glx-alternative-nvidia": "1.2.2",
    "libnvidia-tesla-470-cfg1:amd64": D470,
    "libnvidia-tesla-470-cuda1:amd64": D470,
    "libnvidia-tesla-470-ml1:amd64": D470,
    "libnvidia-tesla-470-ptxjitcompiler1:amd64": D470,
    "nvidia-installer-cleanup": "20220217+3~deb12u1",
    "nvidia-kernel-common": "20220217+3~deb12u1",
    "nvidia-modprobe": "535.309.01-0+deb12u1",
    "nvidia-persistenced": "535.171.04-1~deb12u1",
    "nvidia-support": "20220217+3~deb12u1",
    "nvidia-tesla-470-alternative": D470,
    "nvidia-tesla-470-kernel-dkms": D470,
    "nvidia-tesla-470-kernel-support": D470,
    "nvidia-tesla-470-smi": D470,
}
DEBIAN_SAME_BUILD = [
    "firmware-nvidia-gsp",
    "libcuda1",
    "libnvidia-cfg1",
    "libnvidia-ml1",
    "libnvidia-pkcs11-openssl3",
    "libnvidia-ptxjitcompiler1",
    "nvidia-alternative",
    "nvidia-kernel-dkms",
    "nvidia-kernel-support",
    "nvidia-legacy-check",
    "nvidia-smi",
]


def test_ubuntu_535_to_580_purges_the_old_branch_and_installs_the_new_names():
    plan = db.plan(UBUNTU_535, "Ubuntu", "580", U580, kernel_flavour="generic")
    assert plan.branch_move and plan.from_branch == "535" and plan.from_version == U535
    assert plan.purge == tuple(sorted(db.package_name(n) for n in UBUNTU_535 if "-535-server" in n))
    assert "linux-signatures-nvidia-5.15.0-101-generic" not in plan.purge  # no branch in its name
    assert plan.install == (
        f"nvidia-headless-no-dkms-580-server={U580}",
        f"nvidia-utils-580-server={U580}",
        f"libnvidia-compute-580-server={U580}",
        f"nvidia-compute-utils-580-server={U580}",
        f"nvidia-dkms-580-server={U580}",
        "linux-headers-generic",
    )
    assert "nvidia-utils-580-server" in plan.hold and not any("-535-" in n for n in plan.hold)
    assert "linux-headers-generic" not in plan.hold  # not an NVIDIA package: the role does not hold it
    assert plan.reboot


def test_ubuntu_signed_modules_move_back_to_535():
    box = {
        f"{stem}-580-server": U580
        for stem in ("nvidia-headless-no-dkms", "nvidia-utils", "libnvidia-compute", "nvidia-compute-utils")
    }
    box |= {
        "linux-modules-nvidia-580-server-generic": "5.15.0-101.111",
        "linux-modules-nvidia-580-server-5.15.0-101-generic": "5.15.0-101.111",
        "linux-objects-nvidia-580-server-5.15.0-101-generic": "5.15.0-101.111",
    }
    plan = db.plan(box, "Ubuntu", "535", U535, signed_modules=True, kernel_flavour="generic")
    assert set(plan.purge) == set(box)
    assert plan.install[-1] == "linux-modules-nvidia-535-server-generic"
    assert not any(spec.startswith("nvidia-dkms") for spec in plan.install)
    assert plan.reboot


def test_a_converged_box_has_nothing_to_do():
    box = {f"{s}-580-server": U580 for s in db._UBUNTU_BASE} | {
        "nvidia-dkms-580-server": U580,
        "linux-headers-generic": "5.15.0.101.98",
    }
    plan = db.plan(box, "Ubuntu", "580", U580, kernel_flavour="generic")
    assert not plan.changes and not plan.reboot and plan.purge == () and plan.install == ()
    assert "nvidia-utils-580-server" in plan.hold


def test_same_branch_new_build_is_no_branch_move_but_a_reboot():
    box = dict(UBUNTU_535)
    plan = db.plan(box, "Ubuntu", "535", "535.309.01-0ubuntu0.22.04.1", kernel_flavour="generic")
    assert not plan.branch_move and plan.purge == () and plan.reboot


def test_debian_535_to_550_moves_the_same_names_and_the_whole_build():
    plan = db.plan(DEBIAN_535, "Debian", "550", D550)
    assert plan.branch_move and plan.purge == ()
    versioned = {spec.split("=")[0] for spec in plan.install if "=" in spec}
    assert versioned == set(DEBIAN_SAME_BUILD)
    assert all(spec.endswith(f"={D550}") for spec in plan.install if "=" in spec)
    assert "nvidia-persistenced" in plan.install  # unversioned: its own version
    assert "nvidia-modprobe" not in versioned  # another source's build number: apt decides
    assert plan.reboot and plan.notes and "libc6" in plan.notes[0]
    assert "libc6" not in plan.hold


def test_debian_same_build_packages_move_only_when_offered():
    offered = {name: [D535, D550] for name in DEBIAN_SAME_BUILD if name != "nvidia-legacy-check"}
    plan = db.plan(DEBIAN_535, "Debian", "550", D550, offered=offered | {"nvidia-legacy-check": [D535]})
    assert "nvidia-legacy-check=" + D550 not in plan.install


def test_debian_refuses_a_named_package_the_archive_lacks():
    offered = {name: [D535] for name in DEBIAN_SAME_BUILD}
    with pytest.raises(db.BranchMoveError, match=r"nvidia_driver_version=550.163.01-2: the archive does not offer"):
        db.plan(DEBIAN_535, "Debian", "550", D550, offered=offered)


def test_debian_535_to_470_purges_the_535_build_and_installs_the_tesla_names():
    plan = db.plan(DEBIAN_535, "Debian", "470", D470)
    assert plan.branch_move and (plan.from_branch, plan.to_branch) == ("535", "470")
    # what apt removed in the research run: the 11 packages of the 535.261.03-1 build (installing the 470
    # names alone removes nothing: apt simulated "7 newly installed, 0 to remove", both branches side by side)
    assert plan.purge == tuple(DEBIAN_SAME_BUILD)
    assert plan.install == (
        f"nvidia-tesla-470-kernel-dkms={D470}",
        f"nvidia-tesla-470-smi={D470}",
        f"libnvidia-tesla-470-cuda1={D470}",
        f"libnvidia-tesla-470-ml1={D470}",
        "nvidia-persistenced",
    )
    assert "nvidia-smi" not in plan.hold and "nvidia-tesla-470-smi" in plan.hold
    assert "nvidia-modprobe" in plan.hold and plan.reboot and not plan.notes


def test_debian_470_back_to_535_purges_the_tesla_names():
    plan = db.plan(DEBIAN_470, "Debian", "535", D535)
    assert (plan.from_branch, plan.from_version) == ("470", D470)
    assert plan.purge == tuple(sorted(db.package_name(n) for n in DEBIAN_470 if "tesla-470" in n))
    assert plan.install == (*(f"{n}={D535}" for n in db._DEBIAN_VERSIONED), "nvidia-persistenced")
    assert plan.reboot


@pytest.mark.parametrize(
    ("distribution", "branch", "version", "names"),
    [
        ("Ubuntu", "999", U535, "nvidia_driver_branch='999'"),
        ("Debian", "580", "580.178.04-1", "nvidia_driver_branch='580'"),
        ("Ubuntu", "580", U535, "nvidia_driver_version=535.274.02-0ubuntu0.22.04.1 is a build of branch 535"),
        ("Ubuntu", "580", "580", "nvidia_driver_version='580' is not an exact apt version"),
        ("Ubuntu", "580", "latest", "nvidia_driver_version='latest'"),
        ("Fedora", "580", U580, "ansible_facts.distribution='Fedora'"),
    ],
)
def test_impossible_moves_are_refused_naming_the_variable_and_the_fix(distribution, branch, version, names):
    with pytest.raises(db.BranchMoveError) as err:
        db.plan(UBUNTU_535, distribution, branch, version, kernel_flavour="generic")
    assert names in str(err.value) and "Fix:" in str(err.value)


def test_ubuntu_without_a_flavour_is_refused():
    with pytest.raises(db.BranchMoveError, match="nvidia_driver_kernel_flavour"):
        db.plan(UBUNTU_535, "Ubuntu", "580", U580)


@pytest.mark.parametrize(
    ("name", "branch"),
    [
        ("linux-modules-nvidia-535-server-5.15.0-101-generic", "535"),
        ("linux-signatures-nvidia-5.15.0-101-generic", ""),
        ("nvidia-firmware-580-server-580.178.04", "580"),
        ("nvidia-dkms-535-server-open", "535"),
        ("libnvidia-compute-580-server:amd64", "580"),
        ("nvidia-tesla-470-kernel-dkms", "470"),
        ("nvidia-smi", ""),
        ("libnvidia-pkcs11-openssl3", ""),
        ("nvidia-legacy-390xx-kernel-dkms", ""),
    ],
)
def test_branch_of_name(name, branch):
    assert db.branch_of_name(name) == branch


# The release check the role runs before any change (tasks/validate.yml, also run by preflight).
@pytest.mark.parametrize(
    ("distribution", "release", "branch", "version"),
    [
        ("Debian", "12", "535", D535),
        ("Debian", "12", "470", D470),
        ("Ubuntu", "22", "535", U535),
        ("Ubuntu", "22", "580", U580),
    ],
)
def test_the_release_carries_the_branch(distribution, release, branch, version):
    assert db.check_release(distribution, release, branch, version) == version.split("-")[0]


@pytest.mark.parametrize(
    ("distribution", "release", "branch", "version", "says"),
    [
        ("Debian", "12", "580", "580.95.05-1", "it carries 470, 535"),
        ("Debian", "12", "550", D550, "needs trixie's libc6 2.41"),
        ("Ubuntu", "22", "470", "470.256.02-0ubuntu0.22.04.1", "it carries 535, 580"),
    ],
)
def test_a_branch_the_release_lacks_is_refused_naming_the_variable_and_the_fix(
    distribution, release, branch, version, says
):
    with pytest.raises(db.BranchMoveError) as err:
        db.check_release(distribution, release, branch, version)
    text = str(err.value)
    assert f"nvidia_driver_branch='{branch}' is not a branch {distribution} {release}'s archive carries" in text
    assert says in text and "Fix: set nvidia_driver_branch to one of" in text and "Nothing was changed" in text


def test_control_the_distribution_table_alone_accepts_trixies_550_on_debian():
    # control for the test above: plan() knows Debian's branches across releases; only the release check
    # refuses 550 on Debian 12, where it would pull trixie's libc6 (research run, 08 and 13)
    assert db.plan(DEBIAN_535, "Debian", "550", D550).notes
    with pytest.raises(db.BranchMoveError):
        db.check_release("Debian", "12", "550", D550)


def test_a_release_the_table_lacks_is_checked_against_the_distribution():
    assert db.check_release("Debian", "13", "550", D550) == "550.163.01"


def _facts(installed: dict[str, str]) -> dict[str, str]:
    """The installed packages as validate.yml hands them to the plan: dpkg-query's lines through dpkg_installed."""
    return db.dpkg_installed("".join(f"ii \t{name}\tamd64\t{version}\n" for name, version in installed.items()))


def test_dpkg_installed_reads_what_dpkg_has_on_disk():
    text = (
        "ii \tlibcuda1\tamd64\t535.261.03-1\n"
        "hi \tnvidia-smi\tamd64\t535.261.03-1\n"  # held
        "iU \tnvidia-kernel-dkms\tamd64\t535.261.03-1\n"  # unpacked by a run stopped before configuring
        "iF \tnvidia-driver\tamd64\t535.261.03-1\n"  # half-configured
        "iH \tnvidia-alternative\tall\t535.261.03-1\n"  # half-installed
        "rc \tnvidia-tesla-470-driver\tamd64\t470.256.02-1\n"  # purged but for its configuration files
        "un \tnouveau-firmware\t\t\n"  # known to dpkg, never installed
        "pn \tnvidia-legacy-340xx-driver\t\t\n"
        "ii \tlibc6\tamd64\t2.36-9\n"
        "ii \tlibc6\ti386\t2.36-8\n"  # a second architecture: the first line's version is kept
        "not a line of the format\n"
        "\n"
    )
    assert db.dpkg_installed(text) == {
        "libcuda1": "535.261.03-1",
        "nvidia-smi": "535.261.03-1",
        "nvidia-kernel-dkms": "535.261.03-1",
        "nvidia-driver": "535.261.03-1",
        "nvidia-alternative": "535.261.03-1",
        "libc6": "2.36-9",
    }
    assert db.dpkg_installed("") == {}


def test_dpkg_installed_reads_dpkg_querys_own_output():
    """The format validate.yml gives dpkg-query, run here on this machine's own package database."""
    dpkg_query = shutil.which("dpkg-query")
    assert dpkg_query, "dpkg-query is part of every Debian and Ubuntu system"
    out = subprocess.run(
        [dpkg_query, "--show", f"--showformat={dpkg.FORMAT}", "dpkg"], capture_output=True, text=True, check=True
    ).stdout
    version = subprocess.run(
        [dpkg_query, "--show", "--showformat=${Version}", "dpkg"], capture_output=True, text=True, check=True
    ).stdout
    assert db.dpkg_installed(out) == {"dpkg": version}


def test_validate_hands_dpkg_query_the_parsers_format():
    tasks = yaml.safe_load((REPO / "roles/nvidia_driver/tasks/validate.yml").read_text())
    argv = next(t["ansible.builtin.command"]["argv"] for t in tasks if t.get("register") == "_nvidia_driver_dpkg")
    assert argv == ["dpkg-query", "--show", f"--showformat={dpkg.FORMAT}"]


def test_plan_facts_is_the_roles_view_of_a_branch_move():
    got = db.plan_facts(_facts(DEBIAN_535), "Debian", "12", "470", D470)
    assert got["problems"] == [] and got["branch_move"] and got["reboot"] and got["changes"]
    assert got["purge"] == DEBIAN_SAME_BUILD
    assert got["install"][0] == f"nvidia-tesla-470-kernel-dkms={D470}"
    assert got["summary"].startswith(f"branch 535 -> 470 ({D535} -> {D470}): purge firmware-nvidia-gsp libcuda1")


def test_plan_facts_of_a_converged_box_purges_nothing():
    got = db.plan_facts(_facts(DEBIAN_470), "Debian", "12", "470", D470)
    assert (got["purge"], got["install"], got["changes"], got["reboot"]) == ([], [], False, False)


def test_plan_facts_of_a_version_move_purges_nothing():
    # the version move the role did before (535.261.03-1 -> 535.309.01-0+deb12u1): no purge, so the role's
    # apt task installs as before (tasks/main.yml takes the apt-get --purge path only for a purge)
    got = db.plan_facts(_facts(DEBIAN_535), "Debian", "12", "535", "535.309.01-0+deb12u1")
    assert got["purge"] == [] and not got["branch_move"] and got["reboot"]


def test_plan_facts_reports_a_refusal_as_a_problem_not_a_traceback():
    got = db.plan_facts(_facts(DEBIAN_535), "Debian", "12", "580", "580.95.05-1")
    assert got["problems"] and "nvidia_driver_branch='580'" in got["problems"][0]
    assert (got["purge"], got["install"], got["changes"]) == ([], [], False)


def test_plan_facts_ubuntu_535_to_580_purges_the_535_server_names():
    got = db.plan_facts(_facts(UBUNTU_535), "Ubuntu", "22", "580", U580, signed_modules=False, kernel_flavour="generic")
    assert got["problems"] == []
    assert got["purge"] and all("-535-server" in name for name in got["purge"])
    assert f"nvidia-dkms-580-server={U580}" in got["install"] and "linux-headers-generic" in got["install"]


def test_the_filter_hands_the_roles_inputs_to_the_plan():
    from ansible_collections.gpubox.gpubox.plugins.filter.gpubox_filters import FilterModule

    plan = FilterModule().filters()["driver_branch_plan"]
    # as validate.yml calls it: package facts, distribution, major version, branch, version, signed, flavour
    got = plan(_facts(DEBIAN_470), "Debian", "12", "535", D535, False, "")
    assert got["purge"] == sorted(db.package_name(n) for n in DEBIAN_470 if "tesla-470" in n)
    assert "unhold" not in got  # the role releases the holds of what it moves itself (tasks/main.yml)
    assert plan(_facts(DEBIAN_535), "Debian", "12", "580", "580.95.05-1", False, "")["problems"]
    signed = plan(_facts(UBUNTU_535), "Ubuntu", "22", "580", U580, True, "generic")
    assert signed["install"][-1] == "linux-modules-nvidia-580-server-generic"
