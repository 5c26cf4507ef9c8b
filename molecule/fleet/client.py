#!/usr/bin/python3
"""TEST ONLY: a client that keeps sending completions through the gateway until told to stop.

Usage: client.py URL CAFILE KEYFILE OUT STOPFILE [WORKERS [INTERVAL_S]]

Each of WORKERS (default 1) sends POST URL/v1/completions (max_tokens 4) with an X-Session-Id out of a
few values (so the gateway's affinity spreads them over the boxes), then waits INTERVAL_S (default 3),
and appends one JSON line per request to OUT: {"t": start time, "session": ..., "status": HTTP status
or 0, "error": ..., "seconds": ...}. It stops when STOPFILE exists. The key is read from KEYFILE
(root-only), never from argv.

Why so light: the steps that use it ((d), (f), (g)) count the requests lost around one event (a box down, a
failed turn, a GPU fault), and one completion every 3 s leaves a gap of at most 3 s. The load itself is
stream_load.py's, in step (c). (It was first sized for three CPU engines sharing two cores, which the
stand-in boxes no longer run.)
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request


def worker(
    n: int, url: str, ctx: ssl.SSLContext, key: str, out, lock: threading.Lock, stop: str, interval: float
) -> None:
    i = 0
    while not os.path.exists(stop):
        session = f"client-{n}-{i % 3}"
        # The prompt names the session: the gateway places by the conversation's start (llm_gateway_placement prefix),
        # so the sessions spread over the pool's boxes as their X-Session-Id did under session placement.
        body = json.dumps({"model": "tiny", "prompt": f"hello {session}", "max_tokens": 4}).encode()
        req = urllib.request.Request(
            url + "/v1/completions",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}", "X-Session-Id": session},
        )
        t0 = time.time()
        status, error = 0, ""
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=120) as resp:
                status = resp.status
                json.load(resp)
        except urllib.error.HTTPError as exc:
            status, error = exc.code, exc.read()[:200].decode("utf-8", "replace")
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:200]
        line = {
            "t": round(t0, 3),
            "session": session,
            "status": status,
            "error": error,
            "seconds": round(time.time() - t0, 3),
        }
        with lock:
            out.write(json.dumps(line) + "\n")
            out.flush()
        i += 1
        time.sleep(interval)


def main(argv: list[str]) -> int:
    if not 6 <= len(argv) <= 8:
        print(__doc__, file=sys.stderr)
        return 2
    url, cafile, keyfile, outpath, stop = argv[1:6]
    workers = int(argv[6]) if len(argv) > 6 else 1
    interval = float(argv[7]) if len(argv) > 7 else 3.0
    with open(keyfile, encoding="utf-8") as fh:
        key = fh.read().split()[0]  # the first word: the gateway's file is "<key> <tenant>" a line
    ctx = ssl.create_default_context(cafile=cafile)
    lock = threading.Lock()
    with open(outpath, "a", encoding="utf-8") as out:
        threads = [
            threading.Thread(target=worker, args=(n, url, ctx, key, out, lock, stop, interval)) for n in range(workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
