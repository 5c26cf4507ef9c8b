"""Tags per layer: `ansible-playbook site.yml --tags <layer>` lists that layer's tasks and preflight's, nothing else.

Read from Ansible itself (`--list-tasks`). Role argument validation (Ansible's own task, tagged always,
read-only) is listed under every tag and is not a layer's work.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml

from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = ansible_vars.tool("ansible-playbook")
ROLES = {p.name for p in (ROOT / "roles").iterdir() if p.is_dir()}
PREFLIGHT_PLAY = "Preflight (checks only, changes nothing)"
REBOOT_GATE_PLAY = "Reboot gate (one gated reboot when the host layer needs it)"
REPORT_PLAY = "Report what the box runs"
ARGSPEC = "Validating arguments against arg spec"
# The roles whose tasks each tag runs besides preflight (the shared gpubox role may appear in any).
LAYERS = {
    "preflight": set(),
    "driver": {"nvidia_driver"},
    "cuda": {"cuda_toolkit"},
    "tuning": {"gpu_tuning"},
    "env": {"python_env"},
    "model": {"model_store"},
    "firewall": {"firewall"},
    "front_door": {"front_door"},
    "service": {"vllm_service"},
    "metrics": {"metrics"},
    "report": set(),
    "fleet_cache": {"fleet_cache"},  # the LAN cache host (group fleet_cache), not a box layer
}
# Plays outside preflight that must list a task for the tag (the reboot gate guards the host layer).
PLAYS = {
    "driver": {REBOOT_GATE_PLAY},
    "cuda": {REBOOT_GATE_PLAY},
    "tuning": {REBOOT_GATE_PLAY},
    "report": {REPORT_PLAY},
}

_PLAY = re.compile(r"^  play #\d+ \([^)]*\): (?P<name>.*?)\tTAGS: \[(?P<tags>.*)\]$")
_TASK = re.compile(r"^ {6}(?P<task>.+?)\tTAGS: \[(?P<tags>.*)\]$")


@dataclass(frozen=True)
class Task:
    play: str
    role: str | None
    name: str
    tags: frozenset[str]


@cache
def list_tasks(*args: str) -> str:
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "site.yml", "-i", "inventories/production", "--list-tasks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@cache
def listed(*args: str) -> tuple[Task, ...]:
    stdout = list_tasks(*args)
    tasks, play = [], None
    for line in stdout.splitlines():
        if m := _PLAY.match(line):
            play = m["name"]
        elif (m := _TASK.match(line)) and play:
            role, sep, rest = m["task"].partition(" : ")
            name, role = (rest, role) if sep and role in ROLES else (m["task"], None)
            tags = frozenset(t.strip() for t in m["tags"].split(",") if t.strip())
            tasks.append(Task(play, role, name, tags))
    assert tasks, stdout
    return tuple(tasks)


def layer_tasks(tag: str) -> list[Task]:
    return [t for t in listed("--tags", tag) if t.play != PREFLIGHT_PLAY and not t.name.startswith(ARGSPEC)]


def test_every_preflight_task_is_tagged_always() -> None:
    preflight = [t for t in listed() if t.play == PREFLIGHT_PLAY]
    assert preflight
    assert all("always" in t.tags for t in preflight), [t.name for t in preflight if "always" not in t.tags]


@pytest.mark.parametrize("tag", sorted(LAYERS))
def test_a_tag_runs_preflight_and_its_layer_only(tag: str) -> None:
    everything = listed()
    selected = listed("--tags", tag)
    # preflight, whole, whatever the tag
    assert [t for t in selected if t.play == PREFLIGHT_PLAY] == [t for t in everything if t.play == PREFLIGHT_PLAY]
    layer = layer_tasks(tag)
    assert all(tag in t.tags for t in layer), [t for t in layer if tag not in t.tags]
    roles = {t.role for t in layer if t.role}
    assert LAYERS[tag] <= roles <= LAYERS[tag] | {"gpubox"}, roles
    for other, other_roles in LAYERS.items():
        if other != tag:
            assert not roles & other_roles, f"--tags {tag} lists tasks of {roles & other_roles}"
    assert PLAYS.get(tag, set()) <= {t.play for t in layer}
    # what the argument validation of other roles does is read-only and always tagged
    assert all("always" in t.tags for t in selected if t.name.startswith(ARGSPEC))


def test_model_tag_republishes_only_the_model() -> None:
    layer = layer_tasks("model")
    # besides model_store, only the play's start (playbooks/tasks/fresh_start.yml): its dpkg recovery
    dpkg = {t["name"] for t in yaml.safe_load((ROOT / "roles/gpubox/tasks/dpkg_recover.yml").read_text())}
    assert layer and {t.role for t in layer if t.role and t.name not in dpkg} == {"model_store"}
    assert {t.name for t in layer if t.role == "gpubox"} == dpkg
    assert {t.play for t in layer} == {"Serve the model with vLLM"}


def test_every_layer_task_has_a_layer_tag() -> None:
    untagged = [
        t for t in listed() if t.play != PREFLIGHT_PLAY and not t.name.startswith(ARGSPEC) and not t.tags & set(LAYERS)
    ]
    assert not untagged, untagged


def test_each_play_is_listed_once_and_the_shared_start_once_per_play() -> None:
    everything = listed()
    plays = [m["name"] for line in list_tasks().splitlines() if (m := _PLAY.match(line))]
    assert len(plays) == len(set(plays)), plays
    # playbooks/tasks/fresh_start.yml, imported by the host, metrics and serving plays, each once
    starts = [t.play for t in everything if t.name == "Forget the cached facts (they may predate a reboot)"]
    assert starts == ["Drive, tune and check the GPUs", "Export the box's metrics", "Serve the model with vLLM"]


def test_metrics_tag_sets_up_node_exporter_once_and_rewrites_the_textfile_after_vllm() -> None:
    layer = layer_tasks("metrics")
    role_plays = {t.play for t in layer if t.role == "metrics"}
    assert role_plays == {"Export the box's metrics"}, role_plays
    refresh = [t for t in layer if t.name.startswith("Write the box's metrics again")]
    assert [t.play for t in refresh] == ["Serve the model with vLLM"], refresh
