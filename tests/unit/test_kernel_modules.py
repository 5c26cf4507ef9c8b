"""Kernel update safety: which packages keep a nvidia module for every installed kernel."""

from __future__ import annotations

from ansible_collections.gpubox.gpubox.plugins.module_utils import kernel_modules as km

# Package names as a Debian 12 cloud box lists them (the test image: molecule/shared/image/build.sh).
DEBIAN = ["linux-image-6.1.0-57-cloud-amd64", "linux-image-cloud-amd64", "nvidia-kernel-dkms", "bash"]
# Ubuntu 22.04 with the GA kernel and an older kernel still installed.
UBUNTU = [
    "linux-image-5.15.0-91-generic",
    "linux-image-5.15.0-88-generic",
    "linux-image-generic",
    "linux-image-unsigned-5.15.0-91-generic",
    "linux-image-5.15.0-91-generic-dbgsym",
]

POLICY = """linux-headers-6.1.0-57-cloud-amd64:
  Installed: (none)
  Candidate: 6.1.192-3
  Version table:
     6.1.192-3 500
linux-headers-cloud-amd64:
  Installed: (none)
  Candidate: 6.1.192-3
  Version table:
"""


def test_installed_kernels_and_metapackages():
    assert km.installed_kernels(DEBIAN) == ["6.1.0-57-cloud-amd64"]
    assert km.kernel_metapackages(DEBIAN) == ["cloud-amd64"]
    assert km.installed_kernels(UBUNTU) == ["5.15.0-88-generic", "5.15.0-91-generic"]
    assert km.kernel_metapackages(UBUNTU) == ["generic"]


def test_parse_policy_reads_each_candidate():
    assert km.parse_policy(POLICY) == {
        "linux-headers-6.1.0-57-cloud-amd64": "6.1.192-3",
        "linux-headers-cloud-amd64": "6.1.192-3",
    }


def test_debian_needs_headers_of_every_kernel_and_of_its_metapackage():
    plan = km.kernel_module_plan(DEBIAN, km.parse_policy(POLICY))
    assert plan["path"] == "dkms"
    assert plan["packages"] == ["linux-headers-6.1.0-57-cloud-amd64", "linux-headers-cloud-amd64"]
    assert plan["missing"] == [] and plan["problems"] == []
    # Secure Boot on Debian: still DKMS (no precompiled signed modules; DKMS signs with the MOK)
    assert km.kernel_module_plan(DEBIAN, None, secure_boot=True)["path"] == "dkms"


def test_headers_neither_installed_nor_offered_are_a_problem_naming_the_package_and_the_fix():
    policy = POLICY.replace("Candidate: 6.1.192-3\n  Version table:\n     6.1.192-3 500", "Candidate: (none)")
    plan = km.kernel_module_plan(DEBIAN, km.parse_policy(policy))
    assert plan["missing"] == ["linux-headers-6.1.0-57-cloud-amd64"]
    (line,) = plan["problems"]
    assert "kernel 6.1.0-57-cloud-amd64 would have no nvidia module" in line
    assert "apt-get install linux-headers-6.1.0-57-cloud-amd64" in line
    assert "apt-get purge linux-image-6.1.0-57-cloud-amd64" in line
    # a package apt does not know at all is missing too; an installed one is never asked about
    plan = km.kernel_module_plan([*DEBIAN, "linux-headers-cloud-amd64"], {})
    assert plan["missing"] == ["linux-headers-6.1.0-57-cloud-amd64"]


def test_ubuntu_secure_boot_takes_the_signed_module_of_every_kernel():
    plan = km.kernel_module_plan(UBUNTU, {}, secure_boot=True, signed_modules=True, branch="535")
    assert plan["path"] == "signed"
    assert plan["packages"] == [
        "linux-modules-nvidia-535-server-5.15.0-88-generic",
        "linux-modules-nvidia-535-server-5.15.0-91-generic",
        "linux-modules-nvidia-535-server-generic",
    ]
    assert len(plan["problems"]) == 3
    assert "kernel updates of linux-modules-nvidia-535-server" in plan["problems"][2]
    # Secure Boot off on Ubuntu: DKMS, headers of both kernels
    plan = km.kernel_module_plan(UBUNTU, None, secure_boot=False, signed_modules=True)
    assert plan["packages"] == [
        "linux-headers-5.15.0-88-generic",
        "linux-headers-5.15.0-91-generic",
        "linux-headers-generic",
    ]
    assert plan["problems"] == []  # not asked yet: nothing to report


def test_filter_wraps_the_plan():
    from ansible_collections.gpubox.gpubox.plugins.filter.gpubox_filters import FilterModule

    plan = FilterModule().filters()["kernel_module_plan"]({n: [] for n in DEBIAN}.keys(), POLICY, False, False, "535")
    assert plan["packages"] == ["linux-headers-6.1.0-57-cloud-amd64", "linux-headers-cloud-amd64"]
