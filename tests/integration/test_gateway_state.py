"""A gateway reload keeps the boxes' states: roles/llm_gateway's saver (files/haproxy_runtime.py save-state) writes the
runtime API's `show servers state`, and the rendered haproxy.cfg (server-state-file, load-server-state-from-file)
makes the next HAProxy start from it. Real HAProxy on loopback; without the saved file the box is back in the
pool (the control), so the test can fail."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import live_proxies

SAVER = live_proxies.RUNTIME_CLIENT


def status(sock: Path) -> str:
    lines = live_proxies.haproxy_cli(sock, "show stat").splitlines()
    head = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(head, line.split(","))) for line in lines[1:] if line]
    return next(r["status"] for r in rows if r["pxname"] == "pool_tiny" and r["svname"] == "localhost")


def wait_status(sock: Path, want: str) -> str:
    seen = ""
    for _ in range(50):
        seen = status(sock)
        if seen == want:
            break
        time.sleep(0.1)
    return seen


def test_a_drained_box_stays_drained_across_a_restart_from_the_saved_state(tmp_path: Path) -> None:
    engine, engine_port = live_proxies.start_standin(10, 5)
    (tmp_path / "box").mkdir()
    try:
        try:
            front, front_port = live_proxies.start_front_door(tmp_path / "box", engine_port, {})
        except live_proxies.Missing as exc:
            pytest.fail(str(exc))
        gw, sock, cert = tmp_path / "gw", tmp_path / "gw" / "admin.sock", tmp_path / "box" / "tls.crt"
        try:
            gateway, _ = live_proxies.start_gateway(gw, front_port, cert, {}, log=tmp_path / "haproxy-1.log")
            assert wait_status(sock, "UP") == "UP"
            live_proxies.haproxy_cli(sock, "set server pool_tiny/localhost state drain")
            assert status(sock) == "DRAIN"
            # the role's client as the tasks run it: the drained box's state and no request in flight
            stat = subprocess.run([sys.executable, str(SAVER), "stat", str(sock), "pool_tiny"],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            assert json.loads(stat.stdout)["localhost"]["status"] == "DRAIN", stat.stdout
            saved = subprocess.run([sys.executable, str(SAVER), "save-state", str(sock), str(gw / "server-state")])
            assert saved.returncode == 0 and (gw / "server-state").read_text().startswith("1\n")
            live_proxies.stop(gateway)

            gateway, _ = live_proxies.start_gateway(gw, front_port, cert, {}, log=tmp_path / "haproxy-2.log")
            time.sleep(1)  # health checks run: a box loaded as drained stays drained
            assert status(sock) == "DRAIN"
            live_proxies.stop(gateway)

            (gw / "server-state").unlink()  # the control: from the configuration alone, the box is back
            gateway, _ = live_proxies.start_gateway(gw, front_port, cert, {}, log=tmp_path / "haproxy-3.log")
            assert wait_status(sock, "UP") == "UP"
        finally:
            live_proxies.stop(gateway)
            live_proxies.stop(front)
    finally:
        live_proxies.stop(engine)


def test_the_saver_writes_nothing_when_haproxy_does_not_answer(tmp_path: Path) -> None:
    argv = [sys.executable, str(SAVER), "save-state", str(tmp_path / "none.sock"), str(tmp_path / "state")]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0 and "no state saved" in done.stderr
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(("check_timeout_ms", "want"), [(None, "UP"), (200, "DOWN")], ids=["role default", "control"])
def test_a_box_that_answers_health_late_stays_in_the_pool(tmp_path: Path, check_timeout_ms, want) -> None:
    """The stand-in answers /health 500 ms late, as a box busy with its streams does; checks run every 200 ms.
    The role's check timeout keeps the box in the pool; a timeout of the interval (HAProxy's own when none is
    set, the rendered file before llm_gateway_check_timeout_ms) takes it out while it serves."""
    engine, engine_port = live_proxies.start_standin(10, 1, health_delay_ms=500)
    (tmp_path / "box").mkdir()
    knobs = {"llm_gateway_check_interval_ms": 200}
    if check_timeout_ms is not None:
        knobs["llm_gateway_check_timeout_ms"] = check_timeout_ms
    try:
        front, front_port = live_proxies.start_front_door(tmp_path / "box", engine_port, {})
        try:
            gateway, _ = live_proxies.start_gateway(
                tmp_path / "gw", front_port, tmp_path / "box" / "tls.crt", knobs, log=tmp_path / "haproxy.log"
            )
            try:
                time.sleep(2.5)  # checks of 200 ms or more: two failed would have taken it out by now
                seen = wait_status(tmp_path / "gw" / "admin.sock", want)
            finally:
                live_proxies.stop(gateway)
        finally:
            live_proxies.stop(front)
    finally:
        live_proxies.stop(engine)
    assert seen == want, (tmp_path / "haproxy.log").read_text()[-2000:]


def test_a_canarys_share_is_its_weight_set_at_run_time_and_given_back(tmp_path: Path) -> None:
    """roles/llm_gateway/tasks/canary.yml's `set weight <pool>/<box> <p>%` on the rendered configuration (every server
    at weight 100): the runtime API takes it and the role's client reads it back, pool and counters with it."""
    engine, engine_port = live_proxies.start_standin(10, 5)
    (tmp_path / "box").mkdir()
    gateway = front = None
    try:
        front, front_port = live_proxies.start_front_door(tmp_path / "box", engine_port, {})
        gw, sock, cert = tmp_path / "gw", tmp_path / "gw" / "admin.sock", tmp_path / "box" / "tls.crt"
        gateway, _ = live_proxies.start_gateway(gw, front_port, cert, {}, log=tmp_path / "haproxy.log")
        assert wait_status(sock, "UP") == "UP"

        def stat() -> dict:
            done = subprocess.run([sys.executable, str(SAVER), "stat", str(sock), "*"], capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)["localhost"]

        assert stat()["weight"] == 100 and stat()["pool"] == "pool_tiny"  # the configured weight
        for share, want in (("25", 25), ("100", 100)):
            command = f"set weight pool_tiny/localhost {share}%"
            said = subprocess.run([sys.executable, str(SAVER), "ask", str(sock), command],
                                  capture_output=True, text=True, check=True)  # fmt: skip
            assert said.stdout.strip() == "", said.stdout  # HAProxy answers nothing when it took the weight
            assert stat()["weight"] == want
        said = subprocess.run([sys.executable, str(SAVER), "ask", str(sock), "set weight pool_tiny/nobox 25%"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        assert (
            said.stdout.strip() != ""
        )  # the control: a weight HAProxy did not take is answered (the task fails on it)
        assert stat()["errors"] == 0
    finally:
        for proc in (gateway, front, engine):
            if proc is not None:
                live_proxies.stop(proc)
