"""Verify the host layer on the simulated 4 x RTX 4090 box: PCIe only, the driver reports no P2P."""

import json
import os
from pathlib import Path

from harness.ansible_vars import json_report, scenario_playbook

PIN = "535.261.03-1"
BOX = "gpubox-m-4x4090"


def test_driver_pinned_and_held(host):
    assert host.package("nvidia-smi").version == PIN
    assert "nvidia-smi" in host.check_output("apt-mark showhold").split()


def test_gpu_check_disables_p2p(host):
    props = host.check_output("systemctl show -p ActiveState -p Result gpubox-gpu-check.service")
    assert "ActiveState=active" in props and "Result=success" in props
    lines = host.file("/etc/gpubox/nccl.env").content_string.splitlines()
    assert "NCCL_P2P_DISABLE=1" in [line.strip() for line in lines if not line.startswith("#")]


def test_gpu_check_saw_four_gpus_without_p2p(host):
    state = json.loads(host.file("/var/lib/gpubox/gpu-check.json").content_string)
    pairs = state["p2p_read"]
    assert len(pairs) == 6  # 4 GPUs -> 6 pairs
    assert all(v != "OK" for v in pairs.values())
    assert not any(v.startswith("NV") for v in state["links"].values())


def test_swappiness_from_group_vars(host):
    assert "vm.swappiness=1" in host.file("/etc/sysctl.d/60-gpubox.conf").content_string.replace(" ", "")


def test_reboot_gate_skipped_only_because_this_is_a_container(host):
    # No gpubox_reboot_skip here (roles/gpubox default false): the container is the only cause.
    gate = json.loads(host.file("/etc/ansible/facts.d/gpubox_reboot.fact").content_string)
    assert "NVIDIA driver or nouveau blacklist changed" in gate["reasons"], gate
    assert gate["decision"] == "skipped", gate
    assert gate["skipped_by"] == "container", gate
    assert gate["skip_causes"] == ["container"], gate


def test_metrics_export_the_p2p_verdict_and_the_4x4090_plan(host):
    # node-exporter scraped inside the box; the numbers come from the GPU check and preflight's plan
    # (make plan -l gpu_4x4090: 8779 blocks).
    code = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())"
    text = host.check_output(f'python3 -c "{code}"')
    lines = [line for line in text.splitlines() if line.startswith("gpubox_")]
    assert 'gpubox_info{cuda="12.2",driver="535.261.03-1",p2p="disabled"} 1' in lines, lines
    assert "gpubox_kv_cache_blocks_planned 8779" in lines, lines


# ---------------------------------------------------------------- the plan on each stack, on this box
PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))


def preflight_on(stack: str) -> dict:
    """playbooks/preflight.yml against this box with gpubox_stack set; the json callback's result (the
    profile_tasks lines around it skipped)."""
    proc = scenario_playbook(PROJECT / "playbooks/preflight.yml", f"gpubox_stack={stack}", callback="json", limit=BOX)
    result = json_report(proc.stdout)
    tables = [
        host["msg"]
        for play in result["plays"]
        for task in play["tasks"]
        if task["task"]["name"].endswith("Show what was found and the memory plan")  # "preflight : Show ..."
        for host in task["hosts"].values()
    ]
    return {"rc": proc.returncode, "stats": result["stats"][BOX], "table": tables[0] if tables else []}


def test_the_box_plans_on_both_stacks_and_preflight_changes_nothing():
    """Issue 33: both topologies plan on both stacks. The 4 x 4090 box converged on the pinned stack; its
    preflight on each stack names the stack and its engine and fits the group's model (Qwen2.5-72B AWQ, tp 4),
    with the KV cache of each engine's own budget (V0's and V1's differ), and changes nothing."""
    kv = {}
    for stack, engine in (("pinned-0.7.3", "V0 engine"), ("lts-580", "V1 engine")):
        run = preflight_on(stack)
        assert run["rc"] == 0 and run["stats"]["failures"] == 0 and run["stats"]["changed"] == 0, run
        table = run["table"]
        assert any(line.startswith(f"stack {stack}:") and engine in line for line in table), table
        assert any(line.startswith("plan: fits") and " yes " in line for line in table), table
        kv[stack] = next(line for line in table if line.startswith("plan: KV cache"))
    assert kv["pinned-0.7.3"] != kv["lts-580"], kv
