"""The variables of one host as Ansible itself resolves them (test helper).

Inventory (host_vars, group_vars directories), the defaults and vars of the play's roles and extra
vars are combined by Ansible's own VariableManager, and values are templated by Ansible's Templar,
so lookups (gpubox.gpubox.desired_state) and filters resolve exactly as in a run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEST_KEY = "unit-test-key-0123456789abcdef"


def templar_for(
    host: str,
    inventory: str | Path = ROOT / "inventories" / "production",
    roles: tuple[str, ...] = ("gpubox",),
    extra_vars: dict[str, Any] | None = None,
    groups: tuple[str, ...] = (),
):
    """(templar, variables) for ``host`` in a play of ``roles``. The API key defaults to TEST_KEY.

    ``groups``: add ``host`` to these inventory groups first (a box of a topology with no host yet).
    """
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.play import Play
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    # The plugin loader is set up once, by tests/unit/conftest.py.
    loader = DataLoader()
    loader.set_basedir(str(ROOT))
    inv = InventoryManager(loader=loader, sources=[str(inventory)])
    for group in groups:
        inv.add_host(host, group=group)
    vm = VariableManager(loader=loader, inventory=inv)
    extra = {"vault_gpubox_api_key": TEST_KEY}
    extra.update(extra_vars or {})
    vm._extra_vars = extra
    play = Play.load({"hosts": host, "gather_facts": False, "roles": list(roles)}, variable_manager=vm, loader=loader)
    variables = vm.get_vars(play=play, host=inv.get_host(host))
    return Templar(loader=loader, variables=variables), variables


def scenario_inventory(scenario: str, out: Path) -> Path:
    """A copy of the inventory molecule builds for ``scenario`` (written under ``out``): its platforms flat under
    ``all`` in their groups, as molecule writes them, with molecule/shared/group_vars and the scenario's host_vars
    (the links of .config/molecule/config.yml). For rendering what a scenario's box runs without the box."""
    import yaml

    platforms = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())["platforms"]
    groups: dict[str, dict] = {}
    for platform in platforms:
        for group in platform.get("groups", []):
            groups.setdefault(group, {"hosts": {}})["hosts"][platform["name"]] = None
    out.mkdir(parents=True, exist_ok=True)
    (out / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": groups}}))
    (out / "group_vars").symlink_to(ROOT / "molecule" / "shared" / "group_vars")
    host_vars = ROOT / "molecule" / scenario / "host_vars"
    if host_vars.is_dir():
        (out / "host_vars").symlink_to(host_vars)
    return out


def render(host: str, expression: str, **kwargs: Any) -> Any:
    """Template one Jinja expression for ``host``; plain Python types come back."""
    from ansible.template import trust_as_template

    templar, _ = templar_for(host, **kwargs)
    value = templar.template(trust_as_template("{{ " + expression + " }}"))
    return json.loads(json.dumps(value))


def facts(host: str, **kwargs: Any) -> dict[str, Any]:
    """The raw (templated, unchecked) gpubox_* facts of ``host``, keyed by variable name."""
    from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks

    templar, variables = templar_for(host, **kwargs)
    out = {name: templar.template(variables[name]) for name in state_checks.FACTS if name in variables}
    return json.loads(json.dumps(out))


def run_module(module: str, args: str, cwd: Path, check: bool = False, env: dict[str, str] | None = None) -> dict:
    """One module of this checkout's collection through `ansible localhost -m` (the real AnsiballZ path).

    ``env`` is the base environment (default: this process's). No ansible.cfg is read, so the json
    callback prints plain results; the host's result comes back.
    """
    import os
    import subprocess
    import sys

    ansible = Path(sys.executable).parent / "ansible"
    run_env = {k: v for k, v in (os.environ if env is None else env).items() if k != "ANSIBLE_CONFIG"}
    run_env.update(
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
    )
    argv = [str(ansible), "localhost", "-c", "local", "-m", module, "-a", args, *(["--check"] if check else [])]
    proc = subprocess.run(argv, env=run_env, cwd=cwd, capture_output=True, text=True)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
