"""The engine stand-in (harness/engine_standin/standin.py, TEST ONLY) speaks what clients and gpubox's
checks ask of vLLM 0.7.3's OpenAI server, directly and through the real front door and gateway."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import live_proxies

ROOT = Path(__file__).resolve().parents[2]
KEY = live_proxies.GATEWAY_KEY
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def standin() -> Iterator[int]:
    proc, port = live_proxies.start_standin(40, 5)
    try:
        yield port
    finally:
        live_proxies.stop(proc)


def _connection(port: int, tls: bool) -> http.client.HTTPConnection:
    if tls:
        return http.client.HTTPSConnection("127.0.0.1", port, timeout=20, context=live_proxies.unverified_tls())
    return http.client.HTTPConnection("127.0.0.1", port, timeout=20)


def ask(port: int, method: str, path: str, body: dict | None = None, headers: dict | None = None, tls: bool = False):
    conn = _connection(port, tls)
    try:
        started = time.monotonic()
        conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read().decode(), time.monotonic() - started
    finally:
        conn.close()


def events(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            payload = block[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_health_models_metrics_and_the_key(standin: int) -> None:
    assert ask(standin, "GET", "/health")[0] == 200  # no key needed, as vLLM 0.7.3
    status, _, body, _ = ask(standin, "GET", "/v1/models")
    assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
    status, _, body, _ = ask(standin, "GET", "/v1/models", headers=AUTH)
    assert status == 200 and json.loads(body)["data"][0]["id"] == "tiny"
    metrics = ask(standin, "GET", "/metrics")[2]
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_count"):  # fmt: skip
        assert f"\n{name}{{" in metrics, name


def test_a_chat_stream_is_whole_and_keeps_its_pace(standin: int) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    status, ctype, text, took = ask(standin, "POST", "/v1/chat/completions", body, AUTH)
    assert status == 200 and ctype.startswith("text/event-stream")
    got = events(text)
    assert got[-1] == "[DONE]"
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}  # vLLM 0.7.3's first chunk
    tokens = [e for e in got[1:-1] if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(tokens) == 12 and tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert got[-2]["usage"]["completion_tokens"] == 12 and got[-2]["choices"] == []
    assert took >= 0.040 + 11 * 0.005  # the first token after --ttft-ms, then one each --itl-ms


def test_completions_plain_and_bad_input(standin: int) -> None:
    status, _, text, _ = ask(standin, "POST", "/v1/completions", {"prompt": "a b c", "max_tokens": 3}, AUTH)
    answer = json.loads(text)
    assert status == 200 and answer["choices"][0]["text"] == "tok tok tok"
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert ask(standin, "POST", "/v1/completions", {"max_tokens": 0}, AUTH)[0] == 400
    assert ask(standin, "POST", "/v1/nothing", {}, AUTH)[0] == 404


def test_a_stream_through_the_gateway_and_the_front_door_arrives_whole(standin: int, tmp_path: Path) -> None:
    (tmp_path / "box").mkdir()
    try:
        front, front_port = live_proxies.start_front_door(tmp_path / "box", standin, {}, 1024)
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))
    try:
        try:
            gateway, port = live_proxies.start_gateway(
                tmp_path / "gw", front_port, tmp_path / "box" / "tls.crt", {}, log=tmp_path / "haproxy.log"
            )
        except live_proxies.Missing as exc:
            pytest.fail(str(exc))
        try:
            time.sleep(0.5)  # the gateway's first health check
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": True, "model": "tiny"}
            status, _, text, _ = ask(port, "POST", "/v1/chat/completions", body, AUTH, tls=True)
            got = events(text)
            assert status == 200 and got[-1] == "[DONE]", text[-300:]
            assert sum(1 for e in got[1:-1] if e["choices"][0]["delta"].get("content")) == 20
        finally:
            live_proxies.stop(gateway)
    finally:
        live_proxies.stop(front)


def _arrivals(port: int, tokens: int) -> list[float]:
    """When each read of a streamed completion arrived through the front door (one read per chunk)."""
    conn = _connection(port, tls=True)
    try:
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": tokens, "stream": True}), AUTH)
        resp = conn.getresponse()
        assert resp.status == 200
        times = []
        while chunk := resp.read1(65536):
            if b"data:" in chunk:
                times.append(time.monotonic())
        return times
    finally:
        conn.close()


def test_the_front_door_passes_each_event_on_as_it_comes_and_buffering_would_not(tmp_path: Path) -> None:
    # A stand-in paced at 60 ms a token: unbuffered, 20 events arrive 60 ms apart, far above any scheduling
    # noise; with proxy_buffering on (the rendered file changed in one word) nginx holds them to the end.
    def buffering_on(conf: str) -> str:
        assert "proxy_buffering off;" in conf
        return conf.replace("proxy_buffering off;", "proxy_buffering on;")

    engine, port = live_proxies.start_standin(10, 60)
    gaps = {}
    try:
        for mode, edit in (("off", None), ("on", buffering_on)):
            (tmp_path / mode).mkdir()
            try:
                front, front_port = live_proxies.start_front_door(tmp_path / mode, port, {}, edit=edit)
            except live_proxies.Missing as exc:
                pytest.fail(str(exc))
            try:
                times = _arrivals(front_port, 20)
            finally:
                live_proxies.stop(front)
            gaps[mode] = sum(1 for a, b in zip(times, times[1:]) if b - a > 0.030)
    finally:
        live_proxies.stop(engine)
    assert gaps["off"] >= 10, gaps  # piece by piece (19 when nothing else runs)
    assert gaps["on"] <= 3, gaps  # the test can fail: buffered, the events come together


def test_under_vllms_module_name_it_takes_the_production_command_line(tmp_path: Path) -> None:
    """As molecule/shared/prepare.yml installs it for group gpubox_sim_standin: vllm/entrypoints/openai/api_server.py
    (namespace packages) on PYTHONPATH, started with the 2x3090 box's own vLLM 0.7.3 arguments (the real renderer)."""
    import os
    import shutil
    import socket
    import subprocess
    import sys

    from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import vllm_args
    from test_vllm_args import group_state

    package = tmp_path / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    shutil.copy(live_proxies.STANDIN, package / "api_server.py")
    port = live_proxies.free_port()
    args = vllm_args({**group_state("gpu_2x3090"), "gpubox_port": port}, "127.0.0.1", True, True)
    assert "--tensor-parallel-size" in args and "--middleware" in args  # flags the stand-in only takes
    env = dict(os.environ, PYTHONPATH=str(tmp_path), GPUBOX_STANDIN_TTFT_MS="5", GPUBOX_STANDIN_ITL_MS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        live_proxies.wait_for(port, proc, "stand-in")
        conn = _connection(port, tls=False)
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        served = args[args.index("--served-model-name") + 1]
        assert resp.status == 200 and json.loads(resp.read())["data"][0]["id"] == served
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 3}), {})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("x-gpubox-standin-host") == socket.gethostname()
        assert json.loads(resp.read())["usage"]["completion_tokens"] == 3
    finally:
        live_proxies.stop(proc)
    start_line = proc.stdout.read()
    assert "TEST ONLY" in start_line and "--tensor-parallel-size" in start_line, start_line


def test_a_start_delay_keeps_it_from_listening_until_it_has_passed() -> None:
    import os
    import socket
    import subprocess
    import sys

    port = live_proxies.free_port()
    env = dict(os.environ, GPUBOX_STANDIN_START_DELAY_S="1.5")
    proc = subprocess.Popen([sys.executable, str(live_proxies.STANDIN), "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(0.5)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        live_proxies.wait_for(port, proc, "stand-in")  # then it listens
    finally:
        live_proxies.stop(proc)
