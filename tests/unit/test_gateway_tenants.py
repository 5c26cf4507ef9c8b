"""The gateway accepts exactly the keys of the boxes' tenants, and behind it each tenant keeps its own limits.

- the keys come from the boxes' gpubox_tenants in the inventory (gpubox_api_key when []), as the role's own
  variables compute them through Ansible; boxes with different tenants are refused;
- through the real HAProxy and the real nginx on loopback, with an engine that logs every request: no key, a
  wrong key, a retired key: 401 from the gateway; a key of one tenant past its limit: 429 from the box's front
  door while another tenant's key passes; none of the refused requests reaches the engine, and every request
  that does carries the engine's own key.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import live_proxies

ROOT = Path(__file__).resolve().parents[2]
KEY_A, KEY_A_OLD, KEY_B = "tenant-a-key-0123456789", "tenant-a-retired-0123456789", "tenant-b-key-0123456789"
API_KEY = live_proxies.GATEWAY_KEY
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}

PLAY = """
- hosts: gw
  gather_facts: false
  vars_files: [{vars}]
  tasks:
    - name: Write the keys the gateway would accept (a test only, the role never writes them out)
      ansible.builtin.copy:
        content: "{{{{ {{'sets': __llm_gateway_key_sets | length, 'keys': __llm_gateway_keys}} | to_json }}}}"
        dest: {out}
        mode: "0600"
"""


def _keys(tmp_path: Path, boxes: dict[str, dict]) -> tuple[int, dict]:
    inventory = {
        "all": {
            "children": {
                "gpu_boxes": {"hosts": boxes},
                "llm_gateways": {"hosts": {"gw": {**LOCAL, "llm_gateway_backends": list(boxes)}}},
            }
        }
    }
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    out = tmp_path / "keys.json"
    (tmp_path / "play.yml").write_text(PLAY.format(vars=ROOT / "roles" / "llm_gateway" / "vars" / "main.yml", out=out))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.json")]
    done = subprocess.run([*argv, str(tmp_path / "play.yml")], env=env, cwd=ROOT, capture_output=True, text=True)
    return done.returncode, json.loads(out.read_text()) if done.returncode == 0 else {
        "stdout": done.stdout + done.stderr
    }


def test_the_gateway_accepts_every_key_of_the_boxes_tenants(tmp_path: Path) -> None:
    tenants = [{"name": "a", "keys": [KEY_A, KEY_A_OLD]}, {"name": "ops", "keys": [API_KEY, KEY_B]}]
    box = {"vault_gpubox_api_key": API_KEY, "gpubox_tenants": tenants}
    rc, got = _keys(tmp_path, {"b1": box, "b2": box})
    assert rc == 0 and got == {"sets": 1, "keys": sorted([KEY_A, KEY_A_OLD, API_KEY, KEY_B])}, got
    # No tenants listed: the one key, gpubox_api_key (vault_gpubox_api_key).
    rc, got = _keys(tmp_path, {"b1": {"vault_gpubox_api_key": API_KEY}})
    assert rc == 0 and got == {"sets": 1, "keys": [API_KEY]}, got
    # Boxes with different tenants: two sets, which the role refuses.
    rc, got = _keys(tmp_path, {"b1": box, "b2": {"vault_gpubox_api_key": API_KEY}})
    assert rc == 0 and got["sets"] == 2, got
    # A bad tenant list (which the box's own preflight refuses first): no set of keys, which the role refuses.
    bad = {"vault_gpubox_api_key": API_KEY, "gpubox_tenants": [{"name": "a", "keys": ["short"]}]}
    rc, got = _keys(tmp_path, {"b1": bad})
    assert rc != 0 or got["sets"] != 1, got


class _Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server calls it by this name
        self.server.seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})  # type: ignore[attr-defined]
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """HAProxy accepting tenant a's current key, tenant b's and ops' (not a's retired one) in front of a front door
    whose tenant a may send one request a minute."""
    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    engine.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=engine.serve_forever, daemon=True).start()
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
        pytest.skip(str(exc))
    try:
        try:
            gateway, port = live_proxies.start_gateway(
                tmp_path_factory.mktemp("gateway"), box_port, box_dir / "tls.crt", {}, keys=[KEY_A, KEY_B, API_KEY]
            )
        except live_proxies.Missing as exc:
            pytest.skip(str(exc))
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
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_through_haproxy_and_nginx_unknown_and_retired_keys_and_a_tenant_past_its_limit_never_reach_the_engine(fleet):
    port, engine = fleet["port"], fleet["engine"]
    for n, key in enumerate([None, "wrong-key-0123456789abcdef", KEY_A_OLD, KEY_A.upper()]):
        status, body = _get(port, f"/v1/models?probe-gw-{n}", key)
        assert status == 401 and body["error"]["code"] == "invalid_api_key", (key, status, body)
    assert _get(port, "/v1/models?probe-a-1", KEY_A)[0] == 200
    status, body = _get(port, "/v1/models?probe-a-2", KEY_A)  # tenant a's second request within the minute
    assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body
    assert _get(port, "/v1/models?probe-b", KEY_B)[0] == 200  # another tenant, the same gateway address: its own limit
    paths = [line["path"] for line in engine.seen]
    assert not any("probe-gw-" in p or "probe-a-2" in p for p in paths), paths
    assert "/v1/models?probe-a-1" in paths and "/v1/models?probe-b" in paths
    assert {line["authorization"] for line in engine.seen} == {f"Bearer {live_proxies.ENGINE_KEY}"}
