"""Verify the box after the crash suite: every point was struck, and the box converged anyway.

crash_suite.py (run by converge.yml) wrote its results on the controller; here they are read back and
the box is checked as a user would: packages consistent, the environment imports vLLM, the live model
verifies against its manifest, a completion with the key succeeds, no download unit left behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Beside the scenario's log (tools/run_scenarios.py): .cache/molecule-logs/crash/ (per-run logs, results).
RESULTS = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", "/nonexistent")) / ".cache/molecule-logs/crash/results.json"
WATCHER = "/usr/local/libexec/gpubox-crash/watcher.py"

COMPLETE = r"""
import json, urllib.request
key = next(l.split("=", 1)[1].strip() for l in open("/etc/gpubox/vllm.env") if l.startswith("VLLM_API_KEY="))
body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4}).encode()
req = urllib.request.Request("http://127.0.0.1:8000/v1/completions", data=body,
                             headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
with urllib.request.urlopen(req, timeout=120) as resp:
    print(json.dumps({"status": resp.status, "body": json.loads(resp.read())}))
"""


def test_every_point_was_struck_and_the_box_converged_after() -> None:
    results = json.loads(RESULTS.read_text())
    points = results["points"]
    assert len(points) >= 10
    assert [p["point"] for p in points if not p["struck"]] == []
    assert [(p["point"], p["invariants"]) for p in points if p["invariants"]] == []
    assert {p["action"] for p in points} == {"kill", "freeze"}
    final = {run["run"]: run for run in results["final"]}
    assert final["converge"]["rc"] == 0
    assert final["idempotence"]["rc"] == 0 and final["idempotence"]["recap"]["changed"] == 0
    # ... with the hub's master moved upstream before it: the lock held, no file was fetched (day two, step 2)
    assert final["idempotence"]["master_now"] != final["idempotence"]["master_was"]
    assert final["idempotence"]["hub_file_gets"] == []


def test_packages_are_consistent(host) -> None:
    assert host.check_output("dpkg --audit") == ""


def test_the_environment_imports_vllm(host) -> None:
    assert host.run("/opt/gpubox/venv-lts-580/bin/python -c 'import vllm'").rc == 0


def test_the_live_model_verifies_against_its_manifest(host) -> None:
    check = json.loads(host.check_output(f"python3 {WATCHER} --check /data/models"))
    assert check["live"] and check["problems"] == []


def test_a_completion_with_the_key_succeeds(host) -> None:
    out = json.loads(host.check_output("python3 -c %s", COMPLETE))
    assert out["status"] == 200 and out["body"]["choices"][0]["text"] is not None


def test_no_download_unit_or_staging_is_left(host) -> None:
    units = host.check_output("systemctl list-units --all --plain --no-legend 'gpubox-model-fetch-*'")
    assert units.strip() == ""
    staging = host.check_output("ls -A /data/models/.staging").split()
    assert [name for name in staging if not name.endswith(".lock")] == []
