"""The live servers start on a port another process took between free_port() and their bind (any connection's
ephemeral port may be that number: the scenarios' SSH connections run beside these tests): the starters try a
new port instead of failing the test on a race it does not test (harness/live_proxies.py, PortTaken)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import live_proxies


@pytest.fixture
def taken_first(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """free_port() answers a port another socket holds first, then free ones; yields the ports answered."""
    # Bound, not listening: as an outgoing connection holds its local port (a listener would answer the starter's
    # own probe and hide the failed bind).
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    answered: list[int] = []
    real = live_proxies.free_port

    def free_port() -> int:
        answered.append(holder.getsockname()[1] if not answered else real())
        return answered[-1]

    monkeypatch.setattr(live_proxies, "free_port", free_port)
    try:
        yield answered
    finally:
        holder.close()


def test_the_front_door_starts_on_a_new_port_when_its_first_was_taken(tmp_path: Path, taken_first: list[int]):
    proc, port = live_proxies.start_front_door(tmp_path, 9, {})
    try:
        assert len(taken_first) == 2 and port == taken_first[1] != taken_first[0]
        assert proc.poll() is None
    finally:
        live_proxies.stop(proc)


def test_the_engine_standin_starts_on_a_new_port_when_its_first_was_taken(taken_first: list[int]):
    proc, port = live_proxies.start_standin(0, 0)
    try:
        assert len(taken_first) == 2 and port == taken_first[1]
    finally:
        live_proxies.stop(proc)


def test_a_port_taken_every_time_still_fails_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    monkeypatch.setattr(live_proxies, "free_port", lambda: holder.getsockname()[1])
    try:
        with pytest.raises(live_proxies.PortTaken, match="Address already in use"):
            live_proxies.start_front_door(tmp_path, 9, {})
    finally:
        holder.close()
