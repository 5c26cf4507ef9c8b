"""Two hops from site.yml to a behaviour: site.yml -> playbooks/<stage>.yml -> roles/<role>.

site.yml names the stage playbooks it imports, in order; each stage playbook holds plays only (no
further import), so every play of site.yml is written in the file site.yml names. No stage and no play
is imported twice; the metrics role is set up by one play; the reboot gate is a play of its own, named
so. Read from the YAML; tests/integration/test_tags.py reads the same from Ansible's --list-tasks.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["preflight.yml", "fleet_cache.yml", "host.yml", "serving.yml", "fleet_cache_pins.yml", "report.yml"]


def _load(path: Path) -> list[dict]:
    return yaml.safe_load(path.read_text()) or []


def _site_imports() -> list[str]:
    return [entry["ansible.builtin.import_playbook"] for entry in _load(ROOT / "site.yml")]


def _site_plays() -> list[tuple[str, dict]]:
    return [(stage, play) for stage in _site_imports() for play in _load(ROOT / stage)]


def test_site_yml_imports_the_stage_playbooks_directly_in_order():
    assert _site_imports() == [f"playbooks/{name}" for name in STAGES]
    assert not (ROOT / "playbooks" / "site.yml").exists()


def test_a_stage_playbook_holds_plays_only():
    for stage, play in _site_plays():
        assert "hosts" in play, f"{stage}: {play.get('name')} is not a play (an import would be a third hop)"
        assert not any(k.endswith("import_playbook") for k in play), stage


def test_no_stage_and_no_play_is_imported_twice():
    imports = _site_imports()
    assert len(imports) == len(set(imports)), imports
    names = [play["name"] for _, play in _site_plays()]
    assert len(names) == len(set(names)), names


def test_one_play_sets_up_the_metrics_and_it_follows_the_reboot_gate():
    plays = [play for _, play in _site_plays()]
    names = [play["name"] for play in plays]
    with_metrics = [play["name"] for play in plays if any(r.get("role") == "metrics" for r in play.get("roles", []))]
    assert with_metrics == ["Export the box's metrics"], with_metrics
    gate = next(i for i, name in enumerate(names) if name.startswith("Reboot gate"))
    host = names.index("Drive, tune and check the GPUs")
    assert host < gate < names.index("Export the box's metrics") < names.index("Serve the model with vLLM")


def test_the_serving_play_writes_the_textfile_again_after_its_roles_not_in_a_play_of_its_own():
    serving = next(play for _, play in _site_plays() if play["name"] == "Serve the model with vLLM")
    refresh = serving["post_tasks"][-1]["ansible.builtin.include_role"]
    assert (refresh["name"], refresh["tasks_from"]) == ("metrics", "textfile.yml")
    assert serving["post_tasks"][-1]["tags"] == ["metrics"]


def test_the_reboot_gate_is_a_play_named_so_that_runs_the_file_named_so():
    gates = [play for _, play in _site_plays() if "reboot" in play["name"].lower()]
    assert len(gates) == 1, [g["name"] for g in gates]
    (gate,) = gates
    assert gate["name"].startswith("Reboot gate")
    (task,) = gate["tasks"]
    assert task["ansible.builtin.import_role"] == {"name": "gpubox", "tasks_from": "reboot_gate.yml"}
    assert (ROOT / "roles" / "gpubox" / "tasks" / "reboot_gate.yml").is_file()
    assert set(gate["tags"]) == {"driver", "cuda", "tuning"}


def test_the_rolling_rebuild_runs_the_top_level_site_yml():
    # rebuild.yml lives in playbooks/ (a box's turn in playbooks/tasks/rebuild_turn.yml, where playbook_dir is still
    # playbooks/): the entry point is one directory up
    text = (ROOT / "playbooks" / "tasks" / "rebuild_turn.yml").read_text()
    assert "(playbook_dir | dirname) ~ '/site.yml'" in text
    assert "playbook_dir ~ '/site.yml'" not in text


def test_nothing_names_the_removed_playbooks_site_yml():
    here = str(Path(__file__).relative_to(ROOT))
    proc = subprocess.run(
        ["git", "grep", "-n", "playbooks/site.yml", "--", ".", ":!CHANGELOG.md", f":!{here}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1 and not proc.stdout, proc.stdout
