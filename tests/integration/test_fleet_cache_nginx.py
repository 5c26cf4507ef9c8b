"""The LAN cache's nginx file, rendered as Ansible renders it and run by a real nginx on loopback.

No mocks: the rendered conf.d file (roles/fleet_cache/templates/gpubox-fleet-cache.conf.j2) is
included in a minimal main configuration (as files/nginx-check does for `nginx -t`), nginx serves it
on 127.0.0.1, and a tiny Python hub (http.server on 127.0.0.1) answers what each test sets up. The
one change to the rendered text: `listen PORT;` becomes `listen 127.0.0.1:PORT;` (the test binds
loopback only); realip in the main configuration lets a request from 127.0.0.5 carry a LAN address
(X-Forwarded-For: 10.x), as if that host had sent it. A box of gpu_boxes is a socket bound to 127.0.0.3
(its facts' default IPv4 here) or the LAN address 10.231.94.11 (its ansible_host); a host that is not a
box binds 127.0.0.2 or carries another 10.x address.

Skipped when no nginx binary is installed (apt-get install nginx: Debian's archive).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.client
import http.server
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]
HOST = "unit-fleet-cache"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
COMMIT = "0123456789abcdef" * 2 + "01234567"  # a commit id: 40 lower-case hex digits
BODY = b"0123456789" * 100  # a model file of 1000 bytes
# Source addresses on loopback (every 127/8 address is one on Linux): a box of gpu_boxes, a host that is not one.
BOX_CLIENT = "127.0.0.3"
OUTSIDE_CLIENT = "127.0.0.2"
ALLOWED_CLIENT = BOX_CLIENT  # the default source of the tests' requests
# A LAN as nginx sees it: a request from LAN_GATE with X-Forwarded-For: A is from A (realip in the test's main
# configuration, not in the rendered file). BOX_LAN is box2's address, LAN_OTHER another private address.
LAN_GATE = "127.0.0.5"
BOX_LAN = "10.231.94.11"
LAN_OTHER = "10.231.94.99"

# What a box's client may send that changes a hub's answer or says who asks; the key is the path, Revision and FilePath.
CLIENT_HEADERS = ("Authorization", "Cookie", "Accept-Encoding", "User-Agent", "Accept-Language", "X-Box-Private")

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install -y nginx)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render(template: str, extra: dict[str, Any]) -> str:
    """One template of roles/fleet_cache as Ansible renders it (its includes resolve as in a run)."""
    from ansible.template import trust_as_template

    templar, _ = ansible_vars.templar_for(
        HOST, roles=("fleet_cache",), extra_vars={"ansible_managed": "managed by a test", **extra}
    )
    path = ROOT / "roles" / "fleet_cache" / "templates" / template
    return templar.template(trust_as_template("{{ lookup('ansible.builtin.template', '" + str(path) + "') }}"))


# --------------------------------------------------------------------------- the tiny hub


@dataclass
class Hub:
    """What the hub answers, per path; every request it saw (method, raw path) in seen, its headers in heard."""

    port: int = 0
    answers: dict[str, tuple] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)
    heard: list[dict[str, str]] = field(default_factory=list)  # each request's headers, names lower-cased

    def answer(self, path: str, *spec: Any) -> None:
        self.answers[path] = spec

    def count(self, fragment: str) -> int:
        return sum(fragment in raw for _, raw in self.seen)


def hub_server(hub: Hub) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            hub.seen.append(("GET", self.path))
            hub.heard.append({key.lower(): value for key, value in self.headers.items()})
            path = self.path.split("?", 1)[0]
            spec = hub.answers.get(path, ("status", 404, b"no such file\n"))
            kind = spec[0]
            if kind == "status":  # (status, body): a complete answer
                _, status, body = spec
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif kind == "short":  # says Content-Length: len(body) but sends only `cut` bytes, then closes
                _, body, cut = spec
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
            elif kind == "nolength":  # no Content-Length, no chunking: ends when the connection closes
                _, body = spec
                self.send_response(200)
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True
            elif kind == "chunked-cut":  # chunked, one chunk, then the connection closes without the last chunk
                _, body = spec
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(body), body))
                self.wfile.flush()
                self.close_connection = True
            elif kind == "echo":  # what this client sent, as a hub that answers per client would (gzip if asked)
                said = {h: self.headers[h] for h in CLIENT_HEADERS if self.headers.get(h) is not None}
                body = json.dumps(said, sort_keys=True).encode()
                gzipped = "gzip" in (self.headers.get("Accept-Encoding") or "")
                body = gzip.compress(body, mtime=0) if gzipped else body
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                if gzipped:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                self.wfile.write(body)
            elif kind == "redirect":
                _, location = spec
                self.send_response(302)
                self.send_header("Location", location)
                self.send_header("Content-Length", "0")
                self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    hub.port = server.server_address[1]
    return server


# --------------------------------------------------------------------------- nginx


@dataclass
class Cache:
    port: int
    hub: Hub
    root: Path
    tls_port: int = 0
    conf: str = ""

    def get(
        self, path: str, source: str = ALLOWED_CLIENT, headers: dict[str, str] | None = None, tls: bool = False
    ) -> tuple[int, Any, bytes]:
        """(status, headers, body) of one GET through the cache, from source address ``source``; over TLS
        (checking the certificate against the test's own, as a box checks the inventory's) when ``tls``."""
        conn: http.client.HTTPConnection
        if tls:
            context = ssl.create_default_context(cafile=str(self.root / "cert.pem"))
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self.tls_port, timeout=10, source_address=(source, 0), context=context
            )
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10, source_address=(source, 0))
        try:
            conn.putrequest("GET", path, skip_accept_encoding=True)
            for key, value in (headers or {}).items():
                conn.putheader(key, value)
            conn.endheaders()
            resp = conn.getresponse()
            try:
                body = resp.read()
            except http.client.IncompleteRead as exc:
                body = exc.partial
            return resp.status, resp.headers, body
        finally:
            conn.close()

    def file(self, name: str, owner: str = "gpubox-test", model: str = "tiny", revision: str = COMMIT) -> str:
        """The box's request for one file, and the hub path it is forwarded to."""
        return f"/api/v1/models/{owner}/{model}/repo?Revision={revision}&FilePath={name}"

    def log(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.root / "access.log").read_text().splitlines() if line.strip()]


def box_clients(extra: list[str] | None = None) -> dict[str, Any]:
    """Who may use the test's cache, as the role computes it: two boxes of gpu_boxes and no other network.
    box1's ansible_host is loopback (a forwarded port, as in molecule), so its facts' default IPv4 counts:
    BOX_CLIENT, a real source address on loopback. box2 is BOX_LAN (10.231.94.11, its ansible_host), which
    the test's nginx sees through realip (LAN_GATE below)."""
    from ansible_collections.gpubox.gpubox.plugins.module_utils import fleet_cache_access as access

    boxes = [
        access.BoxSeen("box1", ansible_host="127.0.0.1", default_ipv4=BOX_CLIENT),
        access.BoxSeen("box2", ansible_host=BOX_LAN),
    ]
    clients = access.clients(boxes, extra or [])
    assert clients["errors"] == [] and clients["boxes"] == {"box1": [f"{BOX_CLIENT}/32"], "box2": [f"{BOX_LAN}/32"]}
    return clients


@contextlib.contextmanager
def running_cache(prefix: str, overrides: dict[str, Any]) -> Iterator[Cache]:
    """The rendered conf.d file, with ``overrides`` over the role's variables, served by a real nginx on
    loopback in front of a tiny hub of its own. Two test-only lines wrap it in the main configuration:
    the listen address (loopback only) and realip, so that a request from LAN_GATE carrying
    X-Forwarded-For: ADDRESS is one from ADDRESS (a LAN host) for everything in the rendered file."""
    # Not under pytest's tmp_path (0700 when the test runs as root): nginx's workers run as nobody then.
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o755)
    for sub in ("models", "pinned", "temp"):
        (root / sub).mkdir()
        os.chmod(root / sub, 0o777)  # nginx's workers (nobody when the test runs as root) write here
    # A certificate for 127.0.0.1, as the inventory would give one (fleet_cache_tls_certificate).
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=gpubox fleet cache test", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(root / "key.pem"), "-out", str(root / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    hub = Hub()
    server = hub_server(hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port, tls_port = free_port(), free_port()
    conf = render(
        "gpubox-fleet-cache.conf.j2",
        {
            "fleet_cache_port": port,
            "fleet_cache_model_upstream": f"http://127.0.0.1:{hub.port}",
            "fleet_cache_model_redirect_hosts": ["storage.example.com"],
            "__fleet_cache_clients": box_clients(),
            # The lock files the boxes use (vars/main.yml reads them from hostvars, which this templar lacks;
            # test_fleet_cache_inputs.py runs that part in a real play).
            "__fleet_cache_lock_files": [],
            "fleet_cache_resolver": "127.0.0.1",
            "__fleet_cache_model_dir": str(root / "models"),
            "__fleet_cache_pinned_dir": str(root / "pinned"),
            "__fleet_cache_nginx_log": str(root / "access.log"),
            "fleet_cache_tls_port": tls_port,
            "fleet_cache_tls_certificate": (root / "cert.pem").read_text(),
            "fleet_cache_tls_private_key": (root / "key.pem").read_text(),
            "__fleet_cache_tls_cert": str(root / "cert.pem"),
            "__fleet_cache_tls_key": str(root / "key.pem"),
            **overrides,
        },
    )
    assert f"listen {tls_port} ssl;" in conf
    conf = conf.replace(f"listen {tls_port} ssl;", f"listen 127.0.0.1:{tls_port} ssl;")
    assert f"listen {port};" in conf
    conf = conf.replace(f"listen {port};", f"listen 127.0.0.1:{port};")
    (root / "gpubox-fleet-cache.conf").write_text(conf)
    temp = root / "temp"
    (root / "nginx.conf").write_text(
        f"pid {root}/nginx.pid;\n"
        f"error_log {root}/error.log info;\n"
        "worker_processes 1;\n"
        "events {}\n"
        "http {\n"
        "    include /etc/nginx/mime.types;\n"
        f"    client_body_temp_path {temp}/body;\n    proxy_temp_path {temp}/proxy;\n"
        f"    fastcgi_temp_path {temp}/fastcgi;\n    uwsgi_temp_path {temp}/uwsgi;\n    scgi_temp_path {temp}/scgi;\n"
        f"    set_real_ip_from {LAN_GATE}/32;\n    real_ip_header X-Forwarded-For;\n"
        f"    include {root}/gpubox-fleet-cache.conf;\n"
        "}\n"
    )
    check = subprocess.run([NGINX, "-t", "-q", "-c", str(root / "nginx.conf")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr + conf
    proc = subprocess.Popen(
        [NGINX, "-c", str(root / "nginx.conf"), "-g", "daemon off;"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "nginx exited"
                assert time.monotonic() < deadline, "nginx did not listen within 10 s"
                time.sleep(0.05)
        yield Cache(port=port, hub=hub, root=root, tls_port=tls_port, conf=conf)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # nginx's master and its workers (their own session)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        server.shutdown()
        server.server_close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cache() -> Iterator[Cache]:
    """The cache as the role's defaults render it: the boxes of gpu_boxes only, no other network."""
    with running_cache("gpubox-fleet-cache-nginx.", {}) as running:
        yield running


def wait_for_cache_files(cache: Cache, at_least: int) -> None:
    """nginx renames a stored answer into place as the response ends: give it a moment."""
    deadline = time.monotonic() + 10
    while True:
        stored = [p for p in (cache.root / "models").rglob("*") if p.is_file()]
        if len(stored) >= at_least:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"nginx stored {len(stored)} files under {cache.root}/models in 10 s, not {at_least}")
        time.sleep(0.02)


# --------------------------------------------------------------------------- what is stored


def test_a_complete_200_is_stored_and_served_from_cache(cache: Cache) -> None:
    """The positive control: without it the 'not cached' tests below would pass for a cache that caches nothing."""
    cache.hub.answer("/api/v1/models/gpubox-test/tiny/repo", "status", 200, BODY)
    first = cache.get(cache.file("good.bin"))
    assert first[0] == 200 and first[2] == BODY and first[1]["X-Gpubox-Fleet-Cache"] == "MISS"
    wait_for_cache_files(cache, 1)
    before = len(cache.hub.seen)
    second = cache.get(cache.file("good.bin"))
    assert second[0] == 200 and second[2] == BODY and second[1]["X-Gpubox-Fleet-Cache"] == "HIT"
    assert len(cache.hub.seen) == before, "a HIT must not reach the hub"
    # A Range request is answered from the stored file (206), never stored as a 206 of its own.
    part = cache.get(cache.file("good.bin"), headers={"Range": "bytes=10-19"})
    assert part[0] == 206 and part[2] == BODY[10:20] and len(cache.hub.seen) == before


@pytest.mark.parametrize("status", [500, 502, 404, 403])
def test_an_error_from_the_hub_is_never_served_from_cache(cache: Cache, status: int) -> None:
    path = f"/api/v1/models/gpubox-test/err{status}/repo"
    cache.hub.answer(path, "status", status, b'{"Code": 500, "Message": "hub is sad"}')
    url = cache.file("model.safetensors", model=f"err{status}")
    assert cache.get(url)[0] == status
    cache.hub.answer(path, "status", 200, BODY)  # the hub recovers: the next request must reach it
    again = cache.get(url)
    assert again[0] == 200 and again[2] == BODY and again[1]["X-Gpubox-Fleet-Cache"] == "MISS"


def test_an_answer_shorter_than_its_content_length_is_never_stored(cache: Cache) -> None:
    """nginx drops a body that ends before its Content-Length (ngx_http_upstream: cache_free, not update)."""
    path = "/api/v1/models/gpubox-test/short/repo"
    cache.hub.answer(path, "short", BODY, 400)
    url = cache.file("model.safetensors", model="short")
    status, _, body = cache.get(url)
    assert status == 200 and len(body) < len(BODY)  # the box sees a short body (and its own check fails)
    cache.hub.answer(path, "status", 200, BODY)
    again = cache.get(url)
    assert again[2] == BODY and again[1]["X-Gpubox-Fleet-Cache"] == "MISS"
    assert cache.hub.count("/short/repo") == 2


def test_a_chunked_answer_cut_before_its_last_chunk_is_never_stored(cache: Cache) -> None:
    path = "/api/v1/models/gpubox-test/chunkcut/repo"
    cache.hub.answer(path, "chunked-cut", BODY[:300])
    url = cache.file("model.safetensors", model="chunkcut")
    cache.get(url)
    cache.hub.answer(path, "status", 200, BODY)
    again = cache.get(url)
    assert again[2] == BODY and again[1]["X-Gpubox-Fleet-Cache"] == "MISS"


def test_an_answer_without_a_content_length_is_passed_on_but_never_stored(cache: Cache) -> None:
    """A close-delimited body cannot be told from a cut one, so it is not stored (proxy_no_cache)."""
    path = "/api/v1/models/gpubox-test/nolength/repo"
    cache.hub.answer(path, "nolength", BODY[:300])
    url = cache.file("model.safetensors", model="nolength")
    assert cache.get(url)[2] == BODY[:300]
    cache.hub.answer(path, "status", 200, BODY)
    again = cache.get(url)
    assert again[2] == BODY and again[1]["X-Gpubox-Fleet-Cache"] == "MISS"


# --------------------------------------------------------------------------- redirects


def test_a_redirect_to_the_hubs_own_origin_is_followed_and_cached_under_the_request(cache: Cache) -> None:
    cache.hub.answer("/api/v1/models/gpubox-test/redir/repo", "redirect",
                     f"http://127.0.0.1:{cache.hub.port}/_storage/x?Signature=abc")  # fmt: skip
    cache.hub.answer("/_storage/x", "status", 200, BODY)
    url = cache.file("model.safetensors", model="redir")
    first = cache.get(url)
    assert first[0] == 200 and first[2] == BODY
    wait_for_cache_files(cache, 2)
    second = cache.get(url)
    assert second[2] == BODY and second[1]["X-Gpubox-Fleet-Cache"] == "HIT"


@pytest.mark.parametrize(
    ("location", "named"),
    [
        ("http://storage.example.com/f?Signature=1", "http://storage.example.com"),  # allowed host, plain http
        ("https://elsewhere.example.net/f", "https://elsewhere.example.net"),  # https, not on the list
        ("https://127.0.0.1/f", "https://127.0.0.1"),  # loopback
        ("http://127.0.0.1:{other}/f", "http://127.0.0.1:{other}"),  # loopback, another port than the hub's
        ("https://storage.example.com@127.0.0.1/f", "https://storage.example.com"),  # userinfo trick
        ("https://storage.example.com.evil.example/f", "https://storage.example.com.evil.example"),
        ("/_storage/relative", "a relative or unparsable Location"),
    ],
)
def test_a_redirect_off_the_allow_list_is_refused_with_502_naming_it(cache: Cache, location: str, named: str) -> None:
    other = free_port()
    location, named = location.format(other=other), named.format(other=other)
    model = f"refused{abs(hash(location)) % 10**8}"
    cache.hub.answer(f"/api/v1/models/gpubox-test/{model}/repo", "redirect", location)
    seen = len(cache.hub.seen)
    status, headers, body = cache.get(cache.file("model.safetensors", model=model))
    assert status == 502, body
    assert headers["X-Gpubox-Fleet-Cache"] == "redirect-refused"
    text = body.decode()
    assert named in text and "fleet_cache_model_redirect_hosts" in text and "Signature" not in text
    assert len(cache.hub.seen) == seen + 1, "only the hub's answer, nothing fetched from the redirect target"
    # The uncached path (a branch, not a commit) refuses the same redirect.
    status, _, _ = cache.get(cache.file("model.safetensors", model=model, revision="master"))
    assert status == 502


# --------------------------------------------------------------------------- what a box sends upstream

BOX_A_HEADERS = {
    "Authorization": "Bearer box-a-token",
    "Cookie": "m_session_id=box-a",
    "Accept-Encoding": "gzip",
    "User-Agent": "modelscope/box-a",
    "Accept-Language": "zh-CN",
    "X-Box-Private": "box-a",
}


@pytest.mark.parametrize("redirected", [False, True], ids=["from-the-hub", "from-a-redirect"])
def test_a_stored_file_is_fetched_with_no_header_of_the_box_that_asked_first(cache: Cache, redirected: bool) -> None:
    """The key is (path, Revision, FilePath): box A's credentials, cookie and encoding (and any other header)
    never reach the hub for a file that is stored, so box B is never served an answer made for box A. Before,
    nginx forwarded them all: the hub saw A's token and gzip, and B got A's gzip-encoded answer naming A."""
    model = f"hdr{int(redirected)}"
    hub_path = f"/api/v1/models/gpubox-test/{model}/repo"
    if redirected:
        cache.hub.answer(hub_path, "redirect", f"http://127.0.0.1:{cache.hub.port}/_storage/{model}?Signature=a")
        cache.hub.answer(f"/_storage/{model}", "echo")
    else:
        cache.hub.answer(hub_path, "echo")
    url, heard = cache.file("w.bin", model=model), len(cache.hub.heard)
    stored = len([p for p in (cache.root / "models").rglob("*") if p.is_file()])
    status, headers, body_a = cache.get(url, headers=BOX_A_HEADERS)
    assert (status, headers["X-Gpubox-Fleet-Cache"]) == (200, "MISS"), body_a
    wait_for_cache_files(cache, stored + 1)
    status, headers_b, body_b = cache.get(url, source=LAN_GATE, headers={"X-Forwarded-For": BOX_LAN})
    assert (status, headers_b["X-Gpubox-Fleet-Cache"], body_b) == (200, "HIT", body_a), "box B gets the stored answer"
    answer_b = gzip.decompress(body_b) if headers_b.get("Content-Encoding") == "gzip" else body_b
    encoding = headers_b.get("Content-Encoding")
    assert b"box-a" not in answer_b, f"box B was served box A's answer: {answer_b!r} (Content-Encoding {encoding})"
    assert "Content-Encoding" not in headers_b, "box B asked for no encoding"
    upstream = cache.hub.heard[heard:]
    assert len(upstream) == 1 + redirected
    for sent in upstream:
        leaked = {h: sent[h.lower()] for h in CLIENT_HEADERS if h != "User-Agent" and h.lower() in sent}
        assert leaked == {}, f"the box's headers reached the hub: {leaked}"
        assert sent.get("user-agent") == "gpubox-fleet-cache", sent
    assert json.loads(body_a) == {"User-Agent": "gpubox-fleet-cache"}


def test_a_passed_through_request_keeps_the_boxs_own_headers(cache: Cache) -> None:
    """The control of the test above, and what is kept: a branch's file and a listing are never stored, so each
    answer reaches only the box that asked, and its own headers still go upstream."""
    cache.hub.answer("/api/v1/models/gpubox-test/hdrpass/repo", "echo")
    cache.hub.answer("/api/v1/models/gpubox-test/hdrpass/repo/files", "echo")
    listing = "/api/v1/models/gpubox-test/hdrpass/repo/files?Revision=master"
    for url in (cache.file("w.bin", model="hdrpass", revision="master"), listing):
        heard = len(cache.hub.heard)
        status, headers, body = cache.get(url, headers=BOX_A_HEADERS)
        assert status == 200 and headers.get("X-Gpubox-Fleet-Cache") in (None, "", "BYPASS"), headers
        sent = cache.hub.heard[heard]
        assert sent["authorization"] == "Bearer box-a-token" and sent["accept-encoding"] == "gzip", sent
        assert headers["Content-Encoding"] == "gzip" and b"box-a-token" in gzip.decompress(body)


# --------------------------------------------------------------------------- control characters


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/models/gpubox-test/tiny%0d%0aX-Injected:%20yes/repo?Revision=" + COMMIT + "&FilePath=a",
        "/api/v1/models/gpubox-test/tiny/repo%0D%0AHost:evil?Revision=" + COMMIT + "&FilePath=a",
        "/api/v1/models/gpubox-test/tiny/repo?Revision=" + COMMIT + "&FilePath=a%0d%0aX-Injected:%20yes",
        "/api/v1/models/gpubox-test/tiny/repo?Revision=master&FilePath=a%00b",
        "/api/v1/models/gpubox-test/tiny%09/repo?Revision=master&FilePath=a",
        "/api/v1/models/gpubox-test/tiny/repo/files?Revision=master%7f",
        "/index/numpy%0a/",
    ],
)
def test_a_control_character_in_the_request_is_400_and_never_reaches_the_hub(cache: Cache, path: str) -> None:
    seen = len(cache.hub.seen)
    status, _, body = cache.get(path)
    assert status == 400, body
    assert len(cache.hub.seen) == seen
    assert not any("X-Injected" in raw or "evil" in raw for _, raw in cache.hub.seen)


def test_an_encoded_percent_is_not_a_control_character(cache: Cache) -> None:
    """%250d is the text '%0d', not a CR: it is forwarded (the refusal is not a blanket ban on %)."""
    cache.hub.answer("/api/v1/models/gpubox-test/tiny/repo", "status", 200, BODY)
    status, _, _ = cache.get(cache.file("a%250d.bin"))
    assert status == 200 and cache.hub.count("FilePath=a%250d.bin") == 1


# --------------------------------------------------------------------------- who may use it


@pytest.mark.parametrize(
    "path",
    [
        "/_fleet_cache/health",
        "/api/v1/models/gpubox-test/tiny/repo?Revision=" + COMMIT + "&FilePath=good.bin",  # cached
        "/api/v1/models/gpubox-test/tiny/repo?Revision=master&FilePath=good.bin",  # passed through
        "/api/v1/models/gpubox-test/tiny/repo/files?Revision=master",
        "/index/numpy/",
    ],
)
def test_a_client_outside_the_allowed_networks_gets_403(cache: Cache, path: str) -> None:
    cache.hub.answer("/api/v1/models/gpubox-test/tiny/repo", "status", 200, BODY)
    seen = len(cache.hub.seen)
    assert cache.get(path, source=OUTSIDE_CLIENT)[0] == 403
    assert len(cache.hub.seen) == seen
    assert cache.get("/_fleet_cache/health", source=ALLOWED_CLIENT)[0] == 200
    assert cache.get("/_fleet_cache/health", source="127.0.0.1")[0] == 200  # the role's own check


def lan_get(cache: Cache, path: str, address: str) -> tuple[int, Any, bytes]:
    """A request from the LAN host ``address`` (nginx sees it through realip, LAN_GATE)."""
    return cache.get(path, source=LAN_GATE, headers={"X-Forwarded-For": address})


def test_by_default_a_box_is_admitted_and_another_lan_host_is_refused(cache: Cache) -> None:
    """The default (fleet_cache_allowed_networks empty): the boxes of gpu_boxes, nothing else of the LAN.
    The old default (every RFC 1918 network) admitted LAN_OTHER: test_an_operators_network_... is that control."""
    cache.hub.answer("/api/v1/models/gpubox-test/tiny/repo", "status", 200, BODY)
    url = cache.file("lan.bin")
    box = lan_get(cache, url, BOX_LAN)
    assert box[0] == 200 and box[2] == BODY
    seen = len(cache.hub.seen)
    for address in (LAN_OTHER, "192.168.1.20", "172.16.0.9"):
        status, _, body = lan_get(cache, url, address)
        assert status == 403, (address, body)
        assert f"{address} is not a box of gpu_boxes nor in fleet_cache_allowed_networks" in body.decode()
    assert len(cache.hub.seen) == seen, "a refused client's request never reaches the hub"
    # The realip gate itself is not a client the cache admits, and 127.0.0.2 (no box) is refused too.
    assert cache.get(url, source=LAN_GATE)[0] == 403
    assert cache.get(url, source=OUTSIDE_CLIENT)[0] == 403


def test_the_rendered_allow_list_is_exactly_loopback_and_the_boxes(cache: Cache) -> None:
    lines = [line.split() for line in cache.conf.splitlines()]
    allowed = sorted(words[1].rstrip(";") for words in lines if words[:1] == ["allow"])
    assert allowed == sorted(["127.0.0.1", "::1", f"{BOX_CLIENT}/32", f"{BOX_LAN}/32"])
    assert "10.0.0.0/8" not in cache.conf and "192.168.0.0/16" not in cache.conf


def test_the_log_names_each_client(cache: Cache) -> None:
    clients = {entry["client"] for entry in cache.log()}
    assert {ALLOWED_CLIENT, OUTSIDE_CLIENT} <= clients


# --------------------------------------------------------------------------- pinned models

# The model lock of the bounded cache below: one pinned commit of gpubox-test/pinned (3 files).
PINNED_LOCK = {
    "schema": 1,
    "models": {
        "gpubox-test/pinned@master": {"commit": COMMIT, "endpoint": "https://hub.example", "content_sha256": "a" * 64,
                                      "files": 3, "total_bytes": 3 * len(BODY)},
    },
}  # fmt: skip
SHARED_BOUND = 64 * 1024  # fleet_cache_model_cache_size of the bounded cache: 64k
FILLER = b"f" * (16 * 1024)


@pytest.fixture(scope="module")
def bounded() -> Iterator[Cache]:
    """A cache whose shared zone holds 64 KiB, with the lock above beside its inventory, and the old default
    (every private network) given on purpose as fleet_cache_allowed_networks."""
    lock_dir = Path(tempfile.mkdtemp(prefix="gpubox-fleet-cache-lock."))
    try:
        (lock_dir / "models.lock.json").write_text(json.dumps(PINNED_LOCK))
        overrides = {
            "fleet_cache_model_cache_size": "64k",
            "__fleet_cache_lock_files": [str(lock_dir / "models.lock.json")],
            "__fleet_cache_clients": box_clients(["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"]),
        }
        with running_cache("gpubox-fleet-cache-bounded.", overrides) as running:
            yield running
    finally:
        shutil.rmtree(lock_dir, ignore_errors=True)


def stored_path(cache: Cache, zone_dir: Path, url: str) -> Path:
    """Where nginx keeps the answer to ``url`` in a zone (levels=1:2: the md5 of the key, its last 3 digits)."""
    path, query = url.split("?", 1)
    args = dict(pair.split("=", 1) for pair in query.split("&"))
    digest = hashlib.md5(f"{path}|{args['Revision']}|{args['FilePath']}".encode()).hexdigest()
    return zone_dir / digest[-1] / digest[-3:-1] / digest


def is_stored(path: Path) -> bool:
    """nginx renames a stored answer into place as the response ends: give it a moment."""
    for _ in range(100):
        if path.is_file():
            return True
        time.sleep(0.02)
    return False


def zone_bytes(zone_dir: Path) -> int:
    return sum(p.stat().st_size for p in zone_dir.rglob("*") if p.is_file())


def test_an_operators_network_admits_a_lan_host(bounded: Cache) -> None:
    """The control of the default's refusal: fleet_cache_allowed_networks given (here the old default, every
    private network) admits LAN_OTHER, which the default cache refuses."""
    bounded.hub.answer("/api/v1/models/gpubox-test/tiny/repo", "status", 200, BODY)
    assert lan_get(bounded, bounded.file("lan.bin"), LAN_OTHER)[0] == 200
    assert lan_get(bounded, bounded.file("lan.bin"), "203.0.113.7")[0] == 403  # a public address never


def test_a_pinned_commit_survives_other_traffic_filling_the_shared_zone(bounded: Cache) -> None:
    """The lock's commit of gpubox-test/pinned is stored in its own zone; 30 files of 16 KiB of another model
    fill the shared zone (64 KiB) many times over. The shared zone evicts its oldest file (the control, read
    before the pinned file and stored the same way), the pinned file stays and is served with no hub request."""
    from ansible_collections.gpubox.gpubox.plugins.module_utils import fleet_cache_access as access

    zone = bounded.root / "pinned" / access.zone_id("gpubox-test/pinned", COMMIT)
    assert f"proxy_cache_path {zone} " in bounded.conf
    bounded.hub.answer("/api/v1/models/gpubox-test/pinned/repo", "status", 200, BODY)
    bounded.hub.answer("/api/v1/models/gpubox-test/unpinned/repo", "status", 200, BODY)
    bounded.hub.answer("/api/v1/models/gpubox-test/filler/repo", "status", 200, FILLER)
    control, kept = bounded.file("w.bin", model="unpinned"), bounded.file("w.bin", model="pinned")
    for url in (control, kept):
        assert bounded.get(url)[1]["X-Gpubox-Fleet-Cache"] == "MISS"
    assert is_stored(stored_path(bounded, bounded.root / "models", control))
    assert is_stored(stored_path(bounded, zone, kept)), "the pinned commit's file is in its own zone"
    assert not stored_path(bounded, bounded.root / "models", kept).exists()
    # Another commit of the pinned model is not the pinned commit: it is stored in the shared zone.
    other = bounded.file("w.bin", model="pinned", revision="f" * 40)
    bounded.get(other)
    assert is_stored(stored_path(bounded, bounded.root / "models", other))
    assert not stored_path(bounded, zone, other).exists()

    for i in range(30):
        assert bounded.get(bounded.file(f"fill{i}.bin", model="filler"))[0] == 200
    deadline = time.monotonic() + 15
    while stored_path(bounded, bounded.root / "models", control).exists():  # nginx's cache manager evicts
        size = zone_bytes(bounded.root / "models")
        assert time.monotonic() < deadline, f"the shared zone was not evicted: {size} bytes"
        time.sleep(0.1)
    assert zone_bytes(bounded.root / "models") < 30 * len(FILLER), "the shared zone is bounded"
    before = len(bounded.hub.seen)
    status, headers, body = bounded.get(kept)
    assert (status, headers["X-Gpubox-Fleet-Cache"], body) == (200, "HIT", BODY), "the pinned file was evicted"
    assert len(bounded.hub.seen) == before
    assert stored_path(bounded, zone, kept).is_file()
    again = bounded.get(control)  # the control: evicted, so fetched from the hub again
    assert again[1]["X-Gpubox-Fleet-Cache"] == "MISS" and len(bounded.hub.seen) == before + 1


# --------------------------------------------------------------------------- TLS


def test_tls_serves_the_same_cache_with_the_same_rules(cache: Cache) -> None:
    """fleet_cache_tls_certificate given: nginx also serves TLS, a box that trusts the certificate gets the
    same cached file, and the allow-list and the control-character refusal apply there as well."""
    cache.hub.answer("/api/v1/models/gpubox-test/tiny/repo", "status", 200, BODY)
    status, _, body = cache.get(cache.file("tls.bin"), tls=True)
    assert status == 200 and body == BODY
    wait_for_cache_files(cache, 1)
    again = cache.get(cache.file("tls.bin"))  # the plain port shares the cache
    assert again[2] == BODY and again[1]["X-Gpubox-Fleet-Cache"] == "HIT"
    assert cache.get("/_fleet_cache/health", source=OUTSIDE_CLIENT, tls=True)[0] == 403
    assert cache.get(cache.file("a%0d%0aX-Injected:%20yes"), tls=True)[0] == 400
    with pytest.raises(ssl.SSLCertVerificationError):  # a box that does not trust it refuses the cache
        conn = http.client.HTTPSConnection("127.0.0.1", cache.tls_port, timeout=5, context=ssl.create_default_context())
        try:
            conn.request("GET", "/_fleet_cache/health")
        finally:
            conn.close()


# --------------------------------------------------------------------------- purge (make cache-purge)


def run_purge_playbook(cache: Cache, model: str | None) -> dict[str, Any]:
    """playbooks/fleet_cache_purge.yml for real on this host, its paths pointed into the test's directory."""
    inventory = {
        "all": {
            "children": {
                "fleet_cache": {
                    "hosts": {"cache": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
                }
            }
        }
    }
    (cache.root / "hosts.json").write_text(json.dumps(inventory))
    extra = {
        "ansible_become": False,
        "__fleet_cache_model_dir": str(cache.root / "models"),
        "__fleet_cache_pinned_dir": str(cache.root / "pinned"),
        "__fleet_cache_purge": str(cache.root / "gpubox-fleet-cache-purge"),
        "fleet_cache_purge_model": model or "",
    }
    (cache.root / "extra.json").write_text(json.dumps(extra))
    env = dict(
        os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="json"
    )
    argv = [
        str(ansible_vars.tool("ansible-playbook")),
        "-i", str(cache.root / "hosts.json"),
        "-e", "@" + str(cache.root / "extra.json"),
        str(ROOT / "playbooks" / "fleet_cache_purge.yml"),
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    report = ansible_vars.json_report(done.stdout)
    results = [task["hosts"]["cache"] for task in report["plays"][0]["tasks"] if "cache" in task["hosts"]]
    return {"rc": done.returncode, "results": results, "stdout": done.stdout}


def test_purge_removes_one_models_stored_files_then_all(cache: Cache) -> None:
    """make cache-purge MODEL=OWNER/NAME (the playbook, run for real): that model's files are fetched again,
    another model's stay HITs. The cache is the module's: files earlier tests stored are counted first."""
    earlier = len([p for p in (cache.root / "models").rglob("*") if p.is_file()])
    for model in ("purge-a", "purge-b"):
        cache.hub.answer(f"/api/v1/models/gpubox-test/{model}/repo", "status", 200, BODY)
        for name in ("x.bin", "y.bin"):
            assert cache.get(cache.file(name, model=model))[0] == 200
    wait_for_cache_files(cache, earlier + 4)
    assert cache.get(cache.file("x.bin", model="purge-a"))[1]["X-Gpubox-Fleet-Cache"] == "HIT"

    done = run_purge_playbook(cache, "gpubox-test/purge-a")
    assert done["rc"] == 0, done["stdout"]
    purged = json.loads(next(r["stdout"] for r in done["results"] if "stdout" in r))
    assert purged == {"model": "gpubox-test/purge-a", "removed": 2, "bytes": purged["bytes"], "dry_run": False}
    assert purged["bytes"] > 2 * len(BODY)
    for name in ("x.bin", "y.bin"):
        assert cache.get(cache.file(name, model="purge-a"))[1]["X-Gpubox-Fleet-Cache"] == "MISS"
        assert cache.get(cache.file(name, model="purge-b"))[1]["X-Gpubox-Fleet-Cache"] == "HIT"

    # The command the playbook installed, for every model (--all), and refusing a name that is not OWNER/NAME.
    wait_for_cache_files(cache, earlier + 4)
    script = [sys.executable, str(cache.root / "gpubox-fleet-cache-purge"), "--cache-dir", str(cache.root / "models")]
    refused = subprocess.run([*script, "gpubox-test/purge-a/../x"], capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "the model must be OWNER/NAME" in refused.stderr
    everything = subprocess.run([*script, "--all"], capture_output=True, text=True, check=True)
    assert json.loads(everything.stdout)["removed"] == earlier + 4
    assert not [p for p in (cache.root / "models").rglob("*") if p.is_file() and "." not in p.name]
    assert cache.get(cache.file("x.bin", model="purge-b"))[1]["X-Gpubox-Fleet-Cache"] == "MISS"
