"""Verify the metrics role on the simulated 2 x RTX 3090 box (host layer only: no model, no vLLM).

node-exporter is scraped inside the box, as Prometheus would over the network; the textfile metrics must
carry what the roles published, the node and systemd collectors must answer, and the Grafana dashboard's
node and gpubox panels must query only metrics this scrape returned. The scraped names are written to
.cache/molecule-logs/day2_driver.metric-names.txt for the dashboard check (tools/check_dashboard.py).
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NAMES_FILE = ROOT / ".cache" / "molecule-logs" / "day2_driver.metric-names.txt"
DASHBOARD = ROOT / "roles" / "metrics" / "files" / "grafana" / "gpubox.json"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
SCRAPE = (
    "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics', timeout=30).read().decode())"
)


@pytest.fixture(scope="module")
def scrape(host):
    text = host.check_output(f'python3 -c "{SCRAPE}"')
    samples = []
    for line in text.splitlines():
        match = SAMPLE.match(line.strip())
        if match:
            samples.append((match.group(1), match.group(2) or "", match.group(3)))
    assert samples, text[:2000]
    return samples


def values(samples, name, labels=""):
    return [float(v) for n, lab, v in samples if n == name and all(part in lab for part in labels.split(","))]


def test_node_exporter_runs_from_debians_package(host):
    assert host.package("prometheus-node-exporter").is_installed
    svc = host.service("prometheus-node-exporter")
    assert svc.is_running and svc.is_enabled
    assert host.socket("tcp://0.0.0.0:9100").is_listening
    args = host.file("/etc/default/prometheus-node-exporter").content_string
    assert "--collector.textfile.directory=/var/lib/prometheus/node-exporter" in args


@pytest.mark.parametrize("unit", ["prometheus-node-exporter.service", "gpubox-gpu-check.service"])
def test_units_locked_down_on_the_converged_box(host, unit):
    # systemd-analyze inside the box, on the unit as loaded (node-exporter: the package's unit + our drop-in)
    report = host.check_output(f"systemd-analyze security --no-pager {unit}")
    score = float(re.search(r"Overall exposure level for \S+: (\d+\.\d+)", report).group(1))
    assert score <= 2.5, report
    assert host.service(unit).is_running or unit == "gpubox-gpu-check.service"
    props = host.check_output(f"systemctl show -p ActiveState -p Result {unit}")
    assert "ActiveState=active" in props and "Result=success" in props, props


def test_textfile_written_whole_by_root(host):
    prom = host.file("/var/lib/prometheus/node-exporter/gpubox.prom")
    assert prom.user == "root" and prom.mode == 0o644
    leftovers = host.check_output("ls -A /var/lib/prometheus/node-exporter").split()
    # gpubox.prom (box_metrics) and gpubox_gpu.prom (the GPU collector), each renamed into place: no temp file.
    assert sorted(leftovers) == ["gpubox.prom", "gpubox_gpu.prom"], leftovers
    gpu = host.file("/var/lib/prometheus/node-exporter/gpubox_gpu.prom")
    assert gpu.user == "root" and gpu.mode == 0o644


def test_gpubox_info_from_the_roles_facts(scrape):
    info = [lab for n, lab, v in scrape if n == "gpubox_info" and v == "1"]
    assert len(info) == 1, info
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info[0]))
    # driver: nvidia_driver's pin; cuda: cuda_toolkit's version; p2p: the GPU check's verdict (NVLink bridge)
    assert labels == {"driver": "535.261.03-1", "cuda": "12.2", "p2p": "enabled"}


def test_planned_blocks_equal_make_plan_and_nothing_unknown_is_exported(scrape):
    argv = [sys.executable, str(ROOT / "tools" / "plan.py"), "-l", "gpu_2x3090"]
    plan = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    planned = int(re.search(r"^GPU blocks\s+(\d+)", plan, re.M).group(1))
    assert values(scrape, "gpubox_kv_cache_blocks_planned") == [planned]
    names = {n for n, _lab, _v in scrape}
    # host layer only: no model, no vLLM on this box
    assert not names & {"gpubox_model_verified", "gpubox_kv_cache_blocks_actual"}


def test_node_and_systemd_collectors_answer(scrape):
    assert values(scrape, "node_textfile_scrape_error") == [0.0]
    assert values(scrape, "node_memory_MemTotal_bytes")[0] > 0
    assert values(scrape, "node_cpu_seconds_total", 'mode="idle"')
    assert values(scrape, "node_systemd_unit_state", 'name="gpubox-gpu-check.service",state="active"') == [1.0]
    assert values(scrape, "node_systemd_service_restart_total", 'name="gpubox-gpu-check.service"') == [0.0]


def test_dashboard_node_and_gpubox_panels_query_scraped_metrics(scrape):
    NAMES_FILE.parent.mkdir(parents=True, exist_ok=True)
    NAMES_FILE.write_text("\n".join(sorted({n for n, _lab, _v in scrape})) + "\n")
    # gpubox_kv_cache_blocks_actual and gpubox_model_verified exist only where vLLM serves: the serving
    # scenario checks them with vLLM's own names; here every node and host-layer gpubox query is checked.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_dashboard.py"), str(DASHBOARD), "--names", str(NAMES_FILE),
         "--skip-prefix", "vllm:", "--skip-prefix", "gpubox_kv_cache_blocks_actual",
         "--skip-prefix", "gpubox_model_verified"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
