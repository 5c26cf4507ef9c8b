"""The tenant counts over the real nginx's access log: the front door's rendered files run by nginx on loopback
(harness/live_proxies.py) in front of the engine stand-in, clients of two tenants, a wrong key, no key, a tenant
past its limit (429); then the real collector (roles/metrics/files/gpubox-tenant-metrics) over the log nginx wrote,
and again after a rotation done as Debian's logrotate does it for nginx (rename to .1, a line still written to .1,
USR1: nginx reopens a new file, a line in the new file). A missing nginx fails it (Debian's package)."""

from __future__ import annotations

import http.client
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils.node_textfile import parse_samples
from harness import live_proxies

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / "roles" / "metrics" / "files" / "gpubox-tenant-metrics"
A_KEY = "team-a-key-0123456789abcdef"
B_KEY = "team-b-key-0123456789abcdef"
TENANTS = [
    {"name": "ops", "keys": [live_proxies.GATEWAY_KEY]},
    {"name": "team-a", "keys": [A_KEY], "requests_per_s": 1000, "burst": 1000},
    {"name": "team-b", "keys": [B_KEY], "requests_per_s": 1, "burst": 0},  # a second request at once: 429
]


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    try:
        live_proxies.nginx_binary()
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))
    tmp = tmp_path_factory.mktemp("tenant-door")
    # The log in a directory nginx's workers (nobody) can reach, as /var/log/nginx: on USR1 each worker reopens it
    # itself (pytest's own directory is root's 0700).
    logs = Path(tempfile.mkdtemp(prefix="gpubox-tenant-log."))
    logs.chmod(0o755)
    knobs = {"gpubox_tenants": TENANTS, "__front_door_access_log": str(logs / "access.log")}
    engine, engine_port = live_proxies.start_standin(0, 0)
    try:
        proc, port = live_proxies.start_front_door(tmp, engine_port, knobs)
        try:
            yield {"proc": proc, "port": port, "dir": tmp, "log": logs / "access.log"}
        finally:
            live_proxies.stop(proc)
    finally:
        live_proxies.stop(engine)
        shutil.rmtree(logs, ignore_errors=True)


def call(port: int, key: str | None, path: str = "/v1/models") -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=live_proxies.unverified_tls())
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def wait_lines(path: Path, n: int) -> None:
    """nginx writes a request's line after it answered: wait until ``path`` holds ``n`` lines."""
    deadline = time.monotonic() + 10
    while lines(path) < n:
        assert time.monotonic() < deadline, f"{path} has {lines(path)} lines, not {n}"
        time.sleep(0.05)


def collect(tmp: Path, log: Path) -> dict[tuple[str, tuple], str]:
    state = tmp / "collector-state"
    state.mkdir(exist_ok=True)
    argv = [sys.executable, str(COLLECTOR), "--lib", str(ROOT / "plugins" / "module_utils"), "--log", str(log)]
    out = subprocess.run(
        [*argv, "--out", str(tmp / "gpubox_tenants.prom"), "--state-dir", str(state)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and out.stderr == "", out.stderr
    text = (tmp / "gpubox_tenants.prom").read_text()
    return {(name, tuple(sorted(labels.items()))): value for name, labels, value in parse_samples(text)}


def counters(samples: dict[tuple[str, tuple], str]) -> dict[tuple[str, tuple], str]:
    """The samples but the run's time."""
    return {
        key: value for key, value in samples.items() if key[0] != "gpubox_front_door_log_last_run_timestamp_seconds"
    }


def requests(tenant: str, code: str) -> tuple[str, tuple]:
    return ("gpubox_front_door_requests_total", (("code", code), ("tenant", tenant)))


def test_the_counts_of_each_tenant_the_refused_keys_and_a_limit_from_the_real_log(door: dict) -> None:
    port, log, tmp = door["port"], door["log"], door["dir"]
    assert [call(port, A_KEY) for _ in range(3)] == [200, 200, 200]
    assert [call(port, B_KEY) for _ in range(2)] == [200, 429]  # team-b's 1 r/s with no burst
    assert [call(port, "no-such-tenant-key-0123456789"), call(port, None)] == [401, 401]
    assert call(port, None, "/elsewhere") == 404  # no key and not the API: counted, not a refused key
    wait_lines(log, 8)
    got = collect(tmp, log)
    assert got[requests("team-a", "2xx")] == "3"
    assert (got[requests("team-b", "2xx")], got[requests("team-b", "4xx")]) == ("1", "1")
    assert got[requests("(none)", "4xx")] == "3"
    assert got[("gpubox_front_door_refused_keys_total", ())] == "2"
    assert got[("gpubox_front_door_log_lines_unparsed_total", ())] == "0"
    assert requests("ops", "2xx") not in got
    # Again with nothing new: nothing counted twice.
    assert counters(collect(tmp, log)) == counters(got)


def test_a_rotation_as_logrotate_does_it_loses_and_doubles_nothing(door: dict) -> None:
    port, log, tmp, proc = door["port"], door["log"], door["dir"], door["proc"]
    before = collect(tmp, log)
    assert call(port, A_KEY) == 200  # read by no run before the rotation
    wait_lines(log, 9)
    rotated = Path(f"{log}.1")
    log.rename(rotated)  # logrotate: the file renamed, nginx still writes to it ...
    time.sleep(1.1)  # team-b's limit: one request a second
    assert call(port, B_KEY) == 200
    wait_lines(rotated, 10)
    proc.send_signal(signal.SIGUSR1)  # ... until postrotate's `invoke-rc.d nginx rotate` (USR1) reopens the log
    deadline = time.monotonic() + 10
    while not log.exists():
        assert time.monotonic() < deadline, "nginx did not reopen its access log after USR1"
        time.sleep(0.05)
    assert call(port, "no-such-tenant-key-0123456789") == 401
    wait_lines(log, 1)
    assert lines(rotated) == 10
    got = collect(tmp, log)
    assert int(got[requests("team-a", "2xx")]) == int(before[requests("team-a", "2xx")]) + 1
    assert int(got[requests("team-b", "2xx")]) == int(before[requests("team-b", "2xx")]) + 1
    assert int(got[("gpubox_front_door_refused_keys_total", ())]) == 3
    assert got[("gpubox_front_door_log_restarts_total", ())] == "0"
    # The next run: nothing new in either file, nothing counted again.
    assert counters(collect(tmp, log)) == counters(got)
