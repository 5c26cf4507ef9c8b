"""TEST ONLY: the reading side of one streaming completion over HTTP/1.1, standard library only (asyncio).

Shared by bench/proxy_load.py (on the controller) and harness/stream_load.py (copied into the
gateway container beside it). A stream is whole when it ends with ``data: [DONE]`` after exactly the
token events asked for; each token event's arrival time is kept, for TTFT and ITL.
"""

from __future__ import annotations

import asyncio
import json
import time


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile by the nearest-rank method (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def request(path: str, host: str, key: str, body: dict, headers: dict[str, str] | None = None) -> bytes:
    """A POST with a JSON body, kept alive; the key goes in the Authorization header only."""
    data = json.dumps(body).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\n{extra}Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return status, headers


async def chunks(reader: asyncio.StreamReader):
    """The data of each chunk of a chunked body, up to the last (empty) one."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return
        data = await reader.readexactly(size + 2)
        yield data[:-2]


async def skip_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return b"".join([data async for data in chunks(reader)])
    return await reader.readexactly(int(headers.get("content-length") or 0))


async def read_events(reader: asyncio.StreamReader, times: list[float] | None = None) -> tuple[list[float], bool]:
    """The arrival time (perf_counter) of each token event of a chat or text completion, and whether [DONE] came.
    ``times``: the list to append to, which keeps the events that came when the stream breaks off (an exception)."""
    times = [] if times is None else times
    done = False
    pending = b""
    async for data in chunks(reader):
        pending += data
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            if not event.startswith(b"data: "):
                continue
            payload = event[6:]
            if payload == b"[DONE]":
                done = True
                continue
            choices = json.loads(payload).get("choices") or []
            if choices and (choices[0].get("delta", {}).get("content") or choices[0].get("text")):
                times.append(time.perf_counter())
    return times, done
