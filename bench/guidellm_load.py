#!/usr/bin/env python3
"""The three paths measured by a kept load client, guidellm (issue 22, item 2): a bench, not a test.

    python bench/guidellm_load.py [--levels 1,32,128] [--seconds 20] [--prompt-tokens 32] [--output-tokens 32]
                                  [--ttft-ms 50] [--itl-ms 20] [--out bench/guidellm-load.json]

guidellm (github.com/vllm-project/guidellm, the vLLM project's benchmark client) runs its "concurrent"
profile against each path of bench/proxy_load.py (direct to the engine stand-in, through the front door,
through the gateway and the front door), at each level, for --seconds: TTFT, ITL and request latency
percentiles, requests/s, and its counts of successful, errored and incomplete requests (incomplete: cut
when the time was up). Its own figures, read from its JSON report; nothing is measured here but by it.

Its environment is its own: $GPUBOX_CACHE/guidellm-venv (made on the first run: guidellm 0.3.1 under
bench/guidellm-constraints.txt; the releases after it that we read, 0.4.0, 0.5.0 and 0.8.1, require torch,
which this machine can only fetch as a multi-GB CUDA build). Its tokenizer is the tiny test model's
($GPUBOX_CACHE/tiny-model, made by harness/hub/make_tiny_model.py when missing). The key reaches it
in its environment (GUIDELLM__OPENAI__API_KEY), never in argv; TLS is not verified (the rendered files' self-signed
certificates). The stand-in (TEST ONLY) counts prompt words, not tokens, so guidellm's prompt-token column
reads lower than asked; output tokens are exact. guidellm, the proxies and the stand-in share this machine's
cores: guidellm's worker processes are heavier than bench/proxy_load.py's client, so its figures include
more of its own time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import proxy_load  # sets up the collection loader and live_proxies

HERE = Path(__file__).resolve().parent

live_proxies = proxy_load.live_proxies
ROOT = proxy_load.ROOT
CACHE = Path(os.environ.get("GPUBOX_CACHE") or Path.home() / ".cache" / "gpubox")
VENV = CACHE / "guidellm-venv"
GUIDELLM = "guidellm==0.3.1"
CONSTRAINTS = HERE / "guidellm-constraints.txt"


def ensure_venv() -> Path:
    """guidellm's own environment, made once. The marker is written last, so an interrupted install is made
    again from nothing (a venv's scripts name their interpreter by path: it is made under its final name)."""
    marker = VENV / ".gpubox-installed"
    want = GUIDELLM + "\n" + CONSTRAINTS.read_text()
    if marker.exists() and marker.read_text() == want:
        return VENV / "bin" / "guidellm"
    subprocess.run(["rm", "-rf", str(VENV)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-c", str(CONSTRAINTS), GUIDELLM], check=True)
    marker.write_text(want)
    return VENV / "bin" / "guidellm"


def tokenizer(tmp: Path) -> Path:
    cached = CACHE / "tiny-model"
    if (cached / "tokenizer.json").exists():
        return cached
    made = tmp / "tiny-model"
    maker = ROOT / "harness" / "hub" / "make_tiny_model.py"
    subprocess.run([str(VENV / "bin" / "python"), str(maker), str(made)], check=True)
    return made


def figures(report: dict) -> dict:
    bench = report["benchmarks"][0]
    metrics, totals = bench["metrics"], bench["request_totals"]

    def pct(name: str, q: str) -> float | None:
        value = metrics[name]["successful"]["percentiles"].get(q)
        return None if value is None else round(value, 2)

    return {
        "successful": totals["successful"], "errored": totals["errored"], "incomplete": totals["incomplete"],
        "requests_per_s": round(metrics["requests_per_second"]["successful"]["mean"], 2),
        "concurrency_max": metrics["request_concurrency"]["successful"]["max"],
        "ttft_p50_ms": pct("time_to_first_token_ms", "p50"), "ttft_p99_ms": pct("time_to_first_token_ms", "p99"),
        "itl_p50_ms": pct("inter_token_latency_ms", "p50"), "itl_p99_ms": pct("inter_token_latency_ms", "p99"),
        "latency_p99_s": pct("request_latency", "p99"),
        "output_tokens_mean": round(metrics["output_token_count"]["successful"]["mean"], 1),
    }  # fmt: skip


def run_one(guidellm: Path, url: str, processor: Path, level: int, args: argparse.Namespace, out: Path) -> dict:
    env = dict(
        os.environ,
        GUIDELLM__OPENAI__API_KEY=live_proxies.GATEWAY_KEY,
        GUIDELLM__OPENAI__VERIFY="false",
        GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL="ERROR",
    )
    argv = [
        str(guidellm), "benchmark", "run", "--target", url, "--processor", str(processor),
        "--data", f"prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}",
        "--rate-type", "concurrent", "--rate", str(level), "--max-seconds", str(args.seconds),
        "--random-seed", "22", "--output-path", str(out), "--disable-progress", "--disable-console-outputs",
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.seconds * 4 + 120)
    if done.returncode != 0 or not out.exists():
        return {"error": f"guidellm exited {done.returncode}: {(done.stderr or done.stdout)[-400:]}"}
    return figures(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,32,128")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "guidellm-load.json"))
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    CACHE.mkdir(parents=True, exist_ok=True)
    guidellm = ensure_venv()
    procs: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="gpubox-guidellm-load."))
    results: dict[str, list[dict]] = {}
    try:
        processor = tokenizer(tmp)
        paths = proxy_load.start_paths(tmp, args.ttft_ms, args.itl_ms, procs)
        for level in levels:
            for name, (port, tls) in paths.items():
                url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
                row = {"level": level, **run_one(guidellm, url, processor, level, args, tmp / f"{name}-{level}.json")}
                results.setdefault(name, []).append(row)
                print(f"{name:10} {json.dumps(row)}", flush=True)
    except live_proxies.Missing as exc:
        print(f"guidellm_load: {exc}", file=sys.stderr)
        return 2
    finally:
        for proc in reversed(procs):
            live_proxies.stop(proc)
    version = subprocess.run([str(guidellm), "--version"], capture_output=True, text=True).stdout.strip()
    record = {
        **proxy_load.provenance("guidellm_load.py", argv),
        "client": version or GUIDELLM,
        "stand_in": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms},
        "load": {"seconds": args.seconds, "prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens},
        "results": results,
    }
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0 if all("error" not in row for rows in results.values() for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
