"""No decision on facts cached before a reboot (ansible.cfg: gathering = smart, a jsonfile cache for an hour).

Every play of the host and serving layers that runs roles drops the cache and gathers the facts the
roles read before its first role task; the GPU facts are read live by the gpu_facts module
(molecule/day2_driver proves a module loaded behind Ansible's back is seen).
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_cache_this_guards_against_is_configured():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert cfg["defaults"]["gathering"] == "smart"
    assert int(cfg["defaults"]["fact_caching_timeout"]) > 0


@pytest.mark.parametrize("playbook", ["host.yml", "serving.yml"])
def test_plays_with_roles_drop_cached_facts_and_gather_first(playbook):
    plays = [p for p in yaml.safe_load((ROOT / "playbooks" / playbook).read_text()) if p.get("roles")]
    assert plays
    for play in plays:
        assert play.get("gather_facts") is False, play["name"]  # smart gathering would take the cache
        first, second = play["pre_tasks"][:2]
        assert first.get("ansible.builtin.meta") == "clear_facts", play["name"]
        subsets = second["ansible.builtin.setup"]["gather_subset"]
        # distribution (vars files), platform (kernel), local facts, virtualization (gpubox_in_container)
        assert "min" in subsets and "virtual" in subsets, subsets
        # the same tags as the play's roles, so that a --tags run of any layer re-gathers too
        role_tags = {t for r in play["roles"] for t in r.get("tags", [])}
        assert set(first["tags"]) == set(second["tags"]) == role_tags


def test_the_serving_play_gathers_the_addresses_the_front_door_names():
    # the front door's self-signed certificate names the box's addresses (all_ipv4_addresses): without
    # the network subset a client reaching the box by its LAN address could not verify it
    serving = yaml.safe_load((ROOT / "playbooks/serving.yml").read_text())[0]["pre_tasks"][1]
    assert "network" in serving["ansible.builtin.setup"]["gather_subset"]
