#!/usr/bin/env python3
"""Placement inside a pool against the prefix cache (issue 47, item 3): a bench, not a test.

    python bench/placement_load.py [--seconds 20] [--warmup 5] [--clients 24] [--tokens 16-48] [--ttft-ms 50]
                                   [--itl-ms 20] [--prefill-ms-per-token 0.2] [--cache-blocks 256]
                                   [--system-prompts 16] [--system-words 600] [--users 240] [--chats 30]
                                   [--policies NAME,...] [--seeds 47,...]
                                   [--workloads shared-prompts,multi-turn] [--out bench/placement-load.json]
    python bench/placement_load.py --real-engine [--out-real bench/placement-real-engine.json]

Three boxes on this machine's loopback, as bench/affinity_load.py starts them (the engine stand-in, TEST ONLY,
behind nginx with roles/front_door's rendered file), but each stand-in runs its MODEL of vLLM 0.32's prefix cache
(harness/engine_standin/standin.py, PrefixCache: chained hashes of 16-token blocks, tokens = words of the text,
--cache-blocks blocks per box, LRU), so that a request's TTFT is --ttft-ms plus --prefill-ms-per-token for each
prompt token its box did not hold. The client is the fleet's (harness/stream_load.py: --clients closed-loop
workers, each stream after the last), with two workloads (SharedPrompts, MultiTurn below):
  shared-prompts  --system-prompts long system prompts (--system-words words each), each the prompt of one
                  application; each stream, a user drawn from --users (user u of application u mod
                  --system-prompts) asks, as session "user-u", a new short question (20-40 words);
  multi-turn      --chats chats at once (each its session), a short system prompt shared by all, then turn by
                  turn user messages (20-60 words) and the answers; each stream is the next turn of a chat not
                  waiting for one; a chat ends after 4-10 turns and a new one takes its place.
The defaults size the cache so that the pool's three boxes together hold each workload's working set, and one
box does not (shared-prompts: 16 prompts of about 38 blocks, 608 blocks, against 256 a box).
Each workload runs once per policy and --seeds draw, the boxes' caches emptied before (vLLM's POST
/reset_prefix_cache), the same draws for every policy, one after the other in one run; a draw (the seed) sets the
prompts' texts and the session names, so where a hash puts them: with 16 prompts over three boxes one draw can be
lucky or not, so more draws show the spread. Policies:
  round-robin    the gateway (HAProxy with roles/llm_gateway's file) with llm_gateway_placement: round-robin;
  session-hash   llm_gateway_placement: session (balance hdr(X-Session-Id), consistent, the load bound);
  prefix-aware   llm_gateway_placement: prefix (the conversation's first bytes key it; each key a home box, no box
                 home to more than its share of the keys, the bound: files/gpubox_route.lua, gpubox_place);
  prefix-aware-256  the same with llm_gateway_prefix_bytes: 256 (the role's default: 1024);
  prefix-hash, prefix-hash-125  the role's prefix file without the homes' lines (EDITS: no gpubox_place, no
                 use-server): HAProxy's consistent hash of the key alone, at the bound 120 or 125 (what homes add);
  prefix-aware-125, prefix-aware-150, prefix-aware-unbounded  the same with llm_gateway_hash_balance_factor 125
                 (issue 47's 1.25x), 150, or 0 (no bound; the role's default: 120): what the load bound costs the
                 cache (not in the default --policies);
  vllm-router    vLLM's router (PyPI vllm-router, a Rust binary, in its own venv under ~/.cache/gpubox, made on
                 the first run) with --policy cache_aware, over the same front doors (HTTPS, the boxes'
                 certificates trusted through SSL_CERT_FILE); the client reaches it over plain HTTP (another
                 path: no TLS to the router, no HAProxy; its hit rate and balance compare as they are);
  vllm-router-rr the same router with --policy round_robin: the control for that path's TTFT.
Figures per workload and policy, over the streams that started after --warmup and the counters from then to
the end: the prefix-cache hit rate (vllm:prefix_cache_hits_total over vllm:prefix_cache_queries_total, read
from each box's /metrics, as the real engine's are read), TTFT p50/p99 at the client, the load per box (its
vllm:num_requests_running, sampled each second) and the busiest box over the mean (the bound: 1.25); and where
the streams went (the box each answer names): of each application's (shared-prompts) or chat's (multi-turn)
streams, the share on its most frequent box ("own_box_share": what the load bound and the key's changes move
away), and for shared-prompts how many applications have each box as their most frequent ("apps_per_box": how
the hash spread the 16 prompts).
The gateway's rendered file is checked to hold the policy's balance line, so that a knob the role does not
know yet cannot pass for a policy. --real-engine instead starts vLLM 0.32 for CPUs (~/.cache/gpubox/
vllm032-venv, made by `make engines`) with the tiny test model, sends one prompt twice and reads the same counters.
What is real: nginx, HAProxy and vllm-router with their own files, the fleet's client. What is not: the engine
(a stand-in with a fixed pace, whose prefix cache is a model) and three boxes sharing two cores with the client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench import proxy_load  # sets up the collection loader and live_proxies
from harness import stream_load
from harness.engine_standin.standin import PrefixCache

live_proxies = proxy_load.live_proxies
ROOT = proxy_load.ROOT
CACHE = Path(os.environ.get("GPUBOX_CACHE", Path.home() / ".cache" / "gpubox"))
ROUTER_VENV = CACHE / "vllm-router-venv"
ROUTER_VERSION = "0.1.17"
VLLM_VENV = Path(os.environ.get("GPUBOX_VLLM032_VENV", CACHE / "vllm032-venv"))
TINY_MODEL = CACHE / "tiny-model"
CPU_BLOCK_SIZE = 128  # vLLM 0.32's CPU backend sets it (vllm/platforms/cpu.py) when none is given
PREFIX_LINE = re.compile(r"^(# TYPE )?vllm:prefix_cache_(queries|hits)_total\b")  # no HELP: vLLM's words

BOXES = [f"gpubox-m-fleet-box{n}" for n in (1, 2, 3)]
PREFIX = "balance hash var(txn.gpubox_prefix)"
# name: how it is started; "expect": what the rendered gateway file must hold for it
POLICIES: dict[str, dict] = {
    "round-robin": {"knobs": {"llm_gateway_placement": "round-robin"}, "expect": ["balance roundrobin"]},
    "session-hash": {"knobs": {"llm_gateway_placement": "session"}, "expect": ["balance hdr("]},
    "prefix-aware": {"knobs": {"llm_gateway_placement": "prefix"}, "expect": [PREFIX, "lua.gpubox_place 120"]},
    "prefix-aware-256": {
        "knobs": {"llm_gateway_placement": "prefix", "llm_gateway_prefix_bytes": 256},
        "expect": [PREFIX, "lua.gpubox_route 256 "],
    },
    # what the load bound costs the cache (not the role's default: the busiest box may go past 1.25x the mean)
    "prefix-aware-125": {
        "knobs": {"llm_gateway_placement": "prefix", "llm_gateway_hash_balance_factor": 125},
        "expect": [PREFIX, "hash-balance-factor 125", "lua.gpubox_place 125"],
    },
    "prefix-aware-150": {
        "knobs": {"llm_gateway_placement": "prefix", "llm_gateway_hash_balance_factor": 150},
        "expect": [PREFIX, "hash-balance-factor 150", "lua.gpubox_place 150"],
    },
    "prefix-aware-unbounded": {
        "knobs": {"llm_gateway_placement": "prefix", "llm_gateway_hash_balance_factor": 0},
        "expect": [PREFIX, "lua.gpubox_place 0"],
        "absent": ["hash-balance-factor"],
    },
    # the role's prefix placement without its homes (no gpubox_place, no use-server lines): HAProxy's consistent hash
    # of the key alone, the bound at 120 and at 125
    "prefix-hash": {
        "knobs": {"llm_gateway_placement": "prefix"},
        "expect": [PREFIX, "hash-balance-factor 120"],
        "absent": ["lua.gpubox_place"],
        "edit": "no-homes",
    },
    "prefix-hash-125": {
        "knobs": {"llm_gateway_placement": "prefix", "llm_gateway_hash_balance_factor": 125},
        "expect": [PREFIX, "hash-balance-factor 125"],
        "absent": ["lua.gpubox_place"],
        "edit": "no-homes",
    },
    "vllm-router": {"router": "cache_aware"},
    "vllm-router-rr": {"router": "round_robin"},
}
HOMES = ("http-request lua.gpubox_place ", "use-server ")
EDITS = {"no-homes": lambda conf: "\n".join(line for line in conf.splitlines() if not line.strip().startswith(HOMES))}
DEFAULT_POLICIES = "round-robin,session-hash,prefix-aware,prefix-hash,prefix-aware-256,vllm-router,vllm-router-rr"
WORKLOADS = ("shared-prompts", "multi-turn")
SHARED_SYSTEM = "You are the assistant of this service: answer briefly and say so when you do not know."


# --- what /metrics says, the stand-in's and vLLM's alike -----------------------------------------------------
def metric(text: str, name: str) -> float:
    """The sum of a metric's samples over its label sets (0 when absent)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.eE+-]+)$", re.M)
    return sum(float(value) for value in pattern.findall(text))


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return answer.read().decode()


def read_box(port: int, text: str | None = None) -> dict:
    text = metrics_text(port) if text is None else text
    return {
        "t": time.time(),
        "queries": metric(text, "vllm:prefix_cache_queries_total"),
        "hits": metric(text, "vllm:prefix_cache_hits_total"),
        "running": metric(text, "vllm:num_requests_running"),
    }


class Sampler(threading.Thread):
    """Each box's /metrics once a second, until stopped."""

    def __init__(self, engines: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.engines = engines
        self.samples: list[dict[str, dict]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.samples.append({name: read_box(port) for name, port in self.engines.items()})
            self.halt.wait(1.0)

    def stop(self) -> dict[str, dict]:
        self.halt.set()
        self.join()
        last = {name: read_box(port) for name, port in self.engines.items()}
        self.samples.append(last)
        return last


# --- the workloads, as the fleet client's next chat ----------------------------------------------------------
def text(rng: random.Random, words: int, tag: str) -> str:
    return " ".join(f"{tag}{rng.randrange(100000)}" for _ in range(words))


class SharedPrompts(stream_load.Load):
    """Each stream: a user drawn from --users (user u uses application u mod --system-prompts), that user's session
    and a new question after the application's system prompt. A client is a worker, not a user: were it a user,
    its answer's blocks, cached just before its next request, would make every policy hit (no one else's request
    between them); real users come back after others' requests have gone through the box."""

    def __init__(self, args: argparse.Namespace, key: str) -> None:
        super().__init__(args, key)
        apps = random.Random(args.seed)
        self.prompts = [
            f"Application {k}. " + text(apps, args.system_words, f"a{k}w") for k in range(args.system_prompts)
        ]

    def next_chat(self, n: int, rng: random.Random) -> tuple[str, list[dict]]:
        user = rng.randrange(self.args.users)
        messages = [
            {"role": "system", "content": self.prompts[user % len(self.prompts)]},
            {"role": "user", "content": text(rng, rng.randint(20, 40), "q")},
        ]
        return f"user-{self.args.seed}-{user}", messages


class MultiTurn(stream_load.Load):
    """--chats chats at once, each its own session: a short system prompt shared by all, then turn by turn a user
    message (20-60 words) and the answer it got; a chat ends after 4-10 turns and a new one takes its place. Each
    stream is the next turn of a chat drawn from those not waiting for an answer (a client is a worker, as above:
    between two turns of a chat, other chats' turns go through the boxes, as a user's reading and typing lets)."""

    def __init__(self, args: argparse.Namespace, key: str) -> None:
        super().__init__(args, key)
        self.rng = random.Random(args.seed)
        self.chats = [self.new_chat(slot, 0) for slot in range(args.chats)]
        self.idle = set(range(args.chats))
        self.asking: dict[int, int] = {}  # client: the chat slot its stream is a turn of

    def new_chat(self, slot: int, count: int) -> dict:
        opening = [{"role": "system", "content": SHARED_SYSTEM}]
        chat_id = f"chat-{self.args.seed}-{slot}-{count}"
        return {"id": chat_id, "count": count, "turns": 0, "length": self.rng.randint(4, 10), "messages": opening}

    def next_chat(self, n: int, rng: random.Random) -> tuple[str, list[dict]]:
        slot = rng.choice(sorted(self.idle))  # --chats > --clients: never empty
        self.idle.discard(slot)
        self.asking[n] = slot
        chat = self.chats[slot]
        chat["messages"].append({"role": "user", "content": text(rng, rng.randint(20, 60), "u")})
        chat["turns"] += 1
        return chat["id"], list(chat["messages"])

    def answered(self, n: int, line: dict) -> None:
        slot = self.asking.pop(n)
        chat = self.chats[slot]
        if line["whole"]:  # the answer as the stand-in streamed it: one "tok" per token
            chat["messages"].append({"role": "assistant", "content": " ".join(["tok"] * line["got"])})
        else:  # no answer: the turn is asked again
            chat["messages"].pop()
            chat["turns"] -= 1
        if chat["turns"] == chat["length"]:
            self.chats[slot] = self.new_chat(slot, chat["count"] + 1)
        self.idle.add(slot)


def run_load(args, workload: str, seed: int, port: int, ca: Path | None, tmp: Path, engines: dict[str, int]) -> dict:
    out, samples, stop = tmp / "load.jsonl", tmp / "samples.jsonl", tmp / "stop"
    for path in (out, samples, stop):
        path.unlink(missing_ok=True)
    for engine in engines.values():  # an empty cache for each policy
        urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{engine}/reset_prefix_cache", method="POST"))
    load_args = argparse.Namespace(
        ca=str(ca) if ca else None, out=str(out), samples=str(samples), stop=str(stop), host="127.0.0.1", port=port,
        clients=args.clients, tokens=args.tokens, hot_clients=0, sessions=1, seed=seed, session_prefix="",
        system_prompts=args.system_prompts, system_words=args.system_words, users=args.users, chats=args.chats,
    )  # fmt: skip
    load = (SharedPrompts if workload == "shared-prompts" else MultiTurn)(load_args, live_proxies.GATEWAY_KEY)
    sampler = Sampler(engines)
    started = time.time()
    sampler.start()
    timer = threading.Timer(args.seconds, stop.touch)
    timer.start()
    try:
        asyncio.run(load.run())
    finally:
        timer.cancel()
        last = sampler.stop()
    lines = stream_load.read_jsonl(str(out))
    start = started + args.warmup
    group = functools.partial(application, args.system_prompts) if workload == "shared-prompts" else None
    return figures(lines, sampler.samples, last, start) | where(lines, start, group)


def application(prompts: int, session: str) -> int:
    """The application (its system prompt) of a shared-prompts stream's session, "user-<seed>-<user>"."""
    return int(session.rsplit("-", 1)[1]) % prompts


def where(lines: list[dict], start: float, group=None) -> dict:
    """Where the streams after ``start`` went: of each group's (``group(session)``, else the session: an
    application's or a chat's) answered streams, the share on its most frequent box; with ``group``, how many
    groups have each box as their most frequent."""
    counts: dict = {}
    for line in lines:
        if line["t"] >= start and line["status"] == 200 and line["box"]:
            key = group(line["session"]) if group else line["session"]
            box = counts.setdefault(key, {})
            box[line["box"]] = box.get(line["box"], 0) + 1
    out: dict = {"own_box_share": stream_load.share(counts.values())}
    if group:
        mains = [max(boxes, key=boxes.get) for boxes in counts.values()]
        out["apps_per_box"] = {
            box: mains.count(box) for box in sorted({*mains, *(b for c in counts.values() for b in c)})
        }
    return out


def summary(draws: list[dict]) -> dict:
    """The first draw's figures; with more draws, each one's headline figures too, and the mean hit rate."""
    out = dict(draws[0])
    if len(draws) > 1:
        keys = ("seed", "hit_rate", "ttft_p50_ms", "ttft_p99_ms", "busiest_over_mean", "own_box_share", "apps_per_box")
        out["draws"] = [{k: d[k] for k in keys if k in d} for d in draws]
        rates = [d["hit_rate"] for d in draws if d["hit_rate"] is not None]
        out["hit_rate_mean"] = round(statistics.fmean(rates), 3) if rates else None
    return out


def figures(lines: list[dict], samples: list[dict[str, dict]], last: dict[str, dict], start: float) -> dict:
    steady = stream_load.phase([line for line in lines if line["t"] >= start])
    steady.pop("failures")
    first = next((s for s in samples if min(box["t"] for box in s.values()) >= start), samples[0])
    per_box = {name: {k: last[name][k] - first[name][k] for k in ("queries", "hits")} for name in last}
    queries, hits = sum(b["queries"] for b in per_box.values()), sum(b["hits"] for b in per_box.values())
    window = [s for s in samples if min(box["t"] for box in s.values()) >= start]
    load = {name: round(statistics.fmean(s[name]["running"] for s in window), 2) for name in last} if window else {}
    mean = statistics.fmean(load.values()) if load else 0
    return {
        **steady,
        "hit_rate": round(hits / queries, 3) if queries else None,
        "hit_rate_per_box": {
            n: round(b["hits"] / b["queries"], 3) if b["queries"] else None for n, b in per_box.items()
        },
        "prompt_tokens": int(queries),
        "load_per_box": load,
        "busiest_over_mean": round(max(load.values()) / mean, 3) if mean else None,
    }


# --- the paths: the gateway, vllm-router ---------------------------------------------------------------------
def start_gateway(tmp: Path, policy: str, boxes: list) -> tuple[subprocess.Popen, int]:
    spec = POLICIES[policy]
    tmp.mkdir(parents=True, exist_ok=True)
    gateway, port = live_proxies.start_gateway(
        tmp,
        0,
        Path(),
        {**proxy_load.HIGH_LIMITS_GATEWAY, **spec["knobs"]},
        log=tmp / "haproxy.log",
        boxes=boxes,
        edit=EDITS.get(spec.get("edit", "")),
    )
    conf = (tmp / "haproxy.cfg").read_text()
    missing = [line for line in spec["expect"] if line not in conf]
    missing += [f"no {line!r}" for line in spec.get("absent", []) if line in conf]
    if missing:
        live_proxies.stop(gateway)
        raise live_proxies.Missing(
            f"{policy}: the rendered gateway file does not match: {missing} ({spec['knobs']} not known to "
            "roles/llm_gateway at this commit?); leave it out with --policies"
        )
    return gateway, port


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def router_binary() -> Path:
    """vllm-router's own environment, made once (as bench/guidellm_load.py makes guidellm's): the marker is written
    last, so an interrupted install is made again from nothing."""
    marker, want = ROUTER_VENV / ".gpubox-installed", f"vllm-router=={ROUTER_VERSION}\n"
    if not (marker.exists() and marker.read_text() == want):
        subprocess.run(["rm", "-rf", str(ROUTER_VENV)], check=True)
        subprocess.run([sys.executable, "-m", "venv", str(ROUTER_VENV)], check=True)
        pip = [str(ROUTER_VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
        if subprocess.run([*pip, want.strip()]).returncode != 0:
            raise live_proxies.Missing(
                f"vllm-router=={ROUTER_VERSION} did not install into {ROUTER_VENV} (PyPI reachable?); "
                "leave vllm-router and vllm-router-rr out with --policies"
            )
        marker.write_text(want)
    return ROUTER_VENV / "bin" / "vllm-router"


def start_router(policy: str, boxes: list, tmp: Path) -> tuple[subprocess.Popen, int]:
    """vllm-router over the boxes' front doors (HTTPS): it trusts the boxes' certificates through SSL_CERT_FILE (it
    has no option of its own for a CA; without the bundle it refuses them and does not start)."""
    binary = router_binary()
    log, bundle = tmp / "router.log", tmp / "boxes.pem"
    bundle.write_bytes(b"".join(cert.read_bytes() for _, _, cert in boxes))
    env = dict(os.environ, SSL_CERT_FILE=str(bundle))

    def launch(port: int) -> subprocess.Popen:
        workers = [f"https://127.0.0.1:{front}" for _, front, _ in boxes]
        argv = [str(binary), "--host", "127.0.0.1", "--port", str(port), "--policy", POLICIES[policy]["router"],
                "--worker-urls", *workers, "--log-level", "warning"]  # fmt: skip
        with log.open("a") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)

    proc, port = live_proxies.start_on_a_free_port(launch, "vllm-router")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # it listens before its workers pass their checks
        if healthy(port):
            return proc, port
        time.sleep(0.5)
    live_proxies.stop(proc)
    raise AssertionError(f"vllm-router does not answer /health on {port}: see {log}")


# --- the real engine's counters ------------------------------------------------------------------------------
def real_engine(out: Path) -> int:
    """vLLM 0.32 for CPUs with the tiny model: one prompt twice, the counters read as the bench reads the boxes'."""
    python = VLLM_VENV / "bin" / "python"
    if not python.exists() or not TINY_MODEL.is_dir():
        print(f"placement_load: needs {python} (make engines) and {TINY_MODEL}", file=sys.stderr)
        return 2
    port = live_proxies.free_port()
    log = Path(tempfile.mkdtemp(prefix="gpubox-real-engine.")) / "vllm.log"
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(TINY_MODEL),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "--served-model-name",
        "tiny",
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--enable-prefix-caching",
    ]  # fmt: skip (block size: the CPU backend's own, a multiple of 32)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_SERVER_DEV_MODE="1")
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env)
    started = time.monotonic()
    try:
        while True:
            if proc.poll() is not None or time.monotonic() - started > 570:
                print(f"placement_load: vLLM did not start; its log: {log}", file=sys.stderr)
                return 1
            if healthy(port):
                break
            time.sleep(2)
        up_s = time.monotonic() - started
        prompt = " ".join(f"word{i}" for i in range(100))  # 490 tokens of the tiny model's tokenizer
        rounds = []
        for n in range(2):
            before = read_box(port)
            body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 2}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                             {"Content-Type": "application/json"})  # fmt: skip
            with urllib.request.urlopen(request, timeout=120) as answer:
                usage = json.loads(answer.read())["usage"]
            time.sleep(1)  # the counters are updated by the engine's stats logger after the step
            text = metrics_text(port)
            after = read_box(port, text)
            counted = {k: after[k] - before[k] for k in ("queries", "hits")}
            rounds.append({"request": n + 1, "prompt_tokens": usage["prompt_tokens"], **counted})
        version = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                                 text=True).stdout.strip()  # fmt: skip
    finally:
        live_proxies.stop(proc)
    # what the stand-in's model predicts for the same prompt twice, at the engine's block size (its
    # vllm:cache_config_info; the CPU backend's is 128, vllm/platforms/cpu.py; CUDA's default 16)
    configured = re.search(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', text, re.M)
    block_size = int(configured[1]) if configured else CPU_BLOCK_SIZE
    model = PrefixCache(capacity=64, block_size=block_size)
    words = [str(i) for i in range(rounds[0]["prompt_tokens"])]
    predicted = [model.admit(words), model.admit(words)]
    record = {**proxy_load.provenance("placement_load.py", sys.argv[1:]), "vllm": version, "start_s": round(up_s),
              "block_size": block_size, "model_predicts_hits": predicted,
              "metrics_lines": [line for line in text.splitlines() if PREFIX_LINE.match(line)],
              "model": "tiny-model (Qwen2, 2 layers, vocabulary 512)", "rounds": rounds}  # fmt: skip
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--tokens", default="16-48")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.2)
    parser.add_argument("--cache-blocks", type=int, default=256, help="the prefix cache model's blocks per box")
    parser.add_argument("--system-prompts", type=int, default=16)
    parser.add_argument("--system-words", type=int, default=600)
    parser.add_argument("--users", type=int, default=240, help="shared-prompts: users, each of one application")
    parser.add_argument("--chats", type=int, default=30, help="multi-turn: chats at once (more than --clients)")
    parser.add_argument("--policies", default=DEFAULT_POLICIES)
    parser.add_argument(
        "--seeds", default="47", help="the workload's draws (prompts, names: where the hash puts them), comma-separated"
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--out", default=str(ROOT / "bench" / "placement-load.json"))
    parser.add_argument("--real-engine", action="store_true", help="only the check of the real engine's counters")
    parser.add_argument("--out-real", default=str(ROOT / "bench" / "placement-real-engine.json"))
    args = parser.parse_args(argv)
    if args.real_engine:
        return real_engine(Path(args.out_real))
    policies = [name.strip() for name in args.policies.split(",") if name.strip()]
    workloads = [name.strip() for name in args.workloads.split(",") if name.strip()]
    if unknown := [name for name in policies if name not in POLICIES]:
        parser.error(f"--policies: unknown {unknown}; known: {list(POLICIES)}")
    try:
        seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    except ValueError:
        parser.error(f"--seeds: integers separated by commas, not {args.seeds!r}")
    if not seeds:
        parser.error("--seeds: at least one")
    if unknown := [name for name in workloads if name not in WORKLOADS]:
        parser.error(f"--workloads: unknown {unknown}; known: {list(WORKLOADS)}")
    if min(args.cache_blocks, args.system_prompts, args.clients, args.users) < 1:
        parser.error("--cache-blocks, --system-prompts, --clients and --users must be 1 or more")
    if args.chats <= args.clients:
        parser.error(
            f"--chats ({args.chats}) must be more than --clients ({args.clients}): a chat waits for its answer"
        )
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="gpubox-placement-load."))
    results: dict[str, dict] = {workload: {} for workload in workloads}
    try:
        boxes, engines = [], {}
        for name in BOXES:
            engine, engine_port = live_proxies.start_on_a_free_port(
                lambda port, name=name: standin(port, name, args), "the engine stand-in"
            )
            procs.append(engine)
            engines[name] = engine_port
            box_dir = tmp / name
            box_dir.mkdir()
            front, front_port = live_proxies.start_front_door(
                box_dir, engine_port, proxy_load.HIGH_LIMITS_FRONT_DOOR, 4096, name=name
            )
            procs.append(front)
            boxes.append((name, front_port, box_dir / "tls.crt"))
        for policy in policies:
            for workload in workloads:
                draws = []
                for seed in seeds:  # each a new gateway or router: nothing of the last draw stays
                    path_dir = tmp / f"{policy}-{workload}-{seed}"
                    path_dir.mkdir()
                    if "router" in POLICIES[policy]:
                        proc, port = start_router(policy, boxes, path_dir)
                        ca = None
                    else:
                        proc, port = start_gateway(path_dir, policy, boxes)
                        ca = path_dir / "tls.pem"
                        time.sleep(1.5)  # the first health checks mark the boxes up
                    try:
                        draws.append({"seed": seed, **run_load(args, workload, seed, port, ca, tmp, engines)})
                    finally:
                        live_proxies.stop(proc)
                    print(f"{workload:15} {policy:17} {json.dumps(draws[-1])}", flush=True)
                results[workload][policy] = summary(draws)
    except live_proxies.Missing as exc:
        print(f"placement_load: {exc}", file=sys.stderr)
        return 2
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(OSError):
                live_proxies.stop(proc)
    record = {
        **proxy_load.provenance("placement_load.py", argv),
        "haproxy": proxy_load.haproxy_version(),
        "vllm_router": ROUTER_VERSION if any("router" in POLICIES[p] for p in policies) else None,
        "load": {
            k: getattr(args, k)
            for k in ("seconds", "warmup", "clients", "tokens", "system_prompts", "system_words", "users", "chats")
        }
        | {"seeds": seeds},
        "stand_in": {k: getattr(args, k) for k in ("ttft_ms", "itl_ms", "prefill_ms_per_token", "cache_blocks")}
        | {"block_size": 16},
        "results": results,
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


def standin(port: int, name: str, args: argparse.Namespace) -> subprocess.Popen:
    """The engine stand-in (TEST ONLY) with its prefix cache model, keyed as live_proxies.start_standin keys it."""
    argv = [sys.executable, str(live_proxies.STANDIN), "--port", str(port), "--box-name", name,
            "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms), "--prefix-cache-blocks",
            str(args.cache_blocks), "--prefill-ms-per-token", str(args.prefill_ms_per_token)]  # fmt: skip
    env = dict(os.environ, VLLM_API_KEY=live_proxies.GATEWAY_KEY)
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


if __name__ == "__main__":
    sys.exit(main())
