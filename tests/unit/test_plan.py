"""`make plan` (tools/plan.py): the inventory as Ansible reads it, checked, then planned like preflight."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.vault import VaultLib, VaultSecret

import plan as plan_tool
from harness import markdown

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION_GROUP_VARS = ROOT / "inventories" / "production" / "group_vars"
SECRET = "plan-must-never-show-this-key-0123456789"


def group_vars_of(group: str) -> dict[str, Any]:
    return yaml.safe_load((PRODUCTION_GROUP_VARS / f"{group}.yml").read_text())


def write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else "---\n" + yaml.safe_dump(data))


def make_inventory(
    root: Path,
    hosts: dict[str, list[str]],
    group_vars: dict[str, Any] | None = None,
    host_vars: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """hosts: topology group -> host names, under gpu_boxes. group_vars values: a mapping (one file)
    or {"dir": {file name: mapping}} (a directory of files, as Ansible allows)."""
    tree = {"gpu_boxes": {"children": {g: {"hosts": {h: None for h in names} or {}} for g, names in hosts.items()}}}
    write(root / "hosts.yml", tree)
    for group, data in (group_vars or {}).items():
        if isinstance(data, dict) and set(data) == {"dir"}:
            for name, content in data["dir"].items():
                write(root / "group_vars" / group / name, content)
        else:
            write(root / "group_vars" / f"{group}.yml", data)
    for host, data in (host_vars or {}).items():
        write(root / "host_vars" / f"{host}.yml", data)
    return root


def plan_process(*argv: str) -> subprocess.CompletedProcess[str]:
    """tools/plan.py as a user runs it: exit status, stdout and stderr of a real process."""
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "plan.py"), *argv], cwd=ROOT, capture_output=True, text=True, check=False
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = plan_tool.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# --- the shipped inventory ------------------------------------------------------------------------


def test_production_topology_groups_are_planned_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys)
    assert rc == 0, err
    assert "group gpu_2x3090 (1 host: gpu-box): Qwen/Qwen2.5-14B-Instruct on 2 x NVIDIA GeForce RTX 3090" in out
    assert "group gpu_4x4090 (no hosts: planned from the group's variables): Qwen/Qwen2.5-72B-Instruct-AWQ" in out
    assert out.count("fits") == 2


def test_group_argument_and_limit_agree(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "gpu_2x3090")[1] == run(capsys, "-i", "inventories/production", "-l", "gpu_2x3090")[1]


def test_a_host_of_the_production_inventory(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "-l", "gpu-box")
    assert rc == 0
    assert out.startswith("host gpu-box: Qwen/Qwen2.5-14B-Instruct")


def test_compatibility_helpers_read_the_inventory() -> None:
    assert plan_tool.topology_groups() == ["gpu_2x3090", "gpu_4x4090"]
    values = plan_tool.load_group_vars("gpu_4x4090")
    assert values["gpubox_tensor_parallel_size"] == 4
    # facts the group leaves out come from roles/gpubox/defaults/main.yml
    assert values["gpubox_pipeline_parallel_size"] == 1
    assert values["gpubox_kv_cache_dtype"] == "auto"
    assert "gpubox_api_key" not in values
    model, gpu, serving = plan_tool.planner_inputs(values)
    assert gpu["count"] == 4 and serving["tensor_parallel_size"] == 4 and model["quantization"] == "awq_marlin"


# --- precedence: defaults < group_vars (files and directories) < host_vars < -e ------------------


def test_role_defaults_are_the_lowest_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    group = {k: v for k, v in group_vars_of("gpu_2x3090").items() if k != "gpubox_max_num_seqs"}
    inv = make_inventory(tmp_path, {"gpu_2x3090": ["a"]}, {"gpu_2x3090": group})
    rc, out, err = run(capsys, "-i", str(inv))
    assert rc == 0, err
    assert "max_num_seqs 256," in out  # roles/gpubox/defaults/main.yml


def test_host_vars_override_group_vars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(
        tmp_path,
        {"gpu_2x3090": ["a", "b", "c"]},
        {"gpu_2x3090": group_vars_of("gpu_2x3090")},
        {"b": {"gpubox_max_model_len": 4096}},
    )
    rc, out, err = run(capsys, "-i", str(inv), "-l", "gpu_2x3090")
    assert rc == 0, err
    assert "group gpu_2x3090, hosts a, c: " in out and "max_model_len 8192," in out
    assert "group gpu_2x3090, host b: " in out and "max_model_len 4096," in out
    rc, out, _ = run(capsys, "-i", str(inv), "-l", "b")
    assert rc == 0 and out.startswith("host b: ") and "max_model_len 4096," in out


def test_hosts_sharing_every_fact_get_one_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(tmp_path, {"gpu_2x3090": ["a", "b"]}, {"gpu_2x3090": group_vars_of("gpu_2x3090")})
    rc, out, _ = run(capsys, "-i", str(inv), "-l", "gpu_2x3090")
    assert rc == 0
    assert out.count("fits") == 1
    assert "group gpu_2x3090 (2 hosts: a, b): " in out


def test_directory_style_group_vars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = group_vars_of("gpu_2x3090")
    gpus = {k: v for k, v in facts.items() if k.startswith("gpubox_gpu_") and k != "gpubox_gpu_memory_utilization"}
    profile = {k: v for k, v in facts.items() if k not in gpus} | {"gpubox_max_num_seqs": 12}
    inv = make_inventory(
        tmp_path,
        {"gpu_2x3090": ["a"]},
        {"gpu_2x3090": {"dir": {"gpus.yml": gpus, "profile.yml": profile}}, "gpu_boxes": {"dir": {"main.yml": {}}}},
    )
    rc, out, err = run(capsys, "-i", str(inv))
    assert rc == 0, err
    assert "on 2 x NVIDIA GeForce RTX 3090 (24576 MiB)" in out and "max_num_seqs 12," in out


def test_extra_vars_override_host_vars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(
        tmp_path,
        {"gpu_2x3090": ["a"]},
        {"gpu_2x3090": group_vars_of("gpu_2x3090")},
        {"a": {"gpubox_max_num_seqs": 4}},
    )
    extra = tmp_path / "extra.yml"
    write(extra, {"gpubox_gpu_memory_utilization": 0.85})
    rc, out, err = run(capsys, "-i", str(inv), "-l", "a", "-e", "gpubox_max_num_seqs=16", "-e", f"@{extra}")
    assert rc == 0, err
    assert "max_num_seqs 16," in out and "util 0.85," in out


def test_templated_facts_are_rendered_with_the_inventory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = group_vars_of("gpu_2x3090") | {"context_tokens": 4096, "gpubox_max_model_len": "{{ context_tokens * 2 }}"}
    inv = make_inventory(tmp_path, {"gpu_2x3090": ["a"]}, {"gpu_2x3090": facts})
    rc, out, err = run(capsys, "-i", str(inv))
    assert rc == 0, err
    assert "max_model_len 8192," in out


def test_an_inventory_templated_through_a_builtin_lookup_is_planned(tmp_path: Path) -> None:
    """lookup('ansible.builtin.env', ...) in host_vars (molecule/serving's model lock path is one): the
    real command resolves the builtin lookup as ansible-playbook does (it was "not found")."""
    facts = group_vars_of("gpu_2x3090") | {
        "gpubox_model_lock_file": "{{ lookup('ansible.builtin.env', 'HOME') }}/m.json"
    }
    inv = make_inventory(tmp_path, {"gpu_2x3090": ["a"]}, {"gpu_2x3090": facts})
    proc = plan_process("-i", str(inv))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not found" not in proc.stdout + proc.stderr
    assert "GPU blocks" in proc.stdout


# --- the API key: neither needed nor shown ------------------------------------------------------


def test_no_api_key_is_needed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = make_inventory(tmp_path, {"gpu_2x3090": ["a"]}, {"gpu_2x3090": group_vars_of("gpu_2x3090")})
    rc, out, err = run(capsys, "-i", str(inv))
    assert rc == 0, err
    assert "api_key" not in out + err


def test_the_api_key_is_never_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = group_vars_of("gpu_2x3090") | {"vault_gpubox_api_key": SECRET}
    inv = make_inventory(tmp_path, {"gpu_2x3090": ["a"]}, {"gpu_2x3090": facts})
    for extra in ([], ["-e", "gpubox_block_size=16.0"], ["-e", "gpubox_api_key=short"]):
        rc, out, err = run(capsys, "-i", str(inv), *extra)
        assert SECRET not in out + err
        assert "short" not in out + err
        assert rc == (1 if "gpubox_block_size=16.0" in extra else 0), err


def test_a_vault_encrypted_inventory_needs_its_password(tmp_path: Path) -> None:
    # As the README keeps the key: an encrypted group_vars/all/vault.yml. Real processes (the vault
    # secrets are process-wide in Ansible).
    inv = make_inventory(tmp_path, {"gpu_2x3090": ["a"]}, {"gpu_2x3090": group_vars_of("gpu_2x3090")})
    vault = VaultLib([("default", VaultSecret(b"test-vault-password"))])
    secret_yaml = yaml.safe_dump({"vault_gpubox_api_key": SECRET})
    write(tmp_path / "group_vars" / "all" / "vault.yml", vault.encrypt(secret_yaml).decode())
    proc = plan_process("-i", str(inv))
    assert proc.returncode == 2
    assert "--vault-password-file" in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    password = tmp_path / "vault-pass"
    password.write_text("test-vault-password\n")
    proc = plan_process("-i", str(inv), "--vault-password-file", str(password))
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr


# --- refusals ----------------------------------------------------------------------------------


def test_unknown_group_or_host_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "-l", "gpu_9x9999")
    assert rc == 2 and out == ""
    assert "unknown host or group 'gpu_9x9999'" in err
    assert "gpu_2x3090" in err and "gpu_4x4090" in err and "gpu-box" in err
    rc, _, err = run(capsys, "gpu-box,nobody")
    assert rc == 2 and "'nobody'" in err


def test_missing_inventory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "-i", str(tmp_path / "nowhere"))
    assert rc == 2 and "does not exist" in err


@pytest.mark.parametrize(
    ("extra", "variable"),
    [
        ("gpubox_block_size=16.0", "gpubox_block_size"),
        ("gpubox_max_num_seqs=inf", "gpubox_max_num_seqs"),
        ("gpubox_gpu_memory_utilization=1.5", "gpubox_gpu_memory_utilization"),
        ("gpubox_tensor_parallel_size=4", "gpubox_tensor_parallel_size"),  # 4 > gpubox_gpu_count 2
    ],
)
def test_a_bad_value_exits_1_naming_the_variable(extra: str, variable: str) -> None:
    # A real process: the exit status and stderr a user sees, and no traceback.
    proc = plan_process("-l", "gpu_2x3090", "-e", extra)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"ERROR: {variable}" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "fits" not in proc.stdout  # nothing is planned from a bad state


def test_a_profile_that_does_not_fit_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = group_vars_of("gpu_2x3090") | {"gpubox_model_id": "Qwen/Qwen2.5-32B-Instruct"}
    inv = make_inventory(tmp_path, {"gpu_tight": []}, {"gpu_tight": facts})
    rc, out, _ = run(capsys, "-i", str(inv))
    assert rc == 1
    assert "group gpu_tight (no hosts" in out
    assert re.search(r"^fits +NO$", out, re.MULTILINE), out
    assert "ERROR: weights of gpubox_model_id need" in out


def test_a_model_outside_the_catalog_names_the_variable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    facts = group_vars_of("gpu_2x3090") | {"gpubox_model_id": "someone/unknown-model"}
    inv = make_inventory(tmp_path, {"gpu_2x3090": ["a"]}, {"gpu_2x3090": facts})
    rc, _, err = run(capsys, "-i", str(inv))
    assert rc == 1
    assert "gpubox_model_id" in err and "Traceback" not in err


def test_a_host_outside_every_topology_group_names_the_missing_facts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = make_inventory(tmp_path, {"gpu_2x3090": ["a"]}, {"gpu_2x3090": group_vars_of("gpu_2x3090")})
    (inv / "hosts.yml").write_text((inv / "hosts.yml").read_text() + "stray:\n  hosts:\n    lonely:\n")
    rc, _, err = run(capsys, "-i", str(inv), "-l", "lonely")
    assert rc == 1
    assert "ERROR: gpubox_gpu_name is not set" in err and "ERROR: gpubox_model_id is not set" in err


def test_readme_topology_table_is_the_plan() -> None:
    """README.md's topology table shows `make plan`'s figures for every production topology group."""
    table = markdown.table((ROOT / "README.md").read_text(), "## Supported hardware")
    rows = {row["group"].strip("`"): list(row.values())[4:] for row in table if row["group"].startswith("`gpu_")}
    groups = plan_tool.topology_groups()
    assert sorted(rows) == sorted(groups)
    for group in groups:
        result = plan_tool.plan(plan_tool.load_group_vars(group))
        assert rows[group] == plan_tool.readme_cells(result), (group, "regenerate README's row from `make plan`")


# --- the stack a box runs (gpubox_stack, issue 33) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stack", "driver", "advisories"),
    [
        ("pinned-0.7.3", "NVIDIA driver R535", "roles/python_env/files/advisories.yml"),
        ("lts-580", "NVIDIA driver R580", "advisories-vllm-0.32.0.yml"),
    ],
)
def test_the_plan_names_the_stack_its_support_ends_and_open_advisories(
    capsys: pytest.CaptureFixture[str], stack: str, driver: str, advisories: str
) -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks

    rc, out, err = run(capsys, "-l", "gpu_2x3090", "-e", f"gpubox_stack={stack}")
    assert rc == 0, err
    assert f"\nstack {stack}: " in out
    assert f"  {driver}" in out and "  Ubuntu 22.04 standard support: " in out
    count = stacks.open_advisories(stacks.get(stack))
    assert f"  open advisories (accepted, unfixed): {count} (" in out and advisories in out
    assert f"  engine: {stacks.get(stack).engine} " in out


def test_a_bad_stack_is_refused_by_the_plan_naming_the_fact_and_the_allowed_values(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = run(capsys, "-l", "gpu_2x3090", "-e", "gpubox_stack=lts-570")
    assert rc == 1 and "nothing planned" in err and "stack " not in out
    assert "ERROR: gpubox_stack must be one of pinned-0.7.3, lts-580, got 'lts-570'" in err


def test_the_plan_models_the_engine_of_the_boxs_stack() -> None:
    """A box on lts-580 is planned with vLLM's V1 engine, the pinned stack's with V0 (stacks.engine_of)."""
    values = plan_tool.load_group_vars("gpu_2x3090")
    pinned = plan_tool.plan(values)
    lts = plan_tool.plan({**values, "gpubox_stack": "lts-580"})
    assert (pinned["engine"], lts["engine"]) == ("v0", "v1")
    # The two engines budget memory differently (V1: NCCL outside the budget, CUDA graphs inside it).
    assert pinned["kv_cache_gib_per_gpu"] != lts["kv_cache_gib_per_gpu"]
    # A name that is not a stack is refused by its own check; the plan meanwhile models the default engine.
    assert plan_tool.plan({**values, "gpubox_stack": "lts-570"})["engine"] == "v0"
