"""Tests of the GPU edge: nvidia-smi/sysfs parsing (gpubox_gpu), the replay nvidia-smi, the fake
sysfs writer and the boot-time gpubox-gpu-check script. The gpubox.gpubox.gpu_facts and gpu_check_library
modules run through `ansible localhost`, and the probe compiled with nvcc, in tests/integration/test_modules.py.

h200x2 is a REAL capture (2x H200, driver 580.159.04); the rtx* boxes are DERIVED (see
tests/fixtures/nvidia-smi/README.md).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import gpu_parsers as g
from harness.fakegpu import FIXTURES, REPLAY, make_sysfs, replay_bin, sim_env

ROOT = Path(__file__).resolve().parents[2]

REFERENCE = FIXTURES / "_reference" / "h200x2"
GPU_CHECK = ROOT / "roles" / "gpu_tuning" / "files" / "gpubox-gpu-check"
BOXES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and not p.name.startswith("_"))
BOX_FILES = {
    "q.xml",
    "topo-m.txt",
    "topo-p2p-r.txt",
    "query-gpu.csv",
    "version.txt",
    "sysfs.json",
    "README.md",
}


def read(box: str, name: str) -> str:
    return (FIXTURES / box / name).read_text()


def facts_for(box: str, sysfs_root: Path | str = "/nonexistent") -> dict:
    return g.gpu_facts(
        query_xml=read(box, "q.xml"),
        topo_m=read(box, "topo-m.txt"),
        topo_p2p_r=read(box, "topo-p2p-r.txt"),
        query_csv=read(box, "query-gpu.csv"),
        sysfs_root=sysfs_root,
    )


def replay(box: str, state: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPLAY), *args], env=sim_env(box, state, **extra), capture_output=True, text=True
    )


# --------------------------------------------------------------------------- fixture layout


def test_expected_boxes_are_present() -> None:
    assert BOXES == ["h200x2", "rtx3090x2-nvlink", "rtx3090x2-pcie", "rtx4090x4"]


@pytest.mark.parametrize("box", BOXES)
def test_box_holds_exactly_the_documented_files(box: str) -> None:
    expected = BOX_FILES | ({"p2p-probe.json"} if box == "h200x2" else set())
    assert {p.name for p in (FIXTURES / box).iterdir()} == expected


@pytest.mark.parametrize("box", [b for b in BOXES if b != "h200x2"])
def test_derived_boxes_are_labelled_and_current(box: str) -> None:
    assert "DERIVED" in read(box, "README.md")
    spec = importlib.util.spec_from_file_location("gpubox_derive_boxes", FIXTURES / "derive_boxes.py")
    derive = sys.modules.setdefault("gpubox_derive_boxes", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(derive)
    definition = next(b for b in derive.BOXES if b.name == box)
    assert read(box, "q.xml") == derive.make_q_xml(definition), "re-run derive_boxes.py"
    assert read(box, "topo-m.txt") == derive.make_topo_m(definition)
    assert read(box, "topo-p2p-r.txt") == derive.make_topo_p2p(definition)


def test_real_capture_keeps_ansi_codes_and_is_labelled_real() -> None:
    assert "\x1b[4m" in read("h200x2", "topo-m.txt")
    assert "\x1b[4m" in read("h200x2", "topo-p2p-r.txt")
    assert "REAL" in read("h200x2", "README.md")


# --------------------------------------------------------------------------- the real capture


def test_h200x2_real_capture_facts(tmp_path: Path) -> None:
    make_sysfs("h200x2", tmp_path)
    facts = facts_for("h200x2", tmp_path)
    assert facts["source"] == "nvidia-smi"
    assert facts["driver_version"] == "580.159.04"
    assert facts["cuda_version"] == "13.0"
    assert facts["count"] == 2
    assert [gpu["name"] for gpu in facts["gpus"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert [gpu["pci_bus_id"] for gpu in facts["gpus"]] == ["00000000:00:06.0", "00000000:00:07.0"]
    assert facts["gpus"][0]["uuid"] == "GPU-d94418e6-a6b4-a953-a9e0-e776c13b31af"
    for gpu in facts["gpus"]:
        assert gpu["memory_total_mib"] == 143771
        assert gpu["persistence_mode"] is True
        assert gpu["pcie_link_gen_current"] == 5
        assert (gpu["pcie_link_width_current"], gpu["pcie_link_width_max"]) == (16, 16)
        assert gpu["bar1_total_mib"] == 262144
        assert gpu["pci_device_id"] == "0x2335"
    assert facts["links"] == {"0-1": "NV18"}
    assert facts["p2p_read"] == {"0-1": "OK"}
    assert facts["loaded_module_version"] == "580.159.04"
    assert facts["nvidia_smi_error"] is None


def test_h200x2_sysfs_agrees_with_nvidia_smi(tmp_path: Path) -> None:
    """Both views are real captures of the same machine: sysfs BAR1 (resource line 2 on a GPU with a
    64-bit BAR0) must equal nvidia-smi's BAR1 total."""
    make_sysfs("h200x2", tmp_path)
    smi = facts_for("h200x2")
    sysfs = g.gpu_facts(sysfs_root=tmp_path)
    assert sysfs["source"] == "sysfs"
    assert [x["pci_bus_id"] for x in sysfs["gpus"]] == [x["pci_bus_id"] for x in smi["gpus"]]
    assert [x["bar1_total_mib"] for x in sysfs["gpus"]] == [x["bar1_total_mib"] for x in smi["gpus"]]
    assert [x["pcie_link_gen_current"] for x in sysfs["gpus"]] == [5, 5]


def test_real_probe_result_on_h200x2() -> None:
    data = json.loads(read("h200x2", "p2p-probe.json"))
    assert data["devices"] == 2
    assert data["pairs"] == {"0-1": "OK", "1-0": "OK"}
    result = g.parse_probe_output(read("h200x2", "p2p-probe.json"), 0, gpu_count=2)
    assert result.status == "passed"
    assert g.nccl_env_for(facts_for("h200x2")["p2p_read"], result.verdict) == {}


def test_real_probe_without_device_counts_as_unavailable() -> None:
    result = g.parse_probe_output((REFERENCE / "p2p-probe-nodev.json").read_text(), 2, gpu_count=2)
    assert result.status == "unavailable"
    assert "cudaErrorNoDevice" in result.detail
    assert result.verdict is None


# --------------------------------------------------------------------------- every box


@pytest.mark.parametrize("box", BOXES)
def test_every_box_parses_consistently(box: str) -> None:
    facts = facts_for(box)
    n = facts["count"]
    assert n == len(read(box, "query-gpu.csv").strip().splitlines())
    assert [gpu["index"] for gpu in facts["gpus"]] == list(range(n))
    all_pairs = {f"{i}-{j}" for i in range(n) for j in range(i + 1, n)}
    assert set(facts["links"]) == all_pairs
    assert set(facts["p2p_read"]) == all_pairs
    csv_gpus = g.gpus_from_csv(g.parse_query_csv(read(box, "query-gpu.csv")))
    for from_xml, from_csv in zip(facts["gpus"], csv_gpus):
        for key in ("name", "uuid", "pci_bus_id", "memory_total_mib", "pcie_link_width_current"):
            assert from_xml[key] == getattr(from_csv, key)


def test_rtx3090_nvlink_box() -> None:
    facts = facts_for("rtx3090x2-nvlink")
    assert facts["driver_version"] == "535.261.03" and facts["cuda_version"] == "12.2"
    assert facts["links"] == {"0-1": "NV4"}
    assert facts["p2p_read"] == {"0-1": "OK"}
    assert {gpu["name"] for gpu in facts["gpus"]} == {"NVIDIA GeForce RTX 3090"}
    assert {gpu["memory_total_mib"] for gpu in facts["gpus"]} == {24576}
    assert {gpu["bar1_total_mib"] for gpu in facts["gpus"]} == {32768}
    assert {gpu["pci_device_id"] for gpu in facts["gpus"]} == {"0x2204"}
    assert facts["gpus"][1]["pci_bus_id"] == "00000000:4B:00.0"
    assert {gpu["persistence_mode"] for gpu in facts["gpus"]} == {False}


def test_rtx3090_pcie_box_is_unhealthy() -> None:
    facts = facts_for("rtx3090x2-pcie")
    assert facts["links"] == {"0-1": "PHB"}
    assert facts["p2p_read"] == {"0-1": "NS"}
    second = facts["gpus"][1]
    assert (second["pcie_link_width_current"], second["pcie_link_width_max"]) == (4, 16)
    assert {gpu["bar1_total_mib"] for gpu in facts["gpus"]} == {256}


def test_rtx4090x4_box_ignores_the_nic_and_has_no_p2p() -> None:
    facts = facts_for("rtx4090x4")
    assert facts["count"] == 4
    assert {gpu["memory_total_mib"] for gpu in facts["gpus"]} == {24564}
    assert {gpu["pci_device_id"] for gpu in facts["gpus"]} == {"0x2684"}
    assert "NIC0" in g.strip_ansi(read("rtx4090x4", "topo-m.txt"))
    assert not any(v.startswith("NV") for v in facts["links"].values())
    assert set(facts["links"].values()) == {"NODE", "SYS"}
    assert set(facts["p2p_read"].values()) == {"NS", "CNS"}


# --------------------------------------------------------------------------- sysfs fallback


@pytest.mark.parametrize("box", BOXES)
def test_sysfs_fallback_for_every_box(box: str, tmp_path: Path) -> None:
    make_sysfs(box, tmp_path)
    smi = facts_for(box)
    facts = g.gpu_facts(sysfs_root=tmp_path, nvidia_smi_error="simulated failure")
    assert facts["source"] == "sysfs"
    assert facts["count"] == smi["count"]  # the HDMI audio functions (class 0x0403) are not GPUs
    assert facts["driver_version"] is None
    assert facts["nvidia_smi_error"] == "simulated failure"
    for sys_gpu, smi_gpu in zip(facts["gpus"], smi["gpus"]):
        assert sys_gpu["pci_bus_id"] == smi_gpu["pci_bus_id"]
        assert sys_gpu["pci_device_id"] == smi_gpu["pci_device_id"]
        assert sys_gpu["name"] == f"PCI 10de:{smi_gpu['pci_device_id'][2:]}"
        assert sys_gpu["pcie_link_width_current"] == smi_gpu["pcie_link_width_current"]
        assert sys_gpu["pcie_link_width_max"] == smi_gpu["pcie_link_width_max"]
        assert sys_gpu["bar1_total_mib"] == smi_gpu["bar1_total_mib"]
        assert sys_gpu["memory_total_mib"] is None and sys_gpu["uuid"] is None
    assert facts["loaded_module_version"] == json.loads(read(box, "sysfs.json"))["nvidia_module_version"]


def test_sysfs_without_module_or_devices(tmp_path: Path) -> None:
    make_sysfs("rtx3090x2-pcie", tmp_path, "--no-module")
    assert g.loaded_module_version(tmp_path) is None
    assert g.gpu_facts(sysfs_root=tmp_path)["count"] == 2
    assert g.gpu_facts(sysfs_root=tmp_path / "empty")["count"] == 0


def test_make_sysfs_module_version_override(tmp_path: Path) -> None:
    make_sysfs("rtx3090x2-nvlink", tmp_path, "--module-version", "535.183.01")
    assert g.loaded_module_version(tmp_path) == "535.183.01"


def test_sysfs_class_filter_skips_non_gpu_nvidia_functions(tmp_path: Path) -> None:
    make_sysfs("rtx4090x4", tmp_path)
    nvswitch = tmp_path / "sys/bus/pci/devices/0000:c0:00.0"
    nvswitch.mkdir(parents=True)
    (nvswitch / "vendor").write_text("0x10de\n")
    (nvswitch / "class").write_text("0x068000\n")  # a bridge-class NVIDIA function (e.g. NVSwitch)
    assert [d.bdf for d in g.scan_sysfs(tmp_path)] == [
        "0000:1a:00.0",
        "0000:3d:00.0",
        "0000:89:00.0",
        "0000:b1:00.0",
    ]


@pytest.mark.parametrize(
    ("speed", "gen"),
    [("2.5 GT/s PCIe", 1), ("8.0 GT/s PCIe", 3), ("16 GT/s", 4), ("32.0 GT/s PCIe", 5), ("", None)],
)
def test_pcie_gen_from_speed(speed: str, gen: int | None) -> None:
    assert g.pcie_gen_from_speed(speed) == gen


# --------------------------------------------------------------------------- garbage in


@pytest.mark.parametrize(
    ("func", "text", "command", "why"),
    [
        (g.parse_query_xml, "Failed to initialize NVML: Unknown Error", "nvidia-smi -q -x", "well-formed"),
        (g.parse_query_xml, "", "nvidia-smi -q -x", "empty"),
        (g.parse_query_xml, "<html><body>hi</body></html>", "nvidia-smi -q -x", "<nvidia_smi_log>"),
        (
            g.parse_query_xml,
            "<nvidia_smi_log><attached_gpus>2</attached_gpus></nvidia_smi_log>",
            "nvidia-smi -q -x",
            "attached_gpus says 2",
        ),
        (g.parse_topo_matrix, "No devices were found", "nvidia-smi topo -m", "GPU0"),
        (g.parse_topo_matrix, "\tGPU0\tGPU1\nGPU0\t X \tNV4\n\nLegend:\n", "nvidia-smi topo -m", "rows"),
        (
            g.parse_topo_matrix,
            "\tGPU0\tGPU1\nGPU0\t X \tWARP9\nGPU1\tNV4\t X \n",
            "nvidia-smi topo -m",
            "WARP9",
        ),
        (g.parse_topo_p2p, " \tGPU0\tGPU1\t\n GPU0\tX\tMAYBE\t\n GPU1\tOK\tX\t\n", "topo -p2p r", "MAYBE"),
        (g.parse_query_csv, "0, NVIDIA H200, GPU-x\n", "--query-gpu", "3 values for 10 fields"),
        (g.parse_query_csv, "\n", "--query-gpu", "empty"),
    ],
)
def test_garbage_raises_the_dedicated_error(func, text: str, command: str, why: str) -> None:
    with pytest.raises(g.GpuParseError) as info:
        func(text)
    assert command in str(info.value)
    assert why in str(info.value)


def test_gpu_facts_names_the_failing_command() -> None:
    with pytest.raises(g.GpuParseError, match="topo -p2p r"):
        g.gpu_facts(query_xml=read("h200x2", "q.xml"), topo_p2p_r="garbage")
    with pytest.raises(g.GpuParseError, match="differ from those of"):
        g.gpu_facts(query_xml=read("h200x2", "q.xml"), query_csv=read("rtx3090x2-pcie", "query-gpu.csv"))


def test_bad_resource_file(tmp_path: Path) -> None:
    with pytest.raises(g.GpuParseError, match="resource"):
        g.parse_resource("0x0 0x1\n")


# --------------------------------------------------------------------------- the P2P decision


@pytest.mark.parametrize(
    ("p2p_read", "probe", "expected"),
    [
        ({}, None, {}),  # single GPU
        ({}, {}, {}),
        ({"0-1": "OK"}, None, {}),
        ({"0-1": "NS"}, None, {"NCCL_P2P_DISABLE": "1"}),
        ({"0-1": "CNS"}, None, {"NCCL_P2P_DISABLE": "1"}),
        ({"0-1": "OK", "0-2": "OK", "1-2": "TNS"}, None, {"NCCL_P2P_DISABLE": "1"}),
        ({"0-1": "OK"}, {"0-1": "OK", "1-0": "OK"}, {}),
        ({"0-1": "OK"}, {"0-1": "OK", "1-0": "MISMATCH"}, {"NCCL_P2P_DISABLE": "1"}),  # probe wins
        ({"0-1": "OK"}, {"0-1": "TIMEOUT", "1-0": "TIMEOUT"}, {"NCCL_P2P_DISABLE": "1"}),
        ({"0-1": "OK"}, {"0-1": "ERROR: cudaErrorPeerAccessUnsupported: x"}, {"NCCL_P2P_DISABLE": "1"}),
        ({"0-1": "OK"}, {"0-1": "NO_PEER_ACCESS", "1-0": "NO_PEER_ACCESS"}, {"NCCL_P2P_DISABLE": "1"}),
        ({"0-1": "NS"}, {"0-1": "OK", "1-0": "OK"}, {}),  # probe verified the pair: it wins
        ({"0-1": "OK", "0-2": "NS", "1-2": "NS"}, {"0-1": "OK", "1-0": "OK"}, {"NCCL_P2P_DISABLE": "1"}),
        ({"0-1": "OK", "0-2": "OK", "1-2": "OK"}, {"0-1": "OK", "1-0": "OK"}, {}),  # 2 uncovered, matrix OK
    ],
)
def test_nccl_env_for_truth_table(p2p_read: dict, probe: dict | None, expected: dict) -> None:
    assert g.nccl_env_for(p2p_read, probe) == expected


def test_p2p_decision_explains_itself() -> None:
    decision = g.p2p_decision({"0-1": "OK", "0-2": "NS"}, {"1-0": "MISMATCH", "0-1": "OK"})
    assert decision.p2p_enabled is False
    assert decision.pairs == {"0-1": "FAILED", "0-2": "FAILED"}
    assert any("1-0: MISMATCH" in r for r in decision.reasons)
    assert any("0-2: NS" in r for r in decision.reasons)


@pytest.mark.parametrize(
    ("stdout", "rc", "timed_out", "status", "pair_value"),
    [
        ('{"pairs": {"0-1": "OK", "1-0": "OK"}, "devices": 2}', 0, False, "passed", "OK"),
        ('{"pairs": {"0-1": "MISMATCH", "1-0": "OK"}, "devices": 2}', 1, False, "failed", "MISMATCH"),
        (
            '{"pairs": {"0-1": "NO_PEER_ACCESS", "1-0": "NO_PEER_ACCESS"}, "devices": 2}',
            0,
            False,
            "passed",
            None,
        ),
        (
            '{"pairs": {}, "devices": 0, "error": "cudaErrorNoDevice: no CUDA-capable device"}',
            2,
            False,
            "unavailable",
            None,
        ),
        ("", None, True, "failed", "TIMEOUT"),
        ("Segmentation fault", -11, False, "failed", "CRASHED"),
    ],
)
def test_parse_probe_output(stdout: str, rc: int | None, timed_out: bool, status: str, pair_value: str | None) -> None:
    result = g.parse_probe_output(stdout, rc, timed_out=timed_out, gpu_count=2)
    assert result.status == status
    if pair_value is not None:
        assert result.pairs["0-1"] == pair_value


# --------------------------------------------------------------------------- the replay nvidia-smi


@pytest.mark.parametrize("box", BOXES)
def test_replay_returns_the_captured_files(box: str, tmp_path: Path) -> None:
    for args, name in (
        (["-q", "-x"], "q.xml"),
        (["topo", "-m"], "topo-m.txt"),
        (["topo", "-p2p", "r"], "topo-p2p-r.txt"),
    ):
        proc = replay(box, tmp_path, *args)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == read(box, name)
    assert replay(box, tmp_path, "--version").stdout == read(box, "version.txt")


@pytest.mark.parametrize("box", BOXES)
def test_replay_query_gpu_matches_the_csv(box: str, tmp_path: Path) -> None:
    fields = ",".join(g.QUERY_FIELDS)
    proc = replay(box, tmp_path, f"--query-gpu={fields}", "--format=csv,noheader,nounits")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == read(box, "query-gpu.csv")


def test_replay_matches_the_real_tool_on_h200x2(tmp_path: Path) -> None:
    """Answers computed from q.xml against what the real nvidia-smi printed on the same machine."""
    fields = ",".join(g.QUERY_FIELDS)
    with_header = replay("h200x2", tmp_path, f"--query-gpu={fields}", "--format=csv")
    assert with_header.stdout == (REFERENCE / "query-gpu-header.csv").read_text()
    assert (
        replay("h200x2", tmp_path, "--query-gpu=persistence_mode", "--format=csv").stdout
        == (REFERENCE / "query-pm.csv").read_text()
    )
    assert replay("h200x2", tmp_path, "-pm", "1").stdout == (REFERENCE / "pm1-noop.txt").read_text()
    summary = replay("h200x2", tmp_path).stdout.splitlines()
    real = (REFERENCE / "plain.txt").read_text().splitlines()
    assert len(summary) == len(real)
    live = ("C ", "W /")  # temperature and power are sampled live; the rest must be identical
    for ours, theirs in zip(summary[1:], real[1:]):
        if not any(mark in theirs for mark in live):
            assert ours == theirs


def test_replay_subsets_and_formats(tmp_path: Path) -> None:
    proc = replay("rtx3090x2-pcie", tmp_path, "--query-gpu=memory.total,pcie.link.width.current", "--format=csv")
    assert proc.stdout.splitlines() == [
        "memory.total [MiB], pcie.link.width.current",
        "24576 MiB, 16",
        "24576 MiB, 4",
    ]
    proc = replay("rtx4090x4", tmp_path, "--query-gpu=name", "--format=csv,noheader", "-i", "2")
    assert proc.stdout == "NVIDIA GeForce RTX 4090\n"


def test_replay_persistence_mode_is_remembered(tmp_path: Path) -> None:
    query = ("--query-gpu=persistence_mode", "--format=csv,noheader")
    assert replay("rtx3090x2-nvlink", tmp_path, *query).stdout == "Disabled\nDisabled\n"
    first = replay("rtx3090x2-nvlink", tmp_path, "-pm", "1")
    assert first.returncode == 0
    assert first.stdout.splitlines() == [
        "Enabled persistence mode for GPU 00000000:21:00.0.",
        "Enabled persistence mode for GPU 00000000:4B:00.0.",
        "All done.",
    ]
    assert replay("rtx3090x2-nvlink", tmp_path, *query).stdout == "Enabled\nEnabled\n"
    assert "<persistence_mode>Enabled</persistence_mode>" in replay("rtx3090x2-nvlink", tmp_path, "-q", "-x").stdout
    assert "already Enabled" in replay("rtx3090x2-nvlink", tmp_path, "-pm", "1").stdout


def test_replay_rejects_set_like_the_real_tool(tmp_path: Path) -> None:
    proc = replay("rtx3090x2-nvlink", tmp_path, "set")
    assert proc.returncode == 255
    assert proc.stdout == (REFERENCE / "set.txt").read_text()
    bogus = replay("rtx3090x2-nvlink", tmp_path, "--no-such-option")
    assert (bogus.returncode, bogus.stdout) == (255, (REFERENCE / "bogus-option.txt").read_text())
    field = replay("h200x2", tmp_path, "--query-gpu=no.such.field", "--format=csv")
    assert (field.returncode, field.stdout) == (2, (REFERENCE / "bad-field.txt").read_text())


@pytest.mark.parametrize("option", ["-r", "--gpu-reset"])
def test_replay_refuses_gpu_reset(option: str, tmp_path: Path) -> None:
    proc = replay("rtx4090x4", tmp_path, option, "-i", "0")
    assert proc.returncode != 0
    assert "reset a GPU" in proc.stderr


def test_replay_failure_modes(tmp_path: Path) -> None:
    mismatch = replay("rtx3090x2-nvlink", tmp_path, "-q", "-x", GPUBOX_SIM_FAIL="mismatch")
    assert mismatch.returncode == 18
    assert "Driver/library version mismatch" in mismatch.stdout
    assert replay("rtx3090x2-nvlink", tmp_path, GPUBOX_SIM_FAIL="no-driver").returncode == 9
    unconfigured = replay("", tmp_path)
    assert unconfigured.returncode != 0 and "no box configured" in unconfigured.stderr


# --------------------------------------------------------------------------- gpubox-gpu-check


@pytest.fixture
def sim_path(tmp_path: Path) -> Path:
    """A bin directory whose nvidia-smi is the replay tool, run by this interpreter."""
    return replay_bin(tmp_path)


def fake_probe(tmp_path: Path, body: str) -> Path:
    probe = tmp_path / "fake-probe"
    probe.write_text(f"#!/bin/sh\n# TEST-ONLY stand-in for gpubox-p2p-probe\n{body}\n")
    probe.chmod(0o755)
    return probe


def gpu_check(box: str, tmp_path: Path, bindir: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = sim_env(box, tmp_path / "simstate", **extra)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    argv = [sys.executable, str(GPU_CHECK), "--lib", str(ROOT / "plugins" / "module_utils")]
    argv += ["--out", str(tmp_path / "etc" / "nccl.env"), "--state", str(tmp_path / "var" / "gpu-check.json")]
    if "--probe" not in args:
        argv += ["--probe", str(tmp_path / "no-probe")]
    return subprocess.run([*argv, *args], env=env, capture_output=True, text=True)


def env_lines(tmp_path: Path) -> list:
    text = (tmp_path / "etc" / "nccl.env").read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_gpu_check_nvlink_box_keeps_p2p(tmp_path: Path, sim_path: Path) -> None:
    proc = gpu_check("rtx3090x2-nvlink", tmp_path, sim_path)
    assert proc.returncode == 0, proc.stderr
    assert env_lines(tmp_path) == []
    out = tmp_path / "etc" / "nccl.env"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert "0-1 NV4" in out.read_text()
    state = json.loads((tmp_path / "var" / "gpu-check.json").read_text())
    assert state["links"] == {"0-1": "NV4"} and state["p2p_read"] == {"0-1": "OK"}
    assert state["probe"]["status"] == "absent"
    assert state["decision"]["p2p_enabled"] is True
    assert state["persistence_mode"] == [True, True]  # `-pm 1` ran before the query
    assert [p.name for p in out.parent.iterdir()] == ["nccl.env"]  # no temporary file left behind


def test_gpu_check_4090_box_disables_p2p(tmp_path: Path, sim_path: Path) -> None:
    proc = gpu_check("rtx4090x4", tmp_path, sim_path)
    assert proc.returncode == 0, proc.stderr
    assert env_lines(tmp_path) == ["NCCL_P2P_DISABLE=1"]
    assert "CNS" in (tmp_path / "etc" / "nccl.env").read_text()


def test_gpu_check_probe_mismatch_disables_p2p_on_nvlink(tmp_path: Path, sim_path: Path) -> None:
    probe = fake_probe(tmp_path, """echo '{"pairs": {"0-1": "MISMATCH", "1-0": "OK"}, "devices": 2}'; exit 1""")
    proc = gpu_check("rtx3090x2-nvlink", tmp_path, sim_path, "--probe", str(probe))
    assert proc.returncode == 0, proc.stderr
    assert env_lines(tmp_path) == ["NCCL_P2P_DISABLE=1"]
    state = json.loads((tmp_path / "var" / "gpu-check.json").read_text())
    assert state["probe"]["status"] == "failed"
    assert state["probe"]["pairs"]["0-1"] == "MISMATCH"


def test_gpu_check_probe_pass_keeps_p2p(tmp_path: Path, sim_path: Path) -> None:
    probe = fake_probe(tmp_path, """echo '{"pairs": {"0-1": "OK", "1-0": "OK"}, "devices": 2}'""")
    proc = gpu_check("rtx3090x2-nvlink", tmp_path, sim_path, "--probe", str(probe))
    assert proc.returncode == 0, proc.stderr
    assert env_lines(tmp_path) == []
    assert json.loads((tmp_path / "var" / "gpu-check.json").read_text())["probe"]["status"] == "passed"


def test_gpu_check_probe_without_device_leaves_the_matrix_in_charge(tmp_path: Path, sim_path: Path) -> None:
    nodev = (REFERENCE / "p2p-probe-nodev.json").read_text().strip()
    probe = fake_probe(tmp_path, f"echo '{nodev}'; exit 2")
    proc = gpu_check("rtx3090x2-nvlink", tmp_path, sim_path, "--probe", str(probe))
    assert proc.returncode == 0, proc.stderr
    assert env_lines(tmp_path) == []
    state = json.loads((tmp_path / "var" / "gpu-check.json").read_text())
    assert state["probe"]["status"] == "unavailable"
    proc = gpu_check("rtx3090x2-pcie", tmp_path, sim_path, "--probe", str(probe))
    assert env_lines(tmp_path) == ["NCCL_P2P_DISABLE=1"]


def test_gpu_check_hung_probe_disables_p2p(tmp_path: Path, sim_path: Path) -> None:
    probe = fake_probe(tmp_path, "exec sleep 30")
    proc = gpu_check("rtx3090x2-nvlink", tmp_path, sim_path, "--probe", str(probe), "--probe-timeout", "1")
    assert proc.returncode == 0, proc.stderr
    assert env_lines(tmp_path) == ["NCCL_P2P_DISABLE=1"]
    assert json.loads((tmp_path / "var" / "gpu-check.json").read_text())["probe"]["pairs"]["0-1"] == "TIMEOUT"


def test_gpu_check_fails_clearly_when_nvidia_smi_fails(tmp_path: Path, sim_path: Path) -> None:
    proc = gpu_check("rtx3090x2-nvlink", tmp_path, sim_path, GPUBOX_SIM_FAIL="mismatch")
    assert proc.returncode == 1
    assert "Driver/library version mismatch" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "etc" / "nccl.env").exists()
    assert "mismatch" in json.loads((tmp_path / "var" / "gpu-check.json").read_text())["error"]


def test_gpu_check_missing_library(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(GPU_CHECK), "--lib", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "cannot import gpu_parsers" in proc.stderr
