"""The NVIDIA driver branch move (day two): from what dpkg lists on the box to the apt steps, pure.

A box moves between driver branches (Ubuntu 22.04: 535-server -> 580-server and back) the same way it
moves between builds of one branch, plus what a branch changes: on Ubuntu the package NAMES carry the
branch (``libnvidia-compute-535-server``), so the old branch's packages are removed and the new
branch's installed; on Debian the driver's names carry no branch (``nvidia-smi``, ``libcuda1``), so the
same names move to a build of the other branch, and only packages whose names do carry one (Debian's
``nvidia-tesla-<branch>-*``) are removed.

``plan()`` takes the installed packages (name -> version, as ``dpkg-query -W`` lists them; a ``:amd64``
suffix is dropped), the distribution and the desired branch and exact version, and returns a
``BranchPlan``: which packages to purge, which to install at which version, which to hold afterwards,
and whether a reboot is needed (the role releases the holds of the packages it moves itself). Impossible
moves raise ``BranchMoveError``, whose message names the variable and the fix, before anything changes on
the host.

Package names (facts, with their sources):
- Ubuntu 22.04, the role's set (roles/nvidia_driver/vars/Ubuntu-22.yml): ``nvidia-headless-no-dkms-<b>-server``,
  ``nvidia-utils-<b>-server``, ``libnvidia-compute-<b>-server``, ``nvidia-compute-utils-<b>-server``, then
  ``linux-modules-nvidia-<b>-server-<flavour>`` (signed, Secure Boot on) or ``nvidia-dkms-<b>-server`` +
  ``linux-headers-<flavour>``. The 580-server names at 580.178.04-0ubuntu0.22.04.1 are in jammy-updates
  (read 2026-12-04, plugins/module_utils/stacks.py, lts-580).
- Ubuntu 22.04, what those pull in (a dpkg -l of a 22.04 box with 535-server): ``libnvidia-cfg1-<b>-server``,
  ``libnvidia-common-<b>-server``, ``libnvidia-decode/encode/extra/fbc1/gl-<b>-server``,
  ``nvidia-kernel-common-<b>-server``, ``nvidia-firmware-<b>-server-<upstream>``,
  ``linux-objects-nvidia-<b>-server-<kernel>``, ``xserver-xorg-video-nvidia-<b>-server``, and
  ``linux-signatures-nvidia-<kernel>`` (no branch in the name: it is not the old branch's and stays).
- Debian 12 (roles/nvidia_driver/vars/Debian-12.yml): ``nvidia-kernel-dkms``, ``nvidia-smi``, ``libcuda1``,
  ``libnvidia-ml1``, ``firmware-nvidia-gsp`` at the driver's version, ``nvidia-persistenced`` (contrib, its
  own version). Branches Debian's archive carries under these names: 535 (bookworm 535.261.03-1,
  bookworm-security 535.309.01-0+deb12u1) and 550 (trixie 550.163.01-2; it needs trixie's dkms,
  nvidia-modprobe and libssl3t64, and so trixie's libc6: see NOTES). Under names that carry the branch,
  bookworm also carries 470 (source nvidia-graphics-drivers-tesla-470, 470.256.02-1~deb12u1):
  ``nvidia-tesla-470-kernel-dkms``, ``nvidia-tesla-470-smi``, ``libnvidia-tesla-470-cuda1``,
  ``libnvidia-tesla-470-ml1`` (they install beside the 535 names: the move removes the old ones itself).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ansible_collections.gpubox.gpubox.plugins.module_utils import dpkg

# The branches each distribution's archive carries under the names the role installs.
BRANCHES: dict[str, tuple[str, ...]] = {"Ubuntu": ("535", "580"), "Debian": ("470", "535", "550")}
# What a plan says about a target that installs but not cleanly (the integrator shows it to the user).
NOTES: dict[tuple[str, str], str] = {
    (
        "Debian",
        "550",
    ): "Debian's 550 is trixie's (Debian 13): on Debian 12 it pulls trixie's dkms, nvidia-modprobe, "
    "libssl3t64 and with it libc6 2.41 and base-files 13 (the box then reports Debian 13); the libc does "
    "not move back with a move back to 535.",
}
# The branches a RELEASE's own archive carries (its suites: <codename>, -updates, -security), under any of
# the names above. Debian 12: 535 (nvidia-graphics-drivers) and 470 (nvidia-graphics-drivers-tesla-470);
# its 550 is trixie's and needs trixie's libc6 2.41 (research run, .cache/branch-experiment 08 and 13).
RELEASE_BRANCHES: dict[tuple[str, str], tuple[str, ...]] = {
    ("Ubuntu", "22"): ("535", "580"),
    ("Debian", "12"): ("470", "535"),
}
RELEASE_WHY: dict[tuple[str, str, str], str] = {
    ("Debian", "12", "550"): "Debian's 550 is trixie's (Debian 13): on Debian 12 it needs trixie's libc6 2.41 "
    "and turns the box into Debian 13.",
}
# The NVIDIA packages: the role's apt pin globs (roles/nvidia_driver/vars/*.yml) and the kernel module packages.
NVIDIA_GLOBS = ("*nvidia*", "libcuda*", "libnv*")
# <stem containing "nvidia", no dots>-<branch>[-server][-open][-<rest>]: the branch a package name carries.
_BRANCH_IN_NAME = re.compile(
    r"^(?P<stem>[a-z0-9-]*nvidia[a-z0-9-]*?)-(?P<branch>\d{3})(?P<server>-server)?(?P<open>-open)?(?:-(?P<rest>.+))?$"
)
# An apt version of the driver: upstream <branch>.<minor>[.<patch>], then the distribution's revision.
_VERSION = re.compile(r"^(?P<upstream>(?P<branch>\d{3})\.\d+(?:\.\d+)?)-[A-Za-z0-9.+~]+$")
_UBUNTU_BASE = ("nvidia-headless-no-dkms", "nvidia-utils", "libnvidia-compute", "nvidia-compute-utils")
_DEBIAN_VERSIONED = ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1", "firmware-nvidia-gsp")
_DEBIAN_UNVERSIONED = ("nvidia-persistenced",)
_DEBIAN_USERSPACE = "nvidia-smi"
# Debian's other branch family: nvidia-graphics-drivers-tesla-<branch>, every name carries the branch.
_DEBIAN_TESLA = (
    "nvidia-tesla-{b}-kernel-dkms",
    "nvidia-tesla-{b}-smi",
    "libnvidia-tesla-{b}-cuda1",
    "libnvidia-tesla-{b}-ml1",
)
_DEBIAN_TESLA_BRANCHES = ("470",)


def _debian_names(branch: str) -> tuple[tuple[str, ...], str]:
    """The versioned packages of ``branch`` on Debian and its nvidia-smi package."""
    if branch in _DEBIAN_TESLA_BRANCHES:
        return tuple(n.format(b=branch) for n in _DEBIAN_TESLA), f"nvidia-tesla-{branch}-smi"
    return _DEBIAN_VERSIONED, _DEBIAN_USERSPACE


def _debian_tesla_smi(packages: Mapping[str, str]) -> list[str]:
    return sorted(n for n in packages if re.fullmatch(r"nvidia-tesla-\d{3}-smi", n))


class BranchMoveError(ValueError):
    """A move that cannot be planned; the message names the variable and the fix."""


@dataclass(frozen=True)
class BranchPlan:
    """The apt steps of one move, in order: purge, install, hold; then reboot when ``reboot``.

    ``install``: ``name=version`` for the packages that carry the driver's version, a bare name for the
    others (headers, signed modules, persistenced). ``from_branch``/``from_version``: "" on a box without
    the driver. ``notes``: what the user should know about this target (NOTES).
    """

    distribution: str
    from_branch: str
    from_version: str
    to_branch: str
    to_version: str
    purge: tuple[str, ...]
    install: tuple[str, ...]
    hold: tuple[str, ...]
    reboot: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def branch_move(self) -> bool:
        """True when the branch changes (not only the build of one branch, not a first install)."""
        return bool(self.from_branch) and self.from_branch != self.to_branch

    @property
    def changes(self) -> bool:
        """False when the box already runs exactly this build and nothing of another branch is left."""
        return bool(self.purge or self.install)


def package_name(dpkg_name: str) -> str:
    """``libcuda1:amd64`` -> ``libcuda1`` (dpkg's ``${binary:Package}`` carries the architecture)."""
    return dpkg_name.split(":", 1)[0]


def is_nvidia(name: str) -> bool:
    """A package the role pins and holds (the apt pin's globs)."""
    return any(fnmatch.fnmatchcase(name, glob) for glob in NVIDIA_GLOBS)


def branch_of_name(name: str) -> str:
    """The branch a package's NAME carries ("" when none): ``linux-modules-nvidia-535-server-generic`` -> 535.

    ``linux-signatures-nvidia-5.15.0-101-generic`` carries none (its digits belong to a kernel release).
    """
    match = _BRANCH_IN_NAME.match(package_name(name))
    return match.group("branch") if match else ""


def split_version(version: str, variable: str = "nvidia_driver_version") -> tuple[str, str]:
    """(branch, upstream) of an apt driver version: ``580.178.04-0ubuntu0.22.04.1`` -> (580, 580.178.04)."""
    match = _VERSION.match(version.strip()) if isinstance(version, str) else None
    if not match:
        raise BranchMoveError(
            f"{variable}={version!r} is not an exact apt version of the NVIDIA driver (like 535.261.03-1 or "
            f"580.178.04-0ubuntu0.22.04.1). Fix: set {variable} to a version `apt-cache policy` lists."
        )
    return match.group("branch"), match.group("upstream")


def _check_target(distribution: str, branch: str, version: str) -> str:
    if distribution not in BRANCHES:
        raise BranchMoveError(
            f"ansible_facts.distribution={distribution!r} has no driver packages gpubox knows. "
            f"Fix: run on {' or '.join(BRANCHES)}."
        )
    branch = str(branch).strip()
    if branch not in BRANCHES[distribution]:
        raise BranchMoveError(
            f"nvidia_driver_branch={branch!r} is not a branch {distribution}'s archive carries under the names "
            f"the role installs (known: {', '.join(BRANCHES[distribution])}). Fix: set nvidia_driver_branch to "
            "one of them, or choose the gpubox_stack whose branch it is."
        )
    version_branch, upstream = split_version(version)
    if version_branch != branch:
        raise BranchMoveError(
            f"nvidia_driver_version={version} is a build of branch {version_branch}, not of "
            f"nvidia_driver_branch={branch}. Fix: set both to the same branch (or leave both empty and let "
            "gpubox_stack choose them)."
        )
    return upstream


def check_release(distribution: str, release: str, branch: str, version: str) -> str:
    """The target's upstream version; BranchMoveError when ``release``'s archive lacks the branch.

    ``release``: the distribution's major version (``ansible_facts.distribution_major_version``). A release
    the table does not list is checked against the distribution's branches only (``BRANCHES``).
    """
    carried = RELEASE_BRANCHES.get((distribution, str(release)))
    branch = str(branch).strip()
    if carried is not None and branch not in carried:
        why = RELEASE_WHY.get((distribution, str(release), branch), "")
        raise BranchMoveError(
            f"nvidia_driver_branch={branch!r} is not a branch {distribution} {release}'s archive carries "
            f"(it carries {', '.join(carried)}).{' ' + why if why else ''} Fix: set nvidia_driver_branch to one of "
            f"{', '.join(carried)} with an nvidia_driver_version `apt-cache madison` lists for it, or leave both "
            "empty to take the stack's. Nothing was changed."
        )
    return _check_target(distribution, branch, version)


def _ubuntu_install(branch: str, version: str, signed_modules: bool, kernel_flavour: str) -> tuple[str, ...]:
    names = [f"{stem}-{branch}-server={version}" for stem in _UBUNTU_BASE]
    if not kernel_flavour:
        raise BranchMoveError(
            "nvidia_driver_kernel_flavour is empty and no flavour was detected. Fix: set "
            "nvidia_driver_kernel_flavour (generic, generic-hwe-22.04, ...)."
        )
    if signed_modules:
        names.append(f"linux-modules-nvidia-{branch}-server-{kernel_flavour}")
    else:
        names += [f"nvidia-dkms-{branch}-server={version}", f"linux-headers-{kernel_flavour}"]
    return tuple(names)


def plan(
    installed: Mapping[str, str],
    distribution: str,
    branch: str,
    version: str,
    *,
    signed_modules: bool = False,
    kernel_flavour: str = "",
    offered: Mapping[str, Iterable[str]] | None = None,
) -> BranchPlan:
    """The move from the box's installed driver to ``branch`` at exactly ``version``.

    ``installed``: every installed package (name -> version; non-NVIDIA ones are ignored). Ubuntu:
    ``signed_modules`` (Secure Boot) and ``kernel_flavour`` choose the module packages, as roles/nvidia_driver
    does. ``offered``: name -> versions the archive offers (``apt-cache madison``); when given, a named
    package the archive lacks at ``version`` is refused, and a package installed at the old build moves
    along only when offered at the new one (Debian).
    """
    upstream = _check_target(distribution, branch, version)
    everything = {package_name(name): str(ver) for name, ver in installed.items()}
    packages = {name: ver for name, ver in everything.items() if is_nvidia(name)}

    if distribution == "Ubuntu":
        userspace = next(
            (name for name in packages if re.fullmatch(r"nvidia-utils-\d{3}(?:-server)?", name)),
            "",
        )
        purge = sorted(name for name in packages if branch_of_name(name) not in ("", branch))
        install = list(_ubuntu_install(branch, version, signed_modules, kernel_flavour))
    else:
        names, userspace_new = _debian_names(branch)
        userspace = next((n for n in (_DEBIAN_USERSPACE, *_debian_tesla_smi(packages)) if n in packages), "")
        old = packages.get(userspace, "")
        # The packages of the installed build: they depend on each other at "=" versions (libnvidia-cfg1,
        # nvidia-alternative, ...). Same names as the target's: they move along, as the role does today.
        # Other names (a tesla-<branch> family on one side): they go, with every other branch's names.
        same_build = sorted(name for name, ver in packages.items() if old and ver == old and old != version)
        same_family = bool(userspace) and userspace == userspace_new
        purge = sorted(
            {name for name in packages if branch_of_name(name) not in ("", branch)}
            | (set() if same_family else set(same_build))
        )
        named = list(names)
        for name in same_build if same_family else ():
            if name not in named and (offered is None or version in set(offered.get(name, ()))):
                named.append(name)
        install = [f"{name}={version}" for name in named] + list(_DEBIAN_UNVERSIONED)

    from_version = packages.get(userspace, "")
    found = _VERSION.match(from_version)  # a build the table does not parse (an epoch) counts as another one
    from_branch, from_upstream = (found.group("branch"), found.group("upstream")) if found else ("", from_version)

    if offered is not None:
        missing = [
            spec.split("=", 1)[0]
            for spec in install
            if "=" in spec and version not in set(offered.get(spec.split("=", 1)[0], ()))
        ]
        if missing:
            raise BranchMoveError(
                f"nvidia_driver_version={version}: the archive does not offer {', '.join(missing)} at that "
                f"version. Fix: add the suite that carries branch {branch} to the apt sources, or set "
                "nvidia_driver_version to a version `apt-cache policy` lists."
            )

    # Already there: every versioned package at the version, every unversioned one installed, nothing else.
    if not purge and all(
        (everything.get(spec.split("=", 1)[0]) == version) if "=" in spec else spec in everything for spec in install
    ):
        install = []
    reboot = bool(install or purge) and from_upstream != upstream
    kept = [name for name in packages if name not in purge]
    hold = sorted({*kept, *(spec.split("=", 1)[0] for spec in install if is_nvidia(spec.split("=", 1)[0]))})
    note = NOTES.get((distribution, branch))
    return BranchPlan(
        distribution=distribution,
        from_branch=from_branch,
        from_version=from_version,
        to_branch=branch,
        to_version=version,
        purge=tuple(purge),
        install=tuple(install),
        hold=tuple(hold),
        reboot=reboot,
        notes=(note,) if note and (install or purge) else (),
    )


def dpkg_installed(text: str) -> dict[str, str]:
    """name -> version of every package dpkg has on disk (``dpkg.on_disk``), from ``dpkg-query --show`` in
    ``dpkg.FORMAT``. Of a package installed for two architectures, the first line's version is kept."""
    out: dict[str, str] = {}
    for row in dpkg.rows(text):
        if dpkg.on_disk(row.status) and row.version:
            out.setdefault(package_name(row.name.strip()), row.version.strip())
    return out


def plan_facts(
    installed: Mapping[str, str],
    distribution: str,
    release: str,
    branch: str,
    version: str,
    *,
    signed_modules: bool = False,
    kernel_flavour: str = "",
) -> dict[str, object]:
    """The role's view of ``plan()``: its fields as a dict, ``problems`` (a refusal's message) and ``summary``."""
    try:
        check_release(distribution, release, branch, version)
        result = plan(
            {str(name): str(version) for name, version in installed.items()},
            distribution,
            branch,
            version,
            signed_modules=signed_modules,
            kernel_flavour=kernel_flavour,
        )
    except BranchMoveError as exc:
        return {
            "problems": [str(exc)],
            "purge": [],
            "install": [],
            "hold": [],
            "reboot": False,
            "branch_move": False,
            "changes": False,
            "summary": "",
        }
    move = f"branch {result.from_branch} -> {result.to_branch}" if result.branch_move else "no branch change"
    summary = (
        f"{move} ({result.from_version or 'no driver'} -> {result.to_version}): purge "
        f"{' '.join(result.purge) or 'nothing'}; install {' '.join(result.install) or 'nothing'}; hold every "
        f"NVIDIA package; {'reboot' if result.reboot else 'no reboot'}"
    )
    return {
        "problems": [],
        "distribution": result.distribution,
        "from_branch": result.from_branch,
        "from_version": result.from_version,
        "to_branch": result.to_branch,
        "to_version": result.to_version,
        "purge": list(result.purge),
        "install": list(result.install),
        "hold": list(result.hold),
        "reboot": result.reboot,
        "branch_move": result.branch_move,
        "changes": result.changes,
        "notes": list(result.notes),
        "summary": summary,
    }
