#!/usr/bin/env python3
"""What the front door and the gateway add under concurrent streams (issue 22, first part): a bench, not a test.

    python bench/proxy_load.py [--levels 1,32,128,256,512] [--tokens 32] [--ttft-ms 50] [--itl-ms 20]
                               [--requests 10] [--rounds 1]
                               [--variants glibc-defaults,reuse-safe,no-l7-retries,64k-bound,no-homes,purge-5s]
                               [--out bench/proxy-load.json]

Side by side, in one run, on this machine's loopback:
  direct        the client -> the engine stand-in;
  front door    the client -> nginx with roles/front_door's rendered file (TLS) -> the stand-in;
  gateway       the client -> HAProxy with roles/llm_gateway's rendered file (TLS) -> the front door -> the stand-in,
                HAProxy with the environment of the role's unit (its drop-in's glibc malloc tunables);
  gateway, <v>  with --variants, the same with one setting of the role's changed (VARIANTS below): glibc-defaults
                (no tunables in HAProxy's environment), reuse-safe (HAProxy's default http-reuse), no-l7-retries
                (retry-on conn-failure alone), 64k-bound (64 KiB buffers), no-homes (prefix placement by HAProxy's
                hash alone, no Lua placement), purge-5s (idle connections to the box purged at HAProxy's default
                pace, 5 s; the role's: 60 s), to measure what each costs or saves side by side.
At each level N, N clients each send --requests streaming chat completions of --tokens tokens one after the
other on one kept-alive connection, all starting together (--rounds times, the paths in turn; the figures pool
every round's streams, so that a load passing on this shared machine falls on every path). Per path and level:
TTFT (request sent -> first token's event) and ITL (gap between token events) p50/p99; TTFT apart for each
connection's first stream (at a round's start all clients' at once: behind the gateway each opens a TLS
connection to the box unless an idle one is reused) and for the later ones (kept alive: the steady state); the
connection set-up (TCP, and TLS for the proxies; not in TTFT) p50/p99, completed streams per second, the most
streams in flight at once, errors and truncated streams (a stream is whole when it ends with `data: [DONE]` after
exactly --tokens token events). The most concurrent streams held is the highest level with 0 errors and 0 truncated.
Per gateway and level, its HAProxy's minor page faults over the level's rounds (its own streams) and its resident
memory after them, now and at its peak (/proc).

What is real: nginx and HAProxy from Debian's archive, running the roles' own rendered configuration (their
limits raised far above the load, since a limit refusing the load is policy, not overhead; nginx's
worker_connections 8192 where the test default, 512, holds 255 streams). What is not: the engine is
harness/engine_standin/standin.py (TEST ONLY: fixed TTFT and ITL, no model), and the client is ours
(asyncio, standard library): vLLM 0.7.3's wheel ships no benchmark client and the kept ones (vLLM's
`vllm bench serve`, guidellm) need a torch install beside it. Client, proxies and stand-in share this
machine's cores, so every figure includes their contention; on 2 cores that dominates at high levels.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))
from ansible.plugins.loader import init_plugin_loader  # noqa: E402

if not any(type(finder).__name__ == "_AnsibleCollectionFinder" for finder in sys.meta_path):  # pytest's is set up
    init_plugin_loader(prefix_collections_path=[str(ROOT / "collections")])  # as tests/conftest.py does
from harness import live_proxies  # noqa: E402
from harness.engine_standin import sse_client  # noqa: E402

KEY = live_proxies.GATEWAY_KEY
# One tenant (its key: KEY, live_proxies' gpubox_api_key) whose limits a load never reaches.
HIGH_LIMITS_FRONT_DOOR = {
    "gpubox_tenants": [{"name": "bench", "keys": [KEY], "requests_per_s": 100000, "burst": 100000, "streams": 65535}],
}
# The role's check interval, not live_proxies' 200 ms (a test's speed-up): a check's TCP and TLS set-up gets
# min(timeout connect, interval), so at 200 ms a loaded machine's slow handshake took the one box out.
HIGH_LIMITS_GATEWAY = {
    "llm_gateway_rate_per_client": 10000000,
    "llm_gateway_rate_period_s": 10,
    "llm_gateway_check_interval_ms": 1000,
}


class Client:
    """One client: --requests streams one after the other on one kept-alive connection (reconnects if closed)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        started = time.perf_counter()
        self.reader, self.writer = await asyncio.open_connection(
            "127.0.0.1", self.run.port, ssl=self.run.tls_context, limit=1 << 20
        )
        self.run.connect.append(time.perf_counter() - started)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await self.writer.wait_closed()
        self.reader = self.writer = None

    async def stream(self, n: int) -> None:
        run = self.run
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"stream {n}"}], "max_tokens": run.tokens,
                "stream": True}  # fmt: skip
        session = {"X-Session-Id": f"s{id(self) % 9973}"}
        message = sse_client.request("/v1/chat/completions", "localhost", KEY, body, session)
        opened = self.writer is None
        if opened:
            await self.connect()
        sent = time.perf_counter()
        self.writer.write(message)
        await self.writer.drain()
        run.in_flight += 1
        run.most_in_flight = max(run.most_in_flight, run.in_flight)
        try:
            status, headers = await sse_client.read_head(self.reader)
            if status != 200:
                await sse_client.skip_body(self.reader, headers)
                run.errors.append(f"HTTP {status}")
                return
            times, done = await sse_client.read_events(self.reader)
        finally:
            run.in_flight -= 1
        if times:
            run.ttft.append(times[0] - sent)
            (run.ttft_first if opened else run.ttft_kept).append(times[0] - sent)
            run.itl.extend(b - a for a, b in zip(times, times[1:]))
        if done and len(times) == run.tokens:
            run.completed += 1
        else:
            run.truncated += 1
        if headers.get("connection", "").lower() == "close":
            await self.close()

    async def work(self) -> None:
        for n in range(self.run.requests):
            try:
                await self.stream(n)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ssl.SSLError) as exc:
                self.run.errors.append(type(exc).__name__)
                await self.close()
        await self.close()


class Run:
    def __init__(self, port: int, tls: bool, level: int, tokens: int, requests: int) -> None:
        self.port, self.tls, self.level, self.tokens, self.requests = port, tls, level, tokens, requests
        # one context for every connection of the run (the rendered files' self-signed certificates unchecked)
        self.tls_context = live_proxies.unverified_tls() if tls else None
        self.ttft: list[float] = []
        self.ttft_first: list[float] = []  # the first stream on each connection (just opened)
        self.ttft_kept: list[float] = []  # the later ones, on a kept-alive connection
        self.itl: list[float] = []
        self.connect: list[float] = []  # TCP (+ TLS) connection set-up, not in TTFT
        self.errors: list[str] = []
        self.completed = 0
        self.truncated = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.rounds = 0
        self.wall = 0.0
        self.round_p99: dict[str, list[float | None]] = {"first": [], "kept": []}

    async def go(self) -> dict:
        """One round (the level's clients, all at once); the figures of every round this Run has had."""
        clients = [Client(self) for _ in range(self.level)]
        started, first, kept = time.perf_counter(), len(self.ttft_first), len(self.ttft_kept)
        await asyncio.gather(*(c.work() for c in clients))
        self.rounds += 1
        self.wall += time.perf_counter() - started
        wall = self.wall

        def ms(values: list[float], q: float) -> float | None:
            value = sse_client.percentile(values, q)
            return None if value is None else round(value * 1000, 2)

        # this round's p99s alone, so that a report can pair each path's round with the front door's beside it
        self.round_p99["first"].append(ms(self.ttft_first[first:], 99))
        self.round_p99["kept"].append(ms(self.ttft_kept[kept:], 99))

        return {
            "level": self.level, "streams": self.level * self.requests * self.rounds, "completed": self.completed,
            "truncated": self.truncated, "errors": len(self.errors), "error_kinds": sorted(set(self.errors))[:5],
            "most_in_flight": self.most_in_flight, "wall_s": round(wall, 2),
            "streams_per_s": round(self.completed / wall, 1) if wall else None,
            "ttft_p50_ms": ms(self.ttft, 50), "ttft_p99_ms": ms(self.ttft, 99),
            "ttft_first_p50_ms": ms(self.ttft_first, 50), "ttft_first_p99_ms": ms(self.ttft_first, 99),
            "ttft_kept_p50_ms": ms(self.ttft_kept, 50), "ttft_kept_p99_ms": ms(self.ttft_kept, 99),
            "ttft_first_p99_rounds_ms": self.round_p99["first"], "ttft_kept_p99_rounds_ms": self.round_p99["kept"],
            "itl_p50_ms": ms(self.itl, 50), "itl_p99_ms": ms(self.itl, 99),
            "connect_p50_ms": ms(self.connect, 50), "connect_p99_ms": ms(self.connect, 99),
        }  # fmt: skip


def provenance(script: str, argv: list[str] | None) -> dict:
    """The command, when and where a bench ran: the first keys of each bench's JSON record."""
    return {
        "command": f"python bench/{script} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}",
    }


def haproxy_version() -> str:
    """The HAProxy a bench ran, as its `haproxy -v` first line names it (e.g. "HAProxy version 2.6.12-1+deb12u4")."""
    out = subprocess.run([live_proxies.haproxy_binary(), "-v"], capture_output=True, text=True).stdout
    return out.splitlines()[0].split(" - ")[0]


# Gateways beside the role's own (--variants), each one setting of the role's changed, to measure what the setting
# costs or saves: name -> (the line the role's file must hold, what replaces it, the body bound in bytes, whether
# HAProxy runs with the role's unit environment: live_proxies.gateway_environment(), the drop-in's glibc tunables)
VARIANTS: dict[str, tuple[str, str, int, bool]] = {
    # glibc's own malloc thresholds: freed buffers go back to the system, a burst faults them in again
    "glibc-defaults": ("", "", 1 << 20, False),
    # HAProxy's default: each client connection's first request opens its own TLS connection to the box
    "reuse-safe": ("    http-reuse always\n", "", 1 << 20, True),
    # no L7 retries: HAProxy copies no request buffer before sending (src/stconn.c), and retries no 502/503
    "no-l7-retries": (
        "    retry-on conn-failure empty-response 502 503\n",
        "    retry-on conn-failure\n",
        1 << 20,
        True,
    ),
    # the bound before llm_gateway_max_body_bytes: 64 KiB buffers (bodies over 64 KiB refused)
    "64k-bound": ("", "", 64 << 10, True),
    # prefix placement without its homes (files/gpubox_route.lua's gpubox_place, the role's bound and generation):
    # HAProxy's hash of the key alone, as before homes; what the Lua placement costs a request
    "no-homes": ("    http-request lua.gpubox_place 120 150\n", "", 1 << 20, True),
    # HAProxy's default pool-purge-delay (the role's: 60 s): half of a box's idle connections closed every 5 s, so
    # that a burst of new clients after a quiet spell opens new TLS connections to the box in their first request
    "purge-5s": (" pool-purge-delay 60s\n", "\n", 1 << 20, True),
}


def process_memory(pid: int) -> dict[str, int]:
    """A process's minor page faults so far (all its threads) and its resident memory now and at its peak (KiB)."""
    faults = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])  # minflt, field 10
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"minflt": faults, **{key: int(status[key].split()[0]) for key in ("VmRSS", "VmHWM")}}


def variant_edit(name: str):
    line, replacement, _, _ = VARIANTS[name]

    def edit(conf: str) -> str:
        if line not in conf:
            raise live_proxies.Missing(f"--variants {name}: the role's gateway file has no {line.strip()!r} any more")
        return conf.replace(line, replacement)

    return edit if line else None


def start_paths(
    tmp: Path,
    ttft_ms: float,
    itl_ms: float,
    procs: list[subprocess.Popen],
    variants: list[str] = (),
    haproxies: dict[str, tuple[int, dict[str, str]]] | None = None,
) -> dict[str, tuple[int, bool]]:
    """The stand-in, the front door before it and the gateway before that (each appended to ``procs``, for the
    caller to stop): {path: (port, TLS)} for "direct", "front door" and "gateway", and "gateway, <variant>" for each
    of ``variants`` (over the same front door). ``haproxies`` gets each gateway path's HAProxy: (process id, what
    it was given in its environment)."""
    haproxies = {} if haproxies is None else haproxies
    engine, engine_port = live_proxies.start_standin(ttft_ms, itl_ms)
    procs.append(engine)
    box_dir = tmp / "box"
    box_dir.mkdir()
    front, front_port = live_proxies.start_front_door(box_dir, engine_port, HIGH_LIMITS_FRONT_DOOR, 8192)
    procs.append(front)
    paths = {"direct": (engine_port, False), "front door": (front_port, True)}
    environment = live_proxies.gateway_environment()  # the role's unit's, from its defaults
    for name in ["", *variants]:
        given = environment if not name or VARIANTS[name][3] else {}
        gateway, gateway_port = live_proxies.start_gateway(
            tmp / f"gateway{name}", front_port, box_dir / "tls.crt", HIGH_LIMITS_GATEWAY,
            log=tmp / f"haproxy{name}.log", edit=variant_edit(name) if name else None,
            body_max_bytes=VARIANTS[name][2] if name else 1 << 20,
            environment=given,
        )  # fmt: skip
        procs.append(gateway)
        path = f"gateway, {name}" if name else "gateway"
        paths[path] = (gateway_port, True)
        haproxies[path] = (gateway.pid, given)
    time.sleep(1.0)  # the gateway's first health checks mark the box up
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,32,128,256,512")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--requests", type=int, default=10, help="streams per client, one after the other")
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds per level, the paths in turn; figures over all rounds' streams"
    )
    parser.add_argument("--variants", default="", help=f"gateways beside the role's, comma-separated: {list(VARIANTS)}")
    parser.add_argument("--out", default=str(ROOT / "bench" / "proxy-load.json"))
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    variants = [x.strip() for x in args.variants.split(",") if x.strip()]
    if args.rounds < 1 or args.requests < 1:
        parser.error("--rounds and --requests must be 1 or more")
    if unknown := [x for x in variants if x not in VARIANTS]:
        parser.error(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # nginx and HAProxy inherit it
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="gpubox-proxy-load."))
    haproxies: dict[str, tuple[int, dict[str, str]]] = {}
    try:
        paths = start_paths(tmp, args.ttft_ms, args.itl_ms, procs, variants, haproxies)
        results: dict[str, list[dict]] = {name: [] for name in paths}
        for level in levels:  # one level for every path before the next: the machine is the same for all three
            runs = {name: Run(port, tls, level, args.tokens, args.requests) for name, (port, tls) in paths.items()}
            before = {name: process_memory(pid) for name, (pid, _) in haproxies.items()}
            for _ in range(args.rounds):  # the paths in turn, round after round: a passing load falls on all
                rows = {name: asyncio.run(run.go()) for name, run in runs.items()}
            for name, (pid, _) in haproxies.items():  # each HAProxy's page faults over the level (its streams alone)
                after = process_memory(pid)
                rows[name] |= {
                    "haproxy_page_faults": after["minflt"] - before[name]["minflt"],
                    "haproxy_rss_kib": after["VmRSS"], "haproxy_peak_rss_kib": after["VmHWM"],
                }  # fmt: skip
            for name, row in rows.items():
                results[name].append(row)
                print(f"{name:10} {json.dumps(row)}", flush=True)
    except live_proxies.Missing as exc:
        print(f"proxy_load: {exc}", file=sys.stderr)
        return 2
    finally:
        for proc in reversed(procs):
            live_proxies.stop(proc)
    held = {
        name: max((r["level"] for r in rows if r["errors"] == 0 and r["truncated"] == 0), default=0)
        for name, rows in results.items()
    }
    record = {
        **provenance("proxy_load.py", argv),
        "nginx": subprocess.run([live_proxies.nginx_binary(), "-v"], capture_output=True, text=True).stderr.strip(),
        "stand_in": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms, "tokens": args.tokens},
        "requests_per_client": args.requests,
        "rounds": args.rounds,
        "results": results,
        "most_streams_held": held,
        "haproxy_environment": {name: given for name, (_, given) in haproxies.items()},
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"most streams held with 0 errors and 0 truncated: {held}; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
