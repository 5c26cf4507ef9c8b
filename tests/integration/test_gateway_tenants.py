"""The gateway accepts exactly the keys of the boxes' tenants, and behind it each tenant keeps its own limits.

- the keys are what each box's front door writes for it (every key of its gpubox_tenants, gpubox_api_key when
  []), as the roles' own variables compute them through Ansible; boxes with different keys are refused;
- through the real HAProxy and the real nginx on loopback, with an engine that logs every request: no key, a
  wrong key, a retired key: 401 from the gateway; a key of one tenant past its limit: 429 from the box's front
  door while another tenant's key passes; none of the refused requests reaches the engine, and every request
  that does carries the engine's own key.
"""

from __future__ import annotations

import http.client
import http.server
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import gateway_pools
from harness import ansible_vars, live_proxies

ROOT = Path(__file__).resolve().parents[2]
KEY_A, KEY_A_OLD, KEY_B = "tenant-a-key-0123456789", "tenant-a-retired-0123456789", "tenant-b-key-0123456789"
API_KEY = live_proxies.GATEWAY_KEY


def _box_keys(tenants: list | None) -> str:
    """What a box's front door writes for the gateway (the content of roles/front_door's task, as it renders)."""
    tasks = (ROOT / "roles" / "front_door" / "tasks" / "main.yml").read_text()
    task = tasks.split("- name: Ensure the list of the keys this front door accepts", 1)[1].split("- name:", 1)[0]
    content = next(line for line in task.splitlines() if line.strip().startswith("content:")).split(":", 1)[1]
    content = yaml.safe_load(content).strip()
    assert content.startswith("{{") and content.endswith("}}")
    extra = {"gpubox_tenants": tenants} if tenants is not None else {}
    return ansible_vars.render(
        "unit-gateway-box", content[2:-2], roles=("gpubox", "front_door"), groups=("gpu_2x3090",),
        extra_vars={"vault_gpubox_api_key": API_KEY, **extra},
    )  # fmt: skip


def _gateway_keys(files: list[str]) -> dict:
    """The gateway's key map and its problems, from the boxes' files (roles/llm_gateway's plan,
    module_utils/gateway_pools.py)."""
    facts = {
        f"box{n}": {"served_model_name": "qwen14b", "model_id": "Qwen/x", "model_commit": "c", "stack": "pinned",
                    "port": 443, "tenants": [{"name": t, "models": None} for t in ("a", "ops", "default")]}
        for n in range(len(files))
    }  # fmt: skip
    plan = gateway_pools.pools(facts, {f"box{n}": text for n, text in enumerate(files)})
    return {"problems": plan["problems"], "keys": plan["key_map"]}


def test_the_gateway_accepts_every_key_of_the_boxes_tenants() -> None:
    tenants = [{"name": "a", "keys": [KEY_A, KEY_A_OLD]}, {"name": "ops", "keys": [API_KEY, KEY_B]}]
    box = _box_keys(tenants)
    assert box == f"{KEY_A} a\n{KEY_A_OLD} a\n{API_KEY} ops\n{KEY_B} ops\n"
    pairs = sorted([(KEY_A, "a"), (KEY_A_OLD, "a"), (API_KEY, "ops"), (KEY_B, "ops")])
    assert _gateway_keys([box, box]) == {"problems": [], "keys": "".join(f"{k} {t}\n" for k, t in pairs)}
    # No tenants listed: the one key, gpubox_api_key (vault_gpubox_api_key), of tenant default.
    assert _box_keys(None) == f"{API_KEY} default\n"
    # Boxes with different tenants: refused, no key named.
    problems = _gateway_keys([box, _box_keys(None)])["problems"]
    assert len(problems) == 1 and "accept different keys" in problems[0] and KEY_A not in problems[0]
    # A bad tenant list (which the box's preflight refuses first): the filter's error names the field, not the key.
    with pytest.raises(Exception, match=r"gpubox_tenants\[0\]\.keys\[0\] must be 16 to 512") as err:
        _box_keys([{"name": "a", "keys": ["short-and-bad"]}])
    assert "short-and-bad" not in str(err.value)
    tasks = (ROOT / "roles" / "front_door" / "tasks" / "main.yml").read_text()
    task = tasks.split("- name: Ensure the list of the keys this front door accepts", 1)[1].split("- name:", 1)[0]
    assert 'mode: "0600"' in task and "no_log: true" in task


class _Engine(live_proxies.EngineHandler):
    def do_POST(self) -> None:  # http.server calls it by this name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})  # type: ignore[attr-defined]
        self.answer(200, b'{"ok": true}')


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """HAProxy accepting tenant a's current key, tenant b's and ops' (not a's retired one) in front of a front door
    whose tenant a may send one request a minute."""
    engine = live_proxies.start_engine(_Engine, seen=[])
    tenants = [
        {"name": "a", "keys": [KEY_A], "requests_per_s": 1, "burst": 0},
        {"name": "b", "keys": [KEY_B], "requests_per_s": 1000, "burst": 1000},
        {"name": "ops", "keys": [API_KEY]},
    ]
    box_dir = tmp_path_factory.mktemp("box")
    try:
        box, box_port = live_proxies.start_front_door(
            box_dir, engine.server_address[1], {"gpubox_tenants": tenants}, engine_key=live_proxies.ENGINE_KEY
        )
    except live_proxies.Missing as exc:
        engine.shutdown()
        pytest.fail(str(exc))
    try:
        try:
            gateway, port = live_proxies.start_gateway(
                tmp_path_factory.mktemp("gateway"),
                box_port,
                box_dir / "tls.crt",
                {},
                keys=[(KEY_A, "a"), (KEY_B, "b"), (API_KEY, "ops")],
            )
        except live_proxies.Missing as exc:
            pytest.fail(str(exc))
        try:
            yield {"port": port, "engine": engine}
        finally:
            live_proxies.stop(gateway)
    finally:
        live_proxies.stop(box)
        engine.shutdown()


def _get(port: int, path: str, key: str | None) -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=live_proxies.unverified_tls())
    try:
        # A completion for the box's model (the gateway answers /v1/models itself; a request it routes names a model).
        conn.request("POST", path, body=b'{"model": "tiny", "prompt": "hi"}',
                     headers={"Authorization": f"Bearer {key}"} if key else {})  # fmt: skip
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_through_haproxy_and_nginx_unknown_and_retired_keys_and_a_tenant_past_its_limit_never_reach_the_engine(fleet):
    port, engine = fleet["port"], fleet["engine"]
    wrong = "wrong-key-0123456789abcdef"  # pragma: allowlist secret (a test value no tenant holds)
    for n, key in enumerate([None, wrong, KEY_A_OLD, KEY_A.upper()]):
        status, body = _get(port, f"/v1/completions?probe-gw-{n}", key)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", (key, status, body)
    assert _get(port, "/v1/completions?probe-a-1", KEY_A)[0] == 200
    status, body = _get(port, "/v1/completions?probe-a-2", KEY_A)  # tenant a's second request within the minute
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body
    assert (
        _get(port, "/v1/completions?probe-b", KEY_B)[0] == 200
    )  # another tenant, the same gateway address: its own limit
    paths = [line["path"] for line in engine.seen]
    assert not any("probe-gw-" in p or "probe-a-2" in p for p in paths), paths
    assert "/v1/completions?probe-a-1" in paths and "/v1/completions?probe-b" in paths
    assert {line["authorization"] for line in engine.seen} == {f"Bearer {live_proxies.ENGINE_KEY}"}
