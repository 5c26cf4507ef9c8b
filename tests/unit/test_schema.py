"""One schema for the desired state (plugins/module_utils/desired_state_schema.py).

- roles/gpubox/defaults/main.yml and meta/argument_specs.yml are byte for byte what the table makes
  (tools/gen_schema.py), and the lists other modules once wrote by hand are the table's;
- the argument spec refuses a wrong type before any task runs (through ansible-playbook), naming the
  variable, and lets through what state_checks accepts (its messages stay the ones users see);
- every flag the table renders gets its test line in FLAG_CASES (docs/design.md, "Adding a vLLM flag").
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import capacity_planner, state_checks, vllm_cmdline
from ansible_collections.gpubox.gpubox.plugins.module_utils import desired_state_schema as schema
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]


def _gen_schema():
    spec = importlib.util.spec_from_file_location("gen_schema", ROOT / "tools" / "gen_schema.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rel", ["roles/gpubox/defaults/main.yml", "roles/gpubox/meta/argument_specs.yml"])
def test_generated_files_are_what_the_table_makes(rel: str) -> None:
    wanted = _gen_schema().generated()[rel]
    assert (ROOT / rel).read_text() == wanted, f"{rel} is stale: run tools/gen_schema.py (never edit it by hand)"


def test_derived_lists_are_the_tables() -> None:
    facts = [row.name for row in schema.ROWS if row.check]
    assert list(state_checks.FACTS) == facts
    for row in schema.FACT_ROWS:
        assert (state_checks.FACTS[row.name].required, state_checks.FACTS[row.name].hint) == (row.required, row.hint)
    flags = {row.flag.name: row.flag.source or row.name for row in schema.ROWS if row.flag}
    assert {k: v for k, v in state_checks.RENDERED_FLAGS.items() if k in flags} == flags
    assert frozenset(state_checks.RENDERED_FLAGS) == vllm_cmdline.RENDERED_FLAGS
    assert set(state_checks.RENDERED_FLAGS) - set(flags) == {flag.name for flag in schema.KNOB_FLAGS}
    aliases = {alias: row.flag.name for row in schema.ROWS if row.flag for alias in row.flag.aliases}
    assert aliases == state_checks.FLAG_ALIASES
    assert {row.planner: row.name for row in schema.ROWS if row.planner} == capacity_planner.INVENTORY_NAMES


def test_each_row_is_complete() -> None:
    for stack in schema.stacks.NAMES:  # within one stack's command line (a renamed flag keeps its slot)
        slots = [flag.slot for flag, _ in schema.command_line(stack)]
        assert slots == sorted(set(slots)), f"each rendered flag of {stack} needs a slot of its own"
    for row in schema.ROWS:
        assert row.name.startswith("gpubox_") and row.description.endswith("."), row.name
        assert row.type in ("str", "int", "float", "bool", "list", "dict", "path", "raw"), row.name
        assert not row.required or row.hint, f"{row.name}: a required fact needs the hint of its fix"
        assert row.check != "int" or (row.low <= row.high and row.example), row.name
        assert not row.flag or row.flag.renders in ("value", "switch", "fixed"), row.name
        assert row.type != "raw" or row.type_note, f"{row.name}: say why its spec type is raw"


# --------------------------------------------------------------------------- every flag, one test line
# (fact, a value, what the command line then carries). Adding a flag to the table means adding its line here.
FLAG_CASES: list[tuple[str, Any, list[str]]] = [
    ("gpubox_tensor_parallel_size", 2, ["--tensor-parallel-size", "2"]),
    ("gpubox_pipeline_parallel_size", 2, ["--pipeline-parallel-size", "2"]),
    ("gpubox_gpu_memory_utilization", 0.85, ["--gpu-memory-utilization", "0.85"]),
    ("gpubox_max_model_len", 4096, ["--max-model-len", "4096"]),
    ("gpubox_max_num_seqs", 4, ["--max-num-seqs", "4"]),
    ("gpubox_max_num_batched_tokens", 9000, ["--max-num-batched-tokens", "9000"]),
    ("gpubox_model_dtype", "half", ["--dtype", "half"]),
    ("gpubox_model_quantization", "awq", ["--quantization", "awq"]),
    ("gpubox_kv_cache_dtype", "fp8", ["--kv-cache-dtype", "fp8"]),
    ("gpubox_block_size", 32, ["--block-size", "32"]),
    ("gpubox_enforce_eager", True, ["--enforce-eager"]),
    ("gpubox_served_model_name", "m1", ["--served-model-name", "m1"]),
    ("gpubox_port", 8001, ["--port", "8001"]),
    ("gpubox_model_root", "/srv/models", ["--model", "/srv/models/Qwen2.5-14B-Instruct"]),
    ("gpubox_kv_cache_memory_bytes", 13900000000, ["--kv-cache-memory-bytes", "13900000000"]),
    (
        "gpubox_speculative_config",
        {"num_speculative_tokens": 3, "method": "ngram"},
        ["--speculative-config", '{"method":"ngram","num_speculative_tokens":3}'],
    ),
]
BASE = {
    "gpubox_model_id": "Qwen/Qwen2.5-14B-Instruct",
    "gpubox_served_model_name": "qwen14b",
    "gpubox_model_root": "/data/models",
    "gpubox_gpu_count": 2,
    "gpubox_max_model_len": 8192,
    "gpubox_tensor_parallel_size": 1,
    **{row.name: row.default for row in schema.FACT_ROWS if row.default is not None and "{{" not in str(row.default)},
}


def test_every_rendered_fact_has_its_test_line() -> None:
    assert sorted(name for name, _, _ in FLAG_CASES) == sorted(row.name for row in schema.ROWS if row.flag)


@pytest.mark.parametrize("name, value, expected", FLAG_CASES, ids=[case[0] for case in FLAG_CASES])
def test_each_flag_renders_from_its_fact(name: str, value: Any, expected: list[str]) -> None:
    flag = schema.BY_NAME[name].flag
    stack = {"gpubox_stack": flag.stacks[0]} if flag.stacks else {}  # a flag one stack's release has
    args = vllm_cmdline.vllm_args({**BASE, **stack, name: value})
    at = [i for i in range(len(args)) if args[i : i + len(expected)] == expected]
    assert at, f"{expected} not in {args}"


# --------------------------------------------------------------------------- the argument spec, in Ansible
PLAYBOOK = """
- hosts: all
  gather_facts: false
  roles:
    - gpubox
  tasks:
    - name: Record that a task after the validation ran
      ansible.builtin.copy:
        dest: "{{ marker_dir }}/{{ inventory_hostname }}"
        content: ran
        mode: "0600"
      delegate_to: localhost
"""

# host: (its variables, the variable the spec refuses, or None: the spec lets it through to state_checks)
SPEC_CASES: dict[str, tuple[dict[str, Any], str | None]] = {
    "defaults": ({}, None),
    "count-word": ({"gpubox_gpu_count": "two"}, "gpubox_gpu_count"),
    "port-list": ({"gpubox_port": [8000]}, "gpubox_port"),
    "eager-word": ({"gpubox_enforce_eager": "maybe"}, "gpubox_enforce_eager"),
    "utilization-word": ({"gpubox_gpu_memory_utilization": "most"}, "gpubox_gpu_memory_utilization"),
    "extra-args-mapping": ({"gpubox_vllm_extra_args": {"--seed": 1}}, "gpubox_vllm_extra_args"),
    "networks-mapping": ({"gpubox_scrape_networks": {"lan": "10.0.0.0/8"}}, "gpubox_scrape_networks"),
    "policy-word": ({"gpubox_reboot_policy": "never"}, "gpubox_reboot_policy"),
    # ansible-core 2.19's int conversion raises on inf: refused here too, before any task, but unnamed.
    "int-inf": ({"gpubox_max_num_seqs": "inf"}, "cannot convert Infinity to integer"),
    # What state_checks accepts (or refuses with its own message) passes the spec:
    "int-text": ({"gpubox_port": "8001", "gpubox_max_model_len": " 8192 "}, None),
    "null-text": ({"gpubox_max_num_batched_tokens": "null", "gpubox_block_size": "", "gpubox_model_config": "~"}, None),
    "float-for-int": ({"gpubox_block_size": 16.0}, None),
    "spaced-choice": ({"gpubox_model_dtype": " bfloat16 ", "gpubox_model_quantization": "none"}, None),
    "bool-text": ({"gpubox_enforce_eager": "false", "gpubox_front_door_enabled": "true"}, None),
}
TOPOLOGIES = ("gpu_2x3090", "gpu_4x4090")
SHORT = "The desired state of a gpubox (every fact, one default) and shared switches"


@pytest.fixture(scope="module")
def spec_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, dict[str, Any]], Path]:
    tmp = tmp_path_factory.mktemp("schema-spec")
    marker = tmp / "ran"
    marker.mkdir()
    shutil.copytree(ROOT / "inventories" / "production" / "group_vars", tmp / "group_vars")
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "marker_dir": str(marker)}
    cases = {name: {**local, **hostvars} for name, (hostvars, _) in SPEC_CASES.items()}
    groups: dict[str, Any] = {"cases": {"hosts": cases}}
    groups |= {group: {"hosts": {f"prod-{group}": local}} for group in TOPOLOGIES}
    groups["gpu_boxes"] = {"children": {group: {} for group in TOPOLOGIES}}
    runs = ansible_vars.run_playbook({"all": {"children": groups}}, PLAYBOOK, tmp, timeout=300)
    failed: dict[str, dict[str, Any]] = {}
    for host, run in runs.items():
        first = next((r for r in run["results"] if r.get("failed")), None)
        if first is not None:
            failed[host] = first
    return failed, marker


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_the_argument_spec_refuses_a_wrong_type_before_any_task(spec_run, case: str) -> None:
    failed, marker = spec_run
    _, refused = SPEC_CASES[case]
    if refused is None:
        assert case not in failed, failed.get(case)
        assert (marker / case).read_text() == "ran"
        return
    assert case in failed, f"{case} passed the argument spec"
    result = failed[case]
    assert result["task"] == "gpubox : Validating arguments against arg spec 'main' - " + SHORT, result["task"]
    assert refused in result["msg"], result["msg"]
    assert not (marker / case).exists(), "a task ran after the refused validation"


@pytest.mark.parametrize("group", TOPOLOGIES)
def test_the_production_topologies_pass_the_argument_spec(spec_run, group: str) -> None:
    failed, marker = spec_run
    assert f"prod-{group}" not in failed, failed.get(f"prod-{group}")
    assert (marker / f"prod-{group}").read_text() == "ran"
