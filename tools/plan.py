#!/usr/bin/env python3
"""Plan vLLM GPU memory for the boxes of an inventory, offline (no box needed).

    python tools/plan.py                                  # the topology groups of inventories/production
    python tools/plan.py -i inventories/production -l gpu_2x3090
    python tools/plan.py -l gpu-box -e gpubox_max_model_len=16384

The inventory is read the way Ansible reads it (ansible.inventory.manager.InventoryManager and
ansible.vars.manager.VariableManager): host_vars, group_vars files and directories, the group tree,
and extra vars from -e (key=value, YAML/JSON or @file) on top. The lowest layer is the gpubox role's
defaults (roles/gpubox/defaults/main.yml: the one default of every fact), as in a play.

The limit (-l, or the positional argument) is a comma-separated list of groups and hosts; without one,
the topology groups (children of gpu_boxes) are planned. A group prints one plan when its hosts share
every fact (one per set of hosts otherwise); a group without hosts is planned from its variables.

Each box's desired state is checked first by plugins/module_utils/state_checks.py, then planned by
the same code as preflight (model_catalog.planned_model, capacity_planner.inventory_inputs and
capacity_planner.plan). The API key is neither read nor printed: the plan does not need it.

Exit status: 0 when every plan fits; 1 when a fact is invalid (each error names the variable) or a
plan does not fit; 2 for a usage error (unknown host or group, unreadable inventory, vault).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible import context
from ansible.cli import CLI
from ansible.errors import AnsibleError
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.parsing.vault import VaultSecretsContext
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar
from ansible.utils.context_objects import CLIArgs
from ansible.utils.vars import combine_vars, load_extra_vars
from ansible.vars.manager import VariableManager

if __name__ == "__main__":
    # As every ansible CLI does before anything else: without the collection loader an inventory's
    # lookup('ansible.builtin.env', ...) is "not found". Before this checkout's collection is imported, so
    # that it is imported through the loader too (imported as a module, by the unit tests, plan.py leaves
    # the process's imports as they are).
    init_plugin_loader()

from ansible_collections.gpubox.gpubox.plugins.module_utils import capacity_planner, model_catalog, stacks, state_checks

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = ROOT / "inventories" / "production"
DEFAULTS = ROOT / "roles" / "gpubox" / "defaults" / "main.yml"
# The group whose children are the topology groups (inventories/production/hosts.yml).
TOPOLOGY_PARENT = "gpu_boxes"
# The name of the stand-in host that plans a group without hosts from its variables.
GROUP_STAND_IN = "__gpubox_plan_{}__"


class UsageError(Exception):
    """Unknown host or group, unreadable inventory, missing vault secret (exit 2)."""


class PlanError(Exception):
    """The desired state of a box is invalid or its model cannot be planned (exit 1)."""


@dataclass
class Unit:
    """One plan to print: the hosts (or the group) that share the same checked facts."""

    label: str
    values: dict[str, Any]
    errors: list[str] = field(default_factory=list)


@dataclass
class Session:
    loader: DataLoader
    inventory: InventoryManager
    variables: VariableManager
    defaults: dict[str, Any]
    source: str


# --------------------------------------------------------------------------- reading the inventory


def open_inventory(
    inventory: str | Path = INVENTORY,
    extra_vars: Sequence[str] = (),
    vault_ids: Sequence[str] = (),
    vault_password_files: Sequence[str] = (),
    ask_vault_pass: bool = False,
) -> Session:
    """Ansible's loader, inventory and variable manager for ``inventory`` with ``extra_vars`` (-e)."""
    source = str(inventory)
    if not Path(source).exists():
        raise UsageError(f"inventory {source} does not exist: pass -i (make plan INVENTORY=...)")
    # Extra vars reach VariableManager the way ansible-playbook passes them: through the CLI context.
    # load_extra_vars() keeps the first result for the process; each session reads its own.
    context.CLIARGS = CLIArgs({"extra_vars": tuple(extra_vars)})
    if hasattr(load_extra_vars, "extra_vars"):
        del load_extra_vars.extra_vars
    loader = DataLoader()
    try:
        secrets = CLI.setup_vault_secrets(
            loader,
            vault_ids=list(vault_ids),
            vault_password_files=list(vault_password_files),
            ask_vault_pass=ask_vault_pass,
            auto_prompt=False,
            # The process-wide context (inline !vault values) is set once, as ansible-playbook does.
            initialize_context=VaultSecretsContext.current(optional=True) is None,
        )
        loader.set_vault_secrets(secrets)
        manager = InventoryManager(loader=loader, sources=[source])
        variables = VariableManager(loader=loader, inventory=manager)
        defaults = loader.load_from_file(str(DEFAULTS), trusted_as_template=True) or {}
    except AnsibleError as exc:
        raise UsageError(_ansible_message(exc, source)) from None
    if not set(manager.groups) - {"all", "ungrouped"} and not manager.hosts:
        raise UsageError(f"inventory {source} has no groups and no hosts: is it an Ansible inventory?")
    return Session(loader, manager, variables, dict(defaults), source)


def _ansible_message(exc: AnsibleError, source: str) -> str:
    text = getattr(exc, "message", None) or str(exc)
    if "vault" in text.lower():
        return (
            f"inventory {source} holds Ansible Vault data ({text.strip()}): give its password with "
            "--vault-password-file FILE (make plan VAULT_PASSWORD_FILE=FILE), --vault-id or --ask-vault-pass "
            "(or set ANSIBLE_VAULT_PASSWORD_FILE); the plan never reads the API key"
        )
    return f"inventory {source} could not be read: {text.strip()}"


def topology_groups_of(session: Session) -> list[str]:
    parent = session.inventory.groups.get(TOPOLOGY_PARENT)
    return sorted(g.name for g in parent.child_groups) if parent else []


def _known(session: Session) -> str:
    groups = sorted(set(session.inventory.groups) - {"all", "ungrouped"})
    topology = set(topology_groups_of(session))
    named = [f"{g} (topology)" if g in topology else g for g in groups]
    hosts = sorted(session.inventory.hosts)
    return f"groups {', '.join(named) or 'none'}; hosts {', '.join(hosts) or 'none'}"


def targets(session: Session, limit: str | None) -> list[tuple[str, list[str], bool]]:
    """(name, hosts, is_group) for each group or host of the limit; a group without hosts gets a stand-in."""
    names = [n.strip() for n in (limit or "").replace(":", ",").split(",") if n.strip()]
    if not names:
        names = topology_groups_of(session)
        if not names:
            raise UsageError(
                f"inventory {session.source} has no {TOPOLOGY_PARENT} group with topology groups: "
                f"name a group or host with -l ({_known(session)})"
            )
    resolved: list[tuple[str, list[str], bool]] = []
    for name in names:
        if name in session.inventory.groups:
            hosts = [h.name for h in session.inventory.groups[name].get_hosts()]
            resolved.append((name, hosts, True))
        elif name in session.inventory.hosts:
            resolved.append((name, [name], False))
        else:
            raise UsageError(f"unknown host or group {name!r} in inventory {session.source}: {_known(session)}")
    # Stand-ins are added after every name is resolved, so that no other group lists them.
    for name, hosts, is_group in resolved:
        if is_group and not hosts:
            stand_in = GROUP_STAND_IN.format(name)
            session.inventory.add_host(stand_in, group=name)
            hosts.append(stand_in)
    return resolved


def _plain(value: Any) -> Any:
    """Ansible's tagged and lazy containers as plain Python values."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


def host_facts(session: Session, host: str) -> tuple[dict[str, Any], list[str]]:
    """The desired-state facts of one host (templated, not yet checked) and any templating errors.

    Precedence as in a play of the gpubox role: role defaults < inventory (group_vars, host_vars) < -e.
    The API key (a template over vault_gpubox_api_key) is left out: the plan neither needs nor shows it.
    """
    try:
        inventory_vars = session.variables.get_vars(host=session.inventory.get_host(host), include_hostvars=False)
    except AnsibleError as exc:  # group_vars/host_vars are read here: a vault file without its password
        raise UsageError(_ansible_message(exc, session.source)) from None
    merged = combine_vars(session.defaults, inventory_vars)
    templar = Templar(loader=session.loader, variables=merged)
    values: dict[str, Any] = {}
    errors: list[str] = []
    for name in state_checks.FACTS:
        if name in state_checks.SECRET_FACTS or name not in merged:
            continue
        try:
            values[name] = _plain(templar.template(merged[name]))
        except AnsibleError as exc:
            text = (getattr(exc, "message", None) or str(exc)).strip().splitlines()[0]
            errors.append(f"{name} could not be templated: {text}")
    return values, errors


def check(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """state_checks.validate() without the API key: (normalized facts, errors naming the variable)."""
    state = state_checks.validate(values)
    secret = tuple(state_checks.SECRET_FACTS)
    errors = [line for line in state.errors if not line.startswith(secret)]
    public = {k: v for k, v in state.values.items() if k not in state_checks.SECRET_FACTS}
    return public, errors


def units(session: Session, limit: str | None) -> list[Unit]:
    """The plans to print, in the order of the limit: one per group whose hosts share every fact."""
    out: list[Unit] = []
    for name, hosts, is_group in targets(session, limit):
        by_facts: dict[str, Unit] = {}
        members: dict[str, list[str]] = {}
        for host in hosts:
            raw, template_errors = host_facts(session, host)
            values, errors = check(raw)
            errors = template_errors + errors
            key = json.dumps([values, errors], sort_keys=True, default=str)
            if key not in by_facts:
                by_facts[key] = Unit("", values, errors)
                members[key] = []
            members[key].append(host)
        for key, unit in by_facts.items():
            shown = [h for h in members[key] if h != GROUP_STAND_IN.format(name)]
            if not is_group:
                unit.label = f"host {name}"
            elif not shown:
                unit.label = f"group {name} (no hosts: planned from the group's variables)"
            elif len(by_facts) == 1:
                unit.label = f"group {name} ({len(shown)} host{'s' if len(shown) > 1 else ''}: {', '.join(shown)})"
            else:
                unit.label = f"group {name}, host{'s' if len(shown) > 1 else ''} {', '.join(shown)}"
            out.append(unit)
    return out


# --------------------------------------------------------------------------- planning


def planner_inputs(hostvars: Mapping[str, Any]) -> tuple[dict, dict, dict]:
    """(model, gpu, serving) inputs of capacity_planner.plan() from checked facts, as preflight maps them."""
    gpu, serving = capacity_planner.inventory_inputs(dict(hostvars))
    return model_catalog.planned_model(dict(hostvars)), gpu, serving


def plan(values: Mapping[str, Any]) -> dict[str, Any]:
    try:
        model, gpu, serving = planner_inputs(values)
    except (model_catalog.UnknownModelError, ValueError, TypeError) as exc:
        raise PlanError(str(exc).strip("\"'")) from None
    return capacity_planner.plan(
        model, gpu, serving, engine=stacks.engine_of(dict(values)), stack=dict(values).get("gpubox_stack")
    )


def readme_cells(result: Mapping[str, Any]) -> list[str]:
    """The figures of a topology's row in README.md's table (weights/GPU, KV cache/GPU, KV tokens,
    concurrency at full length), as tests/unit/test_plan.py holds them equal to the plan."""
    return [
        f"{result['weights_gib_per_gpu']:.2f} GiB",
        f"{result['kv_cache_gib_per_gpu']:.2f} GiB",
        f"{result['kv_tokens']:,}",
        f"{result['max_concurrency']:.1f}x",
    ]


def describe(values: Mapping[str, Any]) -> str:
    v = values
    return (
        f"{v['gpubox_model_id']} on {v['gpubox_gpu_count']} x {v['gpubox_gpu_name']} "
        f"({v['gpubox_gpu_memory_mib']} MiB); tp {v['gpubox_tensor_parallel_size']}, "
        f"util {v['gpubox_gpu_memory_utilization']}, max_model_len {v['gpubox_max_model_len']}, "
        f"max_num_seqs {v['gpubox_max_num_seqs']}, '{v['gpubox_served_model_name']}' on :{v['gpubox_port']}"
    )


def stack_lines(values: Mapping[str, Any]) -> list[str]:
    """Which stack the box runs, its support ends, open advisories and engine (plugins/module_utils/stacks.py)."""
    name = values["gpubox_stack"]
    return [*stacks.summary_lines(name), f"  engine: {stacks.get(name).engine} (vLLM {stacks.get(name).vllm})"]


# --------------------------------------------------------------------------- compatibility helpers


def topology_groups(inventory: str | Path = INVENTORY) -> list[str]:
    """The topology groups of an inventory (children of gpu_boxes)."""
    return topology_groups_of(open_inventory(inventory))


def load_group_vars(group: str, inventory: str | Path = INVENTORY) -> dict[str, Any]:
    """The checked facts of a host in ``group`` with no host_vars of its own (defaults < group_vars)."""
    session = open_inventory(inventory)
    if group not in session.inventory.groups:
        raise UsageError(f"unknown group {group!r} in inventory {session.source}: {_known(session)}")
    stand_in = GROUP_STAND_IN.format(group)
    session.inventory.add_host(stand_in, group=group)
    raw, template_errors = host_facts(session, stand_in)
    values, errors = check(raw)
    if template_errors or errors:
        raise PlanError(f"group {group}: " + "; ".join(template_errors + errors))
    return values


# --------------------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Plan vLLM GPU memory for the boxes of an inventory, read as Ansible reads it."
    )
    parser.add_argument("target", nargs="?", help="a group or host (same as -l; kept for `plan.py gpu_2x3090`)")
    parser.add_argument("-i", "--inventory", default=str(INVENTORY), help="inventory (default: %(default)s)")
    parser.add_argument("-l", "--limit", help="groups and hosts, comma-separated (default: the topology groups)")
    parser.add_argument(
        "-e", "--extra-vars", action="append", default=[], help="as ansible-playbook -e: key=value, YAML/JSON or @file"
    )
    parser.add_argument("--vault-id", action="append", default=[], help="as ansible-playbook --vault-id")
    parser.add_argument(
        "--vault-password-file",
        action="append",
        default=[],
        help="as ansible-playbook: the vault password (make plan VAULT_PASSWORD_FILE=FILE); "
        "ANSIBLE_VAULT_PASSWORD_FILE is read too",
    )
    parser.add_argument("--ask-vault-pass", action="store_true", help="as ansible-playbook")
    args = parser.parse_args(argv)
    if args.target and args.limit:
        parser.error("give the group or host either as the argument or with -l, not both")
    try:
        session = open_inventory(
            args.inventory, args.extra_vars, args.vault_id, args.vault_password_file, args.ask_vault_pass
        )
        todo = units(session, args.limit or args.target)
    except UsageError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    status = 0
    for index, unit in enumerate(todo):
        if index:
            print()
        if unit.errors:
            print(f"{unit.label}: the desired state has {len(unit.errors)} error(s), nothing planned", file=sys.stderr)
            for line in unit.errors:
                print(f"ERROR: {line}", file=sys.stderr)
            status = 1
            continue
        try:
            result = plan(unit.values)
        except PlanError as exc:
            print(f"{unit.label}: nothing planned\nERROR: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"{unit.label}: {describe(unit.values)}")
        print("\n".join(stack_lines(unit.values)))
        print(capacity_planner.plan_table(result))
        if not result["fits"]:
            status = 1
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `make plan | head`: the reader left (Python's documented recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
