"""Each stack has its own Python environment (issue 33, item 4: "moving a group is day two").

gpubox_env_prefix unset (its default, null) is the stack's own prefix (stacks.Stack.env_prefix): the pinned stack's is
/opt/gpubox/venv, the one every box had before stacks existed, so its boxes render byte for byte as before; lts-580's
is /opt/gpubox/venv-lts-580, so a move builds the new environment beside the old one and a move back finds the old one
whole. Every consumer (vllm.service's ExecStart, python_env's paths and pin checker, model_store's modelscope client)
reads the resolved prefix from the desired state; rendered here by Ansible's own variable manager and templar.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks, state_checks
from harness.ansible_vars import render, scenario_inventory, templar_for

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("gpubox", "python_env", "model_store", "vllm_service")
UBUNTU = {"distribution": "Ubuntu", "distribution_major_version": "22"}
# Every place a box runs or writes into its environment, as the roles' tasks see them.
EXPRESSIONS = {
    "desired": "(query('gpubox.gpubox.desired_state') | first).gpubox_env_prefix",
    "python_env_prefix": "__python_env_prefix",
    "python_env_python": "__python_env_python",
    "pin_checker": "__python_env_compare_argv[:2]",
    "pins_dir": "__python_env_pins_dir",
    "modelscope": "__model_store_modelscope_bin",
    "exec_start": "__vllm_service_exec_start.split(' ')[0]",
}


def paths(stack: str | None = None, **extra: Any) -> dict[str, Any]:
    """The EXPRESSIONS for a box of gpu_2x3090 (Ubuntu 22.04) on ``stack`` (None: the group's default)."""
    extra_vars: dict[str, Any] = {"ansible_facts": UBUNTU, "role_path": str(ROOT / "roles" / "python_env")}
    extra_vars.update(yaml.safe_load((ROOT / "roles" / "python_env" / "vars" / "Ubuntu-22.yml").read_text()))
    extra_vars.update(extra)
    if stack is not None:
        extra_vars["gpubox_stack"] = stack
    expression = "{" + ", ".join(f"'{key}': {value}" for key, value in EXPRESSIONS.items()) + "}"
    return render("unit-gpu_2x3090", expression, roles=ROLES, extra_vars=extra_vars, groups=("gpu_2x3090",))


def expected(prefix: str) -> dict[str, Any]:
    return {
        "desired": prefix,
        "python_env_prefix": prefix,
        "python_env_python": f"{prefix}/bin/python",
        "pin_checker": [f"{prefix}/bin/python", f"{prefix}/gpubox/gpubox_pins.py"],
        "pins_dir": f"{prefix}/gpubox",
        "modelscope": f"{prefix}/bin/modelscope",
        "exec_start": f"{prefix}/bin/python",
    }


def test_the_default_stack_renders_the_one_prefix_every_box_had_before() -> None:
    assert paths() == expected("/opt/gpubox/venv")
    assert paths("pinned-0.7.3") == expected("/opt/gpubox/venv")


def test_lts_580_renders_its_own_environment_everywhere() -> None:
    # Control: with one prefix for every stack (the old default) this is /opt/gpubox/venv and fails.
    assert paths("lts-580") == expected("/opt/gpubox/venv-lts-580")


@pytest.mark.parametrize("stack", stacks.NAMES)
def test_an_explicit_prefix_wins_for_every_stack(stack: str) -> None:
    assert paths(stack, gpubox_env_prefix="/srv/py/env") == expected("/srv/py/env")


@pytest.mark.parametrize("unset", ["", "null", "~"])
def test_an_empty_prefix_from_extra_vars_reads_as_unset_and_is_the_stacks(unset: str) -> None:
    assert paths("lts-580", gpubox_env_prefix=unset)["exec_start"] == "/opt/gpubox/venv-lts-580/bin/python"


@pytest.mark.parametrize(
    ("scenario", "host", "prefix"),
    [("serving", "gpubox-m-serving", "/opt/gpubox/venv-lts-580"), ("fleet", "gpubox-m-fleet-box1", "/opt/gpubox/venv")],
)
def test_the_scenarios_boxes_run_their_stacks_environment(
    scenario: str, host: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # molecule/serving's box runs lts-580 (its tests name its environment); the fleet's boxes the default stack.
    monkeypatch.setenv("MOLECULE_EPHEMERAL_DIRECTORY", str(tmp_path))
    inventory = scenario_inventory(scenario, tmp_path / "inventory")
    roles = ("gpubox", "vllm_service")
    assert render(host, "__vllm_service_exec_start", inventory=inventory, roles=roles).startswith(
        f"{prefix}/bin/python -m vllm.entrypoints.openai.api_server "
    )
    if scenario == "serving":
        tests = (ROOT / "molecule" / "serving" / "tests" / "test_serving.py").read_text()
        assert f'"{prefix}/bin/python -m vllm.entrypoints.openai.api_server" in exec_start' in tests


def test_every_stack_has_its_own_prefix_and_the_desired_state_names_it() -> None:
    prefixes = [stack.env_prefix for stack in stacks.STACKS.values()]
    assert len(set(prefixes)) == len(prefixes)
    assert stacks.STACKS[stacks.DEFAULT].env_prefix == "/opt/gpubox/venv"
    for name, stack in stacks.STACKS.items():
        state = state_checks.validate({"gpubox_stack": name}).public()
        assert state["gpubox_env_prefix"] == stack.env_prefix == state["gpubox_stack_info"]["env_prefix"]
        _value, error = state_checks.check("gpubox_env_prefix", stack.env_prefix)
        assert error is None, error  # each stack's own prefix passes the one checker
    # A stack name that is not one: no prefix, and the stack's own error names the fix.
    bad = state_checks.validate({"gpubox_stack": "nope"})
    assert bad.values["gpubox_env_prefix"] is None
    assert any(line.startswith("gpubox_stack") for line in bad.errors)


def _overlap(values: dict[str, Any]) -> list[str]:
    return [line for line in state_checks.validate(values).errors if " overlap:" in line]


def test_the_overlap_check_reads_the_resolved_prefix() -> None:
    # The model store inside lts-580's own environment: refused. Control: under the old behaviour (one prefix,
    # /opt/gpubox/venv, whatever the stack) the same values passed, and the store would sit inside the environment.
    errors = _overlap({"gpubox_stack": "lts-580", "gpubox_model_root": "/opt/gpubox/venv-lts-580/models"})
    assert errors == [
        "gpubox_model_root (/opt/gpubox/venv-lts-580/models) and gpubox_env_prefix (/opt/gpubox/venv-lts-580) "
        "overlap: keep the model store and the Python environment in separate directories"
    ]
    assert not _overlap({"gpubox_stack": "pinned-0.7.3", "gpubox_model_root": "/opt/gpubox/venv-lts-580/models"})
    assert _overlap({"gpubox_stack": "pinned-0.7.3", "gpubox_model_root": "/opt/gpubox/venv/models"})
    # An explicit prefix is the one checked, for every stack.
    for name in stacks.NAMES:
        assert _overlap({"gpubox_stack": name, "gpubox_model_root": "/srv/py", "gpubox_env_prefix": "/srv/py/env"})
        assert not _overlap({"gpubox_stack": name, "gpubox_model_root": "/opt/gpubox/venv-lts-580/models",
                             "gpubox_env_prefix": "/srv/py/env"})  # fmt: skip


def test_the_overlap_check_through_ansible_names_the_resolved_prefix() -> None:
    state = render(
        "unit-gpu_2x3090",
        "query('gpubox.gpubox.desired_state') | first",
        extra_vars={"gpubox_stack": "lts-580", "gpubox_model_root": "/opt/gpubox/venv-lts-580/m"},
        groups=("gpu_2x3090",),
    )
    assert any("gpubox_env_prefix (/opt/gpubox/venv-lts-580) overlap" in line for line in state["errors"])


# --- the local fact: which environment serves, and which others the box holds ------------------------------------


def _fact_task() -> dict[str, Any]:
    tasks = yaml.safe_load((ROOT / "roles" / "python_env" / "tasks" / "packages.yml").read_text())
    (task,) = [t for t in tasks if "ansible.builtin.copy" in t and "__python_env_fact" in t.get("vars", {})]
    return task


def fact_after(stack: str, previous: dict[str, Any] | None, still_there: set[str], **extra: Any) -> dict[str, Any]:
    """The held and stack entries python_env writes on ``stack``, after a run whose previous fact was ``previous``
    and whose stat found bin/python under the prefixes ``still_there`` (the stat task's loop, run here too)."""
    from ansible.template import trust_as_template

    extra_vars: dict[str, Any] = {
        "ansible_facts": {**UBUNTU, "ansible_local": {"gpubox_env": previous} if previous else {}},
        "role_path": str(ROOT / "roles" / "python_env"),
        "gpubox_stack": stack,
        **extra,
    }
    templar, _ = templar_for("unit-gpu_2x3090", roles=ROLES, extra_vars=extra_vars, groups=("gpu_2x3090",))
    tasks = yaml.safe_load((ROOT / "roles" / "python_env" / "tasks" / "packages.yml").read_text())
    (stat,) = [t for t in tasks if t.get("register") == "__python_env_held"]
    looped = json.loads(json.dumps(templar.template(trust_as_template(stat["loop"]))))
    results = [{"item": item, "stat": {"exists": item in still_there}} for item in looped]
    task = _fact_task()
    # The task's own vars, trusted as templates as Ansible trusts a role's task file.
    trusted = {name: trust_as_template(v) if isinstance(v, str) else v for name, v in task["vars"].items()}
    variables = {**trusted, "__python_env_held": {"results": results}}
    templar.available_variables = {**templar.available_variables, **variables}
    fact = task["vars"]["__python_env_fact"]
    out = {key: templar.template(trust_as_template(fact[key])) for key in ("prefix", "stack", "held")}
    return json.loads(json.dumps(out))


def test_the_fact_names_the_serving_environment_and_keeps_the_old_one_after_a_move() -> None:
    first = fact_after("pinned-0.7.3", None, set())
    pinned = {"/opt/gpubox/venv": "pinned-0.7.3"}
    assert first == {"prefix": "/opt/gpubox/venv", "stack": "pinned-0.7.3", "held": pinned}
    moved = fact_after("lts-580", first, {"/opt/gpubox/venv"})
    assert moved == {
        "prefix": "/opt/gpubox/venv-lts-580",
        "stack": "lts-580",
        "held": {"/opt/gpubox/venv": "pinned-0.7.3", "/opt/gpubox/venv-lts-580": "lts-580"},
    }
    back = fact_after("pinned-0.7.3", moved, {"/opt/gpubox/venv-lts-580"})
    assert back["prefix"] == "/opt/gpubox/venv" and back["held"] == moved["held"]


def test_the_fact_drops_an_environment_no_longer_on_disk_and_reads_an_old_fact() -> None:
    # A fact written before stacks had environments of their own names its prefix only: its stack is unknown.
    old = {"prefix": "/opt/gpubox/venv", "method": "venv"}
    assert fact_after("lts-580", old, {"/opt/gpubox/venv"})["held"] == {
        "/opt/gpubox/venv": "unknown",
        "/opt/gpubox/venv-lts-580": "lts-580",
    }
    # Control: the operator removed the old environment by hand; the fact says so.
    assert fact_after("lts-580", old, set())["held"] == {"/opt/gpubox/venv-lts-580": "lts-580"}


def test_an_explicit_prefix_is_one_environment_rebuilt_in_place() -> None:
    first = fact_after("pinned-0.7.3", None, set(), gpubox_env_prefix="/srv/env")
    moved = fact_after("lts-580", first, set(), gpubox_env_prefix="/srv/env")
    assert moved["held"] == {"/srv/env": "lts-580"}


def _tasks(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for task in items or []:
        out.append(task)
        for key in ("block", "rescue", "always"):
            out.extend(_tasks(task.get(key)))
    return out


def test_no_task_of_python_env_removes_or_clears_another_prefix() -> None:
    tasks = [
        task
        for path in sorted((ROOT / "roles" / "python_env" / "tasks").glob("*.yml"))
        for task in _tasks(yaml.safe_load(path.read_text()))
    ]
    commands = [task["ansible.builtin.command"] for task in tasks if "ansible.builtin.command" in task]
    assert commands and all("argv" in command for command in commands)  # no shell line to hide an rm in
    # The one destructive argument: venv --clear of the current prefix, when its pip does not run (a half-made venv).
    clearing = [command["argv"] for command in commands if "--clear" in command["argv"]]
    assert clearing == [["{{ __python_env_system_python }}", "-m", "venv", "--clear", "{{ __python_env_prefix }}"]]
    removed = [task["ansible.builtin.file"]["path"] for task in tasks
               if task.get("ansible.builtin.file", {}).get("state") == "absent"]  # fmt: skip
    assert removed == ["{{ __python_env_miniforge_download }}"]  # the installer download, not an environment
    assert not [task for task in tasks if "ansible.builtin.shell" in task or "ansible.builtin.raw" in task]
