"""tools/check_dashboard.py: PromQL metric-name extraction, and the dashboard in roles/metrics checked against
vLLM 0.7.3's metric names as declared in its released source (tests/data; the serving scenario checks the
names of a real scrape, the default scenario the node and gpubox names it scraped)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import check_dashboard

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "roles" / "metrics" / "files" / "grafana" / "gpubox.json"
VLLM_NAMES = ROOT / "tests" / "data" / "vllm-0.7.3-metric-names.txt"
TOOL = ROOT / "tools" / "check_dashboard.py"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'rate(node_cpu_seconds_total{mode="idle",instance=~"$instance"}[$__rate_interval])',
            {"node_cpu_seconds_total"},
        ),
        (
            "histogram_quantile(0.95, sum by (le, instance) (rate(vllm:time_to_first_token_seconds_bucket[5m])))",
            {"vllm:time_to_first_token_seconds_bucket"},
        ),
        ("a_total / on(instance) group_left(model) b_info", {"a_total", "b_info"}),
        ('count by (driver) (gpubox_info{commit!="x y"}) offset 1h > 1e3', {"gpubox_info"}),
        ('label_replace(up, "dst", "$1", "src", "(.*)") and bool_metric', {"up", "bool_metric"}),
        ("sum without (cpu) (node_x) unless ignoring(job) node_y", {"node_x", "node_y"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert check_dashboard.metric_names(expr) == names


def test_dashboard_is_grafana_json_with_node_gpubox_and_vllm_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = set().union(*(check_dashboard.metric_names(q.expr) for q in check_dashboard.queries(dashboard)))
    assert {n.split("_", 1)[0] for n in names if not n.startswith("vllm:")} == {"gpubox", "node"}
    assert any(n.startswith("vllm:") for n in names)
    assert {"gpubox_info", "gpubox_kv_cache_blocks_planned", "gpubox_kv_cache_blocks_actual"} <= names


def test_dashboard_vllm_queries_name_vllm_073_metrics() -> None:
    proc = subprocess.run(
        [sys.executable, str(TOOL), str(DASHBOARD), "--names", str(VLLM_NAMES), "--skip-prefix", "node_",
         "--skip-prefix", "gpubox_"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_query_of_a_metric_not_scraped_fails(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    dashboard["panels"].append(
        {
            "type": "row",
            "title": "r",
            "panels": [{"title": "Renamed", "targets": [{"expr": "vllm:kv_cache_usage_perc"}]}],
        }
    )
    path = tmp_path / "d.json"
    path.write_text(json.dumps(dashboard))
    proc = subprocess.run(
        [sys.executable, str(TOOL), str(path), "--names", str(VLLM_NAMES), "--skip-prefix", "node_",
         "--skip-prefix", "gpubox_"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "panel 'Renamed' queries vllm:kv_cache_usage_perc" in proc.stdout


@pytest.mark.parametrize(
    ("content", "names"),
    [("{not json", "up\n"), ('{"title": "no panels"}', "up\n"), ('{"panels": []}', "up\n"), ('{"panels": []}', "")],
)
def test_unusable_inputs_exit_2(tmp_path: Path, content: str, names: str) -> None:
    (tmp_path / "d.json").write_text(content)
    (tmp_path / "n.txt").write_text(names)
    assert check_dashboard.main([str(tmp_path / "d.json"), "--names", str(tmp_path / "n.txt")]) == 2
