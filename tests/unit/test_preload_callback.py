"""plugins/callback/preload.py: the controller loads the collection's filter, lookup and action plugins once
when a playbook starts, so that the worker forked for each task inherits them instead of reading and compiling
them again (Ansible's collection loader keeps no bytecode). What it saves is a figure in
bench/harness-figures.json, not a test; here: that it is enabled wherever our playbooks run, and that after it
every plugin of the collection is already loaded in the controller's process, with the control that a fresh
controller has none of them."""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "plugins"

# Run in a fresh interpreter: the unit suite's own process may have imported the collection's code already.
PROBE = r"""
import json, sys
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([sys.argv[1]])
if sys.argv[2] == "preload":
    from ansible.plugins.loader import callback_loader
    callback_loader.get("gpubox.gpubox.preload").v2_playbook_on_start(None)
prefix = "ansible_collections.gpubox.gpubox.plugins."
print(json.dumps(sorted(name[len(prefix):] for name in sys.modules if name.startswith(prefix))))
"""


def loaded(mode: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(ROOT / "collections"), mode],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def plugin_modules() -> set[str]:
    return {f"{kind}.{path.stem}" for kind in ("filter", "lookup", "action") for path in (PLUGINS / kind).glob("*.py")}


def test_the_callback_loads_every_filter_lookup_and_action_plugin_of_the_collection() -> None:
    expected = plugin_modules()
    assert {"filter.gpubox_filters", "lookup.desired_state", "action.apt_present"} <= expected
    after = loaded("preload")
    assert expected <= after, sorted(expected - after)
    # The module_utils they import come with them (the bulk of what a worker would compile).
    assert {"module_utils.capacity_planner", "module_utils.preflight_checks"} <= after


def test_control_a_controller_without_it_has_none_of_them_loaded() -> None:
    assert loaded("none") & plugin_modules() == set()


def test_it_is_enabled_in_the_ansible_cfg_every_run_reads() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    enabled = [name.strip() for name in cfg["defaults"]["callbacks_enabled"].split(",")]
    assert "gpubox.gpubox.preload" in enabled
    # molecule runs with this file (ANSIBLE_CONFIG) and sets no callback list of its own that would replace it.
    molecule = (ROOT / ".config" / "molecule" / "config.yml").read_text()
    assert "ANSIBLE_CONFIG: ${MOLECULE_PROJECT_DIRECTORY}/ansible.cfg" in molecule
    assert "ANSIBLE_CALLBACKS_ENABLED" not in molecule
