"""bench/proxy_load.py end to end at a tiny load (real nginx and HAProxy on loopback, the engine stand-in), and the
section bench/report.py writes from what it recorded."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from bench import proxy_load
from bench import report as bench
from harness import live_proxies

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()), reason="needs nginx")
def test_every_path_carries_whole_streams_and_the_report_shows_them(tmp_path: Path) -> None:
    out = tmp_path / "proxy-load.json"
    argv = ["--levels", "1,4", "--tokens", "5", "--ttft-ms", "20", "--itl-ms", "2", "--requests", "2"]
    argv += ["--variants", "glibc-defaults", "--out", str(out)]
    assert proxy_load.main(argv) == 0
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"direct", "front door", "gateway", "gateway, glibc-defaults"}
    # the role's gateway ran with its unit's environment (the drop-in, rendered from the role's defaults), the
    # variant without it; each HAProxy's page faults and memory were read
    assert data["haproxy_environment"] == {"gateway": live_proxies.gateway_environment(), "gateway, glibc-defaults": {}}
    assert "glibc.malloc.mmap_threshold=" in data["haproxy_environment"]["gateway"]["GLIBC_TUNABLES"]
    for name in ("gateway", "gateway, glibc-defaults"):
        assert all(r["haproxy_page_faults"] >= 0 and r["haproxy_peak_rss_kib"] > 0 for r in data["results"][name])
    for rows in data["results"].values():
        assert [r["level"] for r in rows] == [1, 4]
        for r in rows:
            assert (r["completed"], r["errors"], r["truncated"]) == (r["level"] * 2, 0, 0), r
            assert r["ttft_p50_ms"] >= 20 and r["most_in_flight"] == r["level"]
            # each client's first stream apart from its second (kept alive)
            assert r["ttft_first_p50_ms"] >= 20 and r["ttft_kept_p50_ms"] >= 20, r
    assert data["most_streams_held"] == {"direct": 4, "front door": 4, "gateway": 4, "gateway, glibc-defaults": 4}
    text = bench.proxy_load_report(out)
    assert "| 4 | gateway | 8 / 8 | 0 | 0 | 4 |" in text
    assert "Most concurrent streams held with 0 errors and 0 truncated: direct 4, front door 4, gateway 4," in text
    assert "- gateway: its environment given `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=" in text
    assert "- gateway adds to direct p99 TTFT (ms, by level): 1: " in text


def test_no_recorded_run_says_how_to_make_one(tmp_path: Path) -> None:
    assert "No run recorded (run: make bench-load" in bench.proxy_load_report(tmp_path / "none.json")


def test_a_stream_cut_before_done_or_short_of_tokens_is_truncated_and_an_error_status_is_an_error() -> None:
    # A server that answers: 2 token events and no [DONE]; 2 events and [DONE] (3 were asked); then a 429.
    answers = [
        [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'] * 2,
        [b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n'] * 2 + [b"data: [DONE]\n\n"],
    ]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            if not answers:
                writer.write(b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for event in answers.pop(0):
                writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    async def go() -> dict:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await proxy_load.Run(port, False, 1, 3, 3).go()

    row = asyncio.run(go())
    assert (row["completed"], row["truncated"], row["errors"]) == (0, 2, 1), row
    assert proxy_load.sse_client.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert proxy_load.sse_client.percentile([], 99) is None


def test_variants_run_beside_the_roles_gateway(tmp_path: Path) -> None:
    out = tmp_path / "proxy-load.json"
    argv = ["--levels", "2", "--tokens", "3", "--ttft-ms", "10", "--itl-ms", "2", "--requests", "2", "--out", str(out)]
    assert proxy_load.main([*argv, "--variants", "reuse-safe,no-l7-retries,64k-bound", "--rounds", "2"]) == 0
    results = json.loads(out.read_text())["results"]
    assert list(results)[2:] == ["gateway", "gateway, reuse-safe", "gateway, no-l7-retries", "gateway, 64k-bound"]
    # 2 clients x 2 streams, in each of 2 rounds
    assert all(rows[0]["completed"] == rows[0]["streams"] == 8 for rows in results.values()), results
    assert all(rows[0]["errors"] == 0 for rows in results.values()), results
