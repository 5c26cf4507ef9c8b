"""harness/stream_load.py, the fleet's streaming load client: its figures, and a live run through
the real front door and gateway (nginx and HAProxy with the roles' rendered files) to the engine stand-in.
The live run also shows the client counts a stream the engine cuts as truncated: the test can fail."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import live_proxies, stream_load
from harness.engine_standin import sse_client


def boxed(tmp_path: Path) -> Path:
    """stream_load.py as molecule/fleet installs it on the gateway: beside sse_client.py, no harness package."""
    where = tmp_path / "gateway-client"
    where.mkdir(exist_ok=True)
    for source in (Path(stream_load.__file__), Path(sse_client.__file__)):
        shutil.copy(source, where / source.name)
    return where / "stream_load.py"


def line(
    t: float, session: str, box: str, status: int = 200, whole: bool = True, ttft: float = 0.1, client: int = 0
) -> dict:
    return {"t": t, "end": t + 1, "client": client, "session": session, "status": status, "error": "", "tokens": 3,
            "got": 3 if whole else 1, "done": whole, "whole": whole, "ttft_s": ttft, "box": box}  # fmt: skip


def test_summary_counts_failed_and_truncated_streams_per_phase() -> None:
    lines = [line(1, "a", "b1"), line(2, "a", "b1"), line(3, "b", "b2", whole=False), line(4, "c", "b3", status=502)]
    lines += [line(11, "a", "b2", ttft=0.3), line(12, "a", "b1")]
    figures = stream_load.summarize(lines, [], 0, 10, 20)
    assert figures["steady"]["streams"] == 4
    assert figures["steady"]["failed"] == 1
    assert figures["steady"]["truncated"] == 1
    assert figures["roll"] == {**figures["roll"], "streams": 2, "failed": 0, "truncated": 0, "ttft_p99_ms": 300.0}


def test_summary_load_bound_and_session_share() -> None:
    # b1 carries 6 streams in flight on average, b2 and b3 three: the busiest over the mean is 6 / 4 = 1.5
    samples = [{"t": t, "in_flight": {"b1": 6, "b2": 3, "b3": 3}} for t in range(10)]
    samples.append({"t": 50, "in_flight": {"b1": 100}})  # outside the steady phase
    lines = [line(1, "cold", "b3", client=5)] * 10 + [line(1, "hot", "b1")] * 8 + [line(1, "hot", "b2")] * 2
    lines += [line(1, "warm", "b2", client=6)] * 3 + [line(1, "warm", "b3", client=7)]
    figures = stream_load.summarize(lines, samples, 0, 10, 20)
    assert figures["load_per_box"] == {"b1": 6.0, "b2": 3.0, "b3": 3.0}
    assert figures["busiest_over_mean"] == 1.5
    assert figures["session_share_on_own_box"] == 0.875  # (10 + 8 + 3) / 24
    # the hot session is client 0's (the first --hot-clients share it): without it (10 + 3) / 14
    assert figures["session_share_without_hot"] == round(13 / 14, 3)
    assert figures["samples"] == 10


@pytest.fixture
def fleet_of_one(tmp_path: Path):
    """The stand-in behind the real front door and gateway; yields (gateway port, CA file, key file, stand-in)."""
    engine, engine_port = live_proxies.start_standin(20, 10)
    (tmp_path / "box").mkdir()
    procs = [engine]
    try:
        try:
            front, front_port = live_proxies.start_front_door(tmp_path / "box", engine_port, {}, 1024)
            procs.append(front)
            gateway, port = live_proxies.start_gateway(
                tmp_path / "gw", front_port, tmp_path / "box" / "tls.crt", {}, log=tmp_path / "haproxy.log"
            )
            procs.append(gateway)
        except live_proxies.Missing as exc:
            pytest.fail(str(exc))
        (tmp_path / "key").write_text(live_proxies.GATEWAY_KEY + "\n")
        time.sleep(0.5)  # the gateway's first health check
        yield port, tmp_path / "gw" / "tls.pem", tmp_path / "key", engine
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                live_proxies.stop(proc)


def run_load(tmp_path: Path, port: int, ca: Path, key: Path, clients: int, tokens: str) -> subprocess.Popen:
    # -S: no site-packages, so not the venv's .pth either: the script imports sse_client from beside it
    argv = [sys.executable, "-S", str(boxed(tmp_path)), "--ca", str(ca), "--key-file", str(key), "--port", str(port),
            "--out", str(tmp_path / "out.jsonl"), "--samples", str(tmp_path / "samples.jsonl"),
            "--stop", str(tmp_path / "stop"), "--clients", str(clients), "--tokens", tokens, "--hot-clients", "2",
            "--sessions", "3"]  # fmt: skip
    return subprocess.Popen(argv)


def summary(tmp_path: Path, start: float, split: float, end: float) -> dict:
    out = subprocess.run(
        [sys.executable, "-S", str(boxed(tmp_path)), "--summarize", str(start), str(split), str(end),
         "--out", str(tmp_path / "out.jsonl"), "--samples", str(tmp_path / "samples.jsonl")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_whole_streams_through_the_gateway_each_named_by_its_box(fleet_of_one, tmp_path: Path) -> None:
    port, ca, key, _ = fleet_of_one
    start = time.time()
    load = run_load(tmp_path, port, ca, key, 6, "10-20")
    time.sleep(2)
    (tmp_path / "stop").touch()
    assert load.wait(timeout=30) == 0
    figures = summary(tmp_path, start, time.time(), time.time())
    steady = figures["steady"]
    assert steady["streams"] >= 6 and steady["failed"] == 0 and steady["truncated"] == 0, steady
    assert figures["load_per_box"].keys() == {socket.gethostname()}
    assert figures["samples"] >= 1
    assert key.read_text().strip() not in (tmp_path / "out.jsonl").read_text()


def test_a_stream_the_engine_cuts_is_counted_truncated(fleet_of_one, tmp_path: Path) -> None:
    port, ca, key, engine = fleet_of_one
    start = time.time()
    load = run_load(tmp_path, port, ca, key, 3, "200-200")  # 2 s a stream at 10 ms a token
    time.sleep(0.8)
    engine.kill()  # as vLLM 0.7.3 on SIGTERM: what is in flight ends mid-stream
    engine.wait(timeout=10)
    time.sleep(0.5)
    (tmp_path / "stop").touch()
    assert load.wait(timeout=60) == 0
    lines = [json.loads(text) for text in (tmp_path / "out.jsonl").read_text().splitlines()]
    figures = summary(tmp_path, start, time.time() + 1, time.time() + 1)
    cut = [entry for entry in lines if entry["status"] == 200 and not entry["whole"]]
    assert len(cut) >= 1 and all(0 < entry["got"] < 200 for entry in cut), lines
    assert figures["steady"]["truncated"] == len(cut), figures["steady"]
