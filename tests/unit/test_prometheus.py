"""The Prometheus scrape configuration and alert rules in roles/metrics/files/prometheus pass promtool's
checks, and every alert's unit tests (series in, alerts out) pass `promtool test rules`.

promtool is Debian's (package `prometheus`); `make unit` unpacks it into the cache and points
GPUBOX_PROMTOOL at it (Makefile target promtool), so no Prometheus server is installed or started.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "roles" / "metrics" / "files" / "prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    found = os.environ.get("GPUBOX_PROMTOOL") or shutil.which("promtool")
    assert found and Path(found).is_file(), "promtool not found: run `make unit` (target promtool unpacks Debian's)"
    return found


def run(promtool: str, *args: str, cwd: Path = PROM_DIR) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, check=False)


def test_scrape_config_is_valid(promtool: str) -> None:
    proc = run(promtool, "check", "config", "prometheus.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_alert_rules_are_valid(promtool: str) -> None:
    proc = run(promtool, "check", "rules", "gpubox-alerts.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 17 rules found" in proc.stdout


def test_alert_unit_tests_pass(promtool: str) -> None:
    proc = run(promtool, "test", "rules", "gpubox-alerts.test.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_unit_test() -> None:
    rules = (PROM_DIR / "gpubox-alerts.yml").read_text()
    tests = (PROM_DIR / "gpubox-alerts.test.yml").read_text()
    names = [line.split(":", 1)[1].strip() for line in rules.splitlines() if line.strip().startswith("- alert:")]
    assert len(names) == 17  # 7 of the box and the model, 9 of its GPUs, 1 of the front door's tenant counts
    for name in names:
        assert f"alertname: {name}" in tests, f"{name} has no promtool unit test"


def test_unit_tests_catch_a_loosened_threshold(promtool: str, tmp_path: Path) -> None:
    # The tests mean something: with the KV-cache tolerance at 50 % instead of 10 %, they fail.
    for name in ("gpubox-alerts.yml", "gpubox-alerts.test.yml"):
        shutil.copy(PROM_DIR / name, tmp_path / name)
    rules = tmp_path / "gpubox-alerts.yml"
    rules.write_text(
        rules.read_text().replace("> 0.10 * gpubox_kv_cache_blocks_planned", "> 0.50 * gpubox_kv_cache_blocks_planned")
    )
    proc = run(promtool, "test", "rules", "gpubox-alerts.test.yml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "GpuboxKvCacheOffPlan" in proc.stdout + proc.stderr


def test_the_memory_alert_follows_the_planned_share(promtool: str, tmp_path: Path) -> None:
    # A fixed threshold in place of vLLM's planned share: the tests fail.
    for name in ("gpubox-alerts.yml", "gpubox-alerts.test.yml"):
        shutil.copy(PROM_DIR / name, tmp_path / name)
    rules = tmp_path / "gpubox-alerts.yml"
    text = rules.read_text()
    share = "> on (instance) group_left () (gpubox_gpu_memory_planned_share + 0.03)"
    assert share in text
    rules.write_text(text.replace(share, "> 0.98"))
    proc = run(promtool, "test", "rules", "gpubox-alerts.test.yml", cwd=tmp_path)
    assert proc.returncode != 0 and "GpuboxGpuMemoryBeyondPlan" in proc.stdout + proc.stderr
