"""Which packages keep a nvidia module for every installed kernel (pure Python, stdlib only).

A kernel installed after the driver must still get a module for the pinned driver:
- DKMS path (Debian 12 always; Ubuntu 22.04 with Secure Boot off): DKMS builds the module for a kernel
  only when that kernel's headers are installed. So the headers of every installed kernel
  (``linux-headers-<release>``) are needed, and the headers metapackage of every installed kernel
  metapackage (``linux-image-cloud-amd64`` -> ``linux-headers-cloud-amd64``), so that the kernel
  update that brings a new ``linux-image`` also brings its headers and DKMS's kernel hook builds the
  module before the next boot.
- Signed path (Ubuntu 22.04 with Secure Boot on): Canonical's precompiled, signed module package of the
  branch for every installed kernel (``linux-modules-nvidia-535-server-<release>``), and its flavour
  metapackage, which follows kernel updates.

``kernel_module_plan`` decides from the installed package names (``ansible_facts.packages``) and what
apt offers; it never raises: a package that is neither installed nor offered is a problem line that
names the package and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# linux-image-<release>: 6.1.0-57-cloud-amd64 (Debian), 5.15.0-91-generic (Ubuntu); not the -unsigned
# and -dbg variants, which are no bootable kernel of their own.
_RELEASE = re.compile(r"^linux-image-(\d+\.\d+\.\d+-\d+[.\w+-]*)$")
# linux-image-<flavour> metapackages that follow kernel updates: amd64, cloud-amd64, rt-amd64 (Debian),
# generic, generic-hwe-22.04, lowlatency (Ubuntu). Not "linux-image-unsigned-..." (a release variant).
_META = re.compile(r"^linux-image-([a-z][a-z0-9.-]*)$")
_NOT_KERNEL = ("-unsigned", "-dbg", "-dbgsym")


def installed_kernels(packages: Iterable[str]) -> list[str]:
    """Releases of the installed kernel packages, sorted."""
    out = []
    for name in packages:
        m = _RELEASE.match(name)
        if m and not name.endswith(_NOT_KERNEL):
            out.append(m.group(1))
    return sorted(set(out))


def kernel_metapackages(packages: Iterable[str]) -> list[str]:
    """Flavours of the installed kernel metapackages (``cloud-amd64``, ``generic``), sorted."""
    out = []
    for name in packages:
        m = _META.match(name)
        if m and not m.group(1).startswith("unsigned") and not name.endswith(_NOT_KERNEL):
            out.append(m.group(1))
    return sorted(set(out))


def parse_policy(text: str) -> dict[str, str]:
    """``apt-cache policy A B ...`` -> {package: candidate}; a package apt does not know is absent."""
    out = {}
    for m in re.finditer(r"(?m)^(\S+):\n\s+Installed: .*\n\s+Candidate: (\S+)", text):
        out[m.group(1)] = m.group(2)
    return out


def kernel_module_plan(
    packages: Iterable[str],
    candidates: Mapping[str, str] | None = None,
    *,
    secure_boot: bool = False,
    signed_modules: bool = False,
    branch: str = "535",
) -> dict:
    """What keeps a nvidia module for every installed kernel.

    packages: installed package names; candidates: ``parse_policy`` of the needed packages (None: not
    asked yet, no problems reported); signed_modules: the distribution has Canonical-style precompiled
    signed modules (Ubuntu), used when secure_boot is on.

    Returns {path, kernels, packages (needed), missing (neither installed nor offered), problems}.
    """
    installed = set(packages)
    kernels = installed_kernels(installed)
    flavours = kernel_metapackages(installed)
    if secure_boot and signed_modules:
        path = "signed"
        prefix = f"linux-modules-nvidia-{branch}-server-"
        needed = [prefix + k for k in kernels] + [prefix + f for f in flavours]
    else:
        path = "dkms"
        needed = [f"linux-headers-{k}" for k in kernels] + [f"linux-headers-{f}" for f in flavours]
    missing = []
    problems = []
    if candidates is not None:
        for name in needed:
            if name in installed:
                continue
            if candidates.get(name, "(none)") == "(none)":
                missing.append(name)
        for name in missing:
            what = "the nvidia module for it" if path == "dkms" else "its signed nvidia module"
            kernel = next((k for k in kernels if name.endswith("-" + k)), None)
            subject = f"kernel {kernel}" if kernel else f"the kernel updates of {name.rsplit('-', 1)[0]}"
            problems.append(
                f"nvidia_driver: {subject} would have no nvidia module: {name} (needed to "
                f"{'build' if path == 'dkms' else 'install'} {what}) is neither installed nor offered by "
                f"this box's apt sources. Fix: install {name} (apt-get install {name}) or enable the "
                f"archive that carries it (then apt-get update)"
                + (f", or remove kernel {kernel} (apt-get purge linux-image-{kernel})." if kernel else ".")
            )
    return {"path": path, "kernels": kernels, "packages": needed, "missing": missing, "problems": problems}
