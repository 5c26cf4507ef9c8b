"""A reload of the gateway hands its clients over: HAProxy's master (root) signals the previous worker (another
user) to soft-stop, which it may only with CAP_KILL. Run with the capability bounding set of roles/llm_gateway's
unit drop-in (templates/hardening.conf.j2), a client that keeps one connection busy sees it closed after a
response and goes on with the new worker, and the previous worker is gone; the control, the same set without
CAP_KILL, leaves that worker serving for good (found in molecule/fleet under streaming load), so the test can
fail. Real HAProxy in master-worker mode (as Debian's unit starts it), needs root and setpriv (util-linux)."""

from __future__ import annotations

import http.client
import http.server
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness import live_proxies

ROOT = Path(__file__).resolve().parents[2]
DROP_IN = ROOT / "roles" / "llm_gateway" / "templates" / "hardening.conf.j2"


def bounding_set() -> list[str]:
    line = next(x for x in DROP_IN.read_text().splitlines() if x.startswith("CapabilityBoundingSet="))
    return line.split("=", 1)[1].split()


def old_workers(path: Path) -> int:
    return live_proxies.haproxy_runtime.old_workers(live_proxies.haproxy_cli(path, "show proc"))


def reload_with(tmp: Path, caps: list[str]) -> tuple[int, int, int]:
    """(old workers left 8 s after a reload, requests, connections closed by HAProxy) for a busy client."""
    backend = live_proxies.slow_backend(0.2)
    port = live_proxies.free_port()
    (tmp / "h.cfg").write_text(
        "global\n    user nobody\n    group nogroup\n    hard-stop-after 5s\n"
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n    default_backend b\n"
        f"backend b\n    server s1 127.0.0.1:{backend.server_address[1]}\n"
    )
    master = tmp / "master.sock"
    keep = ",".join("+" + c.removeprefix("CAP_").lower() for c in caps)
    argv = ["setpriv", "--bounding-set=-all," + keep, "--", live_proxies.haproxy_binary(), "-Ws", "-S", str(master),
            "-f", str(tmp / "h.cfg")]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        live_proxies.wait_for(port, proc, "haproxy")
        requests = closes = 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        started = time.monotonic()
        reloaded = False
        while time.monotonic() - started < 10:
            if not reloaded and time.monotonic() - started > 1:
                proc.send_signal(signal.SIGUSR2)  # what Debian's unit does on `systemctl reload`
                reloaded = True
            conn.request("GET", "/")
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
            requests += 1
            if (resp.getheader("connection") or "").lower() == "close":
                closes += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.close()
        return old_workers(master), requests, closes
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        backend.shutdown()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_reload_hands_a_busy_client_to_the_new_worker_with_the_units_capabilities(tmp_path: Path) -> None:
    caps = bounding_set()
    assert "CAP_KILL" in caps and all(re.fullmatch(r"CAP_[A-Z_]+", c) for c in caps)
    try:
        live_proxies.haproxy_binary()
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))
    (tmp_path / "unit").mkdir()
    (tmp_path / "control").mkdir()
    left, requests, closes = reload_with(tmp_path / "unit", caps)
    assert left == 0 and closes >= 1 and requests > 10, (left, requests, closes)
    left, requests, closes = reload_with(tmp_path / "control", [c for c in caps if c != "CAP_KILL"])
    assert left == 1 and closes == 0, (left, requests, closes)
