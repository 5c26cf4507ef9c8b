"""roles/llm_gateway's drop-in of haproxy.service (templates/malloc.conf.j2) puts glibc's malloc thresholds in
HAProxy's environment, so that the buffers HAProxy frees stay mapped instead of being faulted in again by the next
burst of requests (the role's defaults say why).

Real HAProxy from Debian on loopback, started as Debian's unit starts it (master-worker, `-Ws`, a master CLI), with
the environment the rendered drop-in sets, over a backend that keeps each request 50 ms. Proves: systemd reads the
drop-in without a complaint (control: a broken line is named); the master and its worker have GLIBC_TUNABLES as
rendered, and a reload keeps it (the master re-executes itself with the environment it has, which is why a change
of the drop-in restarts HAProxy instead); with the role's buffer size and retries, bursts of concurrent requests
cost the worker far fewer page faults than the same HAProxy without it (the control, as the unit was before)."""

from __future__ import annotations

import http.client
import http.server
import itertools
import os
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness import ansible_vars, live_proxies

ROOT = Path(__file__).resolve().parents[2]
PACKAGED_UNIT = Path("/lib/systemd/system/haproxy.service")
BURSTS, CONCURRENT = 5, 16


def dropin() -> str:
    return live_proxies.render("unit-gateway-live", "llm_gateway", "malloc.conf.j2", ("llm_gateway",), (), {})


def bufsize() -> int:
    """tune.bufsize as the role configures it by default (one name: __llm_gateway_bufsize)."""
    from ansible.template import trust_as_template

    templar, _ = ansible_vars.templar_for("unit-gateway-live", roles=("llm_gateway",), groups=(), extra_vars={})
    return int(templar.template(trust_as_template("{{ __llm_gateway_bufsize }}")))


def retry_on() -> str:
    """The role's retry-on line, as its haproxy.cfg holds it (the retries that copy the request buffer)."""
    text = (ROOT / "roles/llm_gateway/templates/haproxy.cfg.j2").read_text()
    return next(line.strip() for line in text.splitlines() if line.strip().startswith("retry-on "))


def tunables(pid: int) -> str | None:
    """GLIBC_TUNABLES as the process was given it (/proc/<pid>/environ). glibc 2.36 ends each value it reads with a
    NUL in the string itself (elf/dl-tunables.c, parse_tunables) and hands a whole copy to what the process runs
    next, so the tunables after the first show there as strings of their own: joined again here."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for i, item in enumerate(raw):
        if item.startswith(b"GLIBC_TUNABLES="):
            rest = itertools.takewhile(lambda x: x.startswith(b"glibc.") and b"=" in x, raw[i + 1 :])
            return b":".join([item.removeprefix(b"GLIBC_TUNABLES="), *rest]).decode()
    return None


def minflt(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def workers(master_sock: Path) -> list[int]:
    """The current workers' process ids (the master CLI's `show proc`, read by the role's runtime client); the master
    answers there once its workers are up and not while it re-executes itself: asked again for up to 10 s."""
    deadline = time.monotonic() + 10
    while True:
        try:
            text = live_proxies.haproxy_cli(master_sock, "show proc")
            break
        except (ConnectionError, FileNotFoundError):  # not up yet, or re-executing itself on a reload
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    return live_proxies.haproxy_runtime.workers(text)


def start(tmp: Path, backend: int, env: dict[str, str]) -> tuple[subprocess.Popen, int, Path]:
    """HAProxy as Debian's unit starts it (ExecStart: -Ws -f $CONFIG -p $PIDFILE $EXTRAOPTS, with -S), its
    environment this process's without GLIBC_TUNABLES plus ``env``: (the master, its port, its master CLI)."""
    tmp.mkdir()
    port, sock = live_proxies.free_port(), tmp / "master.sock"
    (tmp / "h.cfg").write_text(
        f"global\n    tune.bufsize {bufsize()}\n"
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n"
        f"    option http-buffer-request\n    {retry_on()}\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n    default_backend b\n"
        f"backend b\n    server s1 127.0.0.1:{backend}\n"
    )
    argv = [live_proxies.haproxy_binary(), "-Ws", "-f", str(tmp / "h.cfg"), "-p", str(tmp / "pid"), "-S", str(sock)]
    full = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | env
    proc = subprocess.Popen(
        argv, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    live_proxies.wait_for(port, proc, "haproxy")
    return proc, port, sock


def burst_faults(port: int, worker: int) -> int:
    """The worker's minor page faults over BURSTS bursts of CONCURRENT requests at once (after one to warm up)."""

    def one(_: int) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("POST", "/v1/chat/completions", body=b'{"model": "tiny"}' * 60)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()

    with ThreadPoolExecutor(CONCURRENT) as pool:
        assert set(pool.map(one, range(CONCURRENT))) == {200}
        before = minflt(worker)
        for _ in range(BURSTS):
            assert set(pool.map(one, range(CONCURRENT))) == {200}
        return minflt(worker) - before


@pytest.fixture
def backend():
    server = live_proxies.slow_backend(0.05)  # every request of a burst in flight at once
    yield server.server_address[1]
    server.shutdown()


def test_systemd_reads_the_dropin_beside_the_packaged_unit_without_a_complaint(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None or not PACKAGED_UNIT.is_file():
        pytest.fail("needs systemd-analyze and Debian's haproxy package (apt-get install systemd haproxy)")

    def verify(text: str) -> str:
        (tmp_path / "haproxy.service.d").mkdir(exist_ok=True)
        (tmp_path / "haproxy.service.d" / "gpubox-malloc.conf").write_text(text)
        (tmp_path / "haproxy.service").write_bytes(PACKAGED_UNIT.read_bytes())
        env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{tmp_path}:")  # drop-ins from <path>/haproxy.service.d
        done = subprocess.run(
            ["systemd-analyze", "verify", str(tmp_path / "haproxy.service")], env=env, capture_output=True, text=True
        )
        return done.stdout + done.stderr

    text = dropin()
    assert "gpubox-malloc.conf" not in verify(text)
    # control: systemd names the drop-in when a line of it is one it cannot read
    broken = text.replace("Environment=GLIBC_TUNABLES=", 'Environment="GLIBC_TUNABLES=')
    assert "gpubox-malloc.conf" in verify(broken)


def test_the_role_environment_reaches_haproxy_and_keeps_its_freed_buffers_mapped(tmp_path: Path, backend) -> None:
    env = live_proxies.unit_environment(dropin())
    assert env == live_proxies.gateway_environment()
    assert env["GLIBC_TUNABLES"].startswith("glibc.malloc.mmap_threshold=")
    faults = {}
    for name, given in (("role", env), ("control", {})):
        proc, port, sock = start(tmp_path / name, backend, given)
        try:
            (worker,) = workers(sock)
            assert tunables(proc.pid) == tunables(worker) == given.get("GLIBC_TUNABLES")
            faults[name] = burst_faults(port, worker)
            if name == "role":  # a reload keeps the environment the master started with
                proc.send_signal(signal.SIGUSR2)  # what Debian's unit does on `systemctl reload`
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and workers(sock) == [worker]:
                    time.sleep(0.1)
                (renewed,) = workers(sock)
                assert renewed != worker and tunables(renewed) == tunables(proc.pid) == env["GLIBC_TUNABLES"]
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
    # each request of a burst copies a buffer of about 1.1 MiB (272 pages) before it is sent: without the
    # thresholds glibc gives those pages back after each burst (measured: about 470 faults a request, 25 with)
    requests = BURSTS * CONCURRENT
    assert faults["control"] > 100 * requests and faults["role"] * 4 < faults["control"], faults
