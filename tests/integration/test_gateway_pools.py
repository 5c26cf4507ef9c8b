"""One gateway over two pools (issue 47): each request reaches a box of the model its body names, and nothing else.

Real HAProxy with roles/llm_gateway's rendered file and its Lua reader (files/gpubox_route.lua), real nginx with
roles/front_door's rendered file for each box; behind each front door an engine that records every body it gets
and answers with the model it serves. Box "box-alpha" serves "alpha", box "box-beta" serves "beta"; tenant "a" may
use alpha only (gpubox_tenants' models), tenant "ops" every model.

- 1,000 requests to both models, bodies up to 1 MiB whose "model" comes last, in every spelling JSON allows: 0
  misrouted (each engine checks the model its bodies name); the control: the same requests through one backend
  over both boxes (the gateway before pools) misroute about half of them;
- the model the gateway reads is the one Python's json module (vLLM's) reads, on bodies built to confuse it;
- bad bodies (not JSON, no model, a model of 10 MB, a duplicate model, a model that is not a string) get an
  OpenAI-style 4xx from the gateway and reach no engine;
- /v1/models answers the models the tenant may use; a model the tenant is not given is not found at the gateway,
  and the box's own front door refuses that tenant (403) when asked directly;
- the placement key (txn.gpubox_prefix) of a chat ends where its first user message ends, as Python's json reads
  the messages, so that every turn of a chat has its first turn's key (the control: the first 1024 bytes of those
  turns, the key before, differ).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import random
import socket
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness import live_proxies

KEY_A, KEY_OPS = "tenant-a-key-0123456789", live_proxies.GATEWAY_KEY
TENANTS = [
    {"name": "a", "keys": [KEY_A], "models": ["alpha"]},
    {"name": "ops", "keys": [KEY_OPS], "requests_per_s": 100000, "burst": 100000},
]
POOLS = {"box-alpha": "alpha", "box-beta": "beta"}


class _Engine(live_proxies.EngineHandler):
    def do_POST(self) -> None:  # http.server calls it by this name
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            body = b"".join(parts)
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        asked = json.loads(body).get("model")
        server = self.server
        with server.lock:  # type: ignore[attr-defined]
            server.seen.append(asked)  # type: ignore[attr-defined]
        answer = json.dumps({"served": server.model, "asked": asked}).encode()  # type: ignore[attr-defined]
        self.answer(200 if asked == server.model else 404, answer)  # type: ignore[attr-defined]


def _engine(model: str) -> http.server.ThreadingHTTPServer:
    return live_proxies.start_engine(_Engine, model=model, seen=[], lock=threading.Lock())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    engines = {box: _engine(model) for box, model in POOLS.items()}
    knobs = {box: {"gpubox_tenants": TENANTS, "gpubox_served_model_name": model} for box, model in POOLS.items()}
    try:
        with live_proxies.front_doors(engines, knobs) as boxes:
            pair_keys = [(KEY_A, "a"), (KEY_OPS, "ops")]
            models = {"a": ["alpha"], "ops": None}

            def start(tmp_name: str, edit: Any = None) -> tuple[Any, int]:
                knobs = {"llm_gateway_retries": 0, "llm_gateway_rate_per_client": 1000000}
                return live_proxies.start_gateway(
                    tmp_path_factory.mktemp(tmp_name), 0, boxes[0][2], knobs, boxes=boxes,
                    keys=pair_keys, pools=POOLS, tenant_models=models, edit=edit,
                )  # fmt: skip

            gateway, port = start("gateway")
            try:
                yield {"port": port, "engines": {POOLS[box]: e for box, e in engines.items()}, "boxes": boxes,
                       "start": start}  # fmt: skip
            finally:
                live_proxies.stop(gateway)
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))


def _post(port: int, body: bytes, key: str = KEY_OPS, path: str = "/v1/chat/completions") -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=live_proxies.unverified_tls())
    try:
        conn.request(
            "POST", path, body=body, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        data = resp.read()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, data
    finally:
        conn.close()


def _get(port: int, path: str, key: str) -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=live_proxies.unverified_tls())
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def _seen(fleet: dict) -> int:
    return sum(len(e.seen) for e in fleet["engines"].values())


def _body(model: str, size: int, rng: random.Random) -> bytes:
    """A chat body of about ``size`` bytes whose "model" comes last, written in one of the ways JSON allows."""
    text = "".join(rng.choice('abcdefgh ijk"\\/\n\t') for _ in range(min(size, 4096)))
    filler = (text * (size // max(len(text), 1) + 1))[:size]
    messages = [{"role": "system", "content": filler}, {"role": "user", "content": '"model": "beta", "model":"alpha"'}]
    head = json.dumps({"messages": messages, "max_tokens": 4, "tools": [{"model": "beta"}]})[:-1]
    key = rng.choice(['"model"', '"mod\\u0065l"', '"\\u006dodel"'])
    value = rng.choice([json.dumps(model), json.dumps(model, ensure_ascii=True).replace("a", "\\u0061")])
    body = f"{head}, {key} :\n {value} }}".encode()
    return body if len(body) <= 1 << 20 else _body(model, size * 9 // 10, rng)


def _spread(port: int, bodies: list[tuple[str, bytes]]) -> dict[str, int]:
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda mb: (mb[0], _post(port, mb[1])), bodies))
    out: dict[str, Any] = {"ok": 0, "misrouted": 0, "other": 0}
    for model, (status, body) in answers:
        if status == 200 and body.get("served") == model:
            out["ok"] += 1
        elif isinstance(body, dict) and body.get("served") not in (None, model):
            out["misrouted"] += 1
        else:
            out["other"] += 1
            out.setdefault("first_other", (status, str(body)[:200]))
    return out


def test_every_request_reaches_its_models_pool(fleet: dict) -> None:
    rng = random.Random(47)
    sizes = [rng.choice([64, 512, 4096]) if n % 10 else rng.randint(64 << 10, (1 << 20) - 4096) for n in range(1000)]
    bodies = [(model, _body(model, size, rng)) for size, model in zip(sizes, ["alpha", "beta"] * 500)]
    assert max(len(b) for _, b in bodies) <= 1 << 20 and max(len(b) for _, b in bodies) > 1000 << 10
    for _, body in bodies[:20]:  # what Python's json (vLLM's) reads is the model the body was built for
        assert json.loads(body)["model"] in POOLS.values()
    before = {m: len(e.seen) for m, e in fleet["engines"].items()}
    got = _spread(fleet["port"], bodies)
    assert got == {"ok": 1000, "misrouted": 0, "other": 0}, got
    for model, engine in fleet["engines"].items():
        assert engine.seen[before[model] :] == [model] * 500

    # Control: one backend over both boxes (the gateway before pools): about half of the requests are misrouted.
    def one_backend(conf: str) -> str:
        lines = [ln for ln in conf.splitlines() if not ln.strip().startswith("use_backend")]
        conf = "\n".join(lines).replace("backend pool_beta\n", "backend pool_beta_unused\n")
        beta_port = fleet["boxes"][1][1]
        extra = f"backend pool_alpha\n    server box-beta-too 127.0.0.1:{beta_port} ssl verify none\n"
        conf = conf.replace("backend pool_alpha\n", extra)
        return conf.replace("frontend gpubox_api\n", "frontend gpubox_api\n    default_backend pool_alpha\n")

    control, port = fleet["start"]("control", edit=one_backend)
    try:
        got = _spread(port, bodies[:200])
    finally:
        live_proxies.stop(control)
    assert got["misrouted"] >= 40, got


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "beta", "messages": [{"model": "alpha"}]}',
        b'{"messages": "{\\"model\\": \\"alpha\\"}", "model": "beta"}',
        b'  {"x": [1, {"y": "}"}, "]"], "model"\t:\r\n"beta"}  ',
        b'{"x": "\\\\", "model": "beta"}',
        b'{"x": "\\\\\\"model\\": \\"alpha", "model": "beta"}',
        b'{"n": -1.5e3, "t": true, "f": false, "z": null, "model": "beta"}',
        b'{"mode": "alpha", "models": "alpha", "model": "b\\u0065t\\u0061"}',
        b'{"x": ' + b'[{"model": "alpha", "k": ' * 200 + b"1" + b"}]" * 200 + b', "model": "beta"}',
    ],
)
def test_the_gateway_reads_the_model_pythons_json_reads(fleet: dict, body: bytes) -> None:
    assert json.loads(body)["model"] == "beta"
    status, answer = _post(fleet["port"], body)
    assert (status, answer.get("served")) == (200, "beta"), answer


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "invalid_json"),
        (b'["model", "alpha"]', 400, "invalid_json"),
        (b'{"model": "alpha"', 400, "invalid_json"),
        (b'{"model": "alpha"} x', 400, "invalid_json"),
        (b'{"model": "al\x01pha"}', 400, "invalid_json"),
        (b'{"messages": []}', 400, "model_missing"),
        (b'{"model": "alpha", "x": 1, "model": "beta"}', 400, "model_duplicate"),
        (b'{"model": "alpha", "mod\\u0065l": "alpha"}', 400, "model_duplicate"),
        (b'{"model": ["alpha"]}', 400, "model_not_string"),
        (b'{"model": "' + b"x" * 300 + b'"}', 400, "model_not_string"),
        (b'{"model": "gamma"}', 404, "model_not_found"),
        (b'{"x": ' + b"[" * 100000 + b"]" * 100000 + b', "model": "gamma"}', 404, "model_not_found"),
        (b'{"model": "ALPHA"}', 404, "model_not_found"),
    ],
)
def test_bad_bodies_are_refused_at_the_gateway(fleet: dict, body: bytes, status: int, code: str) -> None:
    before = _seen(fleet)
    got, answer = _post(fleet["port"], body)
    assert got == status, answer
    assert isinstance(answer, dict) and answer["error"]["code"] == code, answer
    assert _seen(fleet) == before


def _refused_while_sending(port: int, path: str, framing: str, pieces: list[bytes]) -> tuple[bytes, dict]:
    """(status line and header fields, JSON body) of the answer to a POST whose body (``pieces`` after the header
    line ``framing``) the gateway may refuse before it has it all: the pieces sent until HAProxy closes, then the
    answer read."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=30)
    with live_proxies.unverified_tls().wrap_socket(raw, server_hostname="localhost") as conn:
        conn.sendall(
            f"POST {path} HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY_OPS}\r\n{framing}\r\n\r\n".encode()
        )
        with contextlib.suppress(ssl.SSLError, ConnectionError):  # HAProxy answers and closes before the end
            for piece in pieces:
                conn.sendall(piece)
        answer = b""
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            while chunk := conn.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, json.loads(body) if head.startswith(b"HTTP/1.1 4") else {}


def test_a_body_announced_over_the_bound_is_refused_before_it_is_read(fleet: dict) -> None:
    """A model of 10 MB: the gateway answers 413 on the Content-Length, before reading the body (the client sees the
    answer once it has sent a part of it)."""
    before = _seen(fleet)
    framing = f"Content-Length: {(10 << 20) + 13}"
    head, body = _refused_while_sending(fleet["port"], "/v1/chat/completions", framing, [b'{"model": "' + b"x" * 100])
    assert head.startswith(b"HTTP/1.1 413"), head
    assert body["error"]["code"] == "request_too_large"
    assert _seen(fleet) == before


def test_a_chunked_body_over_the_bound_is_refused(fleet: dict) -> None:
    """No Content-Length: the gateway reads until its buffer is full; a body whose object has not ended by the bound
    is 413 (the client sees the answer while it is still sending)."""
    before = _seen(fleet)
    data = [b'{"messages": "' + b"x" * (64 << 10)] + [b"x" * (64 << 10)] * 39  # 2.5 MiB, over the 1 MiB bound
    chunks = [f"{len(d):x}\r\n".encode() + d + b"\r\n" for d in data]
    head, body = _refused_while_sending(fleet["port"], "/v1/completions", "Transfer-Encoding: chunked", chunks)
    assert head.startswith(b"HTTP/1.1 413"), head
    assert body["error"]["code"] == "request_too_large"
    assert _seen(fleet) == before


def test_tenants_see_and_use_only_their_models(fleet: dict) -> None:
    port = fleet["port"]
    assert _get(port, "/v1/models", KEY_OPS) == (200, {"object": "list", "data": [
        {"id": "alpha", "object": "model", "created": 0, "owned_by": "gpubox"},
        {"id": "beta", "object": "model", "created": 0, "owned_by": "gpubox"}]})  # fmt: skip
    status, listed = _get(port, "/v1/models", KEY_A)
    assert status == 200 and [m["id"] for m in listed["data"]] == ["alpha"]
    before = _seen(fleet)
    assert _post(port, b'{"model": "alpha"}', KEY_A)[0] == 200
    status, answer = _post(port, b'{"model": "beta"}', KEY_A)
    assert (status, answer["error"]["code"]) == (404, "model_not_found")
    assert _seen(fleet) == before + 1
    assert _get(port, "/v1/models", "not-a-key-0123456789")[0] == 401
    # Other GETs are not routed (no body names a model); other methods are not allowed.
    assert _get(port, "/v1/chat/completions", KEY_OPS)[0] == 404
    # The box serving beta refuses tenant a at its own front door, asked directly.
    _, box_port, _ = fleet["boxes"][1]
    status, answer = _post(box_port, b'{"model": "beta"}', KEY_A)
    assert status == 403 and "beta" in answer["error"]["message"], answer
    assert _post(box_port, b'{"model": "beta"}', KEY_OPS)[0] == 200


# --- the placement key ---------------------------------------------------------------------------------------
PREFIX_BYTES = 1024  # the role's llm_gateway_prefix_bytes


def _key_gateway(conf: str) -> str:
    """The rendered file with one rule more: the gateway answers each routed request with its placement key (hex)."""
    line = next(ln for ln in conf.splitlines() if "lua.gpubox_route" in ln)
    answer = '    http-request return status 200 content-type text/plain lf-string "key=%[var(txn.gpubox_prefix),hex]"'
    return conf.replace(line + "\n", f"{line}\n{answer} if {{ var(txn.gpubox_model) -m found }}\n")


@pytest.fixture(scope="module")
def key_port(fleet: dict) -> Iterator[int]:
    gateway, port = fleet["start"]("keys", edit=_key_gateway)
    try:
        yield port
    finally:
        live_proxies.stop(gateway)


def _key(port: int, body: bytes) -> bytes:
    status, answer = _post(port, body)
    assert status == 200 and isinstance(answer, bytes) and answer.startswith(b"key="), (status, answer)
    return bytes.fromhex(answer[4:].decode())


def _chat(parts: list[str], field: str = "messages") -> tuple[bytes, bytes]:
    """A body whose conversation is the array of ``parts`` (each one element as written), and the key Python's json
    says it has: the array up to the end of its first element whose role is "user" (json.loads keeps an object's
    last "role"), or all of it, at most PREFIX_BYTES."""
    array = "[" + ", ".join(parts) + "]"
    roles = [m.get("role") if isinstance(m, dict) else None for m in json.loads(array)]
    end = len(("[" + ", ".join(parts[: roles.index("user") + 1])).encode()) if "user" in roles else len(array.encode())
    body = f'{{"model": "alpha", "{field}": {array}, "max_tokens": 4}}'.encode()
    return body, array.encode()[: min(end, PREFIX_BYTES)]


SYSTEM = json.dumps({"role": "system", "content": "You answer briefly."})
ASKED = json.dumps({"role": "user", "content": "What is a KV cache? " * 5})


def test_every_turn_of_a_chat_has_its_first_turns_key(key_port: int) -> None:
    rng = random.Random(47)
    turns, keys, old_keys = [SYSTEM, ASKED], [], []
    for _ in range(4):
        body, expected = _chat(turns)
        assert _key(key_port, body) == expected
        keys.append(expected)
        old_keys.append(("[" + ", ".join(turns) + "]").encode()[:PREFIX_BYTES])
        answer = " ".join(f"w{rng.randrange(1000)}" for _ in range(rng.randint(20, 60)))
        turns += [json.dumps({"role": "assistant", "content": answer}), json.dumps({"role": "user", "content": "more"})]
    assert len(set(keys)) == 1 and keys[0].endswith(ASKED.encode())
    # Control: the first 1024 bytes of the conversation (the key before) differ from the first turn's at every turn.
    assert all(old != old_keys[0] for old in old_keys[1:]), old_keys


@pytest.mark.parametrize(
    "parts",
    [
        [SYSTEM, '{"role": "\\u0075ser", "content": "escaped"}', ASKED],
        [SYSTEM, '{"role": "user", "content": "last role wins", "role": "system"}', ASKED, SYSTEM],
        ['{"role": "system", "content": [{"type": "text", "role": "user"}], "meta": {"role": "user"}}', ASKED],
        ['"not a message"', "3", "null", '[1, {"role": "user"}]', ASKED, SYSTEM],
        ['{"role": ["user"], "content": "not a string"}', '{ "role" :\t"user" ,"content":"spaced" }', ASKED],
        ['{"content": "\\"role\\": \\"user\\"", "role": "system"}', "{}", ASKED],
        [SYSTEM, json.dumps({"role": "assistant", "content": "no question yet"})],
        [json.dumps({"role": "system", "content": "long " * 400}), ASKED],
        [SYSTEM, json.dumps({"role": "user", "content": "\u00e9t\u00e9 " * 300}, ensure_ascii=False), ASKED],
    ],
)
def test_the_placement_key_is_what_pythons_json_reads(key_port: int, parts: list[str]) -> None:
    body, expected = _chat(parts)
    assert _key(key_port, body) == expected
    responses, expected = _chat(parts, field="input")  # the Responses API's input, an array of messages
    assert _key(key_port, responses) == expected


def test_a_conversation_that_is_no_array_keys_its_first_bytes(key_port: int) -> None:
    prompt = json.dumps("Complete this: " + "word " * 400)
    assert _key(key_port, f'{{"prompt": {prompt}, "model": "alpha"}}'.encode()) == prompt.encode()[:PREFIX_BYTES]
    short = json.dumps([1, 2, {"role": "system"}])
    assert _key(key_port, f'{{"model": "alpha", "prompt": {short}}}'.encode()) == short.encode()
    assert _key(key_port, b'{"model": "alpha"}') == b""


# --- connections to the boxes ---------------------------------------------------------------------------------
def _box_connections(fleet: dict, tmp: Path, edit: Any = None) -> dict[str, int]:
    """Five clients one after the other, each on its own connection with one request: how many TLS connections the
    gateway opened to the box (its stats' connect) and how many requests went over an idle one (reuse)."""
    knobs = {"llm_gateway_retries": 0, "llm_gateway_rate_per_client": 1000000}
    gateway, port = live_proxies.start_gateway(
        tmp, 0, fleet["boxes"][0][2], knobs, boxes=fleet["boxes"], keys=[(KEY_OPS, "ops")], pools=POOLS, edit=edit
    )
    try:
        for _ in range(5):
            assert _post(port, b'{"model": "alpha"}')[0] == 200
        lines = live_proxies.haproxy_cli(tmp / "admin.sock", "show stat").splitlines()
    finally:
        live_proxies.stop(gateway)
    head = lines[0].lstrip("# ").split(",")
    row = next(r for r in (dict(zip(head, ln.split(","))) for ln in lines[1:] if ln) if r["svname"] == "box-alpha")
    return {"connect": int(row["connect"]), "reuse": int(row["reuse"])}


def test_a_new_clients_first_request_goes_over_an_idle_connection_to_the_box(fleet: dict, tmp_path: Path) -> None:
    assert _box_connections(fleet, tmp_path / "always") == {"connect": 1, "reuse": 4}
    # Control: HAProxy's default (safe) opens a TLS connection to the box for each client's first request.
    safe = _box_connections(fleet, tmp_path / "safe", lambda conf: conf.replace("    http-reuse always\n", ""))
    assert safe == {"connect": 5, "reuse": 0}
