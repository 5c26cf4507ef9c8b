"""plugins/action/apt_present.py: when dpkg alone may answer for apt, and what it must show to do so."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.gpubox.plugins.action.apt_present import Wanted, query_command, unmet, wanted

NGINX_SSL = [Wanted("nginx", None, None), Wanted("ssl-cert", None, None)]
ROWS = "\n".join(
    [
        "ii \tnginx\tamd64\t1.22.1-9+deb12u1",
        "hi \tnvidia-driver\tamd64\t535.247.01-1~deb12u1",
        "iU \tcuda-toolkit-12-2\tamd64\t12.2.140~12.2.2-1",
        "rc \tnvidia-tesla-470-driver\tamd64\t470.256.02-1",
        "ii \tlibc6\tamd64\t2.36-9+deb12u14",
        "ii \tlibc6\ti386\t2.36-9+deb12u14",
        "iiR\tbroken\tamd64\t1.0",
        "",
    ]
)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"name": ["nginx", "ssl-cert"], "state": "present"}, NGINX_SSL),
        ({"name": "nginx, ssl-cert", "cache_valid_time": 3600}, NGINX_SSL),
        ({"pkg": ["libc6:i386"]}, [Wanted("libc6", "i386", None)]),
        (
            {"name": ["nvidia-driver=535.247.01-1~deb12u1", "libcuda1:amd64=1:535.2+b1"], "allow_downgrade": True},
            [Wanted("nvidia-driver", None, "535.247.01-1~deb12u1"), Wanted("libcuda1", "amd64", "1:535.2+b1")],
        ),
        ({"name": ["gnupg"], "update_cache": False, "install_recommends": False}, [Wanted("gnupg", None, None)]),
    ],
)
def test_what_dpkg_must_show_for_a_task_apt_would_find_done(args: dict, expected: list[Wanted]) -> None:
    assert wanted(args) == expected


@pytest.mark.parametrize(
    "args",
    [
        {"name": ["nginx"], "state": "latest"},  # latest asks the archive, not dpkg
        {"name": ["nginx"], "state": "absent"},
        {"name": ["nginx"], "update_cache": True},  # the refresh is asked for: apt does it
        {"name": ["nginx"], "purge": True},  # an argument this plugin does not know what it does
        {"name": ["nginx"], "autoremove": True},
        {"name": ["ngin*"]},  # apt's wildcard
        {"name": ["nginx>=1.22"]},  # a relation, not an exact version
        {"name": ["nginx=1.22*"]},  # a version prefix
        {"name": ["/tmp/x.deb"]},
        {"deb": "/tmp/x.deb"},
        {"name": []},
        {"upgrade": "dist"},
        {"name": ["Nginx"]},  # not a Debian package name: apt says what is wrong with it
    ],
)
def test_only_apt_answers_what_dpkg_cannot(args: dict) -> None:
    assert wanted(args) is None


def test_installed_or_held_at_the_asked_version_is_met() -> None:
    asked = [
        Wanted("nginx", None, None),
        Wanted("nvidia-driver", None, "535.247.01-1~deb12u1"),  # held ("hi ") counts as installed
        Wanted("libc6", "i386", None),
        Wanted("libc6", "amd64", "2.36-9+deb12u14"),
    ]
    assert unmet(asked, ROWS) == []


@pytest.mark.parametrize(
    ("asked", "missing"),
    [
        (Wanted("ssl-cert", None, None), ["ssl-cert"]),  # dpkg has never seen it
        (Wanted("nvidia-driver", None, "535.261.03-1"), ["nvidia-driver=535.261.03-1"]),  # another version
        (Wanted("cuda-toolkit-12-2", None, None), ["cuda-toolkit-12-2"]),  # unpacked, not configured
        (Wanted("nvidia-tesla-470-driver", None, None), ["nvidia-tesla-470-driver"]),  # removed, config left
        (Wanted("broken", None, None), ["broken"]),  # reinstall required
        (Wanted("libc6", "arm64", None), ["libc6"]),  # not for that architecture
    ],
)
def test_anything_else_goes_to_apt(asked: Wanted, missing: list[str]) -> None:
    assert unmet([Wanted("nginx", None, None), asked], ROWS) == missing


def test_the_query_quotes_every_name_and_asks_in_the_c_locale() -> None:
    command = query_command([Wanted("libc6", "i386", None), Wanted("g++", None, "12.2")])
    assert command.startswith("LC_ALL=C dpkg-query -W -f '${db:Status-Abbrev}\\t${Package}")
    assert command.endswith(" -- libc6:i386 g++")
