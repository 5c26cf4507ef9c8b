#!/usr/bin/env python3
"""Session affinity against the load bound through the gateway (issue 22, item 5): a bench, not a test.

    python bench/affinity_load.py [--seconds 60] [--warmup 10] [--clients 32] [--hot-clients 10] [--sessions 11]
                                  [--tokens 100-300] [--ttft-ms 50] [--itl-ms 25] [--variants default,...]
                                  [--placements 4] [--out bench/affinity-load.json]

Three boxes on this machine's loopback, each the engine stand-in (TEST ONLY, harness/engine_standin,
named gpubox-m-fleet-box1..3 as the fleet's boxes are, in the same order) behind nginx with roles/front_door's
rendered file, and HAProxy with roles/llm_gateway's rendered file over the three. The load is the fleet
scenario's own client and mix (harness/stream_load.py: --clients streaming chats one after the other,
the first --hot-clients sharing the session "hot", the others spread over --sessions sessions); only the pace
is quicker (--itl-ms), so that a minute holds several hundred streams instead of the fleet's sixty.

Each variant is one HAProxy started over the same three boxes, loaded for --seconds once per placement: the
fleet's own session names first, then the same mix under other names (stream_load.py --session-prefix), which
hash to other boxes, since what one set of a dozen names gives is one draw. A load's figures count the streams
that started after --warmup: the load per box (mean streams in flight, sampled each second), the
busiest box over the mean (the bound: 1.25), and the share of each session's streams that its most frequent
box served (the goal: 0.9), over all sessions and over all but "hot". Variants:
  no bound       hash-balance-factor off (llm_gateway_hash_balance_factor 0): consistent hashing alone;
  default        the role's defaults (llm_gateway_hash_balance_factor 120); every variant places by session;
  factor 125     the default before this bench (HAProxy's rounding let a box carry 1.31x the mean);
  factor 150     llm_gateway_hash_balance_factor 150.
What is real: nginx and HAProxy from Debian's archive with the roles' files, the fleet's client. What is
not: the engine (a stand-in with a fixed pace) and three boxes sharing two cores with the client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import proxy_load  # sets up the collection loader and live_proxies
from harness import stream_load

live_proxies = proxy_load.live_proxies
ROOT = proxy_load.ROOT

BOXES = [f"gpubox-m-fleet-box{n}" for n in (1, 2, 3)]
# name: the role's variables over its defaults (and over proxy_load's raised limits). Every variant places by the
# session header (llm_gateway_placement session): this bench is about that affinity against the load bound
# (bench/placement_load.py compares the placements).
SESSION = {"llm_gateway_placement": "session"}
VARIANTS: dict[str, dict] = {
    "no bound": {**SESSION, "llm_gateway_hash_balance_factor": 0},
    "default": {**SESSION},
    "factor 125": {**SESSION, "llm_gateway_hash_balance_factor": 125},
    "factor 150": {**SESSION, "llm_gateway_hash_balance_factor": 150},
}


def run_load(
    args: argparse.Namespace, port: int, ca: Path, tmp: Path, prefix: str
) -> tuple[list[dict], list[dict], float]:
    out, samples, stop = tmp / "load.jsonl", tmp / "samples.jsonl", tmp / "stop"
    for path in (out, samples, stop):
        path.unlink(missing_ok=True)
    load_args = argparse.Namespace(
        ca=str(ca), out=str(out), samples=str(samples), stop=str(stop), host="127.0.0.1", port=port,
        clients=args.clients, tokens=args.tokens, hot_clients=args.hot_clients, sessions=args.sessions, seed=22,
        session_prefix=prefix,
    )  # fmt: skip
    started = time.time()
    timer = threading.Timer(args.seconds, stop.touch)
    timer.start()
    try:
        asyncio.run(stream_load.Load(load_args, live_proxies.GATEWAY_KEY).run())
    finally:
        timer.cancel()
    return stream_load.read_jsonl(str(out)), stream_load.read_jsonl(str(samples)), started


def figures(lines: list[dict], samples: list[dict], started: float, args: argparse.Namespace) -> dict:
    start, split = started + args.warmup, started + args.seconds
    summary = stream_load.summarize(lines, samples, start, split, split)
    sessions, hot = summary.pop("sessions"), summary.pop("hot")
    summary["hot_session"] = sessions.get(hot, {})
    summary["sessions_split"] = sorted(name for name, counts in sessions.items() if name != hot and len(counts) > 1)
    summary.pop("roll")
    return summary


def spread(placements: list[dict]) -> dict:
    """Per figure over the placements: the fleet's own names (the first), the worst and the mean."""
    out = {}
    for key, worst in (("busiest_over_mean", max), ("session_share_on_own_box", min),
                       ("session_share_without_hot", min)):  # fmt: skip
        values = [p[key] for p in placements if p[key] is not None]
        if values:
            out[key] = {"fleet_names": placements[0][key], "worst": worst(values),
                        "mean": round(sum(values) / len(values), 3)}  # fmt: skip
    out["streams"] = sum(p["steady"]["streams"] for p in placements)
    out["failed"] = sum(p["steady"]["failed"] for p in placements)
    out["truncated"] = sum(p["steady"]["truncated"] for p in placements)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--hot-clients", type=int, default=10)
    parser.add_argument("--sessions", type=int, default=11)
    parser.add_argument("--tokens", default="100-300")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=25.0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--placements", type=int, default=4, help="session name sets, the fleet's first")
    parser.add_argument("--out", default=str(ROOT / "bench" / "affinity-load.json"))
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {list(VARIANTS)}")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="gpubox-affinity-load."))
    results: dict[str, dict] = {}
    try:
        boxes = []
        for name in BOXES:
            engine, engine_port = live_proxies.start_standin(args.ttft_ms, args.itl_ms, box_name=name)
            procs.append(engine)
            box_dir = tmp / name
            box_dir.mkdir()
            front, front_port = live_proxies.start_front_door(
                box_dir, engine_port, proxy_load.HIGH_LIMITS_FRONT_DOOR, 4096, name=name
            )
            procs.append(front)
            boxes.append((name, front_port, box_dir / "tls.crt"))
        for name in names:
            knobs = VARIANTS[name]
            gw_dir = tmp / f"gateway-{len(results)}"
            gateway, port = live_proxies.start_gateway(
                gw_dir, 0, Path(), {**proxy_load.HIGH_LIMITS_GATEWAY, **knobs},
                log=gw_dir.parent / f"haproxy-{len(results)}.log", boxes=boxes,
            )  # fmt: skip
            placements = []
            try:
                time.sleep(1.5)  # the first health checks mark the boxes up
                for k in range(args.placements):  # 0: the fleet's own session names
                    prefix = f"p{k}-" if k else ""
                    lines, samples, started = run_load(args, port, gw_dir / "tls.pem", tmp, prefix)
                    placements.append({"session_prefix": prefix, **figures(lines, samples, started, args)})
                    print(f"{name:12} {json.dumps(placements[-1])}", flush=True)
            finally:
                live_proxies.stop(gateway)
            results[name] = {"knobs": knobs, "placements": placements, **spread(placements)}
    except live_proxies.Missing as exc:
        print(f"affinity_load: {exc}", file=sys.stderr)
        return 2
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(OSError):
                live_proxies.stop(proc)
    record = {
        **proxy_load.provenance("affinity_load.py", argv),
        "haproxy": proxy_load.haproxy_version(),
        "load": {
            k: getattr(args, k)
            for k in ("seconds", "warmup", "clients", "hot_clients", "sessions", "tokens", "placements")
        },
        "stand_in": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms},
        "results": results,
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
