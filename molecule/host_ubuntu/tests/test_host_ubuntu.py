"""Verify the host layer on Ubuntu 22.04 with Ubuntu's real 535 packages (run by .github/workflows/ubuntu.yml).

Every assertion reads state the roles produced: the exact pinned version of every driver package, the
holds, the apt pin, the unattended-upgrades blacklist, and a nvidia module that DKMS built for every
installed kernel (the kernel-update safety of the DKMS path).
"""

import os
import re

PIN = os.environ["GPUBOX_UBUNTU_DRIVER_PIN"]
PKGS = [
    "nvidia-headless-no-dkms-535-server",
    "nvidia-utils-535-server",
    "libnvidia-compute-535-server",
    "nvidia-compute-utils-535-server",
    "nvidia-dkms-535-server",
]


def test_every_driver_package_at_the_pin_and_held(host):
    held = host.check_output("apt-mark showhold").split()
    for name in PKGS:
        assert host.package(name).version == PIN, name
        assert name in held or f"{name}:amd64" in held, name
    pref = host.file("/etc/apt/preferences.d/60-gpubox-nvidia-driver.pref").content_string
    assert f"Pin: version {PIN}" in pref
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    assert "nvidia-" in dump and "linux-modules-nvidia-" in dump


def test_dkms_built_the_module_for_every_installed_kernel(host):
    kernels = host.check_output("ls /lib/modules").split()
    status = host.check_output("dkms status")
    upstream = PIN.split("-")[0]
    for kernel in kernels:
        assert re.search(rf"nvidia[^,]*/{re.escape(upstream)}, {re.escape(kernel)}, x86_64: installed", status), (
            kernel,
            status,
        )
