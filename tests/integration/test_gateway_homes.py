"""Prefix placement's homes (issue 47, roles/llm_gateway/files/gpubox_route.lua, gpubox_place): a pool of three boxes.

Real HAProxy with roles/llm_gateway's rendered file, real nginx with roles/front_door's file for each box; behind
each front door an engine that records the conversation (the system prompt) of every request it gets, so where a
request went is where the engine saw it. Each "application" is a system prompt of its own, sent one request at a
time and without the load bound, unless a test says otherwise:

- 16 applications: each stays on one box, and no box is home to more than 6 (16 over 3, rounded up); the control:
  the same file without the homes' lines (HAProxy's consistent hash of the key alone) puts 7 of these 16 on one box;
- a drained box gets none of its applications' requests: they move, each to one box, and no box holds more than 8;
  made ready again, it takes keys back as the requests come, from the boxes above their share (one pass: no box
  above 6 again, so it holds 4 or more);
- a box at half weight (a canary's share, set at run time) is home to no more than its share of the keys (4 of 16);
- the load bound: 6 slow requests of one application at once spread over the boxes at the role's bound (120), and
  all go to its home without a bound (0);
- a request its home answers with 503 (an engine stopping) is retried on another box (the control: no retries);
- a home is kept while it is used and forgotten after two generations unused (1 s here, 150 s in the role): an
  application moved off its first box by a drain stays where it went when that box comes back, and goes back to
  its first box once forgotten.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from bench import placement_load
from harness import live_proxies

BOXES = ("box-1", "box-2", "box-3")
APPS = [f"You are the assistant of application {n}: answer in the words of its manual." for n in range(16)]
SLOW = "slow"  # an engine holds a request whose question says so for a second


class _Engine(live_proxies.EngineHandler):
    def do_POST(self) -> None:  # http.server calls it by this name
        messages = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["messages"]
        if self.server.refusing:  # type: ignore[attr-defined]
            self.answer(503)  # as vLLM's front door answers for an engine stopping (retried by the gateway)
            return
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.seen.append(messages[0]["content"])  # type: ignore[attr-defined]
        if messages[-1]["content"] == SLOW:
            time.sleep(1)
        self.answer(200, b"{}")


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    engines = {box: live_proxies.start_engine(_Engine, seen=[], lock=threading.Lock(), refusing=False) for box in BOXES}
    try:
        with live_proxies.front_doors(engines) as boxes:

            @contextlib.contextmanager
            def gateway(name: str, knobs: dict | None = None, edit: Any = None) -> Iterator[tuple[int, Path]]:
                tmp = tmp_path_factory.mktemp(name)
                # No load bound but where a test sets one: a request just answered can still count on its box
                # when the next one is placed (HAProxy ends its stream after the client has the answer), and the
                # bound would then send that one elsewhere.
                knobs = {"llm_gateway_retries": 0, "llm_gateway_rate_per_client": 1000000,
                         "llm_gateway_hash_balance_factor": 0, **(knobs or {})}  # fmt: skip
                proc, port = live_proxies.start_gateway(tmp, 0, boxes[0][2], knobs, boxes=boxes, edit=edit)
                try:
                    _where({"engines": engines})  # nothing of an earlier gateway's requests
                    yield port, tmp / "admin.sock"
                finally:
                    live_proxies.stop(proc)

            yield {"engines": engines, "gateway": gateway}
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))


def _ask(port: int, app: str, question: str = "Which page?", status: int = 200) -> None:
    body = json.dumps({"model": "tiny", "messages": [{"role": "system", "content": app},
                                                     {"role": "user", "content": question}]})  # fmt: skip
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=live_proxies.unverified_tls())
    try:
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Authorization": f"Bearer {live_proxies.GATEWAY_KEY}"})  # fmt: skip
        resp = conn.getresponse()
        assert resp.status == status, (resp.status, resp.read())
        resp.read()
    finally:
        conn.close()


def _where(pool: dict) -> dict[str, Counter]:
    """{application: Counter of the boxes that got its requests} since the last call; the engines forget them."""
    out: dict[str, Counter] = {}
    for box, engine in pool["engines"].items():
        with engine.lock:
            for app in engine.seen:
                out.setdefault(app, Counter())[box] += 1
            engine.seen.clear()
    return out


def _homes(pool: dict, port: int, rounds: int = 3) -> dict[str, str]:
    """Every application asked ``rounds`` times, one request at a time: {application: its one box}."""
    for _ in range(rounds):
        for app in APPS:
            _ask(port, app)
    where = _where(pool)
    assert sorted(where) == sorted(APPS)
    split = {app: dict(boxes) for app, boxes in where.items() if len(boxes) > 1}
    assert not split, f"applications on more than one box: {split}"
    return {app: next(iter(boxes)) for app, boxes in where.items()}


def _per_box(homes: dict[str, str]) -> dict[str, int]:
    return {box: sum(1 for home in homes.values() if home == box) for box in BOXES}


def test_each_application_has_one_home_and_no_box_more_than_its_share(pool: dict) -> None:
    with pool["gateway"]("homes") as (port, _):
        homes = _per_box(_homes(pool, port))
    with pool["gateway"]("hash", edit=placement_load.EDITS["no-homes"]) as (port, _):
        hashed = _per_box(_homes(pool, port))
    assert max(homes.values()) <= math.ceil(len(APPS) / 3), homes
    assert max(hashed.values()) >= 7, hashed  # the control: the key's hash alone


def test_a_drained_box_hands_its_homes_over_and_takes_its_share_back(pool: dict) -> None:
    with pool["gateway"]("drain") as (port, sock):
        before = _homes(pool, port, rounds=1)
        live_proxies.haproxy_cli(sock, "set server pool_tiny/box-1 state drain")
        drained = _homes(pool, port)
        assert _per_box(drained)["box-1"] == 0 and max(_per_box(drained).values()) <= 8, _per_box(drained)
        kept = [app for app, box in before.items() if box != "box-1"]
        assert all(drained[app] == before[app] for app in kept), "a box that stayed kept its applications"
        live_proxies.haproxy_cli(sock, "set server pool_tiny/box-1 state ready")
        back = _per_box(_homes(pool, port))  # the others give up what they hold over their share (6 each)
        assert max(back.values()) <= 6 and back["box-1"] == len(APPS) - back["box-2"] - back["box-3"] >= 4, back


def test_a_box_at_half_weight_is_home_to_its_share(pool: dict) -> None:
    with pool["gateway"]("weight") as (port, sock):
        live_proxies.haproxy_cli(sock, "set weight pool_tiny/box-3 50%")
        homes = _per_box(_homes(pool, port))
        assert homes["box-3"] <= math.ceil(len(APPS) * 50 / 250) and max(homes.values()) <= 7, homes


@pytest.mark.parametrize("factor, boxes", [(120, 3), (0, 1)])
def test_the_load_bound_spreads_one_busy_application(pool: dict, factor: int, boxes: int) -> None:
    with pool["gateway"](f"bound{factor}", {"llm_gateway_hash_balance_factor": factor}) as (port, _):
        with ThreadPoolExecutor(6) as threads:
            asked = []
            for _ in range(6):  # 0.1 s apart: each is placed while the ones before are still held
                asked.append(threads.submit(_ask, port, APPS[0], SLOW))
                time.sleep(0.1)
            for done in asked:
                done.result()
        (where,) = _where(pool).values()
    assert len(where) == boxes and sum(where.values()) == 6, where


def test_a_home_is_kept_while_used_and_forgotten_when_not(pool: dict) -> None:
    app = APPS[0]
    with pool["gateway"]("forget", {"__llm_gateway_home_generation_s": 1}) as (port, sock):
        _ask(port, app)
        (first,) = _where(pool)[app]  # a new pool: its first box in its own order
        live_proxies.haproxy_cli(sock, f"set server pool_tiny/{first} state drain")
        _ask(port, app)
        (moved,) = _where(pool)[app]
        live_proxies.haproxy_cli(sock, f"set server pool_tiny/{first} state ready")
        _ask(port, app)
        (kept,) = _where(pool)[app]
        time.sleep(2.5)  # two generations unused
        _ask(port, app)
        (again,) = _where(pool)[app]
    assert moved != first and kept == moved and again == first, (first, moved, kept, again)


@pytest.mark.parametrize("retries, status", [(3, 200), (0, 503)])  # 3: the role's default
def test_a_request_its_home_refuses_is_retried_on_another_box(pool: dict, retries: int, status: int) -> None:
    app = APPS[1]
    with pool["gateway"](f"retry{retries}", {"llm_gateway_retries": retries}) as (port, _):
        _ask(port, app)
        (home,) = _where(pool)[app]
        pool["engines"][home].refusing = True
        try:
            _ask(port, app, status=status)
        finally:
            pool["engines"][home].refusing = False
        where = _where(pool)
    assert (home not in where.get(app, {})) and len(where.get(app, {})) == (1 if status == 200 else 0), where
