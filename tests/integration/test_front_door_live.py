"""The front door's and the gateway's rendered files, run by the real nginx and HAProxy on loopback.

Skipped where the binary is missing (Debian's packages: apt-get install nginx haproxy). A tiny Python HTTP
server stands in for vLLM and logs every request it gets (its access log): what the front door refuses must
not be there. 127.0.0.2 plays the gateway (front_door_gateway_networks: its exact address), 127.0.0.3 a client
that connects directly; the clients behind the gateway are documentation addresses in X-Forwarded-For.
Tenants (gpubox_tenants) with small limits: one request a minute with no burst, one stream, 1k bodies. Proves:

- no key, a wrong key, a key in the wrong case, another scheme, a retired key: 401 from the front door
  (OpenAI-style JSON, WWW-Authenticate: Bearer), and the engine's log shows none of them;
- a known key reaches the engine carrying the engine's own key (never the client's), with its query string;
- every location forwards the path it checked: nginx's normal form (decoded, slashes merged, dot-segments
  resolved), percent-encoded again, never the raw one (control: the old file sent a tenant's
  "/metrics/../v1/models" as written, which vLLM 0.7.3 serves from its metrics);
- each tenant is limited on its name: its second key shares its limit, another tenant does not, a client
  address (X-Forwarded-For) changes nothing; streams in flight and body size per tenant, chunked too;
- /metrics and /health answer the connection's own address, whatever X-Forwarded-For says (control: the
  same request against a file that reads the rewritten address is let in); a forwarded loopback address is
  refused (400); the access log names the tenant, never a key;
- every error a client can cause (a request line over 8k or malformed, header fields too large or bad, a bad
  body framing, TRACE, a body over the cap, plain HTTP on the TLS port) is JSON with its 4xx, and a slow client
  gets the connection closed, never a page (controls: the old named error location answered nginx's HTML 500,
  505 and 501; a forged client refused in the server block got nginx's HTML 400);
- a key rotation (add, converge, retire, converge: two nginx reloads) under 32 streams drops none;
- HAProxy (when installed) replaces a client's X-Forwarded-For with the address it saw, limits each client
  with its stick table, refuses an unknown key itself, and answers its own errors (429, 401, 404, 503) in JSON;
  it has a JSON answer for every status it takes in http-error (asked of the binary), refuses a path the box
  would read as another (control: without the refusal a key's /v1/../metrics reached the engine's /metrics),
  answers what its parser refuses before a request exists with its built-in page, pinned case by case (HAProxy 2.6
  lets no configuration change that page; 3.3 sends the errorfile: docs/facts.md), and closes a connection that
  sends nothing without that page (control: without option http-ignore-probes it got HTML 408).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import live_proxies

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = "127.0.0.2"
STRANGER = "127.0.0.3"
ENGINE_KEY = live_proxies.ENGINE_KEY
OPS_KEY = live_proxies.GATEWAY_KEY  # gpubox_api_key: the tenant "ops"
SLOW_KEYS = ("slow-tenant-key-0123456789", "slow-tenant-next-key-0123456789")
FAST_KEY = "fast.tenant+key/0123456789=="
ONE_STREAM_KEY = "one-stream-key-0123456789ab"
SMALL_BODY_KEY = "small-body-key-0123456789ab"
TENANTS = [
    {"name": "ops", "keys": [OPS_KEY], "requests_per_s": 1000, "burst": 1000},
    {"name": "slow", "keys": list(SLOW_KEYS), "requests_per_s": 1, "burst": 0},
    {"name": "fast", "keys": [FAST_KEY], "requests_per_s": 1000, "burst": 1000, "body_max": "4k"},
    {"name": "one-stream", "keys": [ONE_STREAM_KEY], "requests_per_s": 1000, "burst": 1000, "streams": 1},
    {"name": "small-body", "keys": [SMALL_BODY_KEY], "requests_per_s": 1000, "burst": 1000, "body_max": "1k"},
]


def _free_port() -> int:
    return live_proxies.free_port()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    return live_proxies.self_signed(tmp)


def _stop(proc: subprocess.Popen) -> None:
    live_proxies.stop(proc)


def _start_front_door(tmp: Path, engine: int, knobs: dict, **kwargs: Any) -> tuple[subprocess.Popen, int]:
    try:
        return live_proxies.start_front_door(tmp, engine, knobs, **kwargs)
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))


def _start_gateway(
    tmp: Path, box_port: int, box_cert: Path, knobs: dict, **kwargs: Any
) -> tuple[subprocess.Popen, int]:
    try:
        return live_proxies.start_gateway(tmp, box_port, box_cert, knobs, **kwargs)
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))


class _Engine(http.server.BaseHTTPRequestHandler):
    """vLLM's stand-in: 200 with what it got (path, forwarding headers, Authorization, body length), 503 on
    /v1/unavailable, a 2 s answer on /v1/slow; every request is appended to the server's ``seen`` (its log)."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body_len = len(self.rfile.read(length)) if length else 0
        seen = {
            "path": self.path,
            "x_real_ip": self.headers.get("X-Real-IP"),
            "xff": self.headers.get_all("X-Forwarded-For"),
            "host": self.headers.get("Host"),
            "authorization": self.headers.get("Authorization"),
            "body_len": body_len,
            "injected": self.headers.get("X-Injected"),
        }
        self.server.seen.append(seen)  # type: ignore[attr-defined]
        if self.path.startswith("/v1/slow"):
            time.sleep(2)
        status = 503 if self.path == "/v1/unavailable" else 200
        body = json.dumps(seen).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def engine() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def _front_door_knobs(markers: Path) -> dict:
    return {
        "gpubox_tenants": TENANTS,
        "front_door_gateway_networks": [f"{GATEWAY}/32"],
        "gpubox_scrape_networks": ["10.9.0.0/16"],
        # nginx's workers (nobody) test the GPU marker: a directory they can reach, as /run/gpubox-gpu-metrics.
        "gpubox_gpu_unhealthy_file": str(markers / "unhealthy"),
    }


@pytest.fixture(scope="module")
def front_door(tmp_path_factory: pytest.TempPathFactory, engine) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("front-door")
    markers = Path(tempfile.mkdtemp(prefix="gpubox-gpu-health."))
    markers.chmod(0o755)
    port = engine.server_address[1]
    proc, door = _start_front_door(tmp, port, _front_door_knobs(markers), engine_key=ENGINE_KEY)
    try:
        yield {"port": door, "dir": tmp, "engine": engine, "marker": markers / "unhealthy"}
    finally:
        _stop(proc)
        shutil.rmtree(markers, ignore_errors=True)


def _request(
    port: int,
    path: str = "/v1/models",
    source: str = STRANGER,
    headers: dict | None = None,
    body: bytes | str | None = None,
    key: str | None = None,
) -> tuple[int, http.client.HTTPResponse, Any]:
    """(status, response, JSON body) of one HTTPS request from ``source`` (the certificate is not checked)."""
    context = live_proxies.unverified_tls()
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context, source_address=(source, 0))
    headers = dict(headers or {})
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request("POST" if body is not None else "GET", path, body=body, headers=headers)
        resp = conn.getresponse()
        raw = resp.read().decode()
        return resp.status, resp, json.loads(raw)
    finally:
        conn.close()


def _get(port: int, path: str = "/v1/models", **kwargs: Any) -> tuple[int, str, Any]:
    status, resp, body = _request(port, path, **kwargs)
    return status, resp.getheader("Content-Type", ""), body


def _is_openai_error(status: int, ctype: str, body: Any, code: str) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return (
        ctype.startswith("application/json")
        and isinstance(error, dict)
        and set(error) == {"message", "type", "code"}
        and error["code"] == code
        and isinstance(error["message"], str)
        and len(error["message"]) > 0
    )


def _reached(engine, marker: str) -> list[dict]:
    """The engine's log lines whose path carries ``marker``."""
    return [line for line in engine.seen if marker in line["path"]]


def _raw(port: int, request: bytes, source: str = STRANGER, tls: bool = True) -> tuple[int, dict, bytes]:
    """``request`` written byte for byte (no client library normalises or refuses it), over TLS unless ``tls`` is
    false; (status, headers with lower-case names, body) of the answer, status 0 when the server closed without
    one. The request should ask for the connection's close (or be one the server cannot answer on)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as sock:
        conn = live_proxies.unverified_tls().wrap_socket(sock) if tls else sock
        try:
            conn.sendall(request)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        except (ConnectionResetError, ssl.SSLError):
            answer = b""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    if not lines[0].startswith("HTTP/"):
        return 0, {}, answer
    headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
    return int(lines[0].split()[1]), {k.strip().lower(): v.strip() for k, v in headers.items()}, body


def _raw_json(port: int, request: bytes, source: str = STRANGER) -> tuple[int, str, Any]:
    """(status, Content-Type, JSON body or the raw body when it is not JSON) of ``_raw``."""
    status, headers, body = _raw(port, request, source)
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        parsed = body
    return status, headers.get("content-type", ""), parsed


# --------------------------------------------------------------------------- the keys


@pytest.mark.parametrize(
    ("n", "authorization"),
    list(
        enumerate(
            [
                None,
                "Bearer wrong-key-0123456789abcdef",
                f"Bearer {OPS_KEY.upper()}",  # nginx's plain map strings would let this in
                f"bearer {OPS_KEY}",
                f"Bearer {OPS_KEY}x",
                f"Bearer  {OPS_KEY}",
                f"Basic {OPS_KEY}",
                f"Bearer {ENGINE_KEY}",  # vLLM's own key is no tenant's
                "Bearer " + FAST_KEY.replace(".", "x"),  # '.' is literal in the key map's expression
            ]
        )
    ),
)
def test_a_request_without_a_known_key_gets_401_from_the_front_door_and_never_reaches_the_engine(
    front_door, n, authorization
):
    marker = f"probe-401-{n}"
    headers = {"Authorization": authorization} if authorization else {}
    status, resp, body = _request(front_door["port"], f"/v1/models?{marker}", headers=headers)
    assert status == 401 and _is_openai_error(status, resp.getheader("Content-Type", ""), body, "invalid_api_key")
    assert body["error"]["type"] == "authentication_error"
    assert resp.getheader("WWW-Authenticate") == "Bearer"
    assert _reached(front_door["engine"], marker) == []


def test_a_known_key_reaches_the_engine_with_the_engines_own_key_and_the_query_it_sent(front_door):
    status, _, body = _get(front_door["port"], "/v1/models?probe-ok=a%2Fb&x=1", key=OPS_KEY)
    assert status == 200, body
    assert body["path"] == "/v1/models?probe-ok=a%2Fb&x=1"
    assert body["authorization"] == f"Bearer {ENGINE_KEY}"  # the client's key never reaches vLLM
    assert body["host"] == f"127.0.0.1:{front_door['engine'].server_address[1]}"
    # Every request the engine ever got carried its own key.
    assert {line["authorization"] for line in front_door["engine"].seen} == {f"Bearer {ENGINE_KEY}"}


@pytest.mark.parametrize(("n", "host"), list(enumerate(["a?", "a#", "evil.example", "127.0.0.1:1/v1/models?"])))
def test_the_engine_never_sees_the_clients_host(front_door, n, host):
    # starlette < 1.0.1 builds request.url from Host: vLLM 0.7.3's key check read a poisoned path
    # (CVE-2026-48710). The front door sends the engine its own fixed Host whatever the client says.
    status, _, body = _get(front_door["port"], headers={"Host": host}, key=OPS_KEY)
    assert status in (200, 400), (status, body)
    if status == 200:
        port = front_door["engine"].server_address[1]
        assert body["host"] == f"127.0.0.1:{port}" and body["path"] == "/v1/models", body


# --------------------------------------------------------------------------- the path vLLM gets


def _http_get(path: str, key: str | None = None, extra: str = "") -> bytes:
    """A GET of ``path`` exactly as written, with ``key`` and the ``extra`` header lines, asking for the close."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}{extra}Connection: close\r\n\r\n".encode()


# (what the client writes, its address, what vLLM must get): nginx decodes the path, merges its slashes and
# resolves its dot-segments, picks the location by that form and checks it; vLLM gets that form, percent-encoded
# again, and the query string as it came.
PATHS = [
    ("/metrics/../v1/models?probe-path-1", STRANGER, "/v1/models?probe-path-1"),
    ("/v1/x/..%2Fmodels?probe-path-2", STRANGER, "/v1/models?probe-path-2"),
    ("//v1///models?probe-path-3", STRANGER, "/v1/models?probe-path-3"),
    ("/v1/%6Dodels?probe-path-4", STRANGER, "/v1/models?probe-path-4"),
    # a decoded "?", line break and space stay inside the path
    ("/v1/a%3Fb%0D%0AX-Injected:%201?probe-path-5", STRANGER, "/v1/a%3Fb%0D%0AX-Injected:%201?probe-path-5"),
    ("/v1/%2e%2e/metrics?probe-path-6", "127.0.0.1", "/metrics?probe-path-6"),
    ("/health/../metrics?probe-path-7", "127.0.0.1", "/metrics?probe-path-7"),
    ("/v1/../health?probe-path-8", "127.0.0.1", "/health?probe-path-8"),
]


@pytest.mark.parametrize(("sent", "source", "forwarded"), PATHS)
def test_every_location_forwards_the_normalised_path_it_checked(front_door, sent, source, forwarded):
    marker = forwarded.rsplit("?", 1)[1]
    status, _, body = _raw_json(front_door["port"], _http_get(sent, OPS_KEY), source)
    assert status == 200 and body["path"] == forwarded and body["injected"] is None, (status, body)
    assert [line["path"] for line in _reached(front_door["engine"], marker)] == [forwarded]


def test_a_dot_segment_path_out_of_a_location_is_checked_as_the_location_it_reaches(front_door):
    # "/v1/../metrics" is /metrics for nginx: its scrape check, not a tenant's key, decides.
    status, ctype, body = _raw_json(front_door["port"], _http_get("/v1/../metrics?probe-path-9", OPS_KEY))
    assert status == 403 and _is_openai_error(status, ctype, body, "forbidden"), (status, body)
    assert _reached(front_door["engine"], "probe-path-9") == []


def _old_forwarding(conf: str) -> str:
    """The file as it forwarded before: the tenants' locations the raw URI ($request_uri), /metrics and /health the
    URI the client wrote (proxy_pass without one)."""
    for new, old in (
        ("        rewrite ^ $gpubox_uri break;\n        proxy_pass http://gpubox_vllm;\n",
         "        proxy_pass http://gpubox_vllm$request_uri;\n"),
        ("proxy_pass http://gpubox_vllm/metrics;", "proxy_pass http://gpubox_vllm;"),
        ("proxy_pass http://gpubox_vllm/health;", "proxy_pass http://gpubox_vllm;"),
    ):  # fmt: skip
        assert new in conf, new
        conf = conf.replace(new, old)
    return conf


def test_control_the_raw_path_reached_the_engines_metrics_with_a_tenants_key(tmp_path, engine):
    # vLLM 0.7.3 serves its metrics on every path that starts with /metrics (docs/facts.md, "nginx and HAProxy"):
    # the tenant's "/metrics/../v1/models", checked as /v1/models, was its metrics.
    markers = Path(tempfile.mkdtemp(prefix="gpubox-gpu-health."))
    markers.chmod(0o755)
    knobs = _front_door_knobs(markers)
    proc, port = _start_front_door(tmp_path, engine.server_address[1], knobs, edit=_old_forwarding)
    try:
        tenant = _raw_json(port, _http_get("/metrics/../v1/models?probe-old-path-1", OPS_KEY))
        scraper = _raw_json(port, _http_get("/v1/../health?probe-old-path-2"), "127.0.0.1")
    finally:
        _stop(proc)
        shutil.rmtree(markers, ignore_errors=True)
    assert tenant[0] == 200 and tenant[2]["path"] == "/metrics/../v1/models?probe-old-path-1", tenant
    assert scraper[0] == 200 and scraper[2]["path"] == "/v1/../health?probe-old-path-2", scraper


# --------------------------------------------------------------------------- limits per tenant


def test_each_tenant_is_limited_on_its_name_not_its_header_nor_its_address(front_door):
    port = front_door["port"]
    first, second = SLOW_KEYS
    assert (
        _get(port, "/v1/models?probe-slow-1", key=first, source=GATEWAY, headers={"X-Forwarded-For": "198.51.100.1"})[0]
        == 200
    )
    # The same tenant's other key, from another client behind the gateway and from a direct client: its limit.
    for source, xff in ((GATEWAY, "198.51.100.2"), (STRANGER, None), (GATEWAY, "203.0.113.77")):
        headers = {"X-Forwarded-For": xff} if xff else {}
        status, ctype, body = _get(port, "/v1/models?probe-slow-2", key=second, source=source, headers=headers)
        assert status == 429 and _is_openai_error(status, ctype, body, "rate_limit_exceeded"), (status, body)
        assert body["error"]["type"] == "rate_limit_error"
    assert _reached(front_door["engine"], "probe-slow-2") == []
    # Another tenant is not refused for it.
    assert (
        _get(port, "/v1/models?probe-fast", key=FAST_KEY, source=GATEWAY, headers={"X-Forwarded-For": "198.51.100.1"})[
            0
        ]
        == 200
    )
    errors = (front_door["dir"] / "error.log").read_text()
    assert "limiting requests, excess: 0." in errors and 'by zone "gpubox_tenant_slow"' in errors, errors[-2000:]


def test_a_tenants_streams_in_flight_are_capped(front_door):
    port = front_door["port"]
    held: list[int] = []
    slow = threading.Thread(target=lambda: held.append(_get(port, "/v1/slow?probe-stream-1", key=ONE_STREAM_KEY)[0]))
    slow.start()
    deadline = time.monotonic() + 5
    while not _reached(front_door["engine"], "probe-stream-1") and time.monotonic() < deadline:
        time.sleep(0.02)
    status, ctype, body = _get(port, "/v1/models?probe-stream-2", key=ONE_STREAM_KEY)
    assert status == 429 and _is_openai_error(status, ctype, body, "rate_limit_exceeded"), (status, body)
    assert _get(port, "/v1/models?probe-stream-other", key=FAST_KEY)[0] == 200  # another tenant's streams are its own
    slow.join(10)
    assert held == [200]
    assert _get(port, "/v1/models?probe-stream-3", key=ONE_STREAM_KEY)[0] == 200  # the stream ended: room again
    assert _reached(front_door["engine"], "probe-stream-2") == []


def _chunked(port: int, path: str, key: str, size: int) -> tuple[int, Any]:
    """A POST whose body comes chunked (no Content-Length), as a client streaming its upload sends it."""
    context = live_proxies.unverified_tls()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, context.wrap_socket(raw) as tls:
        data = b"x" * size
        tls.sendall(
            f"POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
            + b"".join(
                f"{len(data[i : i + 512]):x}\r\n".encode() + data[i : i + 512] + b"\r\n" for i in range(0, size, 512)
            )
            + b"0\r\n\r\n"
        )
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body.strip().startswith(b"{") else body


def test_each_tenant_has_its_own_body_cap_chunked_bodies_too(front_door):
    port = front_door["port"]
    body = "x" * 2048
    status, ctype, answer = _get(port, "/v1/completions?probe-body-small", key=SMALL_BODY_KEY, body=body)
    assert status == 413 and _is_openai_error(status, ctype, answer, "request_too_large"), (status, answer)
    assert "1k" in answer["error"]["message"]
    status, _, answer = _get(port, "/v1/completions?probe-body-fast", key=FAST_KEY, body=body)
    assert status == 200 and answer["body_len"] == 2048, answer
    status, answer = _chunked(port, "/v1/completions?probe-chunked-small", SMALL_BODY_KEY, 2048)
    assert status == 413, answer
    status, answer = _chunked(port, "/v1/completions?probe-chunked-fast", FAST_KEY, 2048)
    assert status == 200 and answer["body_len"] == 2048, answer
    # Above every tenant's cap (the largest, 4k): refused before anything else.
    status, ctype, answer = _get(port, "/v1/completions?probe-body-huge", key=FAST_KEY, body="x" * 8192)
    assert status == 413, answer
    for marker in ("probe-body-small", "probe-chunked-small", "probe-body-huge"):
        assert _reached(front_door["engine"], marker) == [], marker


# --------------------------------------------------------------------------- the client's address


def test_metrics_answer_the_connections_own_address_whatever_x_forwarded_for_says(front_door):
    port = front_door["port"]
    # The gateway is no scrape network: its X-Forwarded-For claiming one (or loopback) gets nothing.
    for xff, expect in (
        ("10.9.0.1", 403),
        ("127.0.0.1", 400),
        ("::1", 400),
        ("0.0.0.0", 400),
        ("::ffff:127.0.0.1", 400),
    ):
        for path in ("/metrics", "/health"):
            status, ctype, body = _get(port, path, source=GATEWAY, headers={"X-Forwarded-For": xff})
            assert status == expect, (xff, path, status, body)
            assert _is_openai_error(status, ctype, body, "forbidden" if expect == 403 else "bad_request")
    assert [line for line in front_door["engine"].seen if line["path"] in ("/metrics", "/health")] == []
    # Loopback itself may (the connection's address); a stranger's header is ignored, not refused.
    assert _get(port, "/metrics", source="127.0.0.1")[0] == 200
    assert _get(port, "/metrics", source=STRANGER, headers={"X-Forwarded-For": "127.0.0.1"})[0] == 403
    assert _get(port, "/v1/models", source=STRANGER, headers={"X-Forwarded-For": "127.0.0.1"}, key=OPS_KEY)[0] == 200


def test_control_a_file_that_reads_the_rewritten_address_lets_the_spoof_in(tmp_path, engine):
    # The same request against the file with the allow list on $remote_addr (what realip rewrites), as it was.
    markers = Path(tempfile.mkdtemp(prefix="gpubox-gpu-health."))
    markers.chmod(0o755)
    edit = lambda conf: conf.replace("geo $realip_remote_addr $gpubox_scraper", "geo $remote_addr $gpubox_scraper")  # noqa: E731
    proc, port = _start_front_door(tmp_path, engine.server_address[1], _front_door_knobs(markers), edit=edit)
    try:
        status, _, _ = _get(port, "/metrics", source=GATEWAY, headers={"X-Forwarded-For": "10.9.0.1"})
    finally:
        _stop(proc)
        shutil.rmtree(markers, ignore_errors=True)
    assert status == 200


def test_a_forwarded_loopback_address_is_refused_and_never_reaches_the_engine(front_door):
    status, ctype, body = _get(
        front_door["port"],
        "/v1/models?probe-forged",
        source=GATEWAY,
        headers={"X-Forwarded-For": "127.0.0.1"},
        key=OPS_KEY,
    )
    assert status == 400 and _is_openai_error(status, ctype, body, "bad_request"), (status, body)
    assert _reached(front_door["engine"], "probe-forged") == []


def test_the_log_names_the_tenant_and_the_client_the_gateway_saw_never_a_key(front_door):
    port = front_door["port"]
    # A client wrote its own X-Forwarded-For; the gateway appended the address it saw: only that last one is read.
    status, _, body = _get(
        port,
        "/v1/models?probe-log",
        source=GATEWAY,
        headers={"X-Forwarded-For": "198.51.100.9, 198.51.100.5"},
        key=OPS_KEY,
    )
    assert status == 200 and body["x_real_ip"] == "198.51.100.5", body
    assert _get(port, "/v1/models?probe-nolog-401", source=STRANGER)[0] == 401
    time.sleep(0.2)
    log = (front_door["dir"] / "access.log").read_text()
    (line,) = [x for x in log.splitlines() if "probe-log" in x]
    assert line.startswith("198.51.100.5 ") and line.endswith(f"tenant=ops conn={GATEWAY}"), line
    (line,) = [x for x in log.splitlines() if "probe-nolog-401" in x]
    assert line.startswith(f"{STRANGER} ") and '" 401 ' in line and line.endswith(f"tenant=- conn={STRANGER}"), line
    for name in ("access.log", "error.log"):
        text = (front_door["dir"] / name).read_text()
        for key in (OPS_KEY, ENGINE_KEY, FAST_KEY, *SLOW_KEYS, ONE_STREAM_KEY, SMALL_BODY_KEY):
            assert key not in text, name
    # The public file holds no key; the root-only ones do.
    conf = (front_door["dir"] / "front-door.conf").read_text()
    assert not any(key in conf for key in (OPS_KEY, ENGINE_KEY, *SLOW_KEYS)) and "$http_authorization" not in conf


def test_health_is_503_json_exactly_while_the_gpu_marker_exists(front_door):
    # roles/metrics' collector keeps the marker while the GPUs are unhealthy; the gateway checks /health.
    marker, port = front_door["marker"], front_door["port"]
    status, _, body = _get(port, "/health", source="127.0.0.1")
    assert status == 200 and body["path"] == "/health", body  # vLLM's own answer, through the door
    marker.write_text("Xid 79 on 0000:4b:00\n")
    try:
        status, ctype, body = _get(port, "/health", source="127.0.0.1")
        assert status == 503 and _is_openai_error(status, ctype, body, "unavailable"), (status, body)
    finally:
        marker.unlink()
    assert _get(port, "/health", source="127.0.0.1")[0] == 200


def test_nginx_own_errors_are_json(front_door):
    port = front_door["port"]
    status, ctype, body = _get(port, path="/version", key=OPS_KEY)
    assert status == 404 and _is_openai_error(status, ctype, body, "not_found"), (status, body)
    status, ctype, body = _get(port, path="/_gpubox_tenant/ops", key=OPS_KEY)  # the tenants' locations are internal
    assert status == 404 and _is_openai_error(status, ctype, body, "not_found"), (status, body)
    status, ctype, body = _get(port, path="/metrics", source=STRANGER)
    assert status == 403 and _is_openai_error(status, ctype, body, "forbidden"), (status, body)
    # A header larger than nginx's buffers (its 494, answered as 431).
    status, ctype, body = _get(port, source=STRANGER, headers={"X-Large": "x" * 20000})
    assert status == 431 and _is_openai_error(status, ctype, body, "headers_too_large"), (status, body)
    # vLLM's own error passes through as vLLM wrote it.
    status, _, body = _get(port, path="/v1/unavailable", key=OPS_KEY)
    assert status == 503 and body["path"] == "/v1/unavailable", body


# --------------------------------------------------------------------------- what a client can get wrong


@contextlib.contextmanager
def _front_door_with(tmp_path: Path, engine, edit) -> Iterator[int]:
    """A front door of its own (the fixture's knobs) whose rendered file ``edit`` changed; its port."""
    markers = Path(tempfile.mkdtemp(prefix="gpubox-gpu-health."))
    markers.chmod(0o755)
    proc, port = _start_front_door(tmp_path, engine.server_address[1], _front_door_knobs(markers), edit=edit)
    try:
        yield port
    finally:
        _stop(proc)
        shutil.rmtree(markers, ignore_errors=True)


def _swap(conf: str, pairs: list[tuple[str, str]]) -> str:
    """``conf`` with each (new, old) pair's text put back as it was; each new text must be there."""
    for new, old in pairs:
        assert new in conf, new
        conf = conf.replace(new, old)
    return conf


LONG = "a" * 9000
KEYED = f"Authorization: Bearer {OPS_KEY}\r\n"
# Every class of error a client can cause at the front door: (the request as sent, status, code). The request
# lines nginx cannot read (too long, malformed) have no URI yet; the others fail on their header fields or body.
CLIENT_ERRORS = {
    "request line over 8k": (f"GET /v1/{LONG} HTTP/1.1\r\nHost: x\r\n", 414, "uri_too_long"),
    "malformed request line": ("GET /v1/models HTTP/1.1 x\r\nHost: x\r\n", 400, "bad_request"),
    "method with a bad character": ("G(T /v1/models HTTP/1.1\r\nHost: x\r\n", 400, "bad_request"),
    "lower-case method": ("get /v1/models HTTP/1.1\r\nHost: x\r\n", 400, "bad_request"),
    "CONNECT": ("CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n", 400, "bad_request"),
    "asterisk form": ("OPTIONS * HTTP/1.1\r\nHost: x\r\n", 400, "bad_request"),
    "path above the root": (f"GET /../v1/models HTTP/1.1\r\nHost: x\r\n{KEYED}", 400, "bad_request"),
    "NUL in the path": (f"GET /v1/mo%00dels HTTP/1.1\r\nHost: x\r\n{KEYED}", 400, "bad_request"),
    "HTTP/2.0 request line": ("GET /v1/models HTTP/2.0\r\nHost: x\r\n", 400, "bad_request"),
    "header field over 8k": (f"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: {LONG}\r\n", 431, "headers_too_large"),
    "header fields over 4 x 8k": (
        "GET /v1/models HTTP/1.1\r\nHost: x\r\n" + "".join(f"X-{i}: {'a' * 4000}\r\n" for i in range(12)),
        431,
        "headers_too_large",
    ),
    "header field with a NUL": ("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n", 400, "bad_request"),
    "unknown Transfer-Encoding": (
        f"POST /v1/models HTTP/1.1\r\nHost: x\r\n{KEYED}Transfer-Encoding: gzip\r\n",
        400,
        "bad_request",
    ),
    "two Content-Length": (
        f"POST /v1/models HTTP/1.1\r\nHost: x\r\n{KEYED}Content-Length: 1\r\nContent-Length: 2\r\n",
        400,
        "bad_request",
    ),
    "Content-Length not a number": (
        f"POST /v1/models HTTP/1.1\r\nHost: x\r\n{KEYED}Content-Length: x\r\n",
        400,
        "bad_request",
    ),
    "Host with a slash": ("GET /v1/models HTTP/1.1\r\nHost: a/b\r\n", 400, "bad_request"),
    "HTTP/1.1 without Host": (f"GET /v1/models HTTP/1.1\r\n{KEYED}", 400, "bad_request"),
    "TRACE": (f"TRACE /v1/models HTTP/1.1\r\nHost: x\r\n{KEYED}", 405, "method_not_allowed"),
    "body over every tenant's cap": (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{KEYED}Content-Length: 9000000\r\n",
        413,
        "request_too_large",
    ),
}


def _sent(head: str) -> bytes:
    return (head + "Connection: close\r\n\r\n").encode("latin-1")


@pytest.mark.parametrize("case", list(CLIENT_ERRORS))
def test_every_error_a_client_can_cause_is_json_with_its_4xx(front_door, case):
    head, expect, code = CLIENT_ERRORS[case]
    seen = len(front_door["engine"].seen)
    status, ctype, body = _raw_json(front_door["port"], _sent(head))
    assert status == expect and _is_openai_error(status, ctype, body, code), (status, ctype, body)
    assert len(front_door["engine"].seen) == seen  # nothing of it reached vLLM


def test_plain_http_on_the_tls_port_is_json_and_no_tls_is_no_answer(front_door):
    status, headers, body = _raw(front_door["port"], _sent("GET /v1/models HTTP/1.1\r\nHost: x\r\n"), tls=False)
    assert status == 400 and _is_openai_error(status, headers["content-type"], json.loads(body), "bad_request")
    # Bytes that are neither TLS nor HTTP: the handshake fails and nothing that reads as an HTTP answer comes back.
    status, _, answer = _raw(front_door["port"], b"\x16\x03\x01\x00\x05hello" + b"x" * 64, tls=False)
    assert status == 0 and b"HTTP/" not in answer and b"<html" not in answer, answer


def _short_client_timeouts(conf: str) -> str:
    """The file with nginx's client timeouts at 1 s (its defaults, which the file keeps, are 60 s)."""
    return _swap(
        conf, [("    access_log ", "    client_header_timeout 1s;\n    client_body_timeout 1s;\n    access_log ")]
    )


def test_a_slow_client_gets_the_connection_closed_never_a_page(tmp_path, engine):
    # nginx answers neither a request whose header fields never end nor one whose body never comes whole: it
    # closes the connection when its timeout (1 s here) passes, with nothing sent.
    request = f"POST /v1/completions?probe-slow-body HTTP/1.1\r\nHost: x\r\n{KEYED}Content-Length: 100\r\n\r\nabc"
    with _front_door_with(tmp_path, engine, _short_client_timeouts) as port:
        started = time.monotonic()
        header = _raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        body = _raw(port, request.encode())
        waited = time.monotonic() - started
    assert header == (0, {}, b"") and body == (0, {}, b""), (header, body)
    assert 2 <= waited < 8, waited  # each waited for the timeout, not refused at once
    assert _reached(engine, "probe-slow-body") == []


def _old_error_pages(conf: str) -> str:
    """The file as it answered errors before: a named location, 494 as 400, no 501 or 505."""
    return _swap(
        conf,
        [
            ("error_page 400 401 403 404 405 408 413 414 429 500 502 503 504 /_gpubox_error;",
             "error_page 400 401 403 404 405 408 413 414 429 500 502 503 504 @gpubox_error;"),
            ("error_page 494 =431 /_gpubox_error;", "error_page 494 495 496 497 =400 @gpubox_error;"),
            ("error_page 495 496 497 501 505 =400 /_gpubox_error;", ""),
            ("location = /_gpubox_error {\n        internal;\n", "location @gpubox_error {\n"),
        ],
    )  # fmt: skip


def test_control_the_named_error_location_answered_html_500_and_nginx_pages(tmp_path, engine):
    with _front_door_with(tmp_path, engine, _old_error_pages) as port:
        answers = {case: _raw_json(port, _sent(CLIENT_ERRORS[case][0])) for case in CLIENT_ERRORS}
    # nginx could not redirect a request with no URI to the named location: its own HTML 500.
    for case in ("request line over 8k", "malformed request line", "CONNECT", "NUL in the path"):
        status, ctype, body = answers[case]
        assert status == 500 and ctype == "text/html" and b"500 Internal Server Error" in body, (case, answers[case])
    for case, status in (("HTTP/2.0 request line", 505), ("unknown Transfer-Encoding", 501)):
        assert answers[case][:2] == (status, "text/html"), (case, answers[case])
    assert answers["header field over 8k"][0] == 400


def test_control_a_forged_client_refused_in_the_server_block_gets_nginx_html(tmp_path, engine):
    # The server's rewrite directives run again on the redirect to /_gpubox_error: refused there a second time,
    # the answer is nginx's own page. So each location refuses a forged client, never the server block.
    refuse = "    if ($gpubox_forged_client) {\n        return 400;\n    }\n    access_log "
    with _front_door_with(tmp_path, engine, lambda conf: _swap(conf, [("    access_log ", refuse)])) as port:
        request = _http_get("/v1/models?probe-forged-server", OPS_KEY, "X-Forwarded-For: 127.0.0.1\r\n")
        status, ctype, body = _raw_json(port, request, GATEWAY)
    assert status == 400 and ctype == "text/html" and b"<html>" in body, (status, ctype, body)


# --------------------------------------------------------------------------- idle connections to vLLM


class _KeptAlive(http.server.BaseHTTPRequestHandler):
    """An engine that never closes a connection itself: for each connection its peer closed, how long it had been
    idle since the last answer (the server's ``idle``)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = b'{"object": "list", "data": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.answered = time.monotonic()

    def handle(self) -> None:
        super().handle()  # until the peer closes the connection
        if hasattr(self, "answered"):
            self.server.idle.append(time.monotonic() - self.answered)  # type: ignore[attr-defined]

    def log_message(self, *args: Any) -> None:
        pass


def _upstream_keepalive_s(conf: str) -> int | None:
    block = re.search(r"upstream gpubox_vllm \{(.*?)\}", conf, re.S)
    assert block, conf
    found = re.search(r"^\s*keepalive_timeout (\d+)s;", block.group(1), re.M)
    return int(found.group(1)) if found else None


def test_the_front_door_closes_an_idle_connection_to_vllm_before_vllm_does(tmp_path: Path) -> None:
    """vLLM closes a connection idle 5 s (0.7.3 and 0.32.0; the role's vars name the sources): nginx must close its
    idle upstream connection first, or it sends a request on one vLLM has just closed and the client gets 502. The
    role's file closes it before; the control, the file without the upstream's keepalive_timeout (nginx's 60 s),
    still holds it open when vLLM would have closed it."""
    engine_keepalive = yaml.safe_load((ROOT / "roles/front_door/vars/main.yml").read_text())[
        "__front_door_engine_keepalive_s"
    ]
    doors = {}
    with contextlib.ExitStack() as stack:
        for name, edit in (("role", None), ("control", lambda conf: re.sub(r"\n\s*keepalive_timeout \d+s;", "", conf))):
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeptAlive)
            server.idle = []  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stack.callback(server.shutdown)
            markers = Path(tempfile.mkdtemp(prefix="gpubox-gpu-health."))
            stack.callback(shutil.rmtree, markers, True)
            (tmp_path / name).mkdir()
            knobs = _front_door_knobs(markers)
            proc, port = _start_front_door(tmp_path / name, server.server_address[1], knobs, edit=edit)
            stack.callback(_stop, proc)
            doors[name] = (server, port, _upstream_keepalive_s((tmp_path / name / "front-door.conf").read_text()))
        assert doors["role"][2] is not None and doors["role"][2] < engine_keepalive, doors["role"][2]
        assert doors["control"][2] is None
        for _server, port, _ in doors.values():
            assert _get(port, key=OPS_KEY)[0] == 200
        time.sleep(engine_keepalive + 0.5)
        # read before nginx stops (which closes what it still holds)
        role, control = list(doors["role"][0].idle), list(doors["control"][0].idle)  # type: ignore[attr-defined]
    assert len(role) == 1 and role[0] < engine_keepalive, role
    assert control == [], control


# --------------------------------------------------------------------------- rotation under load


def _stream(port: int, key: str, tokens: int, out: list[dict]) -> None:
    """One streamed completion; appends {status, got (token events), done ([DONE] came), error}."""
    result: dict[str, Any] = {"status": 0, "got": 0, "done": False, "error": ""}
    try:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=live_proxies.unverified_tls())
        body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": tokens, "stream": True})
        conn.request(
            "POST",
            "/v1/completions",
            body=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        result["status"] = resp.status
        for line in resp:
            if line.startswith(b"data: [DONE]"):
                result["done"] = True
            elif line.startswith(b"data: "):
                result["got"] += 1
        conn.close()
    except Exception as exc:  # a stream cut by the reload is what this test looks for
        result["error"] = f"{type(exc).__name__}: {exc}"
    out.append(result)


def _settled(port: int, key: str, expect: int) -> bool:
    """Whether ``key`` gets ``expect`` 5 times in a row within 10 s: right after a reload the previous worker may
    still accept a connection or two before it has read the master's signal to stop accepting."""
    deadline, in_a_row = time.monotonic() + 10, 0
    while in_a_row < 5 and time.monotonic() < deadline:
        in_a_row = in_a_row + 1 if _get(port, key=key)[0] == expect else 0
        time.sleep(0.05)
    return in_a_row >= 5


def test_a_key_rotation_under_32_streams_drops_none(tmp_path):
    try:
        standin, engine_port = live_proxies.start_standin(5, 50)  # 300 tokens: 15 s a stream
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))
    old, new = "rotation-old-key-0123456789", "rotation-new-key-0123456789"

    def tenants(keys):
        return {
            "gpubox_tenants": [
                {"name": "team", "keys": [*keys, OPS_KEY], "streams": 64, "requests_per_s": 1000, "burst": 1000}
            ]
        }

    try:
        proc, port = _start_front_door(tmp_path, engine_port, tenants([old]))
        try:
            results: list[dict] = []
            threads = [threading.Thread(target=_stream, args=(port, old, 300, results)) for _ in range(32)]
            for thread in threads:
                thread.start()
            time.sleep(0.5)
            assert _get(port, key=new)[0] == 401
            # Add the new key, converge (a reload), while the 32 streams run; both keys work.
            live_proxies.write_front_door(tmp_path, engine_port, port, tenants([old, new]))
            live_proxies.reload(proc, tmp_path)
            assert _settled(port, new, 200) and _settled(port, old, 200)
            # Retire the old key, converge again: it is refused from now on.
            live_proxies.write_front_door(tmp_path, engine_port, port, tenants([new]))
            live_proxies.reload(proc, tmp_path)
            assert _settled(port, old, 401) and _settled(port, new, 200)
            assert all(thread.is_alive() for thread in threads)  # the streams outlived both reloads
            for thread in threads:
                thread.join(60)
        finally:
            _stop(proc)
    finally:
        _stop(standin)
    assert len(results) == 32
    assert [r for r in results if not (r["status"] == 200 and r["done"] and r["got"] == 300)] == [], results


# --------------------------------------------------------------------------- the gateway in front


GATEWAY_KEY = live_proxies.GATEWAY_KEY


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, engine: int) -> Iterator[dict]:
    """HAProxy (3 requests per client in 10 s) in front of a front door with its default limits."""
    box_dir = tmp_path_factory.mktemp("box")
    box, box_port = _start_front_door(
        box_dir, engine.server_address[1], {"front_door_gateway_networks": ["127.0.0.1/32"]}
    )
    try:
        proc, port = _start_gateway(
            tmp_path_factory.mktemp("gateway"), box_port, box_dir / "tls.crt",
            {"llm_gateway_rate_per_client": 3, "llm_gateway_rate_period_s": 10},
        )  # fmt: skip
        try:
            yield {"port": port, "box_dir": box_dir, "box_port": box_port}
        finally:
            _stop(proc)
    finally:
        _stop(box)


KEY = {"Authorization": f"Bearer {GATEWAY_KEY}"}
# What the gateway routes: a body naming the box's model (the gateway answers /v1/models itself).
COMPLETION = {"path": "/v1/completions", "body": b'{"model": "tiny", "prompt": "hi"}'}


def test_the_box_sees_the_client_the_gateway_saw_never_the_clients_own_header(gateway):
    status, _, body = _get(
        gateway["port"], **COMPLETION, source="127.0.0.3", headers={**KEY, "X-Forwarded-For": "203.0.113.9"}
    )
    assert status == 200, body
    # HAProxy replaced the client's header with the address it saw; the box believed it (the gateway is 127.0.0.1).
    assert body["x_real_ip"] == "127.0.0.3", body
    assert not any("203.0.113.9" in value for value in body["xff"]), body


def test_a_client_on_the_gateways_own_loopback_is_served_and_cannot_forge_one(gateway):
    # 127.0.0.1 on the gateway's host is a real client (the fleet scenario's own checks run there): the gateway
    # writes no X-Forwarded-For for it, so the box does not take it for a forged loopback (400) and logs the gateway.
    status, _, body = _get(gateway["port"], **COMPLETION, source="127.0.0.1", headers=KEY)
    assert status == 200, body
    assert body["x_real_ip"] == "127.0.0.1" and body["xff"] == ["127.0.0.1"], body
    # Whatever such a client writes itself is dropped as from any other client.
    status, _, body = _get(
        gateway["port"], **COMPLETION, source="127.0.0.1", headers={**KEY, "X-Forwarded-For": "127.0.0.9"}
    )
    assert status == 200 and not any("127.0.0.9" in value for value in body["xff"]), body


def test_the_gateway_limits_each_client_and_its_429_is_json(gateway):
    port = gateway["port"]
    assert [_get(port, source="127.0.0.4", headers=KEY)[0] for _ in range(3)] == [200, 200, 200]
    status, ctype, body = _get(port, source="127.0.0.4", headers=KEY)
    assert status == 429 and _is_openai_error(status, ctype, body, "rate_limit_exceeded"), (status, ctype, body)
    assert body["error"]["type"] == "rate_limit_error"
    # Another client is not refused for it.
    assert _get(port, source="127.0.0.5", headers=KEY)[0] == 200


def test_the_gateways_own_answers_are_json(gateway):
    port = gateway["port"]
    status, resp, body = _request(port, source="127.0.0.6", headers={"Authorization": "Bearer wrong"})
    assert status == 401 and _is_openai_error(status, resp.getheader("Content-Type"), body, "invalid_api_key")
    assert resp.getheader("WWW-Authenticate") == "Bearer"
    status, ctype, body = _get(port, path="/version", source="127.0.0.6", headers=KEY)
    assert status == 404 and _is_openai_error(status, ctype, body, "not_found"), (status, body)
    assert "live-gateway-key" not in (gateway["box_dir"] / "access.log").read_text()


def test_no_box_up_is_a_json_503(tmp_path, engine):
    # The one box's front door port has nothing listening: HAProxy answers 503 itself.
    cert, _ = _self_signed(tmp_path)
    proc, port = _start_gateway(tmp_path / "gateway", _free_port(), cert, {"llm_gateway_retries": 0})
    try:
        status, ctype, body = _get(port, **COMPLETION, source="127.0.0.7", headers=KEY)
    finally:
        _stop(proc)
    assert status == 503 and _is_openai_error(status, ctype, body, "unavailable"), (status, ctype, body)


# (what the client writes, what the box's nginx would read it as): a path not in its normal form.
GATEWAY_PATHS = [
    ("/v1/../metrics?probe-gw-path-1", "/metrics"),
    ("/v1/..%2Fmetrics?probe-gw-path-2", "/metrics"),
    ("/v1/%2e%2e/health?probe-gw-path-3", "/health"),
    ("/v1/%2E%2E%2Fhealth?probe-gw-path-4", "/health"),
    ("/v1/x%2F..%2F..%2Fmetrics?probe-gw-path-5", "/metrics"),
    ("/v1/./models?probe-gw-path-6", "/v1/models"),
    ("/v1/models/..?probe-gw-path-7", "/v1/"),
    ("https://localhost/v1/../metrics?probe-gw-path-8", "/metrics"),
]


@pytest.mark.parametrize(("n", "sent"), [(n, sent) for n, (sent, _) in enumerate(GATEWAY_PATHS)])
def test_the_gateway_refuses_a_path_the_box_would_read_as_another(gateway, engine, n, sent):
    # Each from its own address (the fixture's gateway allows 3 requests a client in 10 s).
    status, ctype, body = _raw_json(gateway["port"], _http_get(sent, GATEWAY_KEY), f"127.0.1.{n + 1}")
    assert status == 400 and _is_openai_error(status, ctype, body, "path_not_normal"), (status, body)
    assert _reached(engine, sent.rsplit("?", 1)[1]) == []


def test_control_without_the_refusal_a_key_for_v1_reached_the_engines_metrics(tmp_path, gateway, engine):
    # The gateway judged "/v1/../metrics" by its /v1/ prefix; the box read /metrics, from the gateway's address,
    # which its scrape networks may hold (loopback here, a Prometheus on the gateway host in a fleet).
    box_cert = gateway["box_dir"] / "tls.crt"
    proc, port = _start_gateway(tmp_path / "gateway", gateway["box_port"], box_cert, {}, edit=_without_path_refusal)
    try:
        status, _, body = _raw_json(port, _http_post("/v1/../metrics?probe-gw-old-path", GATEWAY_KEY), "127.0.2.1")
    finally:
        _stop(proc)
    assert status == 200 and body["path"] == "/metrics?probe-gw-old-path", (status, body)


def _http_post(path: str, key: str) -> bytes:
    """A POST of ``path`` exactly as written with a body naming the box's model (what the gateway routes)."""
    body = b'{"model": "tiny", "prompt": "hi"}'
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def _without_path_refusal(conf: str) -> str:
    """The gateway's file without its refusal of a path not in its normal form, as it was."""
    lines = conf.splitlines(keepends=True)
    refusal = [line for line in lines if line.rstrip().endswith(" if gpubox_path_not_normal")]
    assert len(refusal) == 1, refusal
    return "".join(line for line in lines if line not in refusal)


def _http_error_statuses(haproxy: str, tmp: Path) -> set[int]:
    """The statuses this HAProxy takes in http-error (it refuses the others), asked of the binary itself in
    batches of 40 (it stops at 50 errors)."""
    taken: set[int] = set()
    for first in range(400, 600, 40):
        codes = range(first, min(first + 40, 600))
        lines = "".join(f'    http-error status {code} content-type application/json string "{{}}"\n' for code in codes)
        conf = tmp / f"statuses-{first}.cfg"
        conf.write_text(f"defaults\n    mode http\n{lines}")
        check = subprocess.run([haproxy, "-c", "-f", str(conf)], capture_output=True, text=True)
        refused = {int(code) for code in re.findall(r"status code '(\d+)' not handled", check.stdout + check.stderr)}
        assert check.returncode == 0 or refused, check.stdout + check.stderr
        taken |= set(codes) - refused
    return taken


def test_every_error_status_haproxy_can_answer_itself_has_its_json(tmp_path):
    try:
        haproxy = live_proxies.haproxy_binary()
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))
    errors = live_proxies.write_gateway_errors(tmp_path / "errors")
    knobs = {"__llm_gateway_servers": [], "__llm_gateway_errors_dir": str(errors)}
    conf = live_proxies.render("unit-gateway-live", "llm_gateway", "haproxy.cfg.j2", ("llm_gateway",), (), knobs)
    lines = [line.strip() for line in conf.splitlines() if line.strip().startswith("errorfile ")]
    # An http-error string would do the same for a request HAProxy has read, and 3.3 would not send it for what
    # its parser refuses (docs/facts.md, "nginx and HAProxy").
    assert not [line for line in conf.splitlines() if line.strip().startswith("http-error ")]
    files = {int(status): Path(path) for _, status, path in (line.split() for line in lines)}
    assert set(files) == _http_error_statuses(haproxy, tmp_path) and len(files) == len(lines), lines
    # The binary loads each file with no warning (-dW: a warning fails): a whole HTTP response whose Content-Length
    # is its body's, for a status it takes there.
    check = tmp_path / "errorfiles.cfg"
    timeouts = "".join(f"    timeout {kind} 5s\n" for kind in ("connect", "client", "server"))
    listener = "frontend fe\n    bind 127.0.0.1:1\n"  # -c binds nothing; without one it exits 2
    check.write_text("defaults\n    mode http\n" + timeouts + "".join(f"    {line}\n" for line in lines) + listener)
    run = subprocess.run([haproxy, "-dW", "-c", "-f", str(check)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    for status, path in files.items():
        head, _, body = path.read_bytes().partition(b"\n\n")
        assert head.startswith(f"HTTP/1.1 {status} ".encode()) and b"\nContent-Type: application/json\n" in head
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "code"} and all(error.values()), (status, error)


def _short_request_timeout(conf: str) -> str:
    return _swap(
        conf,
        [("timeout http-request 30s", "timeout http-request 1s"), ("wait-for-body time 30s", "wait-for-body time 1s")],
    )


def _without_ignore_probes(conf: str) -> str:
    return _swap(_short_request_timeout(conf), [("    option http-ignore-probes\n", "")])


def test_the_gateway_closes_a_connection_that_sends_nothing_without_a_page(tmp_path, gateway):
    # option http-ignore-probes: closed when timeout http-request (1 s here) passes, nothing sent (control: without
    # it HAProxy 2.6 answered its HTML 408, option dontlognull or not).
    box_cert = gateway["box_dir"] / "tls.crt"
    answers = {}
    for name, edit in (("file", _short_request_timeout), ("control", _without_ignore_probes)):
        proc, port = _start_gateway(tmp_path / name, gateway["box_port"], box_cert, {}, edit=edit)
        try:
            started = time.monotonic()
            answers[name] = (_raw(port, b"", "127.0.3.5"), time.monotonic() - started)
        finally:
            _stop(proc)
    (closed, waited), (control, _) = answers["file"], answers["control"]
    assert closed == (0, {}, b"") and 1 <= waited < 8, (closed, waited)
    assert control[0] == 408 and control[1]["content-type"] == "text/html", control


def _bufsize(conf: str) -> int:
    """HAProxy's buffer for this file: its tune.bufsize, or HAProxy's default (16384)."""
    sizes = [int(line.split()[1]) for line in conf.splitlines() if line.strip().startswith("tune.bufsize ")]
    return sizes[-1] if sizes else 16384


# What HAProxy 2.6's HTTP/1 parser refuses before a request exists, each from its own address: (the request, the
# status). The status is right, the body is HAProxy's built-in HTML page whatever the configuration says:
# h1_send_error (src/mux_h1.c) copies http_err_msgs[] and reads the proxy's errorfile only to send nothing for an
# empty one (docs/facts.md, "nginx and HAProxy").
GATEWAY_PARSER_ERRORS = {
    "malformed request line": ("GET /v1/models HTTP/1.1 x\r\nHost: x\r\n", 400),
    "space in a header field name": (f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{KEYED}Bad Name: 1\r\n", 400),
    "control character in a header field name": (f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{KEYED}X\x01y: 1\r\n", 400),
    "over 101 header fields": (
        f"GET /v1/models HTTP/1.1\r\nHost: x\r\n{KEYED}" + "".join(f"X-{i}: 1\r\n" for i in range(120)),
        400,
    ),
    "two Content-Length": (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{KEYED}Content-Length: 1\r\nContent-Length: 2\r\n", 400,
    ),
    "unknown Transfer-Encoding": (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{KEYED}Transfer-Encoding: gzip\r\n", 400,
    ),
    "HTTP/0.9 request line": ("GET /v1/models\r\n", 400),
    "HTTP/1.0 GET with a body": (f"GET /v1/models HTTP/1.0\r\n{KEYED}Content-Length: 3\r\n", 413),
}  # fmt: skip


def test_haproxy_answers_in_json_once_it_has_read_a_request_and_with_its_own_page_before(tmp_path, gateway, engine):
    # A request HAProxy has read gets its errorfile (JSON); what its HTTP/1 parser refuses before a request exists
    # (GATEWAY_PARSER_ERRORS, header fields over its buffer, a first request not complete in time) gets its built-in
    # page, whatever the file says (docs/facts.md, "nginx and HAProxy"): pinned here, status and page, so that an
    # HAProxy that sends the errorfile there too (3.3 does) fails this test and the facts are written again.
    box_cert = gateway["box_dir"] / "tls.crt"
    proc, port = _start_gateway(tmp_path / "gateway", gateway["box_port"], box_cert, {}, edit=_short_request_timeout)
    over_buffer = "a" * _bufsize((tmp_path / "gateway" / "haproxy.cfg").read_text())
    try:
        body_late = _raw_json(
            port,
            f"POST /v1/completions?probe-gw-late HTTP/1.1\r\nHost: x\r\n{KEYED}Content-Length: 100\r\n\r\nabc".encode(),
        )
        parser = {
            case: (_raw(port, _sent(head), f"127.0.3.{n + 10}"), status)
            for n, (case, (head, status)) in enumerate(GATEWAY_PARSER_ERRORS.items())
        }
        parser["header fields over its buffer"] = (
            _raw(port, _sent(f"GET /v1/models HTTP/1.1\r\nX: {over_buffer}\r\n"), "127.0.3.2"),
            400,
        )
        parser["header fields never end"] = (_raw(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n", "127.0.3.3"), 408)
        plain = _raw(port, _sent("GET /v1/models HTTP/1.1\r\nHost: x\r\n"), "127.0.3.4", tls=False)
    finally:
        _stop(proc)
    # A body that never comes whole: the request exists, its 408 is ours.
    assert body_late[0] == 408 and _is_openai_error(*body_late, "request_timeout"), body_late
    assert _reached(engine, "probe-gw-late") == []
    for case, ((status, headers, body), expect) in parser.items():
        assert status == expect and headers["content-type"] == "text/html" and body.startswith(b"<html>"), (
            f"{case}: HAProxy's built-in page is no longer what it sends (docs/facts.md, 'nginx and HAProxy')",
            status,
            headers,
            body,
        )
    # Plain HTTP on the TLS port: the handshake fails, the connection closes, nothing comes back.
    assert plain == (0, {}, b""), plain
