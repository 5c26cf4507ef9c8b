"""gpubox.gpubox.apt_present on this machine's own dpkg and apt: dpkg answers when there is nothing to do,
apt in every other case (check mode: nothing is installed or removed here)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.ansible_vars import run_module

MODULE = "gpubox.gpubox.apt_present"
DPKG_SAYS = "installed as asked (dpkg)"


def installed_version(package: str) -> str:
    return subprocess.run(
        ["dpkg-query", "-W", "-f", "${Version}", package], check=True, capture_output=True, text=True
    ).stdout


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_packages_installed_as_asked_are_answered_by_dpkg(check: bool, tmp_path: Path) -> None:
    pinned = f"bash={installed_version('bash')}"
    result = run_module(MODULE, f"name=dpkg,{pinned} state=present cache_valid_time=3600", tmp_path, check=check)
    assert result.get("changed") is False, result
    assert result.get("msg") == DPKG_SAYS, result
    assert result.get("packages") == ["dpkg", "bash"]


@pytest.mark.parametrize(
    ("args", "apt_says"),
    [
        # another version than the one installed: apt looks for it (and the archive has none)
        ("name=bash=0.0-0gpubox", "bash=0.0-0gpubox"),
        # a package dpkg has never seen
        ("name=dpkg,gpubox-no-such-package", "gpubox-no-such-package"),
    ],
    ids=["other-version", "unknown-package"],
)
def test_anything_dpkg_does_not_show_as_asked_is_apts_to_answer(args: str, apt_says: str, tmp_path: Path) -> None:
    result = run_module(MODULE, args, tmp_path, check=True)
    assert result.get("msg") != DPKG_SAYS, result
    assert result.get("failed") is True, result
    assert apt_says in result["msg"], result


def test_what_only_apt_can_decide_goes_to_apt_even_when_installed(tmp_path: Path) -> None:
    # apt's wildcard matches the installed bash: apt says nothing changes, in its own words
    result = run_module(MODULE, "name=bas? state=present", tmp_path, check=True)
    assert result.get("changed") is False, result
    assert result.get("msg") != DPKG_SAYS, result
    assert "packages" not in result, result
