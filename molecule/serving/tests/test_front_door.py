"""Verify the front door (nginx, TLS) and the firewall (nftables) of the serving box from other hosts.

Two plain Debian containers on the scenario's network (molecule.yml) play the other hosts: the client
(10.231.89.30, not in gpubox_scrape_networks) and the scraper (10.231.89.20, in it). Each request runs
inside them with Python's own http.client/ssl, verifying the box's certificate against the
self-signed one the role generated. The tenants' keys come from the scenario's vault variable
(molecule/shared/group_vars/gpubox_sim.yml; host_vars: tenant "ops" holds it, "team-b" it plus "-team-b") and
are handed to the client on stdin, never on a command line; vLLM's own key (the box's 0600 env file) is the
front door's, which the front door refuses from a client. These tests run before test_serving.py's (file
order), and the rate-limit tests run last here, so that their bursts do not meet the other requests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

BOX_IP = "10.231.89.10"
CLIENT = "gpubox-m-fd-client"
SCRAPER = "gpubox-m-fd-scraper"
PORT = 443
VLLM_PORT = 8000
SERVED = "tiny"
CERT = "/etc/gpubox/front-door/tls.crt"
ACCESS_LOG = "/var/log/nginx/gpubox-front-door.access.log"
ERROR_LOG = "/var/log/nginx/error.log"

# Runs in the client/scraper container; reads one job (JSON) on stdin, prints the result (JSON).
CLIENT_SCRIPT = r"""
import http.client, json, socket, ssl, sys, time
from concurrent.futures import ThreadPoolExecutor
job = json.load(sys.stdin)

def context():
    if job.get("system_cas"):
        return ssl.create_default_context()
    return ssl.create_default_context(cadata=job["ca"])

def request(_=None):
    conn = http.client.HTTPSConnection(job["host"], job["port"], context=context(), timeout=120)
    headers = {"Content-Type": "application/json"}
    if job.get("use_key"):
        headers["Authorization"] = "Bearer " + job["key"]
    body = job.get("body")
    if body is not None and not isinstance(body, str):
        body = json.dumps(body)
    try:
        conn.request(job.get("method", "GET"), job["path"], body=body, headers=headers)
        resp = conn.getresponse()
        if not job.get("stream"):
            return {"status": resp.status, "body": resp.read().decode(errors="replace")}
        reads = []
        while True:
            data = resp.read1(65536)
            if not data:
                break
            reads.append({"t": time.monotonic(), "data": data.decode(errors="replace")})
        return {"status": resp.status, "reads": reads}
    except OSError as err:
        return {"status": 0, "body": type(err).__name__ + ": " + str(err)}
    finally:
        conn.close()

def probe(port):
    sock = socket.socket()
    sock.settimeout(job.get("timeout", 3))
    try:
        sock.connect((job["host"], port))
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as err:
        return type(err).__name__
    finally:
        sock.close()

if job["mode"] == "request":
    out = request()
elif job["mode"] == "burst":
    with ThreadPoolExecutor(job["n"]) as pool:
        out = [r["status"] for r in pool.map(request, range(job["n"]))]
else:
    with ThreadPoolExecutor(len(job["ports"])) as pool:
        out = dict(zip(map(str, job["ports"]), pool.map(probe, job["ports"])))
print(json.dumps(out))
"""


SHARED_VARS = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
SHARED_VARS = SHARED_VARS / "molecule" / "shared" / "group_vars" / "gpubox_sim.yml"


def _key(host=None, tenant: str = "ops") -> str:
    """A tenant's key (host_vars/gpubox-m-serving.yml): ops holds vault_gpubox_api_key, team-b it + "-team-b"."""
    key = yaml.safe_load(SHARED_VARS.read_text())["vault_gpubox_api_key"]
    return key if tenant == "ops" else f"{key}-{tenant}"


def _engine_key(host) -> str:
    """vLLM's own key: the front door's, in the unit's 0600 env file."""
    (line,) = [
        x for x in host.file("/etc/gpubox/vllm.env").content_string.splitlines() if x.startswith("VLLM_API_KEY=")
    ]
    return line.split("=", 1)[1].strip()


def _from(container: str, host, **job):
    """Run one job in ``container`` against the box; the job (key included) travels on stdin. ``use_key``: True for
    the tenant ops's key, or the key itself."""
    job = {"host": BOX_IP, "port": PORT, "ca": host.file(CERT).content_string, **job}
    if job.get("use_key"):
        job["key"] = _key(host) if job["use_key"] is True else job["use_key"]
    proc = subprocess.run(
        ["podman", "exec", "-i", container, "python3", "-c", CLIENT_SCRIPT],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _listening(host) -> dict[int, set[str]]:
    """Every listening TCP port of the box and the addresses it is bound to (ss -ltn)."""
    ports: dict[int, set[str]] = {}
    for line in host.check_output("ss -ltnH").splitlines():
        local = line.split()[3]
        addr, _, port = local.rpartition(":")
        ports.setdefault(int(port), set()).add(addr.strip("[]"))
    return ports


# --- the door answers the client over verified TLS ------------------------------------------------------


def test_https_completion_with_the_key_works_from_another_host(host):
    result = _from(
        CLIENT, host, mode="request", method="POST", path="/v1/completions", use_key=True,
        body={"model": SERVED, "prompt": "hello", "max_tokens": 4},
    )  # fmt: skip
    assert result["status"] == 200, result
    body = json.loads(result["body"])
    assert body["model"] == SERVED
    assert body["choices"][0]["text"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"chat_template": "{{ 'x' * 9 }}"}, "chat_template"),
        # What vLLM 0.7.3 merges over the template: the same field one level down, with an escaped key.
        ('{"chat_template_kwargs": {"chat\\u005ftemplate": "{{ 1 }}"}, "model": "tiny", "messages": []}',
         "chat_template_kwargs.chat_template"),
    ],
)  # fmt: skip
def test_a_request_with_its_own_chat_template_is_refused_with_json(host, body, param):
    # roles/vllm_service/files/gpubox_vllm_guard.py (CVE-2025-61620): vLLM answers 400 before rendering anything.
    if isinstance(body, dict):
        body = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body}
    result = _from(CLIENT, host, mode="request", method="POST", path="/v1/chat/completions", use_key=True, body=body)
    assert result["status"] == 400, result
    error = json.loads(result["body"])["error"]
    assert error["param"] == param and "vllm_service_allow_request_chat_template" in error["message"], error


def test_a_token_id_past_the_models_vocabulary_is_refused_and_the_engine_keeps_serving(host):
    # roles/vllm_service/files/gpubox_vllm_guard.py: the tiny model has 512 ids (its config.json, written into the
    # guard's settings by the role); an id past them would index the engine's tables (CVE-2026-100654 and others).
    for body, param in (
        ({"prompt": [1, 2, 512]}, "prompt"),
        ({"prompt": "hello", "stop_token_ids": [9999], "min_tokens": 2}, "stop_token_ids"),
    ):
        body = {"model": SERVED, "max_tokens": 4, **body}
        result = _from(CLIENT, host, mode="request", method="POST", path="/v1/completions", use_key=True, body=body)
        assert result["status"] == 400, result
        error = json.loads(result["body"])["error"]
        assert error["param"] == param and error["code"] == "token_id_out_of_vocabulary", error
    # control: a token-id prompt inside the vocabulary is answered (the unit tests hold the bound's last id)
    body = {"model": SERVED, "prompt": [1, 2, 3], "max_tokens": 2}
    result = _from(CLIENT, host, mode="request", method="POST", path="/v1/completions", use_key=True, body=body)
    assert result["status"] == 200, result


def test_without_a_tenants_key_the_front_door_answers_401(host):
    for key in (None, "not-a-tenant-key-0123456789", _key().upper(), _engine_key(host)):
        result = _from(CLIENT, host, mode="request", path="/v1/models", use_key=key or False)
        assert result["status"] == 401, (key is None, result)
        error = json.loads(result["body"])["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "authentication_error", error
    # The front door refused them: the access log says so, with no tenant.
    log = host.file(ACCESS_LOG).content_string.splitlines()
    assert sum(1 for line in log[-4:] if '" 401 ' in line and line.endswith("tenant=- conn=10.231.89.30")) == 4, log[
        -4:
    ]


def test_each_tenant_is_its_own_and_vllms_key_is_not_a_clients(host):
    result = _from(CLIENT, host, mode="request", path="/v1/models", use_key=_key(tenant="team-b"))
    assert result["status"] == 200, result
    assert _engine_key(host) not in (_key(), _key(tenant="team-b"))
    assert host.check_output("tail -n 1 %s", ACCESS_LOG).endswith("tenant=team-b conn=10.231.89.30")


def test_the_certificate_is_self_signed_and_verified_by_the_client(host):
    # The client trusts only the box's own certificate: a client trusting the system CAs refuses it,
    # so the successful requests above really verified the certificate (and its IP address name).
    result = _from(CLIENT, host, mode="request", path="/v1/models", system_cas=True)
    assert result["status"] == 0 and "CERTIFICATE_VERIFY_FAILED" in result["body"], result
    text = host.check_output("openssl x509 -in %s -noout -ext subjectAltName", CERT)
    assert f"IP Address:{BOX_IP}" in text


def test_streaming_arrives_in_more_than_one_chunk(host):
    # 400 tokens take vLLM about a second on the CPU (~2 ms each). Unbuffered, nginx passes each
    # server-sent event on as vLLM writes it: the client sees hundreds of separate arrivals. With
    # proxy_buffering on (tried by hand on this box), they came in bursts of buffers: 0 to 8 gaps.
    # The client shares 2 busy cores with the box, so a run where it was not scheduled for most of the
    # stream also reads it in bursts (a CI run with the fleet lane converging beside it saw 21, 1 and 2 gaps):
    # up to 6 attempts, 2 s apart, one must show the stream arriving piece by piece. The same property,
    # proven without timing noise (a paced stand-in engine, and failing with proxy_buffering on), is
    # tests/integration/test_engine_standin.py's.
    seen = []
    for attempt in range(6):
        if attempt:
            time.sleep(2)
        result = _from(
            CLIENT, host, mode="request", method="POST", path="/v1/completions", use_key=True, stream=True,
            body={"model": SERVED, "prompt": "hello", "max_tokens": 400, "stream": True, "ignore_eos": True},
        )  # fmt: skip
        assert result["status"] == 200, result
        reads = [r for r in result["reads"] if "data:" in r["data"]]
        assert sum(r["data"].count("data:") for r in reads) >= 100, result
        assert "[DONE]" in reads[-1]["data"] and "[DONE]" not in reads[0]["data"]
        times = [r["t"] for r in reads]
        apart = sum(1 for a, b in zip(times, times[1:]) if b - a > 0.001)
        seen.append(apart)
        if apart >= 50:
            break
    assert max(seen) >= 50, f"the stream arrived in bursts only (arrivals more than 1 ms apart, per try: {seen})"


def test_only_the_api_is_published(host):
    for path in ("/version", "/tokenize", "/"):
        assert _from(CLIENT, host, mode="request", path=path)["status"] == 404, path


def test_request_bodies_are_capped(host):
    big = json.dumps({"model": SERVED, "prompt": "x" * 100_000, "max_tokens": 1})  # above the 64k cap
    result = _from(CLIENT, host, mode="request", method="POST", path="/v1/completions", use_key=True, body=big)
    assert result["status"] == 413, result


# --- metrics only to the scrape networks ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["/metrics", "/health"])
def test_metrics_and_health_are_refused_to_a_non_scrape_address(host, path):
    assert _from(CLIENT, host, mode="request", path=path)["status"] == 403


def test_metrics_answer_an_address_of_the_scrape_networks(host):
    result = _from(SCRAPER, host, mode="request", path="/metrics")
    assert result["status"] == 200, result
    assert re.search(r"^vllm:\w+", result["body"], re.M), result["body"][:500]
    assert _from(SCRAPER, host, mode="request", path="/health")["status"] == 200


# --- the firewall and the loopback bind ------------------------------------------------------------------


def test_vllm_listens_on_loopback_only(host):
    assert _listening(host)[VLLM_PORT] == {"127.0.0.1"}
    unit = host.file("/etc/systemd/system/vllm.service").content_string
    assert "--host 127.0.0.1 " in unit


def test_no_port_but_the_front_door_is_reachable_from_another_host(host):
    listening = _listening(host)
    assert PORT in listening and 22 in listening
    # Printed into the scenario log: what the box listens on (the engine's internal sockets included).
    print("box listens on:", {p: sorted(a) for p, a in sorted(listening.items())})
    seen = _from(CLIENT, host, mode="probe", ports=sorted(listening), timeout=3)
    assert seen.pop(str(PORT)) == "open"  # the client does reach the box
    # SSH only from the controller's gateway, vLLM's port and the engine's ports from nowhere.
    assert str(VLLM_PORT) in seen and "22" in seen
    assert all(state != "open" for state in seen.values()), seen


def test_the_firewall_drops_by_default(host):
    table = host.check_output("nft list table inet gpubox")
    assert "policy drop;" in table
    assert "tcp dport 22 accept" in table and "10.231.89.1 " in table
    assert f"tcp dport {PORT} accept" in table
    assert host.service("nftables").is_enabled


# --- the key stays out of nginx ----------------------------------------------------------------------------


def test_the_keys_are_in_no_public_nginx_file_log_or_argv(host):
    keys = {"tenant": _key(), "tenant team-b": _key(tenant="team-b"), "engine": _engine_key(host)}
    log = host.file(ACCESS_LOG).content_string
    assert "10.231.89.30" in log and "POST /v1/completions" in log  # the requests above were logged
    config = host.check_output(
        "cat /etc/nginx/nginx.conf /etc/nginx/conf.d/*.conf /etc/nginx/sites-enabled/* 2>/dev/null || true"
    )
    assert "$http_authorization" not in config  # only the root-only key map reads the header
    texts = {"access log": log, "error log": host.file(ERROR_LOG).content_string, "config": config}
    texts["argv"] = host.check_output("ps -eo args")
    texts["journal"] = host.check_output("journalctl --no-pager -o cat -u nginx -u vllm -n 2000")
    texts["facts"] = host.check_output("cat /etc/ansible/facts.d/*.fact")
    for which, key in keys.items():
        for where, text in texts.items():
            assert key not in text, f"the {which} key appears in {where}"
    # The keys live in root's 0600 files only.
    for path in ("/etc/nginx/gpubox/tenants.conf", "/etc/nginx/gpubox/engine-key.conf",
                 "/etc/gpubox/front-door/engine.key", "/etc/gpubox/front-door/tls.key"):  # fmt: skip
        assert host.file(path).mode == 0o600 and host.file(path).user == "root", path
    assert host.file("/etc/nginx/gpubox").mode == 0o700
    assert _key() in host.file("/etc/nginx/gpubox/tenants.conf").content_string
    assert _engine_key(host) in host.file("/etc/nginx/gpubox/engine-key.conf").content_string


# --- rate limits (last: their bursts fill the zones) ------------------------------------------------------


def test_a_burst_of_one_tenant_gets_429_from_its_own_limit_and_not_the_other_tenants(host):
    # 10 at once with ops's key: beyond its burst (1 + 4). team-b (20/s, burst 40) is not refused for it.
    statuses = _from(CLIENT, host, mode="burst", n=10, path="/v1/models", use_key=True)
    assert statuses.count(429) >= 1 and statuses.count(200) >= 1, statuses
    assert 'by zone "gpubox_tenant_ops"' in host.file(ERROR_LOG).content_string
    statuses = _from(CLIENT, host, mode="burst", n=10, path="/v1/models", use_key=_key(tenant="team-b"))
    assert statuses == [200] * 10, statuses


def test_a_burst_without_a_key_is_all_401_and_fills_no_tenants_limit(host):
    statuses = _from(CLIENT, host, mode="burst", n=30, path="/v1/models")
    assert statuses == [401] * 30, statuses


# --- the tenants' counts reach the metrics (roles/metrics: gpubox-tenant-metrics on a timer) ----------------------

TENANT_TEXTFILE = "/var/lib/prometheus/node-exporter/gpubox_tenants.prom"
# Labelled with the model the box serves (gpubox_served_model_name: tiny), so that a fleet's sums are per model.
_TENANT_SAMPLE = re.compile(r'^gpubox_front_door_requests_total\{code="(\dxx)",model="tiny",tenant="([^"]+)"\} (\d+)$')


def _tenant_counts(host) -> tuple[dict[tuple[str, str], int], int]:
    """One run of the collector now, as the timer's would be: ({(tenant, code): requests}, refused keys)."""
    host.run_expect([0], "systemctl start gpubox-tenant-metrics.service")
    text = host.file(TENANT_TEXTFILE).content_string
    counts = {(m.group(2), m.group(1)): int(m.group(3)) for m in map(_TENANT_SAMPLE.match, text.splitlines()) if m}
    (refused,) = [int(x.split()[1]) for x in text.splitlines() if x.startswith("gpubox_front_door_refused_keys_total ")]
    assert "gpubox_front_door_log_readable 1" in text.splitlines(), text
    return counts, refused


def test_each_tenants_requests_and_the_refused_keys_reach_the_metrics(host):
    # This file's requests so far: ops's and team-b's answered, ops's burst past its limit, the keyless 401s.
    before, refused_before = _tenant_counts(host)
    assert before[("ops", "2xx")] >= 1 and before[("ops", "4xx")] >= 1 and before[("team-b", "2xx")] >= 10, before
    assert refused_before >= 34 and before[("(none)", "4xx")] >= 34, (refused_before, before)
    # The access log stays as nginx's package keeps it: the collector reads it as group adm, nothing wider.
    assert host.file(ACCESS_LOG).mode == 0o640 and host.file(ACCESS_LOG).group == "adm"
    ops = _from(CLIENT, host, mode="burst", n=10, path="/v1/models", use_key=True)  # past ops's burst again
    team_b = _from(CLIENT, host, mode="request", path="/v1/models", use_key=_key(tenant="team-b"))
    keyless = _from(CLIENT, host, mode="burst", n=3, path="/v1/models")
    assert team_b["status"] == 200 and keyless == [401] * 3, (team_b, keyless)
    time.sleep(1)  # nginx writes a request's line after it answered
    after, refused_after = _tenant_counts(host)
    assert after[("ops", "2xx")] - before[("ops", "2xx")] == ops.count(200), (before, after, ops)
    assert after[("ops", "4xx")] - before[("ops", "4xx")] == ops.count(429), (before, after, ops)
    assert after[("team-b", "2xx")] - before[("team-b", "2xx")] == 1, (before, after)
    assert refused_after - refused_before == 3
