"""The front door's and the firewall's inputs and rendered files, as Ansible renders them.

- network lists: one checker (net_checks) for the fact gpubox_scrape_networks and the roles' knobs;
- the desired state refuses a front door on vLLM's own port, and vllm_service refuses a LAN bind
  behind the front door;
- nginx's file: /v1/ authenticated (401) and sent to one internal location per tenant (its rate, streams,
  body cap, all keyed on the tenant's name), unbuffered; /metrics and /health only to the connection's
  address in loopback and the scrape networks; no key in the public file, no header in the log but referer
  and agent; the key map root-only and exact; X-Forwarded-For believed from the gateways' exact addresses
  only; nginx's own errors as JSON; Mozilla intermediate ciphers;
- the front door's inputs refused by its validate entry point, naming the variable;
- nftables' file: policy drop, each port only from its networks, split by address family.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import net_checks, state_checks
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]
HOST = "unit-front-door"


def _render(role: str, template: str, extra: dict[str, Any] | None = None) -> str:
    from ansible.template import trust_as_template

    templar, _ = ansible_vars.templar_for(
        HOST,
        roles=("gpubox", role),
        groups=("gpu_2x3090",),
        extra_vars={"ansible_managed": "managed by a test", **(extra or {})},
    )
    text = (ROOT / "roles" / role / "templates" / template).read_text()
    return templar.template(trust_as_template(text))


# --------------------------------------------------------------------------- networks


def test_networks_are_normalized_and_deduplicated() -> None:
    assert net_checks.networks("n", ["10.0.0.0/8", "192.0.2.7", "2001:db8::/32", "10.0.0.0/8"]) == [
        "10.0.0.0/8",
        "192.0.2.7/32",
        "2001:db8::/32",
    ]
    assert net_checks.split_families(["10.0.0.0/8", "::/0"]) == {"ipv4": ["10.0.0.0/8"], "ipv6": ["::/0"]}


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("10.0.0.0/8", "must be a list"),
        (["10.1.2.3/8"], "host bits set: write 10.0.0.0/8"),
        (["10.0.0.0/33"], "not a network in CIDR"),
        (["lan"], "not a network in CIDR"),
        ([None], "n[0] must be a network"),
    ],
)
def test_bad_networks_get_one_line_naming_the_variable(value: Any, expect: str) -> None:
    with pytest.raises(net_checks.NetworkError, match=r"^n") as err:
        net_checks.networks("n", value)
    assert expect in str(err.value)


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ([{"port": 8080}], "must be a mapping with port and networks"),
        ([{"port": 0, "networks": []}], "r[0].port must be a port number 1-65535"),
        ([{"port": 53, "proto": "icmp", "networks": []}], "r[0].proto must be tcp or udp"),
        ([{"port": 53, "networks": ["1.2.3.4/8"]}], "r[0].networks[0]"),
        ([{"port": 53, "networks": [], "to": 1}], "unknown keys ['to']"),
    ],
)
def test_bad_port_rules_are_refused(value: Any, expect: str) -> None:
    with pytest.raises(net_checks.NetworkError) as err:
        net_checks.port_rules("r", value)
    assert expect in str(err.value)


def test_the_desired_state_refuses_a_front_door_on_vllms_port_and_bad_scrape_networks() -> None:
    base = ansible_vars.facts("unit-fd", groups=("gpu_2x3090",))
    errors = state_checks.validate({**base, "gpubox_front_door_port": 8000}).errors
    assert any(e.startswith("gpubox_front_door_port and gpubox_port are both 8000") for e in errors), errors
    assert (
        state_checks.validate({**base, "gpubox_front_door_port": 8000, "gpubox_front_door_enabled": False}).errors == []
    )
    errors = state_checks.validate({**base, "gpubox_scrape_networks": ["10.1.2.3/8"]}).errors
    assert errors == [
        "gpubox_scrape_networks[0] is '10.1.2.3/8', which has host bits set: "
        "write 10.0.0.0/8 (or the address alone for /32)"
    ]


def test_vllm_binds_loopback_by_default() -> None:
    exec_start = ansible_vars.render(
        "unit-fd", "__vllm_service_exec_start", roles=("gpubox", "vllm_service"), groups=("gpu_2x3090",)
    )
    assert " --host 127.0.0.1 " in exec_start


# --------------------------------------------------------------------------- nginx


def test_nginx_file_authenticates_limits_per_tenant_and_keeps_metrics_to_the_connections_address() -> None:
    tenants = [
        {"name": "default", "keys": [ansible_vars.TEST_KEY]},
        {"name": "team-b", "keys": ["team-b-key-0123456789"], "requests_per_s": 3, "burst": 0, "streams": 2,
         "body_max": "64k"},
    ]  # fmt: skip
    conf = _render(
        "front_door",
        "gpubox-front-door.conf.j2",
        {"gpubox_scrape_networks": ["10.9.0.0/16", "2001:db8::/48"], "gpubox_tenants": tenants},
    )
    v1 = conf.split("location /v1/ {", 1)[1].split("\n    }", 1)[0]
    assert 'if ($gpubox_tenant = "") {\n            return 401;' in v1
    # One huge header (CVE-2025-48956) stops at nginx: the buffers are said, not left to a build's default.
    assert "\n    large_client_header_buffers 4 8k;\n" in conf
    assert "rewrite ^ /_gpubox_tenant/$gpubox_tenant last;" in v1 and "proxy_pass" not in v1
    # The path this location checked (nginx's normal form) is what the tenant's location puts back and forwards.
    assert v1.index("set $gpubox_uri $uri;") < v1.index("rewrite ^ /_gpubox_tenant/")
    team = conf.split("location = /_gpubox_tenant/team-b {", 1)[1].split("}", 1)[0]
    lines = [line.strip() for line in team.splitlines() if line.strip()]
    assert lines == [
        "internal;",
        "client_max_body_size 64k;",
        "# nginx refuses burst=0: no burst is written as no burst= at all.",
        "limit_req zone=gpubox_tenant_team-b;",
        "limit_conn gpubox_streams 2;",
        "proxy_buffering off;",
        "proxy_cache off;",
        "gzip off;",
        "rewrite ^ $gpubox_uri break;",
        "proxy_pass http://gpubox_vllm;",
    ]
    assert "$request_uri" not in conf  # the raw URI, which nginx did not check, is never forwarded
    assert "limit_req zone=gpubox_tenant_default burst=40;" in conf and "limit_conn gpubox_streams 256;" in conf
    # One rate zone per tenant, every zone keyed on the tenant's name: never the header or the address.
    zones = [line for line in conf.splitlines() if line.startswith(("limit_req_zone", "limit_conn_zone"))]
    assert zones == [
        "limit_req_zone $gpubox_tenant zone=gpubox_tenant_default:1m rate=20r/s;",
        "limit_req_zone $gpubox_tenant zone=gpubox_tenant_team-b:1m rate=3r/s;",
        "limit_conn_zone $gpubox_tenant zone=gpubox_streams:1m;",
    ]
    assert "limit_req_status 429;" in conf and "limit_conn_status 429;" in conf
    assert "client_max_body_size 4m;" in conf  # the server's: the largest tenant's
    assert "listen 443 ssl;" in conf and "server 127.0.0.1:8000;" in conf
    # The keys live in root-only includes; this file has none, and nothing logs a header but referer and agent.
    assert "include /etc/nginx/gpubox/tenants.conf;" in conf and "include /etc/nginx/gpubox/engine-key.conf;" in conf
    assert ansible_vars.TEST_KEY not in conf and "team-b-key" not in conf and "$http_authorization" not in conf
    log_format = conf.split("log_format gpubox_front_door", 1)[1].split(";", 1)[0]
    assert set(re.findall(r"\$(\w+)", log_format)) == {
        "remote_addr", "time_local", "request", "status", "body_bytes_sent", "http_referer", "http_user_agent",
        "gpubox_tenant_logged", "realip_remote_addr",
    }  # fmt: skip
    assert "access_log /var/log/nginx/gpubox-front-door.access.log gpubox_front_door;" in conf
    # /metrics and /health: the connection's own address (realip rewrites $remote_addr), never allow/deny.
    geo = conf.split("geo $realip_remote_addr $gpubox_scraper {", 1)[1].split("}", 1)[0]
    assert [line.strip() for line in geo.splitlines() if line.strip()] == [
        "default 0;", "127.0.0.1/32 1;", "::1/128 1;", "10.9.0.0/16 1;", "2001:db8::/48 1;",
    ]  # fmt: skip
    for path in ("/metrics", "/health"):
        block, proxy_pass = conf.split(f"location = {path} {{", 1)[1].split("proxy_pass", 1)
        assert "if ($gpubox_scraper = 0) {\n            return 403;" in block
        assert "allow" not in block and "deny" not in block
        assert proxy_pass.startswith(f" http://gpubox_vllm{path};")  # the path checked, not the one written
    rest = conf.split("location / {", 1)[1].split("\n    }", 1)[0]
    assert rest.endswith("\n        return 404;") and "proxy_pass" not in rest
    # Without a gateway in front, X-Forwarded-For is never believed.
    assert "set_real_ip_from" not in conf and "real_ip_header" not in conf


def test_the_key_map_is_root_only_and_exact() -> None:
    tenants = [{"name": "default", "keys": [ansible_vars.TEST_KEY, "second.key+0123456789"]}]
    conf = _render("front_door", "gpubox-front-door.conf.j2", {"gpubox_tenants": tenants})
    keys = _render("front_door", "gpubox-tenants.conf.j2", {"gpubox_tenants": tenants})
    lines = [line.strip() for line in keys.splitlines() if line.strip() and not line.startswith("#")]
    assert lines == [
        "map $http_authorization $gpubox_tenant {",
        'default "";',
        f'"~^Bearer ({ansible_vars.TEST_KEY}|second[.]key[+]0123456789)$" default;',
        "}",
    ]
    assert "$gpubox_tenant" in conf and "map $http_authorization" not in conf
    tasks = (ROOT / "roles" / "front_door" / "tasks" / "main.yml").read_text()
    task = tasks.split("- name: Ensure the tenants' keys are in the front door's root-only key map", 1)[1].split(
        "- name:", 1
    )[0]
    assert 'mode: "0600"' in task and "no_log: true" in task


def test_nginx_file_believes_x_forwarded_for_from_the_gateway_only_and_answers_json_errors() -> None:
    conf = _render(
        "front_door",
        "gpubox-front-door.conf.j2",
        {"front_door_gateway_networks": ["10.231.93.5/32", "2001:db8::7/128"]},
    )
    lines = [line.strip() for line in conf.splitlines()]
    assert [line for line in lines if line.startswith("set_real_ip_from")] == [
        "set_real_ip_from 10.231.93.5/32;",
        "set_real_ip_from 2001:db8::7/128;",
    ]
    # The last address only: the one the gateway appended, never one a client wrote before it.
    assert "real_ip_header X-Forwarded-For;" in lines and "real_ip_recursive off;" in lines
    # A forwarded "localhost" is refused, in each location a client may ask for (never the server block, whose
    # rewrite directives run again on the redirect to the error location).
    server = conf.split("\nserver {", 1)[1]
    assert "\n    if ($gpubox_forged_client)" not in server
    for location in ("location /v1/ {", "location = /metrics {", "location = /health {", "location / {"):
        block = server.split(location, 1)[1].split("\n    }", 1)[0]
        assert block.startswith("\n        if ($gpubox_forged_client) {\n            return 400;"), location
    # Mozilla intermediate, TLS 1.2 and 1.3: AEAD suites with ECDHE/DHE only.
    (ciphers,) = [line.split()[1].rstrip(";") for line in lines if line.startswith("ssl_ciphers ")]
    assert ciphers.split(":")[0] == "ECDHE-ECDSA-AES128-GCM-SHA256"
    assert all(c.startswith(("ECDHE-", "DHE-")) and ("GCM" in c or "CHACHA20" in c) for c in ciphers.split(":"))
    assert "ssl_protocols TLSv1.2 TLSv1.3;" in lines and "ssl_session_tickets off;" in lines
    # nginx's own errors go to one JSON location, by its URI (a request line nginx could not read has no URI, which
    # a named location needs); the status stays the error's (no "="), but for nginx's own codes.
    assert [line for line in lines if line.startswith("error_page")] == [
        "error_page 400 401 403 404 405 408 413 414 429 500 502 503 504 /_gpubox_error;",
        "error_page 494 =431 /_gpubox_error;",
        "error_page 495 496 497 501 505 =400 /_gpubox_error;",
    ]
    block = conf.split("location = /_gpubox_error {", 1)[1].split("\n    }", 1)[0]
    assert "internal;" in block and "default_type application/json;" in block
    body = block.split("return 200 '", 1)[1].split("'", 1)[0]
    assert body.startswith('{"error":{"message":"$gpubox_error_message","type":"$gpubox_error_type"')
    assert not any(line.startswith("proxy_intercept_errors") for line in lines)  # vLLM's own errors pass through


PLAY = """
- hosts: gpu-box
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: front_door
        tasks_from: validate
"""


def _validate(tmp_path: Path, extra: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "play.yml").write_text(PLAY)
    extra = {"ansible_connection": "local", "vault_gpubox_api_key": ansible_vars.TEST_KEY, **extra}
    argv = [str(ansible_vars.tool("ansible-playbook")), "-i", str(ROOT / "inventories" / "production")]
    argv += [str(tmp_path / "play.yml"), "-e", json.dumps(extra)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_front_door_inputs_pass_when_good_and_are_refused_naming_the_variable(tmp_path: Path) -> None:
    good = _validate(tmp_path, {"front_door_gateway_networks": ["10.231.93.5", "2001:db8::7/128"]})
    assert good.returncode == 0, good.stdout
    bad = _validate(
        tmp_path, {"front_door_gateway_networks": ["10.1.2.3/8"], "front_door_tls_ciphers": "HIGH; ssl_ciphers ALL"}
    )
    assert bad.returncode != 0
    assert "front_door: 2 problem(s). Nothing was changed." in bad.stdout
    assert "front_door_gateway_networks[0] is '10.1.2.3/8', which has host bits set: write 10.0.0.0/8" in bad.stdout
    assert "front_door_tls_ciphers is HIGH; ssl_ciphers ALL: write an OpenSSL cipher list" in bad.stdout
    # A gateway is one host: a network would let any of its hosts write the client address.
    bad = _validate(tmp_path, {"front_door_gateway_networks": ["10.231.93.0/24", "10.0.0.1", "2001:db8::/64"]})
    assert "front_door: 2 problem(s). Nothing was changed." in bad.stdout, bad.stdout
    assert "front_door_gateway_networks: 10.231.93.0/24 is a network: list each gateway's own address" in bad.stdout
    assert "front_door_gateway_networks: 2001:db8::/64 is a network" in bad.stdout


# --------------------------------------------------------------------------- nftables


def test_nftables_file_opens_each_port_to_its_networks_only() -> None:
    conf = _render(
        "firewall",
        "nftables.conf.j2",
        {
            "gpubox_scrape_networks": ["10.9.0.0/16"],
            "firewall_ssh_networks": ["192.0.2.0/24", "2001:db8::/32"],
            "firewall_allow": [{"port": 51820, "proto": "udp", "networks": ["198.51.100.0/24"], "comment": "wg"}],
        },
    )
    lines = [line.strip() for line in conf.splitlines()]
    assert conf.splitlines()[0] == "#!/usr/sbin/nft -f"
    assert "table inet gpubox" in lines and "delete table inet gpubox" in lines
    assert "type filter hook input priority filter; policy drop;" in lines
    assert 'iif "lo" accept' in lines and "ct state established,related accept" in lines
    accepts = [line for line in lines if line.endswith("accept") and "dport" in line]
    assert accepts == [
        "ip saddr { 192.0.2.0/24 } tcp dport 22 accept",
        "ip6 saddr { 2001:db8::/32 } tcp dport 22 accept",
        "ip saddr { 0.0.0.0/0 } tcp dport 443 accept",
        "ip6 saddr { ::/0 } tcp dport 443 accept",
        "ip saddr { 10.9.0.0/16 } tcp dport 9100 accept",
        "ip saddr { 198.51.100.0/24 } udp dport 51820 accept",
    ]


def test_nftables_file_has_no_front_door_port_without_a_front_door() -> None:
    conf = _render("firewall", "nftables.conf.j2", {"gpubox_front_door_enabled": False})
    assert "dport 443" not in conf and "dport 8000" not in conf


# --------------------------------------------------------------------------- the controller's own connection


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("192.0.2.9 51234 10.0.0.5 2222", {"client": "192.0.2.9", "port": 2222}),
        ("2001:db8::9 51234 2001:db8::5 22", {"client": "2001:db8::9", "port": 22}),
        ("fe80::1%eth0 51234 fe80::2%eth0 22", {"client": "fe80::1", "port": 22}),
        ("::ffff:192.0.2.9 51234 ::ffff:10.0.0.5 22", {"client": "192.0.2.9", "port": 22}),
        ("", {}),
        ("192.0.2.9 51234 10.0.0.5", {}),
        ("192.0.2.9 51234 10.0.0.5 0", {}),
        ("192.0.2.9 51234 10.0.0.5 70000", {}),
        ("not-an-address 51234 10.0.0.5 22", {}),
        (None, {}),
    ],
)
def test_ssh_connection_is_read_or_ignored(text: Any, expect: dict) -> None:
    assert net_checks.ssh_connection(text) == expect


def test_a_controller_outside_the_ssh_networks_is_named_with_the_fix() -> None:
    assert net_checks.lockout_errors("firewall_ssh_networks", ["192.0.2.0/24"], "192.0.2.9") == []
    assert net_checks.lockout_errors("firewall_ssh_networks", ["::/0"], "192.0.2.9") != []
    assert net_checks.lockout_errors("firewall_ssh_networks", ["192.0.2.0/24"], "") == []  # not over SSH
    assert net_checks.lockout_errors("firewall_ssh_networks", "bad", "192.0.2.9") == []  # network_errors says it
    (line,) = net_checks.lockout_errors("firewall_ssh_networks", ["10.0.0.0/8", "2001:db8::/32"], "198.51.100.7")
    assert line.startswith("firewall_ssh_networks (10.0.0.0/8, 2001:db8::/32) does not admit 198.51.100.7,")
    assert line.endswith("Add 198.51.100.7 or its network to firewall_ssh_networks.")


def _ssh_accepts(conf: str) -> list[str]:
    return [line.strip() for line in conf.splitlines() if "saddr" in line and "dport" in line and "443" not in line]


def test_the_port_this_run_came_in_on_stays_open() -> None:
    conf = _render(
        "firewall",
        "nftables.conf.j2",
        {"firewall_ssh_networks": ["192.0.2.0/24"], "__firewall_ssh_env": {"stdout": "192.0.2.9 5 10.0.0.5 2222"}},
    )
    assert [a for a in _ssh_accepts(conf) if "9100" not in a] == [
        "ip saddr { 192.0.2.0/24 } tcp dport 22 accept",
        "ip saddr { 192.0.2.0/24 } tcp dport 2222 accept",
    ]


@pytest.mark.parametrize(
    ("connection", "ports"),
    [("ssh", ["22", "2200"]), ("ansible.builtin.ssh", ["22", "2200"]), ("containers.podman.podman", ["22"])],
)
def test_without_ssh_connection_ansible_port_of_an_ssh_connection_stays_open(connection: str, ports: list) -> None:
    conf = _render(
        "firewall",
        "nftables.conf.j2",
        {"firewall_ssh_networks": ["192.0.2.0/24"], "ansible_port": 2200, "ansible_connection": connection},
    )
    assert [a.split()[-2] for a in _ssh_accepts(conf) if "9100" not in a] == ports


FIREWALL_PLAY = """
- hosts: gpu-box
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: firewall
        tasks_from: validate
"""


def test_a_firewall_that_would_lock_the_controller_out_is_refused_before_any_change(tmp_path: Path) -> None:
    # The local connection hands this process's environment to the task that reads SSH_CONNECTION.
    (tmp_path / "play.yml").write_text(FIREWALL_PLAY)
    argv = [str(ansible_vars.tool("ansible-playbook")), "-i", str(ROOT / "inventories" / "production")]
    extra = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    extra["vault_gpubox_api_key"] = ansible_vars.TEST_KEY
    argv += [str(tmp_path / "play.yml"), "-e", json.dumps({**extra, "firewall_ssh_networks": ["10.0.0.0/8"]})]
    runs = {}
    for client in ("10.1.2.3", "198.51.100.7"):
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        env["SSH_CONNECTION"] = f"{client} 50000 10.0.0.5 2222"
        runs[client] = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert runs["10.1.2.3"].returncode == 0, runs["10.1.2.3"].stdout
    refused = runs["198.51.100.7"]
    assert refused.returncode != 0
    assert "firewall: 1 problem(s). Nothing was changed." in refused.stdout
    assert "does not admit 198.51.100.7, the address Ansible is connected from" in refused.stdout
