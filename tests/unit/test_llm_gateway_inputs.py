"""roles/llm_gateway refuses bad input (tasks/validate.yml, run first by the role), naming the variable.

Runs the role's validate entry point with ansible-playbook once, on an inventory of local gateway hosts,
one host per case (each with its own variables), and reads each host's result from the json callback.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import gateway_pools
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]

PLAYBOOK = """
- hosts: llm_gateways
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: llm_gateway
        tasks_from: validate
    - name: passed
      ansible.builtin.debug:
        msg: passed
"""

GOOD = {"llm_gateway_backends": ["b1", "b2"], "llm_gateway_backend_addresses": {"b1": "10.0.0.1"}}
BAD: list[tuple[dict[str, Any], str]] = [
    ({}, "llm_gateway_backends is empty"),
    ({"llm_gateway_backends": ["b1", "nope"]}, "llm_gateway_backends: nope is not a host of this inventory"),
    ({"llm_gateway_backends": ["plain"]}, "llm_gateway_backends: plain is not in group gpu_boxes"),
    ({"llm_gateway_backends": ["b1", "b1"]}, "llm_gateway_backends names a box twice"),
    ({"llm_gateway_backends": ["b1"], "llm_gateway_port": 0}, "llm_gateway_port is 0"),
    ({"llm_gateway_backends": ["b1"], "llm_gateway_port": 70000}, "llm_gateway_port is 70000"),
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_affinity_header": "X Session"},
        "llm_gateway_affinity_header is X Session",
    ),
    ({"llm_gateway_backends": ["b1"], "llm_gateway_check_fall": 0}, "llm_gateway_check_fall must be 1-10"),
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_check_timeout_ms": 50},
        "llm_gateway_check_timeout_ms must be 100-60000",
    ),
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_backend_addresses": {"b2": "10.0.0.2"}},
        "b2 is not in llm_gateway_backends",
    ),
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_tls_certificate": "-----BEGIN CERTIFICATE-----"},
        "given together",
    ),
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_rate_per_client": 0},
        "llm_gateway_rate_per_client must be 1-1000000 requests",
    ),
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_rate_period_s": 0},
        "llm_gateway_rate_period_s must be 1-3600 s",
    ),
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_tls_ciphers": "HIGH; ssl-default-bind-options"},
        "llm_gateway_tls_ciphers is HIGH; ssl-default-bind-options: write an OpenSSL cipher list",
    ),
    *(
        (
            {"llm_gateway_backends": ["b1"], "llm_gateway_hash_balance_factor": bad},
            f"llm_gateway_hash_balance_factor is {bad}: give 0 (affinity without a load bound) or a percentage",
        )
        for bad in (100, 50, 1001, -5)
    ),
    # glibc's thresholds in HAProxy's environment: whole bytes, at least its buffer (the body bound + 66,560)
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_malloc_mmap_threshold_bytes": 1048576},
        "llm_gateway_malloc_mmap_threshold_bytes is 1048576: give a whole number of bytes, at least tune.bufsize"
        " (1115136 bytes",
    ),
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_malloc_trim_threshold_bytes": -1},
        "llm_gateway_malloc_trim_threshold_bytes is -1: give a whole number of bytes",
    ),
    # the defaults hold a 1 MiB bound (host good); a larger bound needs a larger mmap threshold
    (
        {"llm_gateway_backends": ["b1"], "llm_gateway_max_body_bytes": 8388608},
        "llm_gateway_malloc_mmap_threshold_bytes is 4194304: give a whole number of bytes, at least tune.bufsize"
        " (8455168 bytes: llm_gateway_max_body_bytes + 66560), e.g. 4194304; or lower llm_gateway_max_body_bytes",
    ),
    *(
        (
            {"llm_gateway_backends": ["b1"], "llm_gateway_drain_timeout_s": bad},
            f"llm_gateway_drain_timeout_s is {bad}: give 1-86400 s",
        )
        for bad in (0, 86401, -1)
    ),
]

NOT_NUMBER: list[dict[str, Any]] = [
    {"llm_gateway_hash_balance_factor": "1.25"},
    {"llm_gateway_drain_timeout_s": "5m"},
    {"llm_gateway_malloc_mmap_threshold_bytes": "4M"},  # glibc would read it as 4 bytes: every buffer mmapped
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One run over every case: host good, bad<i> (BAD[i]), nan<i> (NOT_NUMBER[i]) and gw, a gateway that is
    also in gpu_boxes."""
    local = {"ansible_connection": "local"}
    gateways = {"good": {**local, **GOOD}, "gw": {**local, "llm_gateway_backends": ["b1"]}}
    gateways |= {f"bad{i}": {**local, **gw_vars} for i, (gw_vars, _) in enumerate(BAD)}
    gateways |= {f"nan{i}": {**local, "llm_gateway_backends": ["b1"], **v} for i, v in enumerate(NOT_NUMBER)}
    inventory = {
        "all": {
            "hosts": {"plain": {}},
            "children": {
                "gpu_boxes": {"hosts": {"b1": {}, "b2": {}, "gw": {}}},
                "llm_gateways": {"hosts": gateways},
            },
        }
    }
    runs = ansible_vars.run_playbook(inventory, PLAYBOOK, tmp_path_factory.mktemp("llm-gateway-inputs"))
    assert set(gateways) <= set(runs), f"hosts without a result: {set(gateways) - set(runs)}"
    return runs


def validate_alone(tmp_path: Path, gw_vars: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """One case alone, with the default callback: a refusal under no_log shows its message on screen only."""
    local = {"ansible_connection": "local"}
    inventory = {
        "all": {
            "hosts": {"plain": {}},
            "children": {
                "gpu_boxes": {"hosts": {"b1": {}, "b2": {}}},
                "llm_gateways": {"hosts": {"gw": {**local, **gw_vars}}},
            },
        }
    }
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [str(ansible_vars.tool("ansible-playbook")), "-i", str(tmp_path / "hosts.json")]
    return subprocess.run([*argv, str(tmp_path / "play.yml")], env=env, cwd=ROOT, capture_output=True, text=True)


def refusal(runs: dict[str, dict[str, Any]], host: str) -> dict[str, Any]:
    failed = ansible_vars.first_failure(runs[host])
    assert failed is not None, f"{host} passed: {runs[host]['results']}"
    assert not any(r["task"] == "passed" for r in runs[host]["results"]), "a task ran after the refusal"
    return failed


def test_a_good_pool_passes(runs):
    assert ansible_vars.first_failure(runs["good"]) is None, runs["good"]["results"]
    assert [r["msg"] for r in runs["good"]["results"] if r["task"] == "passed"] == ["passed"]


@pytest.mark.parametrize(("gw_vars", "expected"), BAD)
def test_bad_input_is_refused(runs, tmp_path, gw_vars, expected):
    failed = refusal(runs, f"bad{BAD.index((gw_vars, expected))}")
    if failed.get("censored"):  # a check of a secret (no_log): its message is on screen alone
        done = validate_alone(tmp_path, gw_vars)
        assert done.returncode != 0 and expected in done.stdout and "Nothing was changed" in done.stdout, done.stdout
        return
    assert expected in failed["msg"], failed["msg"]
    assert "Nothing was changed" in failed["msg"]


@pytest.mark.parametrize("gw_vars", NOT_NUMBER, ids=str)
def test_a_value_that_is_no_number_is_refused_by_the_argument_spec(runs, gw_vars):
    failed = refusal(runs, f"nan{NOT_NUMBER.index(gw_vars)}")
    name = next(iter(gw_vars))
    assert "Validating arguments against arg spec" in failed["task"], failed["task"]
    assert re.search(rf"{name}.*(convert|int)", failed["msg"]), failed["msg"]


def test_a_gateway_that_is_a_gpu_box_is_refused(runs):
    assert "the gateway host gw is in gpu_boxes" in refusal(runs, "gw")["msg"]


# Two boxes serving qwen14b, one serving qwen72b-awq; tenant a may use qwen14b only (module_utils/gateway_pools.py).
_TENANTS = [{"name": "a", "models": ["qwen14b"]}, {"name": "ops", "models": None}]
PLAN = gateway_pools.pools(
    {
        box: {"served_model_name": model, "model_id": f"Qwen/{model}", "model_commit": "c" * 40, "stack": "pinned",
              "port": 443, "tenants": _TENANTS}
        for box, model in (("b1", "qwen14b"), ("b2", "qwen14b"), ("b3", "qwen72b-awq"))
    },
    dict.fromkeys(("b1", "b2", "b3"), "key-a-0123456789abcdef a\nkey-ops-0123456789abcdef ops\n"),
    {"b1": "10.0.0.1", "b2": "10.0.0.2", "b3": "10.0.0.3"},
)  # fmt: skip


def gateway_templar(knobs: dict | None = None):
    """The gateway host's templar and variables (the role's defaults and vars, one box), ``knobs`` over them."""
    from harness import ansible_vars

    return ansible_vars.templar_for(
        "unit-gw",
        roles=("llm_gateway",),
        groups=("fleet_cache",),
        extra_vars={
            "ansible_managed": "managed by a test",
            "__llm_gateway_plan": PLAN,
            **(knobs or {}),
        },
    )


def render(template: str, knobs: dict | None = None) -> list[str]:
    from ansible.template import trust_as_template

    templar, _ = gateway_templar(knobs)
    text = (ROOT / "roles/llm_gateway/templates" / template).read_text()
    return [line.strip() for line in templar.template(trust_as_template(text)).splitlines()]


def test_haproxy_file_limits_clients_forwards_the_client_and_answers_json():
    templar, variables = gateway_templar()
    lines = render("haproxy.cfg.j2")
    ciphers = templar.template(variables["llm_gateway_tls_ciphers"])
    # Mozilla intermediate: AEAD with ECDHE/DHE only, one fact written into both directions.
    assert ciphers.split(":")[0] == "ECDHE-ECDSA-AES128-GCM-SHA256" and "CBC" not in ciphers and ":AES" not in ciphers
    assert f"ssl-default-bind-ciphers {ciphers}" in lines and f"ssl-default-server-ciphers {ciphers}" in lines
    assert "ssl-default-bind-options ssl-min-ver TLSv1.2 no-tls-tickets" in lines
    # Every error HAProxy answers itself is OpenAI-style JSON: one errorfile for each status HAProxy 2.6 takes there
    # (tests/integration/test_front_door_live.py asks the binary which), and the refusal of a path not normal.
    errorfiles = [x.split() for x in lines if x.startswith("errorfile ")]
    assert [int(status) for _, status, _ in errorfiles] == [
        400, 401, 403, 404, 405, 407, 408, 410, 413, 421, 422, 425, 429, 500, 501, 502, 503, 504,
    ]  # fmt: skip
    assert all(path == f"/etc/haproxy/gpubox/errors/{status}.http" for _, status, path in errorfiles)
    assert not [x for x in lines if x.startswith("http-error ")]
    for line in (x for x in lines if x.startswith("http-request return status ") and " status 200 " not in x):
        assert "content-type application/json string " in line, line
        body = json.loads(re.search(r' string "((?:[^"\\]|\\.)*)"', line).group(1).replace('\\"', '"'))
        assert set(body["error"]) == {"message", "type", "code"}, line
    # Per-client limit first, then the client's own X-Forwarded-For dropped before HAProxy writes its own.
    frontend = lines[lines.index("frontend gpubox_api") :]
    assert "stick-table type ipv6 size 100k expire 20s store http_req_rate(10s)" in frontend
    assert (
        frontend.index("http-request track-sc0 src")
        < frontend.index("http-request deny deny_status 429 if { sc_http_req_rate(0) gt 200 }")
        < next(i for i, x in enumerate(frontend) if x.endswith(" if gpubox_path_not_normal"))
        < frontend.index("http-request deny deny_status 404 unless { path_beg /v1/ }")
        < frontend.index("http-request deny deny_status 401 unless { var(txn.gpubox_tenant) -m found }")
        < frontend.index("http-request lua.gpubox_route 1024 1048576")
        < frontend.index("use_backend pool_qwen14b if { var(txn.gpubox_model) -m str qwen14b }")
    )
    # Routed by the body's model to its pool; each tenant's /v1/models and grants from its models.
    assert "use_backend pool_qwen72b-awq if { var(txn.gpubox_model) -m str qwen72b-awq }" in frontend
    grant = next(x for x in frontend if "model_not_found" in x)
    assert grant.endswith("unless { var(txn.gpubox_grant) -m str a/qwen14b ops/qwen14b ops/qwen72b-awq }"), grant
    listed = [x for x in frontend if x.startswith("http-request return status 200 ")]
    assert (
        len(listed) == 2 and '\\"id\\":\\"qwen72b-awq\\"' not in listed[0] and "gpubox_tenant) -m str a }" in listed[0]
    )
    backends = [x for x in lines if x.startswith("backend ")]
    assert backends == ["backend pool_qwen14b", "backend pool_qwen72b-awq"]
    b1 = lines.index("backend pool_qwen14b")
    assert [x.split()[1] for x in lines[b1 : lines.index("backend pool_qwen72b-awq")] if x.startswith("server ")] == [
        "b1", "b2"]  # fmt: skip
    # A path the box's nginx would read as another (a dot-segment, a percent-encoded "." or "/") never passes.
    assert [x for x in frontend if x.startswith("acl gpubox_path_not_normal ")] == [
        "acl gpubox_path_not_normal path_sub -i /./ /../ %2e %2f",
        "acl gpubox_path_not_normal path_end /. /..",
    ]
    written = "http-request set-header X-Forwarded-For %[src] unless { src 127.0.0.1 ::1 ::ffff:127.0.0.1 }"
    assert frontend.index("http-request del-header X-Forwarded-For") < frontend.index(written)
    assert "option forwardfor" not in frontend


def test_each_errorfile_is_a_raw_http_response_whose_body_is_openai_json():
    # templates/gpubox-error.http.j2 for each of __llm_gateway_errors, as the role's template task writes it (the
    # same templar; harness/live_proxies.py writes the gateway's on loopback from it too). haproxy -c refuses a file
    # whose Content-Length is not its body's.
    from ansible.template import trust_as_template

    templar, variables = gateway_templar()
    text = (ROOT / "roles/llm_gateway/templates/gpubox-error.http.j2").read_text()
    errors = templar.template(variables["__llm_gateway_errors"])
    listed = [int(x.split()[1]) for x in render("haproxy.cfg.j2") if x.startswith("errorfile ")]
    assert [error["status"] for error in errors] == listed
    for error in errors:
        one = templar.copy_with_new_env(available_variables={**variables, "item": error})
        raw = one.template(trust_as_template(text))
        head, _, body = raw.partition("\n\n")
        status_line, *fields = head.split("\n")
        headers = dict(field.split(": ", 1) for field in fields)
        assert status_line == f"HTTP/1.1 {error['status']} {error['reason']}", raw
        assert headers["Content-Type"] == "application/json" and headers["Content-Length"] == str(len(body.encode()))
        assert json.loads(body) == {"error": {key: error[key] for key in ("message", "type", "code")}}, raw
        assert headers.get("WWW-Authenticate") == ("Bearer" if error["status"] == 401 else None), raw


def test_affinity_has_a_load_bound_unless_turned_off_and_a_reload_keeps_the_states():
    lines = render("haproxy.cfg.j2")
    backend = lines[lines.index("backend pool_qwen14b") :]
    assert "hash-type consistent" in backend and "hash-balance-factor 120" in backend
    # Placement: by the conversation's start (default), by the session header, or round-robin (no bound then).
    assert "balance hash var(txn.gpubox_prefix)" in backend
    session = render("haproxy.cfg.j2", {"llm_gateway_placement": "session"})
    assert "balance hdr(X-Session-Id)" in session and "hash-balance-factor 120" in session
    plain = render("haproxy.cfg.j2", {"llm_gateway_placement": "round-robin"})
    assert "balance roundrobin" in plain and not any(x.startswith("hash-") for x in plain)
    # A box in maintenance (playbooks/maintenance.yml) starts disabled; the others do not.
    held = render("haproxy.cfg.j2", {"__llm_gateway_maintenance": [{"box": "b2", "since": "x", "reason": ""}]})
    servers = {x.split()[1]: x.endswith(" disabled") for x in held if x.startswith("server ")}
    assert servers == {"b1": False, "b2": True, "b3": False}
    assert "timeout check 5000ms" in backend  # a check may outlast its interval (a busy box answers late)
    # idle connections to the boxes serve new clients' first requests; the retry of an empty answer covers the race
    assert "http-reuse always" in backend and "retry-on conn-failure empty-response 502 503" in backend
    assert not any(
        x.startswith("hash-balance-factor") for x in render("haproxy.cfg.j2", {"llm_gateway_hash_balance_factor": 0})
    )
    # the file the reload's saver writes (templates/server-state.conf.j2) is the one every section loads
    assert "server-state-file /run/gpubox-gateway/server-state" in lines
    defaults = lines[lines.index("defaults") : lines.index("frontend gpubox_api")]
    assert "load-server-state-from-file global" in defaults


def test_the_reload_saves_the_states_between_the_check_and_the_signal():
    lines = [x for x in render("server-state.conf.j2") if x.startswith("Exec")]
    assert lines == [
        "ExecStartPre=/bin/rm -f /run/gpubox-gateway/server-state",
        "ExecReload=",
        "ExecReload=/usr/sbin/haproxy -Ws -f $CONFIG -c -q $EXTRAOPTS",
        "ExecReload=/usr/bin/python3 /usr/local/lib/gpubox/haproxy_runtime.py save-state "
        "/run/gpubox-gateway/admin.sock /run/gpubox-gateway/server-state",
        "ExecReload=/bin/kill -USR2 $MAINPID",
    ]


def test_haproxys_environment_holds_glibcs_thresholds_and_nothing_else_that_could_restart_it():
    # templates/malloc.conf.j2: the one Environment= line, from the role's two values alone (a change restarts
    # HAProxy; tests/integration/test_gateway_malloc.py runs it)
    lines = render("malloc.conf.j2")
    assert [x for x in lines if x and not x.startswith("#")] == [
        "[Service]",
        "Environment=GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4194304:glibc.malloc.trim_threshold=268435456",
    ]
    # a smaller body bound from the boxes' tenants changes HAProxy's buffer, never this file
    assert render("malloc.conf.j2", {"__llm_gateway_max_body_bytes": 4096}) == lines
    assert "tune.bufsize 1115136" in render("haproxy.cfg.j2")
    assert "tune.bufsize 70656" in render("haproxy.cfg.j2", {"__llm_gateway_max_body_bytes": 4096})
