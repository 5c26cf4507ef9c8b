"""Tests of the vLLM 0.7.3 command-line renderer (plugins/module_utils/vllm_cmdline.py).

The state comes from the real inventory and roles as Ansible resolves them (harness/ansible_vars.py:
gpubox defaults < group_vars < extra vars, templated through the gpubox.gpubox.desired_state lookup),
so a wrong mapping from gpubox_* facts to flags fails here. tests/engines feeds the same command
lines to each stack's own vLLM parser.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import (
    VllmProfileError,
    systemd_quote,
    systemd_quote_arg,
    vllm_args,
)
from harness.ansible_vars import render, scenario_inventory

TOPOLOGIES = ("gpu_2x3090", "gpu_4x4090")


def group_state(group: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The checked desired state of a host of ``group`` in the production inventory."""
    return render(_host(group), "query('gpubox.gpubox.desired_state') | first", extra_vars=overrides, groups=(group,))


def _host(group: str) -> str:
    return f"unit-{group}"


def exec_start(group: str, overrides: dict[str, Any] | None = None) -> str:
    return render(
        _host(group), "__vllm_service_exec_start", roles=("gpubox", "vllm_service"), extra_vars=overrides,
        groups=(group,),
    )  # fmt: skip


def scenario_render(scenario: str, host: str, expression: str, roles: tuple[str, ...] = ("gpubox",)) -> Any:
    """``expression`` for ``host`` of a molecule scenario, through the inventory molecule builds for it (its groups,
    molecule/shared/group_vars, its host_vars); the scenario's ephemeral directory is an empty one."""
    with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, {"MOLECULE_EPHEMERAL_DIRECTORY": tmp}):
        return render(host, expression, inventory=scenario_inventory(scenario, Path(tmp) / "inventory"), roles=roles)


def scenario_vllm_argv(scenario: str, host: str) -> list[str]:
    """The arguments after the module name in the vllm unit's ExecStart for a scenario's box."""
    argv = shlex.split(scenario_render(scenario, host, "__vllm_service_exec_start", ("gpubox", "vllm_service")))
    return argv[argv.index("vllm.entrypoints.openai.api_server") + 1 :]


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_2x3090_renders_the_seed_command_line() -> None:
    args = vllm_args(group_state("gpu_2x3090"))
    assert args == [
        "--model", "/data/models/Qwen2.5-14B-Instruct",
        "--served-model-name", "qwen14b",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--tensor-parallel-size", "2",
        "--gpu-memory-utilization", "0.92",
        "--max-model-len", "8192",
        "--max-num-seqs", "8",
        "--dtype", "bfloat16",
        "--disable-log-requests",
    ]  # fmt: skip


def test_4x4090_renders_awq_on_four_gpus() -> None:
    args = vllm_args(group_state("gpu_4x4090"))
    assert _flag(args, "--tensor-parallel-size") == "4"
    assert _flag(args, "--quantization") == "awq_marlin"
    assert _flag(args, "--dtype") == "float16"
    assert _flag(args, "--served-model-name") == "qwen72b-awq"
    assert _flag(args, "--model") == "/data/models/Qwen2.5-72B-Instruct-AWQ"
    absent = ("--pipeline-parallel-size", "--kv-cache-dtype", "--max-num-batched-tokens", "--enforce-eager")
    assert not set(absent) & set(args)


@pytest.mark.parametrize("group", TOPOLOGIES)
def test_no_api_key_on_the_command_line(group: str) -> None:
    line = exec_start(group, {"vault_gpubox_api_key": "s3cret-key-0123456789"})
    assert "--api-key" not in line
    assert "s3cret-key" not in line
    assert line.startswith("/opt/gpubox/venv/bin/python -m vllm.entrypoints.openai.api_server --model ")


def test_optional_flags_appear_only_when_set() -> None:
    profile = group_state(
        "gpu_2x3090",
        {
            "gpubox_pipeline_parallel_size": 2,
            "gpubox_max_num_batched_tokens": 16384,
            "gpubox_kv_cache_dtype": "fp8",
            "gpubox_enforce_eager": True,
            "gpubox_block_size": 32,
        },
    )
    args = vllm_args(profile)
    assert _flag(args, "--pipeline-parallel-size") == "2"
    assert _flag(args, "--max-num-batched-tokens") == "16384"
    assert _flag(args, "--kv-cache-dtype") == "fp8"
    assert _flag(args, "--block-size") == "32"
    assert "--enforce-eager" in args


def test_pipeline_parallel_one_is_not_rendered() -> None:
    args = vllm_args({**group_state("gpu_2x3090"), "gpubox_pipeline_parallel_size": 1})
    assert "--pipeline-parallel-size" not in args


def test_extra_args_are_appended_in_order() -> None:
    extra = ["--max-log-len", "100", "--disable-custom-all-reduce"]
    args = vllm_args({**group_state("gpu_4x4090"), "gpubox_vllm_extra_args": extra})
    assert args[-3:] == extra


@pytest.mark.parametrize(
    "extra", [["--api-key", "x"], ["--api-key=x"], ["--api_key", "x"], ["--api-ke=x"], ["--api", "x"]]
)
def test_api_key_in_extra_args_is_refused_naming_the_variable(extra: list[str]) -> None:
    with pytest.raises(VllmProfileError, match=r"gpubox_vllm_extra_args\[0\].*--api-key.*vault_gpubox_api_key"):
        vllm_args({**group_state("gpu_2x3090"), "gpubox_vllm_extra_args": extra})


@pytest.mark.parametrize(
    ("extra", "variable"),
    [
        (["--max-model-len", "4096"], "gpubox_max_model_len"),
        (["--max_model_len", "4096"], "gpubox_max_model_len"),
        (["--max-model", "4096"], "gpubox_max_model_len"),
        (["-tp", "4"], "gpubox_tensor_parallel_size"),
        (["-tp4"], "gpubox_tensor_parallel_size"),
        (["-qawq"], "gpubox_model_quantization"),
        (["--port=9000"], "gpubox_port"),
    ],
)
def test_extra_args_may_not_override_a_rendered_flag(extra: list[str], variable: str) -> None:
    with pytest.raises(VllmProfileError, match=variable):
        vllm_args({**group_state("gpu_2x3090"), "gpubox_vllm_extra_args": extra})


def test_extra_args_must_be_a_list() -> None:
    with pytest.raises(VllmProfileError, match="gpubox_vllm_extra_args must be a list"):
        vllm_args({**group_state("gpu_2x3090"), "gpubox_vllm_extra_args": "--enforce-eager"})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("gpubox_tensor_parallel_size", 0, "gpubox_tensor_parallel_size must be between 1 and 64"),
        ("gpubox_port", 70000, "gpubox_port must be between 1 and 65535"),
        ("gpubox_gpu_memory_utilization", 1.5, r"gpubox_gpu_memory_utilization must be a number in \(0, 1\]"),
        ("gpubox_max_model_len", "8k", "gpubox_max_model_len must be an integer"),
        ("gpubox_served_model_name", "", "gpubox_served_model_name is not set"),
        ("gpubox_served_model_name", "--qwen", "gpubox_served_model_name .* read as a flag"),
        ("gpubox_model_root", "data/models", "gpubox_model_root .* relative"),
        ("gpubox_enforce_eager", "maybe", "gpubox_enforce_eager must be true or false"),
        ("gpubox_block_size", 16.0, "gpubox_block_size must be an integer"),
    ],
)
def test_bad_values_name_the_variable(key: str, value: Any, message: str) -> None:
    with pytest.raises(VllmProfileError, match=message):
        vllm_args({**group_state("gpu_2x3090"), key: value})


def _systemd_unquote(line: str) -> list[str]:
    """Approximation of systemd's ExecStart= splitting for the escapes systemd_quote emits:
    specifiers (%%) and variables ($$) first, then shell-like double quotes with backslashes."""
    return [word.replace("%%", "%").replace("$$", "$") for word in shlex.split(line)]


def test_plain_arguments_stay_unquoted() -> None:
    args = vllm_args(group_state("gpu_2x3090"))
    assert systemd_quote(args) == " ".join(args)


@pytest.mark.parametrize(
    "arg",
    ['{"temperature": 0.7}', "with space", "100%", "$HOME", "back\\slash", 'say "hi"', ";", ""],
)
def test_quoting_round_trips(arg: str) -> None:
    line = systemd_quote(["/opt/gpubox/venv/bin/python", "--x", arg])
    assert _systemd_unquote(line) == ["/opt/gpubox/venv/bin/python", "--x", arg]


def test_specifiers_and_variables_are_escaped_even_unquoted() -> None:
    assert systemd_quote_arg("50%") == "50%%"
    assert systemd_quote_arg("$HOME") == '"$$HOME"'
    assert systemd_quote_arg(";") == '";"'


def test_environment_assignments_keep_dollar_signs() -> None:
    # Environment= expands specifiers but not $VAR (systemd.exec(5)), so "$" must stay single.
    assert systemd_quote(["A=x$y 5%"], variables=False) == '"A=x$y 5%%"'


def test_systemd_quote_refuses_a_bare_string() -> None:
    with pytest.raises(VllmProfileError, match="expects a list"):
        systemd_quote("--model /x")
