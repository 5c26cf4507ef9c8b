"""Pure tests of the vLLM 0.7.3 command-line renderer (plugins/module_utils/vllm_cmdline.py).

Profiles come from the real role and inventory: roles/vllm_service/defaults + vars/main.yml
templated by Ansible over inventories/production/group_vars, so a wrong mapping from gpubox_*
variables to flags fails here. tests/vllm073 feeds the same profiles to vLLM's own parser.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
# The role's vars use the gpubox_* filters; find them wherever pytest is started from.
os.environ.setdefault("ANSIBLE_FILTER_PLUGINS", str(REPO / "plugins" / "filter"))

from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import VllmProfileError, systemd_quote, systemd_quote_arg, vllm_args

GROUP_VARS = REPO / "inventories" / "production" / "group_vars"
ROLE = REPO / "roles" / "vllm_service"
TOPOLOGIES = ("gpu_2x3090", "gpu_4x4090")
_LOADER_READY = False


def _trust(value: Any) -> Any:
    from ansible.template import trust_as_template

    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: _trust(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_trust(item) for item in value]
    return value


def role_variables(group: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Role defaults < group_vars (gpu_boxes, then the topology) < role vars, as Ansible orders them."""
    variables: dict[str, Any] = {}
    for path in (ROLE / "defaults" / "main.yml", GROUP_VARS / "gpu_boxes.yml", GROUP_VARS / f"{group}.yml"):
        variables.update(yaml.safe_load(path.read_text()))
    variables.update(overrides or {})
    variables.update(yaml.safe_load((ROLE / "vars" / "main.yml").read_text()))
    variables["role_path"] = str(ROLE)
    return _trust(variables)


def role_template(group: str, name: str, overrides: dict[str, Any] | None = None) -> Any:
    """Template one of the role's variables with Ansible itself; plain Python types come back."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar

    global _LOADER_READY
    if not _LOADER_READY:
        init_plugin_loader()
        _LOADER_READY = True
    variables = role_variables(group, overrides)
    value = Templar(loader=DataLoader(), variables=variables).template(variables[name])
    return json.loads(json.dumps(value))


def role_profile(group: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    return role_template(group, "__vllm_service_profile", overrides)


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_2x3090_renders_the_seed_command_line() -> None:
    args = vllm_args(role_profile("gpu_2x3090"))
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
    args = vllm_args(role_profile("gpu_4x4090"))
    assert _flag(args, "--tensor-parallel-size") == "4"
    assert _flag(args, "--quantization") == "awq_marlin"
    assert _flag(args, "--dtype") == "float16"
    assert _flag(args, "--served-model-name") == "qwen72b-awq"
    assert _flag(args, "--model") == "/data/models/Qwen2.5-72B-Instruct-AWQ"
    absent = ("--pipeline-parallel-size", "--kv-cache-dtype", "--max-num-batched-tokens", "--enforce-eager")
    assert not set(absent) & set(args)


@pytest.mark.parametrize("group", TOPOLOGIES)
def test_no_api_key_on_the_command_line(group: str) -> None:
    exec_start = role_template(group, "__vllm_service_exec_start", {"vault_gpubox_api_key": "s3cret-key"})
    assert "--api-key" not in exec_start
    assert "s3cret-key" not in exec_start
    assert exec_start.startswith("/opt/gpubox/venv/bin/python -m vllm.entrypoints.openai.api_server --model ")


def test_optional_flags_appear_only_when_set() -> None:
    profile = role_profile(
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
    args = vllm_args({**role_profile("gpu_2x3090"), "pipeline_parallel_size": 1})
    assert "--pipeline-parallel-size" not in args


def test_extra_args_are_appended_in_order() -> None:
    extra = ["--swap-space", "8", "--disable-custom-all-reduce"]
    args = vllm_args({**role_profile("gpu_4x4090"), "extra_args": extra})
    assert args[-3:] == extra


@pytest.mark.parametrize("extra", [["--api-key", "x"], ["--api-key=x"]])
def test_api_key_in_extra_args_is_refused_naming_the_variable(extra: list[str]) -> None:
    with pytest.raises(VllmProfileError, match=r"vllm_service_extra_args.*--api-key.*vllm_service_api_key"):
        vllm_args({**role_profile("gpu_2x3090"), "extra_args": extra})


@pytest.mark.parametrize(
    ("extra", "variable"),
    [
        (["--max-model-len", "4096"], "vllm_service_max_model_len"),
        (["-tp", "4"], "vllm_service_tensor_parallel_size"),
    ],
)
def test_extra_args_may_not_override_a_rendered_flag(extra: list[str], variable: str) -> None:
    with pytest.raises(VllmProfileError, match=variable):
        vllm_args({**role_profile("gpu_2x3090"), "extra_args": extra})


def test_extra_args_must_be_a_list() -> None:
    with pytest.raises(VllmProfileError, match="vllm_service_extra_args must be a list"):
        vllm_args({**role_profile("gpu_2x3090"), "extra_args": "--enforce-eager"})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("tensor_parallel_size", 0, "vllm_service_tensor_parallel_size must be >= 1"),
        ("port", 70000, "vllm_service_port must be >= 1 and <= 65535"),
        ("gpu_memory_utilization", 1.5, r"vllm_service_gpu_memory_utilization must be in \(0, 1\]"),
        ("max_model_len", "8k", "vllm_service_max_model_len must be an integer"),
        ("served_model_name", "", "vllm_service_served_model_name is required"),
        ("model_dir", "/data/my model", "vllm_service_model_dir must be a single word"),
        ("enforce_eager", "maybe", "vllm_service_enforce_eager must be a boolean"),
    ],
)
def test_bad_values_name_the_variable(key: str, value: Any, message: str) -> None:
    with pytest.raises(VllmProfileError, match=message):
        vllm_args({**role_profile("gpu_2x3090"), key: value})


def _systemd_unquote(line: str) -> list[str]:
    """Approximation of systemd's ExecStart= splitting for the escapes systemd_quote emits:
    specifiers (%%) and variables ($$) first, then shell-like double quotes with backslashes."""
    return [word.replace("%%", "%").replace("$$", "$") for word in shlex.split(line)]


def test_plain_arguments_stay_unquoted() -> None:
    args = vllm_args(role_profile("gpu_2x3090"))
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
