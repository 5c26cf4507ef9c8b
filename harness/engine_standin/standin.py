#!/usr/bin/env python3
"""TEST ONLY: a stand-in for vLLM 0.7.3's OpenAI server, for load through the front door and the gateway.

    standin.py --port 8000 [--host 127.0.0.1] [--served-model-name tiny] [--ttft-ms 50] [--itl-ms 10]
               [--max-model-len 2048] [--box-name NAME] [--health-delay-ms 0]
               [--prefix-cache-blocks 0] [--block-size 16] [--prefill-ms-per-token 0.2]
               (the API key, when set, comes from VLLM_API_KEY, as vLLM's does)

On a test box of group gpubox_sim_standin it is vLLM's module: molecule/shared/prepare.yml installs it as
vllm/entrypoints/openai/api_server.py on the unit's PYTHONPATH, so roles/vllm_service's own unit starts it
with vLLM 0.7.3's command line (`python -m vllm.entrypoints.openai.api_server --model ... --port ...`).
Flags it does not know are accepted and ignored (listed in its start line); the pace then comes from
GPUBOX_STANDIN_TTFT_MS and GPUBOX_STANDIN_ITL_MS when set, and GPUBOX_STANDIN_START_DELAY_S (or
--start-delay-s) makes it listen only after that many seconds, as vLLM does once its weights are loaded.
Every answer to a completion carries ``x-gpubox-standin-host: <hostname>`` (or --box-name's, for several
stand-ins on one machine), so a test client can tell which box served it. --health-delay-ms answers /health
that late, as a vLLM busy with its streams does.

It speaks what clients and gpubox's checks ask of vLLM 0.7.3 (vllm/entrypoints/openai/api_server.py):
POST /v1/completions and /v1/chat/completions (JSON, or Server-Sent Events with ``"stream": true``: one
chunk per token, then ``data: [DONE]``; ``stream_options.include_usage`` adds the usage chunk), GET
/health, /v1/models and /metrics (vLLM's own metric names), ``Authorization: Bearer`` checked on /v1/
only (as vLLM 0.7.3 does), HTTP/1.1 keep-alive. Each request waits ``--ttft-ms`` before its first token
and ``--itl-ms`` between tokens, and emits ``max_tokens`` tokens (16 when not given).

--prefix-cache-blocks N (0, the default: off, as the fleet scenario runs it) turns on a MODEL of vLLM 0.32's
automatic prefix cache, for placement benches (bench/placement_load.py): PrefixCache below, N blocks of
--block-size tokens per box. A request's time to first token is then --ttft-ms plus --prefill-ms-per-token
for each prompt token the cache did not hold (its prefill), and /metrics adds vLLM 0.32's counters
``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (vllm/v1/metrics/loggers.py), so
that one reader serves the stand-in and the real engine; POST /reset_prefix_cache empties it (vLLM's route
under VLLM_SERVER_DEV_MODE). Off, nothing of it runs and the pace is --ttft-ms alone.

What it does NOT model: the model (every token is one word: "tok", or GPUBOX_STANDIN_WORD's, so that a test can
make one box answer otherwise), tokenization (prompt tokens are
counted as words), batching and its slow-down under load (every stream keeps its pace while the CPU
lasts), the KV cache and preemption, a start's length (none, unless a start delay is given), SIGTERM (it
stops at once, as vLLM 0.7.3 aborts what is in flight), and every endpoint and parameter beyond those
above. Its figures measure the proxies in front of an engine, never an engine.

Standard library only (asyncio), so that it runs in any box or on the controller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import time
import uuid
from collections import OrderedDict

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed"}
MAX_BODY = 1 << 20
DEFAULT_MAX_TOKENS = 16
# vLLM 0.7.3's bucket bounds (vllm/engine/metrics.py: histogram_time_to_first_token, histogram_time_per_output_token)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class PrefixCache:
    """A MODEL of vLLM 0.32's automatic prefix cache (TEST ONLY; vllm/v1/core/kv_cache_utils.py and the block
    pool's free queue), so that a fleet bench can compare placements by their cache hits without an engine.

    What it keeps of vLLM's: a prompt is cut into blocks of ``block_size`` tokens (vLLM 0.32: 16); a full
    block's hash chains the parent block's hash with the block's tokens, so that a block matches only after the
    same whole prefix; a request hits the longest run of leading blocks cached, and at most ``len(tokens) - 1``
    tokens (vLLM computes the last prompt token again for its logits); its full blocks are then cached, and once
    it is answered those of prompt and answer (store(): vLLM caches the blocks its output fills as well). The pool
    holds ``capacity`` blocks per box; when full, the least recently used block goes first, and of one request's
    blocks its later ones before its earlier ones (vLLM frees a request's blocks tail first). Counted as vLLM
    counts them: queries = prompt tokens, hits = cached tokens, per request.

    What it does not: tokens are whatever the caller gives (the stand-in: words of the text, see prompt_words());
    blocks held by running requests are evictable here, as is the partial last block (never cached); the
    hash is Python's hash() of the tuple (vLLM: sha256 by default), unique enough for a bench.
    """

    def __init__(self, capacity: int, block_size: int = 16) -> None:
        if capacity < 1 or block_size < 1:
            raise ValueError("--prefix-cache-blocks and --block-size must be positive")
        self.capacity = capacity
        self.block_size = block_size
        self.blocks: OrderedDict[int, None] = OrderedDict()  # block hash, least recently used first
        self.queries = 0
        self.hits = 0

    def hashes(self, tokens: list) -> list[int]:
        out, parent, size = [], None, self.block_size
        for start in range(0, len(tokens) - size + 1, size):
            parent = hash((parent, tuple(tokens[start : start + size])))
            out.append(parent)
        return out

    def admit(self, tokens: list) -> int:
        """One request's prompt: the tokens it finds cached (counted), then its full blocks cached."""
        hashes = self.hashes(tokens)
        cached = 0
        for block in hashes:
            if block not in self.blocks:
                break
            cached += 1
        hit = min(cached * self.block_size, max(len(tokens) - 1, 0))
        self.queries += len(tokens)
        self.hits += hit
        self.store(tokens, hashes)
        return hit

    def store(self, tokens: list, hashes: list[int] | None = None) -> None:
        """Cache the full blocks of ``tokens`` (a prompt, or a prompt and its answer), uncounted."""
        for block in reversed(self.hashes(tokens) if hashes is None else hashes):  # the tail is evicted first
            self.blocks[block] = None
            self.blocks.move_to_end(block)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def reset(self) -> None:
        self.blocks.clear()


def prompt_words(chat: bool, request: dict) -> list[str]:
    """The prompt's tokens for the prefix cache model: words (whitespace-separated) of the text as sent; a chat's
    messages each begin with a token naming the role, as a chat template's markers do, and the prompt ends with the
    assistant's (the generation prompt), so that a next turn that sends the answer back begins with prompt + answer."""
    if not chat:
        return str(request.get("prompt", "")).split()
    out: list[str] = []
    messages = request.get("messages")
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            out += [f"<|{message.get('role', '')}|>", *str(message.get("content", "")).split()]
    return [*out, "<|assistant|>"]


class Histogram:
    """A Prometheus histogram as prometheus_client writes one (cumulative buckets, +Inf, sum, count)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.sum += value
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def lines(self, name: str, label: str) -> list[str]:
        out, running = [f"# TYPE {name} histogram"], 0
        for bound, count in zip((*self.bounds, "+Inf"), self.counts):
            running += count
            out.append(f'{name}_bucket{{le="{bound}",{label}}} {running}')
        return [*out, f"{name}_sum{{{label}}} {self.sum}", f"{name}_count{{{label}}} {running}"]


class Stats:
    """What /metrics reports, under vLLM 0.7.3's names (vllm/engine/metrics.py)."""

    def __init__(self) -> None:
        self.running = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests = {"stop": 0, "length": 0, "abort": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.cache: PrefixCache | None = None

    def text(self, model: str) -> str:
        label = f'model_name="{model}"'
        lines = [
            "# HELP vllm:num_requests_running Number of requests currently running on GPU.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{label}}} {self.running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{label}}} 0",
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            f"vllm:gpu_cache_usage_perc{{{label}}} 0",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{label}}} {self.prompt_tokens}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{label}}} {self.generation_tokens}",
            "# TYPE vllm:request_success_total counter",
            *(f'vllm:request_success_total{{finished_reason="{k}",{label}}} {v}' for k, v in self.requests.items()),
            *self.ttft.lines("vllm:time_to_first_token_seconds", label),
            *self.tpot.lines("vllm:time_per_output_token_seconds", label),
        ]
        if self.cache is not None:  # vLLM 0.32's counters (vllm/v1/metrics/loggers.py), its labels, as it writes them
            engine = f'engine="0",{label}'
            lines += [
                "# HELP vllm:prefix_cache_queries_total Prompt tokens looked up in the prefix cache (stand-in model).",
                "# TYPE vllm:prefix_cache_queries_total counter",
                f"vllm:prefix_cache_queries_total{{{engine}}} {self.cache.queries}",
                "# HELP vllm:prefix_cache_hits_total Prompt tokens found in the prefix cache (stand-in model).",
                "# TYPE vllm:prefix_cache_hits_total counter",
                f"vllm:prefix_cache_hits_total{{{engine}}} {self.cache.hits}",
            ]
        return "\n".join(lines) + "\n"


class Engine:
    def __init__(self, args: argparse.Namespace) -> None:
        self.model = args.served_model_name
        self.ttft = args.ttft_ms / 1000.0
        self.itl = args.itl_ms / 1000.0
        self.word = args.word
        self.max_model_len = args.max_model_len
        self.key = os.environ.get("VLLM_API_KEY") or None
        self.stats = Stats()
        self.host_header = f"x-gpubox-standin-host: {args.box_name or socket.gethostname()}\r\n"
        self.health_delay = args.health_delay_ms / 1000.0
        self.prefill = args.prefill_ms_per_token / 1000.0
        if args.prefix_cache_blocks > 0:
            self.stats.cache = PrefixCache(args.prefix_cache_blocks, args.block_size)

    # --- HTTP/1.1 ----------------------------------------------------------------------------------
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, version = ([*lines[0].split(" "), "", "", ""])[:3]
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name:
                        headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                if length > MAX_BODY:
                    await self.send_json(writer, 400, error("request body too large", "BadRequestError"), False)
                    return
                body = await reader.readexactly(length) if length else b""
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                await self.route(writer, method, path.split("?", 1)[0], headers, body, keep)
                if not keep:
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            return
        finally:
            writer.close()

    async def route(self, writer, method: str, path: str, headers: dict, body: bytes, keep: bool) -> None:
        if path == "/health" and method == "GET":
            await asyncio.sleep(self.health_delay)  # 0, or as a busy vLLM answers it late
            await self.send(writer, 200, b"", "text/plain", keep)
        elif path == "/metrics" and method == "GET":
            await self.send(writer, 200, self.stats.text(self.model).encode(), "text/plain; version=0.0.4", keep)
        elif path == "/reset_prefix_cache" and method == "POST" and self.stats.cache is not None:
            self.stats.cache.reset()
            await self.send(writer, 200, b"", "text/plain", keep)
        elif path.startswith("/v1/") and self.key and headers.get("authorization") != f"Bearer {self.key}":
            await self.send_json(writer, 401, {"error": "Unauthorized"}, keep)  # vLLM 0.7.3's own answer
        elif path == "/v1/models" and method == "GET":
            card = {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                    "root": self.model, "parent": None, "max_model_len": self.max_model_len}  # fmt: skip
            await self.send_json(writer, 200, {"object": "list", "data": [card]}, keep)
        elif path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            try:
                request = json.loads(body or b"{}")
                if not isinstance(request, dict):
                    raise ValueError("the body is not a JSON object")
            except ValueError as exc:
                await self.send_json(writer, 400, error(f"invalid JSON: {exc}", "BadRequestError"), keep)
                return
            await self.generate(writer, path.endswith("chat/completions"), request, keep)
        else:  # a known path with another method, or an unknown path
            await self.send_json(writer, 405 if path in ("/health", "/metrics") else 404, {"detail": "Not Found"}, keep)

    async def send(self, writer, status: int, body: bytes, ctype: str, keep: bool) -> None:
        writer.write(
            f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\ncontent-type: {ctype}\r\n{self.host_header}"
            f"content-length: {len(body)}\r\nconnection: {'keep-alive' if keep else 'close'}\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    async def send_json(self, writer, status: int, payload: dict, keep: bool) -> None:
        await self.send(writer, status, json.dumps(payload).encode(), "application/json", keep)

    # --- generation -------------------------------------------------------------------------------
    async def generate(self, writer, chat: bool, request: dict, keep: bool) -> None:
        tokens = request.get("max_tokens")
        if tokens is None:
            tokens = request.get("max_completion_tokens", DEFAULT_MAX_TOKENS)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            await self.send_json(writer, 400, error("max_tokens must be a positive integer", "BadRequestError"), keep)
            return
        if chat:
            messages = request.get("messages")
            prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict)) if isinstance(
                messages, list
            ) else ""  # fmt: skip
        else:
            prompt = str(request.get("prompt", ""))
        prompt_tokens = len(prompt.split())
        ttft = self.ttft
        if self.stats.cache is not None:  # the prefix cache model: the prefill of what it did not hold
            words = prompt_words(chat, request)
            prompt_tokens = len(words)
            ttft += (prompt_tokens - self.stats.cache.admit(words)) * self.prefill
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        started = time.monotonic()
        self.stats.running += 1
        self.stats.prompt_tokens += prompt_tokens
        finished = "abort"
        try:
            if request.get("stream"):
                usage = isinstance(request.get("stream_options"), dict) and request["stream_options"].get(
                    "include_usage"
                )
                await self.stream(writer, chat, rid, created, tokens, prompt_tokens, bool(usage), started, ttft)
            else:
                await asyncio.sleep(ttft)
                self.first_token(started)  # the first token is computed now; the answer goes out whole at the end
                await asyncio.sleep(self.itl * (tokens - 1))
                for _ in range(tokens - 1):
                    self.stats.tpot.observe(self.itl)
                text = " ".join([self.word] * tokens)
                choice = (
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                    if chat
                    else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
                )
                payload = {
                    "id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                    "model": self.model, "choices": [choice],
                    "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": tokens,
                              "total_tokens": prompt_tokens + tokens},
                }  # fmt: skip
                await self.send_json(writer, 200, payload, keep)
            self.stats.generation_tokens += tokens
            finished = "length"
            if self.stats.cache is not None:  # vLLM caches the blocks its answer filled too
                self.stats.cache.store(words + [self.word] * tokens)
        finally:
            self.stats.running -= 1
            self.stats.requests[finished] += 1

    def first_token(self, started: float) -> None:
        self.stats.ttft.observe(time.monotonic() - started)

    async def stream(self, writer, chat, rid, created, tokens, prompt_tokens, usage, started, ttft) -> None:
        # chunked, as uvicorn sends vLLM's StreamingResponse
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            + self.host_header.encode()
            + b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
        )
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choice: dict | None, extra: dict | None = None) -> bytes:
            event = {"id": rid, "object": kind, "created": created, "model": self.model,
                     "choices": [choice] if choice else [], **(extra or {})}  # fmt: skip
            data = f"data: {json.dumps(event)}\n\n".encode()
            return f"{len(data):x}\r\n".encode() + data + b"\r\n"

        await asyncio.sleep(ttft)
        if chat:  # vLLM 0.7.3 sends the role first, with empty content
            writer.write(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}))
        previous = 0.0
        for n in range(tokens):
            if n:
                await asyncio.sleep(self.itl)
                self.stats.tpot.observe(time.monotonic() - previous)
            previous = time.monotonic()
            last = n == tokens - 1
            text = self.word if n == 0 else " " + self.word
            choice = (
                {"index": 0, "delta": {"content": text}, "finish_reason": "length" if last else None}
                if chat
                else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length" if last else None}
            )
            writer.write(chunk(choice))
            await writer.drain()
            if n == 0:
                self.first_token(started)
        if usage:
            totals = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": tokens,
                "total_tokens": prompt_tokens + tokens,
            }
            writer.write(chunk(None, {"usage": totals}))
        done = b"data: [DONE]\n\n"
        writer.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")
        await writer.drain()


def error(message: str, kind: str) -> dict:
    return {"object": "error", "message": message, "type": kind, "param": None, "code": 400}


async def main_async(args: argparse.Namespace) -> None:
    if args.start_delay_s > 0:  # a slow start, as vLLM's while it loads the weights: nothing listens yet
        print(f"standin: starting in {args.start_delay_s:g} s (TEST ONLY)", flush=True)
        await asyncio.sleep(args.start_delay_s)
    engine = Engine(args)
    server = await asyncio.start_server(engine.serve, args.host, args.port, backlog=4096, limit=1 << 16)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ignored = f"; ignored: {' '.join(args.ignored)}" if args.ignored else ""
    print(f"standin: serving {args.served_model_name} on {args.host}:{args.port} (TEST ONLY){ignored}", flush=True)
    async with server:
        await stop.wait()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="TEST ONLY: a stand-in for vLLM 0.7.3's OpenAI server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    # vLLM takes one or more names and serves under the first
    parser.add_argument("--served-model-name", nargs="+", default=["tiny"])
    parser.add_argument("--ttft-ms", type=float, default=float(os.environ.get("GPUBOX_STANDIN_TTFT_MS") or 50))
    parser.add_argument("--itl-ms", type=float, default=float(os.environ.get("GPUBOX_STANDIN_ITL_MS") or 10))
    parser.add_argument("--word", default=os.environ.get("GPUBOX_STANDIN_WORD") or "tok", help="every token's word")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument(
        "--start-delay-s", type=float, default=float(os.environ.get("GPUBOX_STANDIN_START_DELAY_S") or 0)
    )
    parser.add_argument("--health-delay-ms", type=float, default=0.0, help="answer /health this late")
    parser.add_argument("--box-name", default="", help="the x-gpubox-standin-host header's value (the hostname)")
    parser.add_argument(
        "--prefix-cache-blocks", type=int, default=0, help="model vLLM 0.32's prefix cache: blocks per box (0: off)"
    )
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block of the prefix cache model")
    parser.add_argument(
        "--prefill-ms-per-token", type=float, default=0.2, help="with the cache model: added TTFT per uncached token"
    )
    args, args.ignored = parser.parse_known_args(argv)
    if args.prefix_cache_blocks < 0 or args.block_size < 1 or args.prefill_ms_per_token < 0:
        parser.error(
            "--prefix-cache-blocks must be 0 (off) or more, --block-size 1 or more, --prefill-ms-per-token 0 or more"
        )
    args.served_model_name = args.served_model_name[0]
    return args


def main() -> None:
    asyncio.run(main_async(parse()))


if __name__ == "__main__":
    main()
