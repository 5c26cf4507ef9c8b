#!/usr/bin/python3
"""TEST ONLY: every request through the gateway reaches a box of the model its body names (issue 47).

Usage: route_check.py URL CAFILE KEYFILE MODEL_A MODEL_B [REQUESTS]

Sends REQUESTS (default 1000) completions through the gateway, alternating MODEL_A and MODEL_B, from 8 workers
on kept-alive connections, paced to about 60 a second (within the boxes' tenant limits); every fiftieth body is
about 1 MiB of prompt with "model" written last. A request is misrouted when the answer names another model than
the one asked for (each engine answers with its served name). Then the gateway's own answers: /v1/models lists
both models, an unknown model is 404, a body without a model or not JSON is 400. Prints one JSON line of counts;
the key is read from KEYFILE (the gateway's "<key> <tenant>" file, root only), never from argv.
"""

from __future__ import annotations

import http.client
import json
import ssl
import sys
import threading
import time
from urllib.parse import urlsplit


def _post(conn: http.client.HTTPSConnection, key: str, body: bytes, path: str = "/v1/completions") -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn.request("POST", path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, {"raw": data[:200].decode("utf-8", "replace")}


def _body(model: str, n: int) -> bytes:
    prompt = f"route check {n} " + ("x " * (512 * 1024 - 512) if n % 50 == 0 else "")
    return (json.dumps({"prompt": prompt, "max_tokens": 1})[:-1] + f', "model": {json.dumps(model)}}}').encode()


def main(argv: list[str]) -> int:
    if len(argv) not in (6, 7):
        print(__doc__, file=sys.stderr)
        return 2
    url, cafile, keyfile, model_a, model_b = argv[1:6]
    total = int(argv[6]) if len(argv) == 7 else 1000
    with open(keyfile, encoding="utf-8") as fh:
        key = fh.read().split()[0]
    ctx = ssl.create_default_context(cafile=cafile)
    host = urlsplit(url)
    counts = {"requests": 0, "ok": 0, "misrouted": 0, "other": 0, "largest_body": 0, "first_other": None}
    lock = threading.Lock()
    workers = 8
    pace = workers / 60  # seconds between one worker's requests: about 60 a second in all

    def connect() -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(host.hostname, host.port or 443, context=ctx, timeout=60)

    def worker(w: int) -> None:
        conn = connect()
        for n in range(w, total, workers):
            model = model_a if n % 2 == 0 else model_b
            body = _body(model, n)
            t0 = time.monotonic()
            try:
                status, answer = _post(conn, key, body)
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = connect()
                status, answer = 0, {"error": f"{type(exc).__name__}: {exc}"}
            with lock:
                counts["requests"] += 1
                counts["largest_body"] = max(counts["largest_body"], len(body))
                if status == 200 and answer.get("model") == model:
                    counts["ok"] += 1
                elif status == 200:
                    counts["misrouted"] += 1
                else:
                    counts["other"] += 1
                    counts["first_other"] = counts["first_other"] or [status, str(answer)[:200]]
            time.sleep(max(0.0, pace - (time.monotonic() - t0)))
        conn.close()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conn = connect()
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})
    resp = conn.getresponse()
    counts["models"] = sorted(m["id"] for m in json.loads(resp.read())["data"])
    counts["unknown_model"] = _post(conn, key, b'{"model": "no-such-model", "prompt": "x"}')
    counts["no_model"] = _post(conn, key, b'{"prompt": "x"}')
    counts["not_json"] = _post(conn, key, b"prompt=x")
    conn.close()
    print(json.dumps(counts, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
