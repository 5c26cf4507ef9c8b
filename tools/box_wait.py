#!/usr/bin/env python3
"""Wait on a container, a unit or a port: ask again until a deadline, and say what was awaited on giving up.

One wait for the harness (molecule/shared/create.yml, `make demo` through it) and the tests, where each
wait had been written on its own: a wait that asks once races the thing it waits for. A container that
podman has just started has no D-Bus yet, so `systemctl is-system-running --wait` asked at once answers
"Failed to connect to bus" (exit 1) where the same command a second later waits for the boot and answers
"running".

    box_wait.py booted NAME [NAME ...] [--timeout 120]   systemd in each container has finished booting
    box_wait.py unit NAME UNIT [--timeout 60]            the unit is active in the container
    box_wait.py port HOST PORT [--banner SSH-] [--timeout 60]   something listens (and greets with BANNER)

Exit 0 when everything awaited is there; 1 with one line naming what was awaited, for how long, and the
last answer, otherwise.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

# `systemctl is-system-running` states after the boot: accepted, or final (the boot is over and failed).
BOOTED = ("running", "degraded")
BOOT_FAILED = ("maintenance", "stopping")


@dataclass(frozen=True)
class Answer:
    """One probe's answer: ok (the thing is there), final (it will not come: stop asking), what it said."""

    ok: bool
    said: str
    final: bool = False


class WaitError(Exception):
    """The deadline passed (or a final answer came) before what was awaited was there."""


def until(
    probe: Callable[[float], Answer],
    what: str,
    timeout: float,
    interval: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Ask `probe` (given the seconds left) until it answers ok; return how many times it was asked.

    Raises WaitError naming `what`, the time waited and the last answer when the deadline passes or the
    probe's answer is final. The probe is always asked at least once, also with no time left.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds (got {timeout!r}) for the wait on {what}")
    deadline = clock() + timeout
    asked = 0
    while True:
        asked += 1
        answer = probe(max(deadline - clock(), 0.1))
        if answer.ok:
            return asked
        left = deadline - clock()
        if answer.final or left <= 0:
            why = "gave a final answer" if answer.final else f"not there after {timeout:g} s"
            raise WaitError(f"waited for {what}: {why} ({asked} tries); last answer: {answer.said or '(nothing)'}")
        sleep(min(interval, left))


def _run(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """Exit status and output (stdout, else stderr) of a command; None for no answer within `timeout`."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:.0f} s"
    except OSError as exc:  # podman itself missing: nothing will change by asking again
        return -1, f"{argv[0]}: {exc.strerror}"
    out = proc.stdout.strip() or proc.stderr.strip()
    return proc.returncode, out.splitlines()[-1] if out else ""


def booted(container: str) -> Callable[[float], Answer]:
    """Probe: systemd (PID 1) in the container has finished booting (running or degraded)."""

    def probe(left: float) -> Answer:
        rc, said = _run(["podman", "exec", container, "systemctl", "is-system-running", "--wait"], left)
        if rc == -1:
            return Answer(False, said, final=True)
        return Answer(said in BOOTED, f"rc={rc} {said!r}", final=said in BOOT_FAILED)

    return probe


def unit_active(container: str, unit: str) -> Callable[[float], Answer]:
    """Probe: the unit is active in the container."""

    def probe(left: float) -> Answer:
        rc, said = _run(["podman", "exec", container, "systemctl", "is-active", unit], left)
        return Answer(said == "active", f"rc={rc} {said!r}", final=rc == -1)

    return probe


def port_open(host: str, port: int, banner: str = "") -> Callable[[float], Answer]:
    """Probe: a TCP connection to host:port is accepted and, with a banner, its first bytes start with it."""

    def probe(left: float) -> Answer:
        try:
            with socket.create_connection((host, port), timeout=min(left, 5)) as conn:
                if not banner:
                    return Answer(True, "connected")
                conn.settimeout(min(left, 5))
                first = conn.recv(64).decode("ascii", "replace").strip()
                return Answer(first.startswith(banner), f"greeted with {first!r}")
        except OSError as exc:
            return Answer(False, f"{type(exc).__name__}: {exc}")

    return probe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    p_boot = sub.add_parser("booted", help="systemd in each container has finished booting")
    p_boot.add_argument("containers", nargs="+")
    p_unit = sub.add_parser("unit", help="a unit is active in a container")
    p_unit.add_argument("container")
    p_unit.add_argument("unit")
    p_port = sub.add_parser("port", help="a TCP port accepts connections (and greets with --banner)")
    p_port.add_argument("host")
    p_port.add_argument("port", type=int)
    p_port.add_argument("--banner", default="")
    for p, default in ((p_boot, 120.0), (p_unit, 60.0), (p_port, 60.0)):
        p.add_argument("--timeout", type=float, default=default, help=f"seconds (default {default:g})")
        p.add_argument("--interval", type=float, default=0.5, help="seconds between tries (default 0.5)")
    args = parser.parse_args(argv)
    if args.kind == "booted":
        what = "systemd in container {} to finish booting (running or degraded)"
        waits = [(booted(c), what.format(c)) for c in args.containers]
    elif args.kind == "unit":
        what = f"unit {args.unit} to be active in container {args.container}"
        waits = [(unit_active(args.container, args.unit), what)]
    else:
        greets = f" and greet with {args.banner!r}" if args.banner else ""
        what = f"{args.host}:{args.port} to accept connections{greets}"
        waits = [(port_open(args.host, args.port, args.banner), what)]
    try:
        for probe, what in waits:  # each its own deadline: boxes started together boot side by side
            asked = until(probe, what, args.timeout, args.interval)
            print(f"box_wait: {what}: there after {asked} {'try' if asked == 1 else 'tries'}")
    except (WaitError, ValueError) as exc:
        print(f"box_wait: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
