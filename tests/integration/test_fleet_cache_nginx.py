"""The LAN cache's nginx file, rendered as Ansible renders it and run by a real nginx on loopback.

No mocks: the rendered conf.d file (roles/fleet_cache/templates/gpubox-fleet-cache.conf.j2) is
included in a minimal main configuration (as files/nginx-check does for `nginx -t`), nginx serves it
on 127.0.0.1, and a tiny Python hub (http.server on 127.0.0.1) answers what each test sets up. The
one change to the rendered text: `listen PORT;` becomes `listen 127.0.0.1:PORT;` (the test binds
loopback only). A client outside fleet_cache_allowed_networks is a socket bound to 127.0.0.2 before
it connects; one inside binds 127.0.0.3 (listed in the allow-list here).

Skipped when no nginx binary is installed (apt-get install nginx: Debian's archive).
"""

from __future__ import annotations

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
ALLOWED_CLIENT = "127.0.0.3"
OUTSIDE_CLIENT = "127.0.0.2"

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
    """What the hub answers, per path; every request it saw (method, raw path) in seen."""

    port: int = 0
    answers: dict[str, tuple] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)

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


@pytest.fixture(scope="module")
def cache() -> Iterator[Cache]:
    # Not under pytest's tmp_path (0700 when the test runs as root): nginx's workers run as nobody then.
    root = Path(tempfile.mkdtemp(prefix="gpubox-fleet-cache-nginx."))
    os.chmod(root, 0o755)
    for sub in ("models", "temp"):
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
            "fleet_cache_allowed_networks": [f"{ALLOWED_CLIENT}/32", "10.0.0.0/8"],
            "fleet_cache_resolver": "127.0.0.1",
            "__fleet_cache_model_dir": str(root / "models"),
            "__fleet_cache_nginx_log": str(root / "access.log"),
            "fleet_cache_tls_port": tls_port,
            "fleet_cache_tls_certificate": (root / "cert.pem").read_text(),
            "fleet_cache_tls_private_key": (root / "key.pem").read_text(),
            "__fleet_cache_tls_cert": str(root / "cert.pem"),
            "__fleet_cache_tls_key": str(root / "key.pem"),
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
        yield Cache(port=port, hub=hub, root=root, tls_port=tls_port)
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


def wait_for_cache_files(cache: Cache, at_least: int) -> None:
    """nginx renames a stored answer into place as the response ends: give it a moment."""
    for _ in range(50):
        if len([p for p in (cache.root / "models").rglob("*") if p.is_file()]) >= at_least:
            return
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


def test_the_log_names_each_client(cache: Cache) -> None:
    clients = {entry["client"] for entry in cache.log()}
    assert {ALLOWED_CLIENT, OUTSIDE_CLIENT} <= clients


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
        "__fleet_cache_purge": str(cache.root / "gpubox-fleet-cache-purge"),
        "fleet_cache_purge_model": model or "",
    }
    (cache.root / "extra.json").write_text(json.dumps(extra))
    env = dict(
        os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="json"
    )
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i", str(cache.root / "hosts.json"),
        "-e", "@" + str(cache.root / "extra.json"),
        str(ROOT / "playbooks" / "fleet_cache_purge.yml"),
    ]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    report, _ = json.JSONDecoder().raw_decode(done.stdout[done.stdout.index("{") :])
    results = [task["hosts"]["cache"] for task in report["plays"][0]["tasks"] if "cache" in task["hosts"]]
    return {"rc": done.returncode, "results": results, "stdout": done.stdout}


def test_purge_removes_one_models_stored_files_then_all(cache: Cache) -> None:
    """make cache-purge MODEL=OWNER/NAME (the playbook, run for real): that model's files are fetched again,
    another model's stay HITs."""
    for model in ("purge-a", "purge-b"):
        cache.hub.answer(f"/api/v1/models/gpubox-test/{model}/repo", "status", 200, BODY)
        for name in ("x.bin", "y.bin"):
            assert cache.get(cache.file(name, model=model))[0] == 200
    wait_for_cache_files(cache, 6)
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
    wait_for_cache_files(cache, 6)
    script = [sys.executable, str(cache.root / "gpubox-fleet-cache-purge"), "--cache-dir", str(cache.root / "models")]
    refused = subprocess.run([*script, "gpubox-test/purge-a/../x"], capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "the model must be OWNER/NAME" in refused.stderr
    everything = subprocess.run([*script, "--all"], capture_output=True, text=True, check=True)
    assert json.loads(everything.stdout)["removed"] >= 6
    assert not [p for p in (cache.root / "models").rglob("*") if p.is_file() and "." not in p.name]
    assert cache.get(cache.file("x.bin", model="purge-b"))[1]["X-Gpubox-Fleet-Cache"] == "MISS"
