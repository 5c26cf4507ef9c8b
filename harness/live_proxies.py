"""The front door (nginx) and the gateway (HAProxy) run on loopback from the roles' own rendered files.

Used by tests/integration/test_front_door_live.py and by bench/proxy_load.py (the load through both). The files
are the roles' templates rendered by Ansible's templar over the roles' defaults (ansible_vars.py), with
the knobs a caller gives; only what a test on loopback cannot have is changed (no chroot or user switch for
HAProxy, nginx's pid, logs and temp paths in the caller's directory). Missing binaries raise Missing.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ansible_collections.gpubox.gpubox.plugins.module_utils import gateway_pools
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[1]
GATEWAY = "127.0.0.1"
GATEWAY_KEY = "live-gateway-key-0123456789"
# vLLM's own key, for a test that tells it from the tenants' keys (start_front_door(engine_key=ENGINE_KEY)).
ENGINE_KEY = "live-engine-key-only-the-front-door-holds"
ENGINE_KEY_TOOL = ROOT / "roles" / "front_door" / "files" / "gpubox-engine-key"
STANDIN = ROOT / "harness" / "engine_standin" / "standin.py"
# The one client of HAProxy's sockets: the script roles/llm_gateway installs on the gateway, imported here.
RUNTIME_CLIENT = ROOT / "roles" / "llm_gateway" / "files" / "haproxy_runtime.py"
_spec = importlib.util.spec_from_file_location("gpubox_haproxy_runtime", RUNTIME_CLIENT)
haproxy_runtime = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(haproxy_runtime)


class Missing(Exception):
    """nginx, haproxy or openssl is not installed (Debian's packages)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def render(host: str, role: str, template: str, roles: tuple[str, ...], groups: tuple[str, ...], extra: dict) -> str:
    from ansible.template import trust_as_template

    templar, _ = ansible_vars.templar_for(
        host, roles=roles, groups=groups, extra_vars={"ansible_managed": "managed by a test", **extra}
    )
    return templar.template(trust_as_template((ROOT / "roles" / role / "templates" / template).read_text()))


def self_signed(tmp: Path, name: str = "localhost") -> tuple[Path, Path]:
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
         "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name},IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class PortTaken(AssertionError):
    """The server could not bind the port free_port() found: another process took it in between (any
    connection's ephemeral port may be that number). The starters below try again on a new port."""


# How many ports a starter tries before it gives up (each lost only to a race with another process).
PORT_TRIES = 3


def wait_for(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            kind = PortTaken if "address already in use" in err.lower() else AssertionError
            raise kind(f"{what} exited {proc.returncode}: {err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{what} does not listen on {port}")


def start_on_a_free_port(launch: Callable[[int], subprocess.Popen], what: str) -> tuple[subprocess.Popen, int]:
    """``launch`` a server on a port free_port() finds and wait until it listens; on a new port while another
    process took the last one (PortTaken), PORT_TRIES times at most. The process is stopped on any failure."""
    for attempt in range(PORT_TRIES):
        port = free_port()
        proc = launch(port)
        try:
            wait_for(port, proc, what)
        except PortTaken:
            stop(proc)
            if attempt == PORT_TRIES - 1:
                raise
            continue
        except BaseException:
            stop(proc)
            raise
        return proc, port
    raise AssertionError("unreachable")


class _Slow(http.server.BaseHTTPRequestHandler):
    """TEST ONLY: answers every GET and POST "ok" (HTTP/1.1, kept alive) after the server's ``delay`` seconds, the
    request's body read first."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(self.server.delay)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = _answer  # http.server calls them by these names

    def log_message(self, *args) -> None:
        pass


class EngineHandler(http.server.BaseHTTPRequestHandler):
    """TEST ONLY: the base of the tests' engines behind a front door (HTTP/1.1, kept alive): a GET, the gateway's
    health check (/health through the front door), gets an empty 200; ``answer`` sends a JSON body; nothing is
    logged. A test's engine adds its do_POST."""

    protocol_version = "HTTP/1.1"

    def answer(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        if body:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # http.server calls it by this name
        self.answer(200)

    def log_message(self, *args) -> None:
        pass


def start_engine(handler: type[EngineHandler], **attributes) -> http.server.ThreadingHTTPServer:
    """TEST ONLY: ``handler`` served on a loopback port of its own (``.server_address[1]``) from a thread until
    ``.shutdown()``, the server given ``attributes`` (what the handler reads and records: ``self.server.<name>``)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in attributes.items():
        setattr(server, name, value)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextlib.contextmanager
def front_doors(engines: dict[str, http.server.ThreadingHTTPServer], knobs: dict[str, dict] | None = None
                ) -> Iterator[list[tuple[str, int, Path]]]:  # fmt: skip
    """TEST ONLY: boxes for start_gateway(boxes=...): before each engine of ``engines`` ({box: engine}), nginx with
    roles/front_door's file (``knobs[box]`` over the role's defaults) whose certificate names the box and which sends
    ENGINE_KEY on: [(box, front door port, its certificate)]. On exit the front doors stop and the engines shut
    down."""
    with contextlib.ExitStack() as stack:
        for engine in engines.values():
            stack.callback(engine.shutdown)
        boxes = []
        for box, engine in engines.items():
            # nginx's workers (nobody when the test runs as root) write large bodies under it: a directory of /tmp,
            # not of pytest's (root's 0700).
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"gpubox-{box}-")))
            proc, port = start_front_door(
                tmp, engine.server_address[1], (knobs or {}).get(box, {}), name=box, engine_key=ENGINE_KEY
            )
            stack.callback(stop, proc)
            boxes.append((box, port, tmp / "tls.crt"))
        yield boxes


def slow_backend(delay: float) -> http.server.ThreadingHTTPServer:
    """TEST ONLY: a backend on a loopback port of its own (``.server_address[1]``) that answers each request "ok"
    after ``delay`` seconds, so that a burst is in flight at once; served from a thread until ``.shutdown()``.
    Connections a proxy ends mid-request (a reload's old worker) are not reported."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    server.delay = delay  # type: ignore[attr-defined]
    server.handle_error = lambda *args: None  # type: ignore[method-assign]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def unverified_tls() -> ssl.SSLContext:
    """A client context that does not check the rendered files' self-signed certificates (and loads no CA)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def start_standin(
    ttft_ms: float, itl_ms: float, box_name: str = "", health_delay_ms: float = 0, key: str = GATEWAY_KEY
) -> tuple[subprocess.Popen, int]:
    """The engine stand-in (TEST ONLY, harness/engine_standin) on a free loopback port, keyed ``key`` (the
    key a front door started with the same engine key sends it; GATEWAY_KEY, also the default tenant's key, so
    that a load may go to it directly or through the front door);
    ``box_name``: its x-gpubox-standin-host header (the hostname when empty); ``health_delay_ms``: how late it
    answers /health."""

    def launch(port: int) -> subprocess.Popen:
        argv = [sys.executable, str(STANDIN), "--port", str(port), "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
        argv += ["--box-name", box_name] if box_name else []
        argv += ["--health-delay-ms", str(health_delay_ms)] if health_delay_ms else []
        env = dict(os.environ, VLLM_API_KEY=key)
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    return start_on_a_free_port(launch, "the engine stand-in")


def nginx_binary() -> str:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if nginx is None or shutil.which("openssl") is None:
        raise Missing("nginx (Debian's package) and openssl are needed to run the front door on loopback")
    return nginx


def render_front_door(tmp: Path, engine: int, port: int, knobs: dict, engine_key: str = GATEWAY_KEY) -> dict[str, str]:
    """The front door's files as the role renders them into ``tmp`` (``knobs`` over the role's defaults; the default
    tenant's key is GATEWAY_KEY): {"conf": the public file, "tenants": the root-only key map}. The engine's key
    include is written by the role's own tool (files/gpubox-engine-key) from tmp/engine.key (``engine_key`` unless
    a key file is there already; GATEWAY_KEY by default, the stand-in's key)."""
    cert, key = tmp / "tls.crt", tmp / "tls.key"
    values = {
        "gpubox_front_door_port": port,
        "gpubox_port": engine,
        "vault_gpubox_api_key": GATEWAY_KEY,
        "front_door_ipv6": False,
        "front_door_gateway_networks": [f"{GATEWAY}/32"],
        "__front_door_cert": str(cert),
        "__front_door_key": str(key),
        "__front_door_access_log": str(tmp / "access.log"),
        "__front_door_tenants_conf": str(tmp / "tenants.conf"),
        "__front_door_engine_conf": str(tmp / "engine-key.conf"),
        **knobs,
    }
    out = {
        name: render("unit-front-door-live", "front_door", template, ("gpubox", "front_door"), ("gpu_2x3090",), values)
        for name, template in (("conf", "gpubox-front-door.conf.j2"), ("tenants", "gpubox-tenants.conf.j2"))
    }
    if not (tmp / "engine.key").exists():
        (tmp / "engine.key").write_text(engine_key + "\n")
    tool = [sys.executable, str(ENGINE_KEY_TOOL), str(tmp / "engine.key"), str(tmp / "engine-key.conf")]
    subprocess.run(tool, check=True, capture_output=True)
    return out


def write_front_door(
    tmp: Path,
    engine: int,
    port: int,
    knobs: dict,
    edit: Callable[[str], str] | None = None,
    engine_key: str = GATEWAY_KEY,
) -> None:
    """(Re)write the rendered front door files in ``tmp`` (a reload then reads them)."""
    files = render_front_door(tmp, engine, port, knobs, engine_key)
    (tmp / "tenants.conf").write_text(files["tenants"])
    (tmp / "front-door.conf").write_text(edit(files["conf"]) if edit else files["conf"])


def start_front_door(
    tmp: Path,
    engine: int,
    knobs: dict,
    worker_connections: int | None = None,
    edit: Callable[[str], str] | None = None,
    name: str = "localhost",
    engine_key: str = GATEWAY_KEY,
) -> tuple[subprocess.Popen, int]:
    """nginx with the rendered front door files (``knobs`` over the role's defaults), listening on loopback.
    ``worker_connections``: nginx's events setting (its default, 512, holds 255 proxied streams); ``edit``: a
    change to the rendered file, for a test that shows what the file's own setting prevents; ``name``: the
    box's name in its certificate (tmp/tls.crt), which the gateway checks. The port is in tmp/port; a reload:
    write_front_door() again, then reload(proc)."""
    nginx = nginx_binary()
    tmp.chmod(0o755)  # the workers (nobody when the test runs as root) read nothing here but their temp paths
    self_signed(tmp, name)
    temp_paths = "".join(
        f"    {kind}_temp_path {tmp}/{kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    events = f" worker_connections {worker_connections}; " if worker_connections else ""
    (tmp / "nginx.conf").write_text(
        f"daemon off;\nworker_processes 1;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log notice;\n"
        f"events {{{events}}}\nhttp {{\n{temp_paths}    include {tmp}/front-door.conf;\n}}\n"
    )

    def launch(port: int) -> subprocess.Popen:
        (tmp / "port").write_text(str(port))
        write_front_door(tmp, engine, port, knobs, edit, engine_key)
        argv = [nginx, "-p", str(tmp), "-c", str(tmp / "nginx.conf")]
        return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)

    return start_on_a_free_port(launch, "nginx")


def reload(proc: subprocess.Popen, tmp: Path) -> None:
    """nginx's reload (SIGHUP to the master, as `systemctl reload nginx` sends), after `nginx -t` passes."""
    check = subprocess.run(
        [nginx_binary(), "-t", "-q", "-p", str(tmp), "-c", str(tmp / "nginx.conf")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr
    proc.send_signal(signal.SIGHUP)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def haproxy_cli(path: Path, command: str) -> str:
    """One command on an HAProxy unix socket (the runtime API or the master CLI) and its whole answer."""
    return haproxy_runtime.ask(str(path), command)


def haproxy_binary() -> str:
    haproxy = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
    if haproxy is None:
        raise Missing("haproxy (Debian's package) is needed to run the gateway on loopback")
    return haproxy


def write_gateway_errors(out: Path) -> Path:
    """HAProxy's error answers as roles/llm_gateway writes them (templates/gpubox-error.http.j2, one file per status
    of vars/main.yml's __llm_gateway_errors) into ``out``; returns ``out``, the gateway's __llm_gateway_errors_dir."""
    from ansible.template import trust_as_template

    templar, variables = ansible_vars.templar_for("unit-gateway-live", roles=("llm_gateway",), groups=("fleet_cache",))
    text = (ROOT / "roles" / "llm_gateway" / "templates" / "gpubox-error.http.j2").read_text()
    out.mkdir(parents=True, exist_ok=True)
    for error in templar.template(variables["__llm_gateway_errors"]):
        one = templar.copy_with_new_env(available_variables={**variables, "item": error})
        (out / f"{error['status']}.http").write_text(one.template(trust_as_template(text)))
    return out


def unit_environment(dropin: str) -> dict[str, str]:
    """The variables a systemd unit file's ``Environment=`` lines set (words split as systemd does for the plain,
    quoted and unquoted, assignments a role writes; a later assignment wins; an empty ``Environment=`` resets)."""
    env: dict[str, str] = {}
    for line in dropin.splitlines():
        key, _, value = line.strip().partition("=")
        if key.strip() != "Environment":
            continue
        if not value.strip():
            env.clear()
            continue
        for word in shlex.split(value):
            name, sep, setting = word.partition("=")
            if sep:
                env[name] = setting
    return env


def gateway_environment(knobs: dict | None = None) -> dict[str, str]:
    """What roles/llm_gateway's drop-in (templates/malloc.conf.j2) puts in HAProxy's environment, rendered with the
    role's defaults (``knobs`` over them): {"GLIBC_TUNABLES": ...}."""
    text = render("unit-gateway-live", "llm_gateway", "malloc.conf.j2", ("llm_gateway",), ("fleet_cache",), knobs or {})
    return unit_environment(text)


def start_gateway(
    tmp: Path,
    box_port: int,
    box_cert: Path,
    knobs: dict,
    log: Path | None = None,
    boxes: list[tuple[str, int, Path]] | None = None,
    keys: list[str] | list[tuple[str, str]] | None = None,
    edit: Callable[[str], str] | None = None,
    pools: dict[str, str] | None = None,
    tenant_models: dict[str, list[str] | None] | None = None,
    body_max_bytes: int = 1 << 20,
    environment: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, int]:
    """HAProxy with the rendered gateway file over one box ("localhost", its front door on ``box_port``), or over
    ``boxes`` (name, front door port, certificate) when given; ``keys``: the keys it accepts, each a key (tenant
    "default") or (key, tenant) ([GATEWAY_KEY] when not given); ``pools``: {box: the model it serves} ("tiny" for a
    box not named); ``tenant_models``: {tenant: the models it may use, None for all} (all when not named); the
    pools, grants and key map are what roles/llm_gateway computes from the boxes' facts (module_utils/
    gateway_pools.py); ``edit``: a change to the rendered file, for a test that shows what the file's own setting
    prevents.
    ``log``: a file for HAProxy's request log and messages (under load a pipe nobody reads would fill and stall
    it); without one they go to this process's stdout and a pipe (read when HAProxy fails to start).
    ``environment``: set in HAProxy's environment over this process's, which loses its own GLIBC_TUNABLES either way
    (``gateway_environment()`` is the role's unit's)."""
    haproxy = haproxy_binary()
    tmp.mkdir(parents=True, exist_ok=True)
    cert, key = self_signed(tmp)
    (tmp / "tls.pem").write_bytes(cert.read_bytes())
    (tmp / "tls.pem.key").write_bytes(key.read_bytes())
    pairs = [(k, "default") if isinstance(k, str) else tuple(k) for k in keys or [GATEWAY_KEY]]
    key_text = "".join(f"{key} {tenant}\n" for key, tenant in pairs)
    boxes = boxes or [("localhost", box_port, box_cert)]
    for name, _, crt in boxes:
        (tmp / f"{name}.crt").write_bytes(crt.read_bytes())
    errors = write_gateway_errors(tmp / "errors")
    tenants = [
        {"name": t, "models": (tenant_models or {}).get(t), "body_max_bytes": body_max_bytes}
        for t in sorted({tenant for _, tenant in pairs})
    ]
    facts = {
        name: {"served_model_name": (pools or {}).get(name, "tiny"), "model_id": "gpubox-test/tiny",
               "model_commit": "0" * 40, "stack": "pinned", "port": p, "tenants": tenants}
        for name, p, _ in boxes
    }  # fmt: skip
    plan = gateway_pools.pools(facts, {name: key_text for name in facts}, {name: "127.0.0.1" for name in facts})
    assert not plan["problems"], plan["problems"]
    (tmp / "keys.lst").write_text(plan["key_map"])
    (tmp / "gpubox_route.lua").write_bytes((ROOT / "roles" / "llm_gateway" / "files" / "gpubox_route.lua").read_bytes())

    def launch(port: int) -> subprocess.Popen:
        conf = render(
            "unit-gateway-live", "llm_gateway", "haproxy.cfg.j2", ("llm_gateway",), ("fleet_cache",),
            {
                "llm_gateway_port": port,
                "llm_gateway_bind_address": "127.0.0.1",
                "llm_gateway_check_interval_ms": 200,
                "__llm_gateway_plan": plan,
                "__llm_gateway_max_body_bytes": body_max_bytes,
                "__llm_gateway_lua": str(tmp / "gpubox_route.lua"),
                "__llm_gateway_cert": str(tmp / "tls.pem"),
                "__llm_gateway_keys_file": str(tmp / "keys.lst"),
                "__llm_gateway_backend_ca_dir": str(tmp),
                "__llm_gateway_socket": str(tmp / "admin.sock"),
                "__llm_gateway_state_file": str(tmp / "server-state"),
                "__llm_gateway_errors_dir": str(errors),
                **knobs,
            },
        )  # fmt: skip
        # Not what is tested, and a test may not run as root: no chroot, no switch of user.
        lines = conf.splitlines()
        conf = "\n".join(line for line in lines if line.split()[:1] not in (["chroot"], ["user"], ["group"]))
        conf = edit(conf) if edit else conf
        (tmp / "haproxy.cfg").write_text(conf + "\n")
        check = subprocess.run([haproxy, "-c", "-f", str(tmp / "haproxy.cfg")], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        argv = [haproxy, "-db", "-f", str(tmp / "haproxy.cfg")]
        env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | (environment or {})
        if log is None:
            return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
        with log.open("w") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)

    return start_on_a_free_port(launch, "haproxy")
