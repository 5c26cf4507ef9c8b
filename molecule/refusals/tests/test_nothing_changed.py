"""After the refused run, the box must be exactly as prepared: nothing installed, nothing written."""

import pytest


@pytest.mark.parametrize("pkg", ["nvidia-smi", "nvidia-kernel-dkms", "libcuda1", "cuda-toolkit-12-2"])
def test_nothing_installed(host, pkg):
    assert not host.package(pkg).is_installed


@pytest.mark.parametrize(
    "path",
    [
        "/etc/modprobe.d/blacklist-nouveau.conf",
        "/etc/apt/preferences.d/60-gpubox-nvidia-driver.pref",
        "/etc/apt/sources.list.d/cuda-gpubox.list",
        "/etc/apt/apt.conf.d/51gpubox-nvidia-no-unattended-upgrades",
        "/etc/sysctl.d/60-gpubox.conf",
        "/etc/gpubox",
        "/etc/ansible/facts.d",
    ],
)
def test_nothing_written(host, path):
    assert not host.file(path).exists


def test_no_package_state_changed(host):
    # prepare.yml snapshots the package set when the simulated box is ready
    before = host.file("/var/lib/gpubox-sim/packages-after-prepare.txt").content_string
    now = host.check_output("dpkg-query -W -f='${binary:Package} ${Version}\\n'")
    assert sorted(now.splitlines()) == sorted(before.splitlines())
