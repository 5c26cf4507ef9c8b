"""The front door's and the gateway's rendered files, run by the real nginx and HAProxy on loopback.

Skipped where the binary is missing (Debian's packages: apt-get install nginx haproxy). A tiny Python
HTTP server stands in for vLLM. 127.0.0.1 plays the gateway (front_door_gateway_networks) and 127.0.0.2
a client that connects directly; the tenants behind the gateway are documentation addresses in
X-Forwarded-For. Limits are one request a minute with no burst, so the second request of a client (or
of a key) is the one refused. Proves:

- a 429 of the client limit and of the key limit, a 404 and a 413 that nginx answers itself are
  OpenAI-style JSON (application/json, {"error": {"message", "type", "code"}});
- two clients behind the gateway are limited apart; an X-Forwarded-For from an untrusted source is
  ignored (the connection's address is the client), and of the gateway's header only the last address
  (the one the gateway appended) is believed;
- HAProxy (when installed) replaces a client's X-Forwarded-For with the address it saw, limits each
  client with its stick table and answers its own errors (429, 401, 404, 503) in JSON.
"""

from __future__ import annotations

import http.client
import http.server
import json
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import live_proxies

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = "127.0.0.1"
STRANGER = "127.0.0.2"
# A gateway that is not the loopback address itself (front_door_gateway_networks of the second front door).
LAN_GATEWAY = "127.0.0.3"
KNOWN_KEY = {"Authorization": f"Bearer {live_proxies.GATEWAY_KEY}"}


def _free_port() -> int:
    return live_proxies.free_port()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    return live_proxies.self_signed(tmp)


def _stop(proc: subprocess.Popen) -> None:
    live_proxies.stop(proc)


def _start_front_door(tmp: Path, engine: int, knobs: dict) -> tuple[subprocess.Popen, int]:
    try:
        return live_proxies.start_front_door(tmp, engine, knobs)
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))


def _start_gateway(tmp: Path, box_port: int, box_cert: Path, knobs: dict) -> tuple[subprocess.Popen, int]:
    try:
        return live_proxies.start_gateway(tmp, box_port, box_cert, knobs)
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))


SEEN: list[tuple[str, str | None]] = []  # (path, Authorization) of every request the engine got


class _Engine(http.server.BaseHTTPRequestHandler):
    """vLLM's stand-in: 200 with the forwarding headers it got, or 503 on /v1/unavailable."""

    def do_GET(self) -> None:  # http.server calls it by this name
        SEEN.append((self.path, self.headers.get("Authorization")))
        status = 503 if self.path == "/v1/unavailable" else 200
        body = json.dumps(
            {
                "path": self.path,
                "x_real_ip": self.headers.get("X-Real-IP"),
                "xff": self.headers.get_all("X-Forwarded-For"),
                "host": self.headers.get("Host"),
            }
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def engine() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def front_door(tmp_path_factory: pytest.TempPathFactory, engine: int) -> Iterator[dict]:
    """One request a minute per client, no burst (the one known key: 1000 a second); bodies up to 1k."""
    tmp = tmp_path_factory.mktemp("front-door")
    limits = {
        "front_door_rate_per_client": "1r/m",
        "front_door_burst_per_client": 0,
        "front_door_rate_per_key": "1000r/s",
        "front_door_burst_per_key": 1000,
        "front_door_client_max_body_size": "1k",
    }
    # nginx's workers (nobody) test the GPU marker: a directory they can reach, as /run/gpubox-gpu-metrics (0755).
    markers = Path(tempfile.mkdtemp(prefix="gpubox-gpu-health."))
    markers.chmod(0o755)
    limits["gpubox_gpu_unhealthy_file"] = str(markers / "unhealthy")
    proc, port = _start_front_door(tmp, engine, limits)
    try:
        yield {"port": port, "dir": tmp, "engine": engine, "marker": markers / "unhealthy"}
    finally:
        _stop(proc)
        shutil.rmtree(markers, ignore_errors=True)


def _get(
    port: int,
    path: str = "/v1/models",
    source: str = GATEWAY,
    headers: dict | None = None,
    body: str | None = None,
    key: bool = True,
) -> tuple[int, str, Any]:
    """(status, content type, JSON body) of one HTTPS request from ``source`` (the certificate is not checked),
    with the known key unless ``key`` is false or ``headers`` has an Authorization of its own."""
    context = live_proxies.unverified_tls()
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context, source_address=(source, 0))
    try:
        sent = {**(KNOWN_KEY if key else {}), **(headers or {})}
        conn.request("POST" if body is not None else "GET", path, body=body, headers=sent)
        resp = conn.getresponse()
        raw = resp.read().decode()
        return resp.status, resp.getheader("Content-Type", ""), json.loads(raw)
    finally:
        conn.close()


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


def test_health_is_503_json_exactly_while_the_gpu_marker_exists(front_door):
    # roles/metrics' collector keeps the marker while the GPUs are unhealthy; the gateway checks /health.
    marker = front_door["marker"]
    status, _, body = _get(front_door["port"], "/health")
    assert status == 200 and body["path"] == "/health", body  # vLLM's own answer, through the door
    marker.write_text("Xid 79 on 0000:4b:00\n")
    try:
        status, ctype, body = _get(front_door["port"], "/health")
        assert status == 503 and _is_openai_error(status, ctype, body, "unavailable"), (status, body)
    finally:
        marker.unlink()
    status, _, body = _get(front_door["port"], "/health")
    assert status == 200 and body["path"] == "/health", body


def test_clients_behind_the_gateway_are_limited_apart_and_the_429_is_json(front_door):
    port = front_door["port"]
    status, _, body = _get(port, headers={"X-Forwarded-For": "198.51.100.1"})
    assert status == 200 and body["x_real_ip"] == "198.51.100.1", body
    status, ctype, body = _get(port, headers={"X-Forwarded-For": "198.51.100.1"})
    assert status == 429 and _is_openai_error(status, ctype, body, "rate_limit_exceeded"), (status, ctype, body)
    assert body["error"]["type"] == "rate_limit_error"
    # Another tenant behind the same gateway is not refused for the first one's burst.
    status, _, body = _get(port, headers={"X-Forwarded-For": "198.51.100.2"})
    assert status == 200 and body["x_real_ip"] == "198.51.100.2", body


@pytest.mark.parametrize(("n", "host"), enumerate(["a?", "a#", "evil.example", "127.0.0.1:1/v1/models?"]))
def test_the_engine_never_sees_the_clients_host(front_door, n, host):
    # starlette < 1.0.1 builds request.url from Host: vLLM 0.7.3's key check read a poisoned path
    # (CVE-2026-48710). The front door sends the engine its own fixed Host whatever the client says.
    client = f"198.51.100.{60 + n}"  # a tenant of its own: one request a minute each
    status, _, body = _get(front_door["port"], headers={"Host": host, "X-Forwarded-For": client})
    assert status in (200, 400), (status, body)
    if status == 200:
        assert body["host"] == f"127.0.0.1:{front_door['engine']}" and body["path"] == "/v1/models", body


def test_only_the_address_the_gateway_appended_is_believed(front_door):
    # A client wrote its own X-Forwarded-For (claiming the refused 198.51.100.1); the gateway appended
    # the address it saw. Only that last one is the client.
    status, _, body = _get(front_door["port"], headers={"X-Forwarded-For": "198.51.100.1, 198.51.100.5"})
    assert status == 200 and body["x_real_ip"] == "198.51.100.5", body


def test_x_forwarded_for_from_an_untrusted_source_is_ignored(front_door):
    port = front_door["port"]
    # It claims to be a fresh tenant each time: the limit keys on its own address all the same.
    status, _, body = _get(port, source=STRANGER, headers={"X-Forwarded-For": "198.51.100.3"})
    assert status == 200 and body["x_real_ip"] == STRANGER, body
    status, ctype, body = _get(port, source=STRANGER, headers={"X-Forwarded-For": "198.51.100.4"})
    assert status == 429 and _is_openai_error(status, ctype, body, "rate_limit_exceeded"), (status, body)


@pytest.fixture(scope="module")
def key_limited(tmp_path_factory: pytest.TempPathFactory, engine: int) -> Iterator[dict]:
    """One request a minute per key, no burst; clients unlimited in practice; LAN_GATEWAY is the gateway."""
    tmp = tmp_path_factory.mktemp("front-door-keys")
    limits = {
        "front_door_rate_per_client": "1000r/s",
        "front_door_burst_per_client": 1000,
        "front_door_rate_per_key": "1r/m",
        "front_door_burst_per_key": 0,
        "front_door_gateway_networks": [f"{LAN_GATEWAY}/32"],
    }
    proc, port = _start_front_door(tmp, engine, limits)
    try:
        yield {"port": port, "dir": tmp}
    finally:
        _stop(proc)


def test_the_front_door_refuses_an_unknown_key_before_the_engine_sees_it(key_limited):
    port = key_limited["port"]
    SEEN.clear()
    refused = {
        "none": {},
        "wrong": {"Authorization": "Bearer not-the-key-0123456789"},
        "case": {"Authorization": f"Bearer {live_proxies.GATEWAY_KEY.upper()}"},  # a key matches byte for byte
        "prefix": {"Authorization": f"Bearer {live_proxies.GATEWAY_KEY}x"},
        "basic": {"Authorization": f"Basic {live_proxies.GATEWAY_KEY}"},
    }
    for what, headers in refused.items():
        status, ctype, body = _get(port, source=STRANGER, headers=headers, key=False)
        assert status == 401 and _is_openai_error(status, ctype, body, "invalid_api_key"), (what, status, body)
        assert body["error"]["type"] == "authentication_error"
    assert not SEEN, SEEN  # none of them reached the engine
    # Control: the known key passes, and the engine gets the request.
    status, _, body = _get(port, source=STRANGER)
    assert status == 200 and body["path"] == "/v1/models", body
    assert [("/v1/models", KNOWN_KEY["Authorization"])] == SEEN, SEEN


def test_the_key_limit_counts_the_tenant_never_a_guessed_key(key_limited):
    port = key_limited["port"]
    # The known key's bucket is used (the test before took its one request a minute): refused from any client.
    status, ctype, body = _get(port, source=STRANGER, headers={"X-Forwarded-For": "198.51.100.7"})
    assert status == 429 and _is_openai_error(status, ctype, body, "rate_limit_exceeded"), (status, body)
    # Guessed keys get no bucket of their own: each is a 401, never a 200 nor a fresh allowance.
    for n in range(5):
        status = _get(port, source=STRANGER, headers={"Authorization": f"Bearer guess-{n:020d}"}, key=False)[0]
        assert status == 401, (n, status)
    errors = (key_limited["dir"] / "error.log").read_text()
    assert 'by zone "gpubox_key"' in errors, errors[-2000:]
    # The key is in no log.
    for log in ("access.log", "error.log"):
        text = (key_limited["dir"] / log).read_text()
        assert live_proxies.GATEWAY_KEY not in text and "guess-" not in text, log


def test_nothing_a_gateway_forwards_opens_metrics_or_health(key_limited):
    port = key_limited["port"]
    # /metrics and /health answer by the connection's address: the gateway is not a scrape network, and no
    # address it forwards (loopback included) makes it one.
    for forged in ("127.0.0.1", "198.51.100.1, 127.0.0.1", "::1", "198.51.100.1", None):
        headers = {"X-Forwarded-For": forged} if forged else {}
        for path in ("/metrics", "/health"):
            status, ctype, body = _get(port, path, source=LAN_GATEWAY, headers=headers)
            assert status == 403 and _is_openai_error(status, ctype, body, "forbidden"), (forged, path, status)
    # Control: loopback itself is a scrape source.
    status, _, body = _get(port, "/metrics", source=GATEWAY)
    assert status == 200 and body["path"] == "/metrics", body


def test_nginx_own_errors_are_json(front_door):
    port = front_door["port"]
    status, ctype, body = _get(port, path="/version", headers={"X-Forwarded-For": "198.51.100.9"})
    assert status == 404 and _is_openai_error(status, ctype, body, "not_found"), (status, body)
    status, ctype, body = _get(
        port, path="/v1/completions", headers={"X-Forwarded-For": "198.51.100.10"}, body="x" * 4096
    )
    assert status == 413 and _is_openai_error(status, ctype, body, "request_too_large"), (status, body)
    assert body["error"]["type"] == "invalid_request_error"
    status, ctype, body = _get(port, path="/metrics", source=STRANGER)
    assert status == 403 and _is_openai_error(status, ctype, body, "forbidden"), (status, body)
    # A header larger than nginx's buffers (its 494, answered as 400).
    status, ctype, body = _get(port, source=STRANGER, headers={"X-Large": "x" * 20000})
    assert status == 400 and _is_openai_error(status, ctype, body, "bad_request"), (status, body)
    # vLLM's own error passes through as vLLM wrote it.
    status, _, body = _get(port, path="/v1/unavailable", headers={"X-Forwarded-For": "198.51.100.11"})
    assert status == 503 and body["path"] == "/v1/unavailable", body


# --------------------------------------------------------------------------- the gateway in front


GATEWAY_KEY = live_proxies.GATEWAY_KEY


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, engine: int) -> Iterator[dict]:
    """HAProxy (3 requests per client in 10 s) in front of a front door with its default limits."""
    box_dir = tmp_path_factory.mktemp("box")
    box, box_port = _start_front_door(box_dir, engine, {})
    try:
        proc, port = _start_gateway(
            tmp_path_factory.mktemp("gateway"), box_port, box_dir / "tls.crt",
            {"llm_gateway_rate_per_client": 3, "llm_gateway_rate_period_s": 10},
        )  # fmt: skip
        try:
            yield {"port": port, "box_dir": box_dir}
        finally:
            _stop(proc)
    finally:
        _stop(box)


KEY = {"Authorization": f"Bearer {GATEWAY_KEY}"}


def test_the_box_sees_the_client_the_gateway_saw_never_the_clients_own_header(gateway):
    status, _, body = _get(gateway["port"], source="127.0.0.3", headers={**KEY, "X-Forwarded-For": "203.0.113.9"})
    assert status == 200, body
    # HAProxy replaced the client's header with the address it saw; the box believed it (the gateway is 127.0.0.1).
    assert body["x_real_ip"] == "127.0.0.3", body
    assert not any("203.0.113.9" in value for value in body["xff"]), body


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
    status, ctype, body = _get(port, source="127.0.0.6", headers={"Authorization": "Bearer wrong"})
    assert status == 401 and _is_openai_error(status, ctype, body, "invalid_api_key"), (status, body)
    status, ctype, body = _get(port, path="/version", source="127.0.0.6", headers=KEY)
    assert status == 404 and _is_openai_error(status, ctype, body, "not_found"), (status, body)
    assert "live-gateway-key" not in (gateway["box_dir"] / "access.log").read_text()


def test_no_box_up_is_a_json_503(tmp_path, engine):
    # The one box's front door port has nothing listening: HAProxy answers 503 itself.
    cert, _ = _self_signed(tmp_path)
    proc, port = _start_gateway(tmp_path / "gateway", _free_port(), cert, {"llm_gateway_retries": 0})
    try:
        status, ctype, body = _get(port, source="127.0.0.7", headers=KEY)
    finally:
        _stop(proc)
    assert status == 503 and _is_openai_error(status, ctype, body, "unavailable"), (status, ctype, body)
