"""Who may use the LAN cache and what it pins (plugins/module_utils/fleet_cache_access.py, issue 31 item 6).

The pure functions and their filter glue; the rendered nginx file runs for real in
test_fleet_cache_nginx.py, the role's refusal before any change in test_fleet_cache_inputs.py.
"""

from __future__ import annotations

import json
import re

import pytest

from ansible_collections.gpubox.gpubox.plugins.filter import fleet_cache_filters as filters
from ansible_collections.gpubox.gpubox.plugins.module_utils import fleet_cache_access as access

COMMIT = "0123456789abcdef" * 2 + "01234567"
OTHER = "f" * 40


# --------------------------------------------------------------------------- a box's address


@pytest.mark.parametrize(
    ("box", "expect"),
    [
        (access.BoxSeen("b", ansible_host="10.0.0.11", default_ipv4="10.9.9.9"), ["10.0.0.11/32"]),  # inventory wins
        (access.BoxSeen("b", ansible_host="127.0.0.1", default_ipv4="10.231.94.11"), ["10.231.94.11/32"]),  # a tunnel
        (access.BoxSeen("b", ansible_host="box-a.lan", default_ipv4="10.0.0.12"), ["10.0.0.12/32"]),  # a name
        (access.BoxSeen("10.0.0.13"), ["10.0.0.13/32"]),  # the inventory name is the address
        (access.BoxSeen("b", ansible_host="2001:db8::5"), ["2001:db8::5/128"]),
        (access.BoxSeen("b", ansible_host="[2001:db8::5]"), ["2001:db8::5/128"]),
        (access.BoxSeen("b", ansible_host="::ffff:10.0.0.14"), ["10.0.0.14/32"]),  # IPv4-mapped
        (
            access.BoxSeen("b", ansible_host="box", default_ipv4="10.0.0.15", default_ipv6="2001:db8::15"),
            ["10.0.0.15/32", "2001:db8::15/128"],
        ),
        (access.BoxSeen("b", ansible_host="box", default_ipv4="10.0.0.16", default_ipv6="fe80::1"), ["10.0.0.16/32"]),
        (access.BoxSeen("b", ansible_host="127.0.0.1"), []),
        (access.BoxSeen("b", ansible_host="0.0.0.0"), []),
        (access.BoxSeen("b", ansible_host="box-a.lan"), []),
    ],
)
def test_a_boxs_address_is_its_ansible_host_else_its_default_addresses(box: access.BoxSeen, expect: list[str]) -> None:
    assert access.box_addresses(box) == expect


# --------------------------------------------------------------------------- who may use the cache


def test_the_default_is_the_boxes_and_nothing_else() -> None:
    boxes = [access.BoxSeen("b2", ansible_host="10.0.0.12"), access.BoxSeen("b1", ansible_host="10.0.0.11")]
    got = access.clients(boxes, [])
    assert got == {
        "networks": ["10.0.0.11/32", "10.0.0.12/32"],
        "ipv4": ["10.0.0.11/32", "10.0.0.12/32"],
        "ipv6": [],
        "boxes": {"b1": ["10.0.0.11/32"], "b2": ["10.0.0.12/32"]},
        "errors": [],
    }


def test_an_operators_networks_are_added_once() -> None:
    got = access.clients([access.BoxSeen("b1", ansible_host="10.0.0.11")], ["10.0.0.11", "192.168.7.0/24", "fc00::/7"])
    assert got["networks"] == ["10.0.0.11/32", "192.168.7.0/24", "fc00::/7"] and got["errors"] == []


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        (["0.0.0.0/0"], "fleet_cache_allowed_networks[0] is 0.0.0.0/0, which admits every address"),
        (["10.0.0.0/8", "::/0"], "fleet_cache_allowed_networks[1] is ::/0, which admits every address"),
        (["0.0.0.0/1"], "fleet_cache_allowed_networks[0] is 0.0.0.0/1, which admits public addresses too"),
        (["8.0.0.0/7"], "which admits public addresses too"),
        (["fc00::/6"], "which admits public addresses too"),
        (["lan"], "fleet_cache_allowed_networks[0] is 'lan', not a network in CIDR notation"),
        (["10.1.2.3/8"], "has host bits set: write 10.0.0.0/8"),
        ("10.0.0.0/8", "fleet_cache_allowed_networks must be a list"),
        ([None], "fleet_cache_allowed_networks[0] must be a network"),
    ],
)
def test_a_bad_network_is_refused_naming_the_variable(extra: object, expect: str) -> None:
    got = access.clients([access.BoxSeen("b1", ansible_host="10.0.0.11")], extra)
    assert len(got["errors"]) == 1 and expect in got["errors"][0], got["errors"]
    assert "\n" not in got["errors"][0]


def test_the_widest_private_ranges_are_accepted() -> None:
    """The rule's edge: 10.0.0.0/8 and fc00::/7 are private ranges an operator may name whole."""
    assert access.clients([], ["10.0.0.0/8", "fc00::/7"])["errors"] == []


def test_no_box_and_no_network_is_refused_naming_the_variable() -> None:
    (error,) = access.clients([], [])["errors"]
    assert error.startswith("fleet_cache_allowed_networks is empty and group gpu_boxes has no hosts")
    assert "Fix: put the boxes in gpu_boxes" in error


def test_a_box_with_no_address_is_refused_naming_it_and_why() -> None:
    boxes = [
        access.BoxSeen("box-a", ansible_host="box-a.lan", problem="unreachable (ssh: Could not resolve hostname)"),
        access.BoxSeen("box-b", ansible_host="10.0.0.12"),
    ]
    got = access.clients(boxes, ["192.168.7.0/24"])
    (error,) = got["errors"]
    assert error.startswith("gpu_boxes host box-a has no address the cache can admit: its ansible_host 'box-a.lan'")
    assert "unreachable (ssh: Could not resolve hostname)" in error and "set ansible_host of box-a" in error
    assert got["boxes"]["box-a"] == []


# --------------------------------------------------------------------------- the filter's glue


def test_the_filter_reads_hostvars_and_the_gathering_results() -> None:
    hostvars = {
        "b1": {"ansible_host": "10.0.0.11"},
        "b2": {"ansible_host": "127.0.0.1", "ansible_facts": {"default_ipv4": {"address": "10.231.94.12"}}},
        "b3": {"ansible_host": "b3.lan", "ansible_facts": {}},
        "10.0.0.14": {},
    }
    gathered = {
        "results": [
            {"item": "b2", "ansible_facts": {}},
            {"item": "b3", "unreachable": True, "msg": "Failed to connect to the host via ssh:\n timed out"},
        ]
    }
    got = filters.fleet_cache_clients(["b1", "b2", "b3", "10.0.0.14"], hostvars, [], gathered)
    assert got["boxes"] == {"10.0.0.14": ["10.0.0.14/32"], "b1": ["10.0.0.11/32"], "b2": ["10.231.94.12/32"], "b3": []}
    (error,) = got["errors"]
    assert "gpu_boxes host b3" in error and "unreachable (Failed to connect to the host via ssh: timed out)" in error


# --------------------------------------------------------------------------- pinned models


def lock(models: dict) -> str:
    return json.dumps({"schema": 1, "models": models})


def entry(commit: str = COMMIT, files: object = 3, total: object = 3000) -> dict:
    return {"commit": commit, "endpoint": "https://hub.example", "content_sha256": "a" * 64, "files": files,
            "total_bytes": total}  # fmt: skip


def test_each_locked_commit_gets_a_zone_bounded_by_its_bytes() -> None:
    got = access.pinned(
        {
            "/inv/models.lock.json": lock(
                {"Qwen/Qwen2.5-7B@master": entry(total=15_000_000_000, files=12), "a/b@v1": entry(OTHER)}
            )
        }
    )
    assert got["errors"] == [] and got["unsized"] == []
    zones = {zone["model"]: zone for zone in got["zones"]}
    assert zones["Qwen/Qwen2.5-7B"]["max_size"] == 15_000_000_000 + 13 * access.FILE_OVERHEAD
    assert zones["Qwen/Qwen2.5-7B"]["keys"] == ["Qwen/Qwen2.5-7B@master"]
    assert zones["a/b"]["commit"] == OTHER and zones["a/b"]["id"] == access.zone_id("a/b", OTHER)
    assert len({zone["id"] for zone in got["zones"]}) == 2


def test_one_commit_named_twice_is_one_zone() -> None:
    """A branch and a tag at one commit, in two lock files, and the model's case differing: one zone."""
    got = access.pinned(
        {
            "/a/models.lock.json": lock({"Org/M@master": entry()}),
            "/b/models.lock.json": lock({"org/m@v1": entry(files="3", total="3000")}),
        }
    )
    (zone,) = got["zones"]
    assert zone["keys"] == ["Org/M@master", "org/m@v1"] and zone["bytes"] == 3000


def test_an_entry_without_sizes_is_not_pinned_and_says_so() -> None:
    old = {"commit": COMMIT, "endpoint": "https://hub.example"}  # written before the lock recorded sizes
    got = access.pinned({"/inv/models.lock.json": lock({"a/b@master": old, "c/d@master": entry(total=-1)})})
    assert got["zones"] == [] and got["errors"] == []
    assert len(got["unsized"]) == 2 and "Fix: make lock-models" in got["unsized"][0]


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("{not json", "gpubox_model_lock_file: the model lock /inv/models.lock.json is not JSON"),
        (json.dumps({"schema": 2, "models": {}}), "must be a JSON object with schema 1"),
        (lock({"a/b@master": {"commit": "short"}}), "has an unusable entry 'a/b@master'"),
        (lock({"a/../b@master": entry()}), "whose model is not OWNER/NAME"),
        (lock({"a@master": entry()}), "whose model is not OWNER/NAME"),
    ],
)
def test_a_lock_that_cannot_be_used_is_refused_naming_it(text: str, expect: str) -> None:
    got = access.pinned({"/inv/models.lock.json": text})
    assert got["zones"] == [] and len(got["errors"]) == 1 and expect in got["errors"][0], got


def test_the_zone_regex_matches_exactly_the_pinned_commits_files() -> None:
    """nginx's ~* (PCRE, case-insensitive) on "$uri|$arg_Revision"; Python's re reads this pattern alike."""
    pattern = re.compile(access.pinned_key_regex({"model": "Qwen/Qwen2.5-7B", "commit": COMMIT}), re.I)
    assert pattern.search(f"/api/v1/models/Qwen/Qwen2.5-7B/repo|{COMMIT}")
    assert pattern.search(f"/api/v1/models/qwen/qwen2.5-7b/repo|{COMMIT}")
    for other in (
        f"/api/v1/models/Qwen/Qwen2.5-7B/repo|{OTHER}",
        f"/api/v1/models/Qwen/Qwen2x5-7B/repo|{COMMIT}",  # the dot is a dot
        f"/api/v1/models/Qwen/Qwen2.5-7B-Instruct/repo|{COMMIT}",
        f"/api/v1/models/Qwen/Qwen2.5-7B/repo|{COMMIT}0",
    ):
        assert not pattern.search(other), other
    with pytest.raises(ValueError):
        access.pinned_key_regex({"model": 'a/b"; x', "commit": COMMIT})
