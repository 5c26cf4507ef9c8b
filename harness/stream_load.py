#!/usr/bin/python3
"""TEST ONLY: sustained streaming load through the gateway, until told to stop (molecule/fleet, issue 22).

Usage: stream_load.py --ca CAFILE --key-file KEYFILE --out OUT.jsonl --samples SAMPLES.jsonl --stop STOPFILE
                      [--host 127.0.0.1] [--port 443] [--clients 32] [--tokens 100-300] [--hot-clients 10]
                      [--sessions 11] [--seed 22] [--session-prefix P]

--clients clients stream chat completions one after the other, each on its own kept-alive TLS connection
to the gateway, each with an X-Session-Id: the first --hot-clients share one session ("hot", one tenant
with many chats at once: the skewed mix), the others spread over --sessions sessions (--session-prefix goes
before each name: the same mix, other names, so another placement on the ring). Each stream asks for
a token count drawn from --tokens; at the stand-in's pace (molecule/shared/group_vars/gpubox_sim_standin.yml,
100 ms a token) 100-300 tokens last 10-30 s. When STOPFILE appears, each client finishes the stream it is
in and stops (a stream is never cut by the client).

OUT gets one JSON line per stream: {"t": start (epoch s), "end", "client", "session", "status" (HTTP, or 0
when the connection failed), "error" (also when a 200's stream broke off), "tokens" (asked), "got" (token
events that came), "done" ([DONE] came),
"whole" (done and got == tokens), "ttft_s", "box" (the stand-in's x-gpubox-standin-host header)}.
SAMPLES gets, once a second, {"t", "in_flight": {box: streams}} counted from the streams' headers.
The key is read from KEYFILE (root only), never from argv. Standard library only (sse_client.py, copied
beside it).

    stream_load.py --summarize START SPLIT END --out OUT.jsonl --samples SAMPLES.jsonl

prints the figures of two phases as JSON: "steady" (streams that started in [START, SPLIT)) and "roll"
(started in [SPLIT, END]): streams, failed (no HTTP 200, or the connection failed), truncated (200 but not
whole), TTFT p50/p99; and, over the steady phase's samples, the load per box (mean streams in flight), the
busiest box's mean over the pool's mean (the load bound), and the share of each session's streams on its
most frequent box, over all streams and over all but the hot session's (affinity).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import sys
import time

try:  # in the checkout (the harness package)
    from harness.engine_standin import sse_client
except ImportError:  # copied into the gateway container beside sse_client.py (standard library only)
    import sse_client  # type: ignore[no-redef]


class Load:
    def __init__(self, args: argparse.Namespace, key: str) -> None:
        self.args = args
        self.key = key
        # no CA: plain HTTP (bench/placement_load.py's path to a router without TLS)
        self.ctx = ssl.create_default_context(cafile=args.ca) if args.ca else None
        low, _, high = args.tokens.partition("-")
        self.tokens = (int(low), int(high or low))
        self.in_flight: dict[str, int] = {}
        self.out = open(args.out, "a", encoding="utf-8")  # noqa: SIM115 (closed in run)
        self.samples = open(args.samples, "a", encoding="utf-8")  # noqa: SIM115

    def stopped(self) -> bool:
        return os.path.exists(self.args.stop)

    def write(self, fh, line: dict) -> None:
        fh.write(json.dumps(line) + "\n")
        fh.flush()

    def next_chat(self, n: int, rng: random.Random) -> tuple[str, list[dict]]:
        """Client n's next stream: its session and messages (the fleet's mix: one short chat, a fixed session).
        A bench's workload overrides it (bench/placement_load.py), and answered()."""
        name = "hot" if n < self.args.hot_clients else f"session-{n % self.args.sessions}"
        return self.args.session_prefix + name, [{"role": "user", "content": f"chat {n}"}]

    def answered(self, n: int, line: dict) -> None:
        """Called after each of client n's streams with its line (what OUT gets)."""

    async def client(self, n: int) -> None:
        rng = random.Random(self.args.seed * 1000 + n)
        reader = writer = None
        while not self.stopped():
            tokens = rng.randint(*self.tokens)
            session, messages = self.next_chat(n, rng)
            line = {"t": round(time.time(), 3), "client": n, "session": session, "status": 0, "error": "",
                    "tokens": tokens, "got": 0, "done": False, "whole": False, "ttft_s": None, "box": ""}  # fmt: skip
            box = ""
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(
                        self.args.host, self.args.port, ssl=self.ctx, limit=1 << 20
                    )
                body = {"model": "tiny", "messages": messages, "max_tokens": tokens, "stream": True}
                sent = time.perf_counter()
                writer.write(sse_client.request("/v1/chat/completions", "gpubox-gateway", self.key, body,
                                                {"X-Session-Id": session}))  # fmt: skip
                await writer.drain()
                status, headers = await sse_client.read_head(reader)
                line["status"] = status
                box = line["box"] = headers.get("x-gpubox-standin-host", "")
                if status != 200:
                    line["error"] = (await sse_client.skip_body(reader, headers))[:200].decode("utf-8", "replace")
                else:
                    self.in_flight[box] = self.in_flight.get(box, 0) + 1
                    times: list[float] = []
                    try:
                        _, done = await sse_client.read_events(reader, times)
                        line.update(done=done, whole=done and len(times) == tokens)
                    finally:
                        self.in_flight[box] -= 1
                        line["got"] = len(times)
                        line["ttft_s"] = round(times[0] - sent, 4) if times else None
                if headers.get("connection", "").lower() == "close":
                    writer.close()
                    reader = writer = None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ssl.SSLError) as exc:
                line["error"] = f"{type(exc).__name__}: {exc}"[:200]
                if writer is not None:
                    writer.close()
                reader = writer = None
                await asyncio.sleep(0.5)
            line["end"] = round(time.time(), 3)
            self.write(self.out, line)
            self.answered(n, line)
        if writer is not None:
            writer.close()

    async def sampler(self, clients: list[asyncio.Task]) -> None:
        while not all(task.done() for task in clients):
            self.write(self.samples, {"t": round(time.time(), 3), "in_flight": dict(self.in_flight)})
            await asyncio.sleep(1)

    async def run(self) -> None:
        try:
            clients = [asyncio.create_task(self.client(n)) for n in range(self.args.clients)]
            await asyncio.gather(self.sampler(clients), *clients)
        finally:
            self.out.close()
            self.samples.close()


def phase(lines: list[dict]) -> dict:
    """failed: no answer or not 200; truncated: a 200 whose stream did not end whole (cut, or short)."""
    ok = [line for line in lines if line["status"] == 200]
    ttft = [line["ttft_s"] for line in ok if line["ttft_s"] is not None]

    def ms(q: float) -> float | None:
        value = sse_client.percentile(ttft, q)
        return None if value is None else round(value * 1000, 1)

    return {
        "streams": len(lines),
        "failed": len(lines) - len(ok),
        "truncated": sum(1 for line in ok if not line["whole"]),
        "tokens": sum(line["got"] for line in ok),
        "ttft_p50_ms": ms(50),
        "ttft_p99_ms": ms(99),
        "failures": [line for line in lines if line not in ok or not line["whole"]][:10],
    }


def share(sessions) -> float | None:
    """Of the streams of these sessions ({box: streams} each), the share on each session's most frequent box."""
    sessions = list(sessions)
    placed = sum(sum(counts.values()) for counts in sessions)
    return round(sum(max(counts.values()) for counts in sessions) / placed, 3) if placed else None


def summarize(lines: list[dict], samples: list[dict], start: float, split: float, end: float) -> dict:
    steady = [line for line in lines if start <= line["t"] < split]
    roll = [line for line in lines if split <= line["t"] <= end]
    boxes = sorted({line["box"] for line in steady if line["box"]})
    window = [sample["in_flight"] for sample in samples if start <= sample["t"] < split]
    load = {box: round(sum(s.get(box, 0) for s in window) / len(window), 2) for box in boxes} if window else {}
    mean = sum(load.values()) / len(load) if load else 0
    by_session: dict[str, dict[str, int]] = {}
    for line in steady:
        if line["box"]:
            counts = by_session.setdefault(line["session"], {})
            counts[line["box"]] = counts.get(line["box"], 0) + 1
    hot = next((line["session"] for line in steady if line["client"] == 0), None)  # client 0 is a hot one
    return {
        "steady": phase(steady),
        "roll": phase(roll),
        "load_per_box": load,
        "busiest_over_mean": round(max(load.values()) / mean, 3) if mean else None,
        "session_share_on_own_box": share(by_session.values()),
        "hot": hot,
        "session_share_without_hot": share(counts for name, counts in by_session.items() if name != hot),
        "sessions": {name: counts for name, counts in sorted(by_session.items())},
        "samples": len(window),
    }


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="TEST ONLY: streaming load through the gateway")
    parser.add_argument("--summarize", nargs=3, type=float, metavar=("START", "SPLIT", "END"))
    parser.add_argument("--ca")
    parser.add_argument("--key-file")
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples", required=True)
    parser.add_argument("--stop")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=443)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--tokens", default="100-300")
    parser.add_argument("--hot-clients", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=11)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--session-prefix", default="", help="put before every session name (another placement)")
    args = parser.parse_args(argv)
    if args.summarize:
        figures = summarize(read_jsonl(args.out), read_jsonl(args.samples), *args.summarize)
        print(json.dumps(figures, sort_keys=True))
        return 0
    if not (args.ca and args.key_file and args.stop):
        parser.error("--ca, --key-file and --stop are needed to run the load")
    with open(args.key_file, encoding="utf-8") as fh:
        key = fh.read().split()[0]  # the first word: the gateway's file is "<key> <tenant>" a line
    asyncio.run(Load(args, key).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
