"""One desired state: every fact has one name, one default and one validator, read by every part.

- every gpubox_* fact is defaulted exactly once (roles/gpubox/defaults), declared with the same value
  in its argument spec, and has a validator in plugins/module_utils/state_checks.py;
- no role, inventory or scenario defines a second name for a fact (a variable that only renames one);
- the vLLM unit and preflight's plan, both rendered by Ansible from the same inventory, agree;
- every class of bad input gets one line naming the variable and the fix, and nothing raises.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import preflight_checks, state_checks, vllm_cmdline
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]
GPUBOX = ROOT / "roles" / "gpubox"
FACTS = sorted(state_checks.FACTS)
TOPOLOGIES = ("gpu_2x3090", "gpu_4x4090")
GIB = 1024**3


def _yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def _definitions() -> dict[str, list[str]]:
    """Where each variable is given a value by a role (defaults, vars) or an argument spec default."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "roles").glob("*/defaults/*.yml")) + sorted((ROOT / "roles").glob("*/vars/*.yml")):
        for name in _yaml(path):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


# --------------------------------------------------------------------------- one name, one default


@pytest.mark.parametrize("fact", FACTS)
def test_every_fact_has_one_default_in_the_gpubox_role(fact: str) -> None:
    assert _definitions().get(fact) == ["roles/gpubox/defaults/main.yml"], (
        f"{fact} must be defaulted once, in roles/gpubox/defaults/main.yml"
    )


def test_gpubox_defaults_spec_and_validator_list_the_same_facts() -> None:
    defaults = _yaml(GPUBOX / "defaults" / "main.yml")
    spec = _yaml(GPUBOX / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]
    assert set(defaults) == set(spec)
    assert set(state_checks.FACTS) <= set(defaults)  # equal values: tests/unit/test_roles.py


_RENAME = re.compile(r"^\s*\{\{\s*(gpubox_[a-z0-9_]+|vault_gpubox_[a-z0-9_]+)\s*(\|[^}]*)?\}\}\s*$")


def test_no_role_defines_a_second_name_for_a_fact() -> None:
    offenders = []
    for path in sorted((ROOT / "roles").glob("*/defaults/*.yml")) + sorted((ROOT / "roles").glob("*/vars/*.yml")):
        for name, value in _yaml(path).items():
            if isinstance(value, str) and _RENAME.match(value) and name not in state_checks.FACTS:
                offenders.append(f"{path.relative_to(ROOT)}: {name} = {value}")
    assert offenders == []


def test_inventories_and_scenarios_use_no_retired_names() -> None:
    retired = re.compile(
        r"^(model_store_(root|model_id|revision|name|model_config|modelscope_bin|fact_name)|python_env_prefix|"
        r"vllm_service_(api_key|port|served_model_name|model_dir|max_\w+|tensor_\w+|pipeline_\w+|dtype|quantization|"
        r"extra_args|python_env_prefix|env_file)|preflight_(sysfs_root|model_store_root))\s*:",
        re.M,
    )
    hits = []
    for path in list((ROOT / "inventories").rglob("*.yml")) + list((ROOT / "molecule").rglob("*.yml")):
        if path.is_file() and retired.search(path.read_text()):
            hits.append(str(path.relative_to(ROOT)))
    assert hits == []


def test_one_role_owns_each_handler_topic() -> None:
    owners: dict[str, set[str]] = {}
    for path in (ROOT / "roles").glob("*/handlers/main.yml"):
        for handler in yaml.safe_load(path.read_text()) or []:
            topic = handler.get("listen", handler.get("name"))
            owners.setdefault(topic, set()).add(path.parent.parent.name)
    assert {t: o for t, o in owners.items() if len(o) > 1} == {}
    for path in (ROOT / "roles").glob("*/tasks/*.yml"):
        role = path.parts[-3]
        for topic in re.findall(r"notify: ([^\n]+)", path.read_text()):
            assert owners.get(topic.strip()) == {role}, (
                f"{path}: notifies {topic}, owned by {owners.get(topic.strip())}"
            )


def test_no_role_reads_outside_its_own_directory() -> None:
    hits = [
        str(p.relative_to(ROOT))
        for p in list((ROOT / "roles").rglob("*.yml")) + list((ROOT / "playbooks").rglob("*.yml"))
        if re.search(r"(role_path|playbook_dir)\s*~?\s*\}?\}?\s*['\"]?/\.\.", p.read_text())
    ]
    assert hits == []


# --------------------------------------------------------------------------- unit and plan agree


def _flags(exec_start: str) -> dict[str, str]:
    argv = shlex.split(exec_start)
    out = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else ""
            out[arg] = "" if nxt.startswith("--") or not nxt else nxt
    return out


@pytest.mark.parametrize(
    ("group", "extra"),
    [
        ("gpu_2x3090", {}),
        ("gpu_4x4090", {}),
        ("gpu_2x3090", {"gpubox_model_root": "/srv/models"}),
        ("gpu_4x4090", {"gpubox_model_root": "/srv/models", "gpubox_max_num_seqs": 4, "gpubox_port": 8001}),
    ],
)
def test_unit_and_preflight_plan_agree(group: str, extra: dict[str, Any]) -> None:
    host = f"unit-{group}"
    kwargs = {"groups": (group,), "extra_vars": extra}
    exec_start = ansible_vars.render(host, "__vllm_service_exec_start", roles=("gpubox", "vllm_service"), **kwargs)
    state = ansible_vars.render(host, "query('gpubox.gpubox.desired_state') | first", **kwargs)
    flags = _flags(exec_start)
    model_root = extra.get("gpubox_model_root", "/data/models")
    assert flags["--model"] == state["gpubox_model_dir"]
    assert flags["--model"].startswith(model_root + "/")
    assert int(flags["--tensor-parallel-size"]) == state["gpubox_tensor_parallel_size"]
    assert int(flags["--max-model-len"]) == state["gpubox_max_model_len"]
    assert int(flags["--max-num-seqs"]) == state["gpubox_max_num_seqs"]
    assert float(flags["--gpu-memory-utilization"]) == state["gpubox_gpu_memory_utilization"]
    assert int(flags["--port"]) == state["gpubox_port"]
    assert flags["--served-model-name"] == state["gpubox_served_model_name"]
    host_facts = {
        "distribution": "Ubuntu", "distribution_version": "22.04", "memtotal_mb": 256 * 1024,
        "disk_free_bytes": 500 * GIB, "disk_mount": model_root, "model_bytes_present": 0, "secure_boot": False,
        "gpu": None,
    }  # fmt: skip
    result = preflight_checks.preflight(host_facts, state)
    # The only errors are about the missing GPU facts: the state itself is clean and plans.
    assert [e for e in result["errors"] if "GPU facts" not in e] == []
    plan = result["plan"]
    assert plan is not None and plan["fits"] is True
    assert plan["max_num_batched_tokens"] >= state["gpubox_max_model_len"]
    assert f"disk at {model_root}" in result["table"]


# --------------------------------------------------------------------------- bad input, every class

BAD: list[tuple[str, Any, str]] = [
    ("gpubox_gpu_memory_utilization", math.inf, "gpubox_gpu_memory_utilization"),
    ("gpubox_gpu_memory_utilization", math.nan, "gpubox_gpu_memory_utilization"),
    ("gpubox_gpu_memory_utilization", "nan", "gpubox_gpu_memory_utilization"),
    ("gpubox_gpu_memory_utilization", 10**400, "gpubox_gpu_memory_utilization"),
    ("gpubox_max_model_len", 10**400, "gpubox_max_model_len"),
    ("gpubox_max_num_seqs", math.inf, "gpubox_max_num_seqs"),
    ("gpubox_max_num_seqs", "1e3", "gpubox_max_num_seqs"),
    ("gpubox_block_size", 16.0, "gpubox_block_size"),
    ("gpubox_block_size", "16.0", "gpubox_block_size"),
    ("gpubox_block_size", 64, "gpubox_block_size"),
    ("gpubox_tensor_parallel_size", True, "gpubox_tensor_parallel_size"),
    ("gpubox_port", 0, "gpubox_port"),
    ("gpubox_model_dtype", "int8", "gpubox_model_dtype"),
    ("gpubox_model_quantization", "awq-marlin", "gpubox_model_quantization"),
    ("gpubox_kv_cache_dtype", "fp16", "gpubox_kv_cache_dtype"),
    ("gpubox_served_model_name", None, "gpubox_served_model_name"),
    ("gpubox_served_model_name", "--port", "gpubox_served_model_name"),
    ("gpubox_served_model_name", "-x", "gpubox_served_model_name"),
    ("gpubox_served_model_name", "two words", "gpubox_served_model_name"),
    ("gpubox_model_id", "..", "gpubox_model_id"),
    ("gpubox_model_id", "../../etc", "gpubox_model_id"),
    ("gpubox_model_id", "Qwen/../x", "gpubox_model_id"),
    ("gpubox_model_id", "Qwen/..", "gpubox_model_id"),
    ("gpubox_model_id", "Qwen2.5-14B", "gpubox_model_id"),
    ("gpubox_model_id", "/abs/path", "gpubox_model_id"),
    ("gpubox_model_id", "a/b/c", "gpubox_model_id"),
    ("gpubox_model_revision", "../x", "gpubox_model_revision"),
    ("gpubox_model_root", "data/models", "gpubox_model_root"),
    ("gpubox_model_root", "/", "gpubox_model_root"),
    ("gpubox_model_root", "/tmp", "gpubox_model_root"),
    ("gpubox_model_root", "/tmp/models", "gpubox_model_root"),
    ("gpubox_model_root", "/root", "gpubox_model_root"),
    ("gpubox_model_root", "/dev/shm", "gpubox_model_root"),
    ("gpubox_model_root", "/usr", "gpubox_model_root"),
    ("gpubox_model_root", "/etc", "gpubox_model_root"),
    ("gpubox_model_root", "/etc/models", "gpubox_model_root"),
    ("gpubox_model_root", "/data/../etc", "gpubox_model_root"),
    ("gpubox_model_root", "/usr/", "gpubox_model_root"),
    ("gpubox_env_prefix", "/usr/local", "gpubox_env_prefix"),
    ("gpubox_env_prefix", "venv", "gpubox_env_prefix"),
    ("gpubox_vllm_extra_args", "--enforce-eager", "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--api-key", "k"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--api_key=k"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--api-ke", "k"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--API-KEY"], None),  # argparse is case-sensitive: not the key flag
    ("gpubox_vllm_extra_args", ["--max_num_seqs", "4"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--served-model", "x"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", [{"a": 1}], "gpubox_vllm_extra_args"),
    # flags that change memory or limits the planner does not model, in any spelling argparse reads as them
    ("gpubox_vllm_extra_args", ["--enable-chunked-prefill"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--cpu_offload_gb=4"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--swap-space", "8"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--num-gpu-blocks-over", "100"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--enable-lora", "--max-loras", "2"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--speculative-model", "x/y"], "gpubox_vllm_extra_args"),
    ("gpubox_vllm_extra_args", ["--enable-prefix-caching"], None),  # changes no budget: taken
    ("gpubox_api_key", "short", "gpubox_api_key"),
    ("gpubox_api_key", "has space in it 0123456789", "gpubox_api_key"),
    ("gpubox_api_key", "", "gpubox_api_key"),
    ("gpubox_model_config", {"num_hidden_layers": 2}, "gpubox_model_config"),
    ("gpubox_model_config", {1: 2}, "gpubox_model_config"),
    ("gpubox_model_config", "not a mapping", "gpubox_model_config"),
    ("gpubox_model_config", "DEGENERATE:hidden_size=8", "gpubox_model_config"),
    ("gpubox_model_config", "DEGENERATE:num_key_value_heads=3", "gpubox_model_config"),
    ("gpubox_model_config", "DEGENERATE:weights_bytes=" + str(10**400), "gpubox_model_config"),
    ("gpubox_model_config", "DEGENERATE:num_hidden_layers=2.0", "gpubox_model_config"),
    ("gpubox_model_config", "DEGENERATE:torch_dtype=None", "gpubox_model_config"),
    ("gpubox_model_config", "DEGENERATE:quantization=int3", "gpubox_model_config"),
]


def _degenerate(spec: str) -> dict[str, Any]:
    """A valid gpubox_model_config (the 14B entry) with one field broken: 'DEGENERATE:key=value'."""
    from ansible_collections.gpubox.gpubox.plugins.module_utils import model_catalog

    key, text = spec.split(":", 1)[1].split("=", 1)
    config = {k: v for k, v in model_catalog.CATALOG["Qwen/Qwen2.5-14B-Instruct"].items() if k != "source"}
    config[key] = yaml.safe_load(text) if text not in ("None",) else None
    if key == "weights_bytes":
        config[key] = int(text)
    return config


def _good_state(group: str = "gpu_2x3090") -> dict[str, Any]:
    return ansible_vars.facts(f"unit-{group}", groups=(group,))


@pytest.mark.parametrize(("name", "value", "expect"), BAD, ids=[f"{n}={v!r}"[:60] for n, v, _ in BAD])
def test_bad_input_gets_one_line_naming_the_variable(name: str, value: Any, expect: str | None) -> None:
    value = _degenerate(value) if isinstance(value, str) and value.startswith("DEGENERATE:") else value
    state = state_checks.validate({**_good_state(), name: value})
    if expect is None:
        assert state.errors == []
        return
    assert state.errors, f"{name}={value!r} was accepted"
    assert any(e.startswith(expect) for e in state.errors), state.errors
    for line in state.errors:
        assert "\n" not in line and len(line) < 400
    if name == "gpubox_api_key" and value:
        assert all(value not in e for e in state.errors), "the key must never be echoed"


@pytest.mark.parametrize(
    ("name", "value", "expect"), [b for b in BAD if b[2]], ids=[f"{n}={v!r}"[:60] for n, v, e in BAD if e]
)
def test_preflight_refuses_what_the_roles_refuse(name: str, value: Any, expect: str) -> None:
    """Preflight and the roles use one validator: the same input is refused by both, with the same line."""
    value = _degenerate(value) if isinstance(value, str) and value.startswith("DEGENERATE:") else value
    raw = {**_good_state(), name: value}
    host = {
        "distribution": "Ubuntu", "distribution_version": "22.04", "memtotal_mb": 256 * 1024,
        "disk_free_bytes": 500 * GIB, "disk_mount": "/data", "model_bytes_present": 0, "gpu": None,
    }  # fmt: skip
    errors = preflight_checks.preflight(host, raw)["errors"]
    role_errors = state_checks.validate(raw).errors
    assert set(role_errors) <= set(errors)


def test_rendering_refuses_exactly_what_preflight_refuses() -> None:
    for name, value, _expect in BAD:
        value = _degenerate(value) if isinstance(value, str) and value.startswith("DEGENERATE:") else value
        raw = {**_good_state(), name: value}
        state = state_checks.validate(raw)
        try:
            vllm_cmdline.vllm_args(raw)
            rendered = True
        except vllm_cmdline.VllmProfileError:
            rendered = False
        renders_fact = name not in ("gpubox_gpu_name", "gpubox_gpu_count", "gpubox_gpu_memory_mib", "gpubox_api_key",
                                    "gpubox_model_revision", "gpubox_model_config", "gpubox_env_prefix")  # fmt: skip
        if renders_fact:
            assert rendered == (not state.errors), (name, value)


def test_a_mapping_that_raises_is_reported_not_raised() -> None:
    class Broken(dict):
        def get(self, *_: Any) -> Any:
            raise RuntimeError("boom")

    assert state_checks.validate(Broken()).errors  # every fact unreadable -> reported as unset
    assert state_checks.validate("nope").errors  # type: ignore[arg-type]


def test_the_choices_match_vllm_073_sources_kept_in_the_engines_suite() -> None:
    # tests/engines/test_command_lines.py compares these tuples with the real parser's choices.
    assert "awq_marlin" in state_checks.QUANTIZATIONS and "bfloat16" in state_checks.DTYPES
    assert state_checks.BLOCK_SIZES == (8, 16, 32)


def test_preflight_runs_every_roles_own_input_checks() -> None:
    """Each role's tasks/validate.yml is its first step and is run by preflight before any change."""
    preflight = (ROOT / "roles" / "preflight" / "tasks" / "main.yml").read_text()
    site_roles = set(re.findall(r"- role: (\w+)", (ROOT / "playbooks" / "host.yml").read_text()))
    site_roles |= set(re.findall(r"- role: (\w+)", (ROOT / "playbooks" / "serving.yml").read_text()))
    looped = set(yaml.safe_load(re.search(r"loop: (\[.*\])", preflight).group(1)))
    for role in sorted(site_roles):
        assert (ROOT / "roles" / role / "tasks" / "validate.yml").is_file(), f"{role} has no tasks/validate.yml"
        main = (ROOT / "roles" / role / "tasks" / "main.yml").read_text()
        assert "validate.yml" in main.split("- name:", 3)[1] + main.split("- name:", 3)[2], role
        spec = _yaml(ROOT / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]
        assert spec["validate"]["options"] == spec["main"]["options"], role
        assert role in looped or role == "nvidia_driver", f"preflight does not run {role}'s checks"
    assert "name: nvidia_driver\n    tasks_from: validate\n" in preflight


@pytest.mark.parametrize("name", ["gpubox_gpu_count", "gpubox_port", "gpubox_max_model_len", "gpubox_model_id"])
def test_an_integer_too_long_to_print_is_one_line_not_a_raise(name: str) -> None:
    # repr() of a 5000-digit int raises ValueError (Python's 4300-digit limit): value_text.short sizes it instead.
    state = state_checks.validate({**_good_state(), name: 10**5000})
    assert any(e.startswith(name) and "an integer of 16610 bits" in e for e in state.errors), state.errors
