"""No decision on facts cached before a reboot (ansible.cfg: gathering = smart, a jsonfile cache for an hour).

Every play of the host and serving layers that runs roles starts with playbooks/tasks/fresh_start.yml
(the one copy of those pre-tasks): it drops the cache and gathers the facts the roles read before its
first role task, then finishes an interrupted dpkg; the GPU facts are read live by the gpu_facts module
(molecule/day2_driver proves a module loaded behind Ansible's back is seen).
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
FRESH_START = "tasks/fresh_start.yml"


def test_the_cache_this_guards_against_is_configured():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert cfg["defaults"]["gathering"] == "smart"
    assert int(cfg["defaults"]["fact_caching_timeout"]) > 0


def test_the_shared_start_drops_the_cache_then_gathers_then_finishes_dpkg():
    first, second, third = yaml.safe_load((ROOT / "playbooks" / FRESH_START).read_text())
    assert first.get("ansible.builtin.meta") == "clear_facts"
    subsets = second["ansible.builtin.setup"]["gather_subset"]
    # distribution (vars files), platform (kernel), local facts, virtualization (gpubox_in_container), and
    # network: the front door's self-signed certificate names the box's addresses (all_ipv4_addresses);
    # without it a client reaching the box by its LAN address could not verify it
    assert {"min", "virtual", "network"} <= set(subsets), subsets
    # static, so that the tags of the play's import reach every dpkg task
    assert third["ansible.builtin.import_role"] == {"name": "gpubox", "tasks_from": "dpkg_recover.yml"}


def _plays_with_roles(playbook: str) -> list[dict]:
    plays = [p for p in yaml.safe_load((ROOT / "playbooks" / playbook).read_text()) if p.get("roles")]
    assert plays
    return plays


@pytest.mark.parametrize("playbook", ["host.yml", "serving.yml"])
def test_plays_with_roles_start_from_the_box_as_it_is_now(playbook):
    for play in _plays_with_roles(playbook):
        assert play.get("gather_facts") is False, play["name"]  # smart gathering would take the cache
        first = play["pre_tasks"][0]
        assert first.get("ansible.builtin.import_tasks") == FRESH_START, play["name"]
        # the same tags as the play's roles and later tasks, so that a --tags run of any layer re-gathers too
        layer_tags = {t for r in play["roles"] for t in r.get("tags", [])}
        layer_tags |= {t for task in play.get("post_tasks", []) for t in task.get("tags", [])}
        assert set(first["tags"]) == layer_tags, play["name"]


def test_the_clearing_and_gathering_are_written_once():
    # the shared file is the only place a play of the playbooks drops the cache or runs setup before its roles
    for path in sorted((ROOT / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            for task in play.get("pre_tasks", []):
                assert "ansible.builtin.meta" not in task and "ansible.builtin.setup" not in task, (path.name, task)
