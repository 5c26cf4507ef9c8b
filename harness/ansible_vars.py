"""The variables of one host as Ansible itself resolves them (test helper).

Inventory (host_vars, group_vars directories), the defaults and vars of the play's roles and extra
vars are combined by Ansible's own VariableManager, and values are templated by Ansible's Templar,
so lookups (gpubox.gpubox.desired_state) and filters resolve exactly as in a run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEST_KEY = "unit-test-key-0123456789abcdef"


def tool(name: str) -> Path:
    """An Ansible command (``ansible``, ``ansible-playbook``) of the interpreter running the tests."""
    return Path(sys.executable).parent / name


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


def render_template(path: str | Path, variables: dict[str, Any]) -> str:
    """A role's template file rendered over ``variables`` alone as the template action renders it (its overrides:
    trim_blocks on, LF newlines; ansible/plugins/action/template.py)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    text = trust_as_template(Path(path).read_text())
    overrides = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(text, escape_backslashes=False, overrides=overrides)


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
    run_env = {k: v for k, v in (os.environ if env is None else env).items() if k != "ANSIBLE_CONFIG"}
    run_env.update(
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="json",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
    )
    argv = [str(tool("ansible")), "localhost", "-c", "local", "-m", module, "-a", args, *(["--check"] if check else [])]
    proc = subprocess.run(argv, env=run_env, cwd=cwd, capture_output=True, text=True)
    return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


_RECAP_LINE = re.compile(r"^(?P<host>\S+)\s*:\s*(?P<counts>ok=\d+.*)$", re.M)


def play_recap(output: str) -> dict[str, dict[str, int]]:
    """The last PLAY RECAP in an ansible-playbook run's output: per host, its counters (ok, changed,
    unreachable, failed, skipped, rescued, ignored). Empty when the output has none (the run died first)."""
    if "PLAY RECAP" not in output:
        return {}
    block = output.rsplit("PLAY RECAP", 1)[1]
    return {
        m["host"]: {name: int(n) for name, n in re.findall(r"(\w+)=(\d+)", m["counts"])}
        for m in _RECAP_LINE.finditer(block)
    }


def scenario_playbook(playbook: str | Path, *extra: str, callback: str | None = None, limit: str | None = None) -> Any:
    """``ansible-playbook`` against the running molecule scenario's inventory, from a scenario's tests.

    The checkout's ansible.cfg, roles and collection are used unless the environment (molecule's) names
    others; ``extra`` are ``-e`` pairs; ``callback`` sets the stdout callback (``json`` to read results).
    Returns the finished process (stdout and stderr captured as text).
    """
    project = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", ROOT))
    env = dict(os.environ)
    env.setdefault("ANSIBLE_CONFIG", str(project / "ansible.cfg"))
    env.setdefault("ANSIBLE_ROLES_PATH", str(project / "roles"))
    env.setdefault("ANSIBLE_COLLECTIONS_PATH", str(project / "collections"))
    if callback:
        env["ANSIBLE_STDOUT_CALLBACK"] = callback
    inventory = env.get("MOLECULE_INVENTORY_FILE") or env.get("MOLECULE_EPHEMERAL_DIRECTORY", "") + "/inventory"
    argv = [str(tool("ansible-playbook")), "-i", inventory, *(["-l", limit] if limit else []), str(playbook)]
    for pair in extra:
        argv += ["-e", pair]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=project)


def run_playbook(inventory: dict[str, Any], playbook: str, tmp: Path, timeout: float = 600) -> dict[str, Any]:
    """One ansible-playbook run of ``playbook`` over ``inventory`` (written under ``tmp``), this checkout's
    ansible.cfg and the json callback; per host, its results in task order, each with ``task`` (the task's
    name) added, and its ``stats`` (ok, failures, unreachable ...).

    One host per case, each with its own variables, makes one run check many cases: a failed host stops
    alone (no any_errors_fatal), so each host's results are its case's run."""
    (tmp / "hosts.json").write_text(json.dumps(inventory))
    (tmp / "play.yml").write_text(playbook)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["ANSIBLE_STDOUT_CALLBACK"] = "json"
    argv = [str(tool("ansible-playbook")), "-i", str(tmp / "hosts.json"), str(tmp / "play.yml")]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if "{" not in done.stdout:
        raise AssertionError(f"ansible-playbook printed no report ({done.returncode}):\n{done.stdout}{done.stderr}")
    report = json_report(done.stdout)
    out: dict[str, Any] = {host: {"results": [], "stats": stats} for host, stats in report["stats"].items()}
    for play in report["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                out[host]["results"].append({**result, "task": task["task"]["name"]})
    return out


def json_report(stdout: str) -> dict[str, Any]:
    """The json callback's report out of a run's standard output (lines a callback such as profile_tasks
    prints before or after it are skipped)."""
    report, _ = json.JSONDecoder().raw_decode(stdout[stdout.index("{") :])
    return report


def first_failure(run: dict[str, Any]) -> dict[str, Any] | None:
    """The first failed result of one host of run_playbook (None: the host failed nowhere)."""
    return next((r for r in run["results"] if r.get("failed") or r.get("unreachable")), None)
