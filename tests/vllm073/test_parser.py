"""Prove rendered command lines are valid for the REAL vLLM 0.7.3, and that the pins install.

Installs roles/python_env/files/requirements-vllm-0.7.3.txt under constraints-vllm-0.7.3.txt into
a cached venv (default ~/.cache/gpubox/vllm073-venv; about 7 GB, minutes on first run), reusing it
while its versions match the pins (the role's own gpubox_pins.py decides). Then, in a subprocess of
that venv, vLLM's own parser (make_arg_parser(FlexibleArgumentParser())) parses the arguments the
vllm_service role renders for each production topology.

Run: /tmp/v/bin/pytest -m vllm073 tests/vllm073
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import venv
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import vllm_args
from test_vllm_args import TOPOLOGIES, group_state

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.vllm073

FILES = REPO / "roles" / "python_env" / "files"
REQUIREMENTS = FILES / "requirements-vllm-0.7.3.txt"
CONSTRAINTS = FILES / "constraints-vllm-0.7.3.txt"
VENV = Path(os.environ.get("GPUBOX_VLLM073_VENV", Path.home() / ".cache" / "gpubox" / "vllm073-venv"))

# Runs inside the vLLM venv: parse argv with vLLM's own parser, print the namespace as JSON.
PARSE = """
import json, sys
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils import FlexibleArgumentParser
ns = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
plain = (str, int, float, bool, list, type(None))
print(json.dumps({k: v for k, v in vars(ns).items() if isinstance(v, plain)}))
"""


def _pins_report(python: Path) -> dict[str, Any]:
    out = subprocess.run(
        [str(python), str(FILES / "gpubox_pins.py"), "--requirements", str(REQUIREMENTS),
         "--constraints", str(CONSTRAINTS)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = VENV / "bin" / "python"
    if python.exists() and _pins_report(python)["satisfied"]:
        return python
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    started = time.monotonic()
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--quiet",
         "--requirement", str(REQUIREMENTS), "--constraint", str(CONSTRAINTS)],
        check=True,
    )  # fmt: skip
    print(f"vllm 0.7.3 stack installed in {time.monotonic() - started:.0f} s into {VENV}")
    report = _pins_report(python)
    if report["broken_scripts"]:  # the same repair as roles/python_env/tasks/packages.yml
        subprocess.run(
            [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--quiet",
             "--force-reinstall", "--no-deps", *report["broken_scripts"]],
            check=True,
        )  # fmt: skip
        report = _pins_report(python)
    assert report["satisfied"], f"the pins did not install as written: {report}"
    return python


def _parse(python: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-c", PARSE, *args], capture_output=True, text=True, timeout=300)


def test_installed_versions_match_the_pins(vllm_python: Path) -> None:
    versions = _pins_report(vllm_python)["versions"]
    assert versions["vllm"] == "0.7.3"
    assert versions["torch"] == "2.5.1"
    assert versions["xformers"] == "0.0.28.post3"
    assert versions["modelscope"] == "1.40.2"
    assert versions["modelscope-hub"] == "0.5.1"


def test_modelscope_cli_runs_beside_vllm(vllm_python: Path) -> None:
    # model_store runs this environment's `modelscope` CLI; its deps must load beside vLLM's pins.
    cli = vllm_python.parent / "modelscope"
    result = subprocess.run([str(cli), "download", "--help"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--revision" in result.stdout
    assert "LOCAL_DIR" in result.stdout


def test_transformers_sees_torch(vllm_python: Path) -> None:
    # Newer transformers silently disable PyTorch below 2.6; vLLM then cannot load any model.
    code = "import transformers.utils as u, sys; sys.exit(0 if u.is_torch_available() else 3)"
    result = subprocess.run([str(vllm_python), "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("group", TOPOLOGIES)
def test_real_parser_accepts_rendered_args(vllm_python: Path, group: str) -> None:
    profile = group_state(group)
    started = time.monotonic()
    result = _parse(vllm_python, vllm_args(profile))
    print(f"{group}: parser import + parse took {time.monotonic() - started:.1f} s")
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])

    assert parsed["model"] == profile["gpubox_model_dir"]
    assert parsed["served_model_name"] == [profile["gpubox_served_model_name"]]
    assert parsed["host"] == "0.0.0.0"
    assert parsed["port"] == profile["gpubox_port"]
    assert parsed["tensor_parallel_size"] == profile["gpubox_tensor_parallel_size"]
    assert parsed["pipeline_parallel_size"] == profile["gpubox_pipeline_parallel_size"]
    assert parsed["gpu_memory_utilization"] == pytest.approx(profile["gpubox_gpu_memory_utilization"])
    assert parsed["max_model_len"] == profile["gpubox_max_model_len"]
    assert parsed["max_num_seqs"] == profile["gpubox_max_num_seqs"]
    assert parsed["max_num_batched_tokens"] == profile["gpubox_max_num_batched_tokens"]
    assert parsed["dtype"] == profile["gpubox_model_dtype"]
    assert parsed["quantization"] == profile["gpubox_model_quantization"]
    assert parsed["kv_cache_dtype"] == profile["gpubox_kv_cache_dtype"]
    assert parsed["enforce_eager"] is profile["gpubox_enforce_eager"]
    assert parsed["disable_log_requests"] is True
    assert parsed["api_key"] is None


def test_real_parser_rejects_an_unknown_flag(vllm_python: Path) -> None:
    args = [*vllm_args(group_state(TOPOLOGIES[0])), "--no-such-flag-in-vllm-073"]
    result = _parse(vllm_python, args)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "--no-such-flag-in-vllm-073" in result.stderr


# Runs inside the vLLM venv: the parser's choices for the flags state_checks validates.
CHOICES = """
import json
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
print(json.dumps({a.dest: list(a.choices) for a in parser._actions if a.choices is not None}))
"""


def test_desired_state_choices_are_vllm_073s(vllm_python: Path) -> None:
    from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks

    out = subprocess.run([str(vllm_python), "-c", CHOICES], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    choices = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(state_checks.DTYPES) == set(choices["dtype"])
    assert set(state_checks.KV_CACHE_DTYPES) == set(choices["kv_cache_dtype"])
    assert set(state_checks.QUANTIZATIONS) | {None} >= set(choices["quantization"]) - {None}
    assert set(choices["quantization"]) - {None} == set(state_checks.QUANTIZATIONS)
    assert set(state_checks.BLOCK_SIZES) <= set(choices["block_size"])


@pytest.mark.parametrize("flag", ["--api_key", "--api-ke", "--max_model_len", "-tp4", "-qawq", "--served-model"])
def test_the_parser_reads_refused_spellings_as_rendered_flags(vllm_python: Path, flag: str) -> None:
    """Every spelling state_checks refuses really is read by vLLM 0.7.3 as the key or a rendered flag."""
    from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks

    assert state_checks.flag_problem(flag) is not None
    base = [a for a in vllm_args(group_state(TOPOLOGIES[0]))]
    value = [] if flag.startswith(("-tp", "-q")) else ["x" if "api" in flag or "served" in flag else "4096"]
    result = _parse(vllm_python, [*base, flag, *value])
    if flag == "-tp4" and result.returncode == 2:
        return  # vLLM 0.7.3 refuses it itself: refusing it before the box changes loses nothing
    assert result.returncode == 0, result.stderr[-2000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    changed = {
        "--api_key": parsed["api_key"] == "x",
        "--api-ke": parsed["api_key"] == "x",
        "--max_model_len": parsed["max_model_len"] == 4096,
        "-tp4": parsed["tensor_parallel_size"] == 4,
        "-qawq": parsed["quantization"] == "awq",
        "--served-model": parsed["served_model_name"] == ["x"],
    }[flag]
    assert changed, parsed
