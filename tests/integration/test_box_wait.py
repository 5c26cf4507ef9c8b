"""tools/box_wait.py: a wait asks again until its deadline and, giving up, says what it waited for.

The loop against real sockets on loopback; then real boxes: the harness's image started as
molecule/shared/create.yml starts it and waited on at once, several times (the race `make demo` lost on a
fresh machine: asked at once, `systemctl is-system-running --wait` answered "Failed to connect to bus").
The box tests need podman and the image `make harness` builds (`make test` builds it before the unit
tests run); without them they are skipped, saying so.
"""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import box_wait
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("GPUBOX_IMAGE") or "localhost/gpubox-box:latest"  # as create.yml reads it
STARTS = 5  # boxes started and waited on at once (each about 10 s on the 2-core machine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def listener_after(delay: float, greeting: bytes = b"") -> Iterator[int]:
    """A TCP server on loopback that starts listening `delay` seconds from now and greets each client."""
    port = free_port()
    stop = threading.Event()

    def serve() -> None:
        time.sleep(delay)
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(0.1)
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.sendall(greeting)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        stop.set()
        thread.join(5)


def test_a_port_that_listens_late_is_waited_for() -> None:
    with listener_after(0.6) as port:
        # Asked once, as a wait without retries would, it is not there yet.
        assert not box_wait.port_open("127.0.0.1", port)(1).ok
        asked = box_wait.until(box_wait.port_open("127.0.0.1", port), "the late listener", timeout=10, interval=0.1)
    assert asked > 1


def test_a_banner_is_waited_for_and_a_wrong_one_is_named() -> None:
    with listener_after(0, b"SSH-2.0-OpenSSH_9.2\r\n") as port:
        assert box_wait.until(box_wait.port_open("127.0.0.1", port, "SSH-"), "sshd", timeout=10, interval=0.1) >= 1
    with listener_after(0, b"HTTP/1.1 400 Bad Request\r\n") as port, pytest.raises(box_wait.WaitError) as err:
        box_wait.until(box_wait.port_open("127.0.0.1", port, "SSH-"), "sshd on the box", timeout=0.6, interval=0.1)
    assert "waited for sshd on the box: not there after 0.6 s" in str(err.value)
    assert "greeted with 'HTTP/1.1 400 Bad Request'" in str(err.value)


def test_giving_up_names_what_was_awaited_how_long_and_the_last_answer() -> None:
    port = free_port()  # nobody listens
    began = time.monotonic()
    with pytest.raises(box_wait.WaitError) as err:
        box_wait.until(box_wait.port_open("127.0.0.1", port), f"127.0.0.1:{port}", timeout=0.5, interval=0.1)
    took = time.monotonic() - began
    assert 0.5 <= took < 3, took  # until the deadline, not once and not forever
    message = str(err.value)
    assert message.startswith(f"waited for 127.0.0.1:{port}: not there after 0.5 s (")
    assert "ConnectionRefusedError" in message


def test_a_final_answer_stops_the_wait_at_once() -> None:
    answers = iter(
        [box_wait.Answer(False, "rc=1 'starting'"), box_wait.Answer(False, "rc=1 'maintenance'", final=True)]
    )
    began = time.monotonic()
    with pytest.raises(box_wait.WaitError, match=r"gave a final answer \(2 tries\); last answer: rc=1 'maintenance'"):
        box_wait.until(lambda _left: next(answers), "the boot", timeout=60, interval=0.05)
    assert time.monotonic() - began < 5


def test_a_timeout_that_is_not_positive_is_named() -> None:
    with pytest.raises(ValueError, match=r"timeout must be > 0 seconds \(got 0\) for the wait on the boot"):
        box_wait.until(lambda _left: box_wait.Answer(True, ""), "the boot", timeout=0)


def test_the_command_line_says_what_it_waited_for(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    assert box_wait.main(["port", "127.0.0.1", str(port), "--banner", "SSH-", "--timeout", "0.3"]) == 1
    err = capsys.readouterr().err
    assert f"box_wait: waited for 127.0.0.1:{port} to accept connections and greet with 'SSH-': not there" in err
    with listener_after(0, b"SSH-2.0-x\r\n") as port:
        assert box_wait.main(["port", "127.0.0.1", str(port), "--banner", "SSH-", "--timeout", "5"]) == 0
    # A listener thread on a loaded machine may answer the second ask: the count is the wait's, not the test's.
    assert re.search(r"greet with 'SSH-': there after \d+ tr(y|ies)$", capsys.readouterr().out.strip())


def test_the_harness_waits_only_through_the_two_helpers() -> None:
    """create.yml's waits (systemd's boot, sshd's greeting) are box_wait's, and every other wait of the shared
    harness plays is wait_http.yml: no command asked once, no `until` or `wait_for` of its own."""
    create = (ROOT / "molecule" / "shared" / "create.yml").read_text()
    assert "'booted', '--timeout'" in create
    assert "- port\n" in create and "- SSH-\n" in create
    own = []
    for play in sorted((ROOT / "molecule" / "shared").rglob("*.yml")):
        if play.name == "wait_http.yml" or "group_vars" in play.parts:
            continue
        text = play.read_text()
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        for needle in ("until:", "ansible.builtin.wait_for", "is-system-running", "retries:"):
            if needle in code:
                own.append(f"{play.relative_to(ROOT)}: {needle}")
    assert not own, own


# Real boxes: the harness's image, started as create.yml starts it.


def _harness() -> str | None:
    """Why the box tests cannot run here, or None."""
    try:
        found = subprocess.run(["podman", "image", "exists", IMAGE], capture_output=True, check=False)
    except OSError:
        return "podman is not installed (molecule/shared/host-setup.sh installs it)"
    return None if found.returncode == 0 else f"no image {IMAGE} (make harness builds it)"


needs_box = pytest.mark.skipif(_harness() is not None, reason=str(_harness()))


@contextmanager
def box(name: str, start: bool = True) -> Iterator[str]:
    # create.yml: podman_container with systemd "always" and /sbin/init as the command.
    verb = "run" if start else "create"
    cmd = ["podman", verb, *(["-d"] if start else []), "--name", name, "--hostname", name, "--systemd", "always"]
    subprocess.run([*cmd, "--label", "owner=gpubox-tests", IMAGE, "/sbin/init"], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "0", name], check=False, capture_output=True)


def ask_once(name: str) -> str:
    """The wait create.yml had: one `systemctl is-system-running --wait`, its answer."""
    cmd = ["podman", "exec", name, "systemctl", "is-system-running", "--wait"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    return (proc.stdout.strip() or proc.stderr.strip()).splitlines()[-1]


@needs_box
def test_a_box_started_and_waited_on_at_once_has_booted_every_time() -> None:
    asked = []
    for i in range(STARTS):
        with box(f"gpubox-test-wait-{os.getpid()}-{i}") as name:
            asked.append(box_wait.until(box_wait.booted(name), f"systemd in {name}", timeout=120))
            state = subprocess.run(["podman", "exec", name, "systemctl", "is-system-running"], capture_output=True,
                                   text=True, check=False).stdout.strip()  # fmt: skip
            assert state in box_wait.BOOTED, (i, state)
    assert len(asked) == STARTS


@needs_box
def test_control_a_box_asked_once_before_it_runs_fails_and_box_wait_waits_for_it() -> None:
    """The old wait against a box that is not running yet fails; box_wait, asked at the same moment, waits."""
    name = f"gpubox-test-wait-{os.getpid()}-late"
    with box(name, start=False):
        starter = threading.Timer(1.0, subprocess.run, [["podman", "start", name]], {"capture_output": True})
        starter.start()
        try:
            assert ask_once(name) not in box_wait.BOOTED
            assert box_wait.until(box_wait.booted(name), f"systemd in {name}", timeout=120) > 1
        finally:
            starter.join()


# The box-side wait of the harness's plays (molecule/shared/tasks/wait_http.yml), run by ansible-playbook.


def run_wait_http(tmp_path: Path, url: str, tries: int, on_retry: Callable[[], None] = lambda: None) -> tuple[int, str]:
    """Exit status and output of a play that includes wait_http.yml; `on_retry` runs at its first retry."""
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
        f"    - ansible.builtin.include_tasks: {ROOT}/molecule/shared/tasks/wait_http.yml\n"
        f"      vars: {{_wait_what: the late server, _wait_url: '{url}', _wait_timeout: {tries}}}\n"
        "    - ansible.builtin.debug: {msg: 'answered {{ _wait_http.status }}'}\n"
    )
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    playbook = ansible_vars.tool("ansible-playbook")
    cmd = [str(playbook), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}", str(play)]
    out = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "FAILED - RETRYING" in line and not any("FAILED - RETRYING" in seen for seen in out):
                on_retry()
            out.append(line)
    return proc.returncode, "".join(out)


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_wait_http_waits_for_a_late_server_and_names_one_that_never_answers(tmp_path: Path) -> None:
    port = free_port()
    servers: list[http.server.HTTPServer] = []

    def start() -> None:  # at the first retry: until then nothing listens, and the first ask was refused
        servers.append(http.server.HTTPServer(("127.0.0.1", port), _Ok))
        threading.Thread(target=servers[0].serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    try:
        rc, out = run_wait_http(tmp_path, f"http://127.0.0.1:{port}/", 30, on_retry=start)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    assert rc == 0, out[-2000:]
    assert servers and "answered 200" in out
    rc, out = run_wait_http(tmp_path, f"http://127.0.0.1:{free_port()}/", 2)
    assert rc != 0
    out = " ".join(out.split())
    assert "waited for the late server: http://127.0.0.1:" in out
    assert "did not answer 200 in 2 tries 1 s apart; last answer: -1" in out
