"""Verify the host layer on the simulated 2 x RTX 3090 box (NVLink bridge).

Every assertion reads state the roles produce; removing the task that produces it makes it fail.
"""

import json
import re

PIN = "535.261.03-1"
DRIVER_PKGS = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1", "firmware-nvidia-gsp"]


def test_nouveau_blacklisted_and_initramfs_regenerated(host):
    conf = host.file("/etc/modprobe.d/blacklist-nouveau.conf")
    assert conf.exists
    assert "blacklist nouveau" in conf.content_string
    assert "options nouveau modeset=0" in conf.content_string
    # the initramfs of every installed kernel carries the blacklist
    images = host.check_output("ls /boot/initrd.img-*").split()
    assert images
    for img in images:
        listing = host.check_output(f"lsinitramfs {img}")
        assert "etc/modprobe.d/blacklist-nouveau.conf" in listing, img


def test_exact_driver_version_installed_while_newer_exists(host):
    for pkg in DRIVER_PKGS:
        assert host.package(pkg).is_installed, pkg
        assert host.package(pkg).version == PIN, pkg
    policy = host.check_output("apt-cache policy nvidia-smi")
    assert "535.309.01" in policy, "the archive must offer a newer 535 for this test to mean anything"
    assert f"Candidate: {PIN}" in policy


def test_driver_packages_held_and_upgrade_keeps_them(host):
    held = host.check_output("apt-mark showhold").split()
    for pkg in DRIVER_PKGS:
        assert pkg in held or f"{pkg}:amd64" in held, pkg
    sim = host.check_output("apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    assert not [line for line in sim.splitlines() if line.startswith("Inst") and "nvidia" in line], sim


def test_pin_preferences(host):
    pref = host.file("/etc/apt/preferences.d/60-gpubox-nvidia-driver.pref").content_string
    assert f"Pin: version {PIN}" in pref
    assert "Pin-Priority: 1001" in pref


def test_unattended_upgrades_blacklist(host):
    conf = host.file("/etc/apt/apt.conf.d/51gpubox-nvidia-no-unattended-upgrades").content_string
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    for prefix in ("nvidia-", "libnvidia-", "linux-modules-nvidia-"):
        assert f'"{prefix}"' in conf
        assert prefix in dump


def test_cuda_toolkit_from_the_cuda_repo(host):
    pkg = host.package("cuda-toolkit-12-2")
    assert pkg.is_installed
    policy = host.check_output("apt-cache policy cuda-toolkit-12-2")
    assert "http://127.0.0.1:8089" in policy
    assert not host.package("cuda-toolkit-12-4").is_installed
    src = host.file("/etc/apt/sources.list.d/cuda-gpubox.list").content_string
    assert "signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg" in src
    assert host.file("/usr/share/keyrings/cuda-archive-keyring.gpg").exists
    profile = host.run("bash -lc 'command -v nvcc || echo none; echo $PATH'").stdout
    assert "/usr/local/cuda-12.2/bin" in profile


def test_cuda_repo_driver_packages_blocked(host):
    # the simulated CUDA repo carries decoy drivers at 545.23.08-1: none may be installed or a candidate
    for pkg in ("nvidia-driver", "cuda-drivers", "cuda-drivers-545"):
        assert not host.package(pkg).is_installed, pkg
    policy = host.check_output("apt-cache policy nvidia-smi")
    assert "545.23.08-1" in policy, "the decoy must be visible to apt for this test to mean anything"
    assert re.search(r"545\.23\.08-1 -1\b", policy), policy
    assert host.package("nvidia-smi").version == PIN


def test_persistenced_drop_in(host):
    assert "10-gpubox-persistence-mode.conf" in host.check_output("systemctl cat nvidia-persistenced.service")
    exec_start = host.check_output("systemctl show -p ExecStart nvidia-persistenced.service")
    assert "--persistence-mode" in exec_start
    assert "--no-persistence-mode" not in exec_start
    assert host.service("nvidia-persistenced.service").is_enabled


def test_sysctl_file(host):
    conf = host.file("/etc/sysctl.d/60-gpubox.conf").content_string.replace(" ", "")
    assert "vm.swappiness=1\n" in conf + "\n"


def test_gpu_check_ran_and_nccl_env_matches_nvlink(host):
    svc = host.service("gpubox-gpu-check.service")
    assert svc.is_enabled
    props = host.check_output("systemctl show -p ActiveState -p Result gpubox-gpu-check.service")
    assert "ActiveState=active" in props and "Result=success" in props
    env = host.file("/etc/gpubox/nccl.env")
    assert env.exists
    assert "NCCL_P2P_DISABLE=1" not in env.content_string
    state = json.loads(host.file("/var/lib/gpubox/gpu-check.json").content_string)
    assert state["links"]["0-1"].startswith("NV")


def test_local_facts_written(host):
    driver = json.loads(host.file("/etc/ansible/facts.d/gpubox_driver.fact").content_string)
    assert driver["version"] == PIN
    check = json.loads(host.file("/etc/ansible/facts.d/gpubox_gpu_check.fact").content_string)
    assert check["links"]["0-1"].startswith("NV")
    cuda = json.loads(host.file("/etc/ansible/facts.d/gpubox_cuda.fact").content_string)
    assert cuda["version"] == "12.2"


def test_reboot_gate_honoured_the_host_var_gpubox_reboot_skip(host):
    # host_vars/gpubox-m-day-driver.yml sets gpubox_reboot_skip: true. The container condition holds too;
    # the gate must record the host var as the cause (it outranks the container), which it can only do
    # if the host var reached it (a play var would have overridden it).
    gate = json.loads(host.file("/etc/ansible/facts.d/gpubox_reboot.fact").content_string)
    assert "NVIDIA driver or nouveau blacklist changed" in gate["reasons"], gate
    assert gate["decision"] == "skipped", gate
    assert gate["skipped_by"] == "gpubox_reboot_skip", gate
    assert gate["skip_causes"] == ["gpubox_reboot_skip", "container"], gate
    # the reasons stay pending in this boot (the idempotence run had no handler to repeat them)
    assert gate["boot_id"] == host.file("/proc/sys/kernel/random/boot_id").content_string.strip()
