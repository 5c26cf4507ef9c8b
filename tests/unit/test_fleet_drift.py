"""The fleet report's comparison (plugins/module_utils/fleet_drift.py)."""

from __future__ import annotations

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import fleet_drift


def box(**over):
    row = {
        "kernel": "6.1.0-28-amd64",
        "driver": "535.261.03-1",
        "driver_held": True,
        "cuda": "12.2",
        "vllm": "0.7.3",
        "torch": "2.5.1",
        "model_id": "gpubox-test/tiny-qwen2",
        "model_commit": "a" * 40,
        "manifest_sha256": "b" * 64,
        "p2p": "enabled",
        "kv_tokens_planned": 76288,
        "unit_state": "active",
        "unit_restarts": 0,
    }
    row.update(over)
    return row


def test_identical_boxes_do_not_drift():
    report = fleet_drift.compare({"b1": box(), "b2": box(), "b3": box()})
    assert report["drift"] == []
    assert report["majority"]["driver"] == "535.261.03-1"
    assert "No drift." in fleet_drift.markdown(report)


def test_a_box_off_the_majority_is_marked_and_only_that_value():
    report = fleet_drift.compare({"b1": box(), "b2": box(model_commit="c" * 40), "b3": box()})
    assert report["drift"] == [f"b2: model_commit is {'c' * 40}: majority {'a' * 40}"]
    assert report["hosts"]["b2"]["model_commit"]["drift"] == [f"majority {'a' * 40}"]
    assert report["hosts"]["b1"]["model_commit"]["drift"] == []
    table = fleet_drift.markdown(report)
    assert table.count("DRIFT") == 1 and "| b2 |" in table and "1 drifting value(s)." in table


def test_desired_state_is_checked_even_when_every_box_agrees():
    rows = {"b1": box(), "b2": box()}
    report = fleet_drift.compare(rows, {"b1": {"model_id": "Qwen/Qwen2.5-14B-Instruct"}, "b2": {}})
    assert report["drift"] == ["b1: model_id is gpubox-test/tiny-qwen2: desired Qwen/Qwen2.5-14B-Instruct"]


def test_driver_unheld_and_numbers_compare_as_text():
    report = fleet_drift.compare({"b1": box(), "b2": box(driver_held=False, kv_tokens_planned="76288"), "b3": box()})
    assert [line.split(":")[1].strip() for line in report["drift"]] == ["driver_held is False"]


def test_a_missing_value_drifts_from_the_majority():
    report = fleet_drift.compare({"b1": box(), "b2": box(vllm=None), "b3": box()})
    assert report["hosts"]["b2"]["vllm"]["drift"] == ["missing (majority 0.7.3)"]


def test_no_majority_no_majority_drift():
    report = fleet_drift.compare({"b1": box(torch="1"), "b2": box(torch="2")})
    assert report["majority"]["torch"] is None
    assert [d for d in report["drift"] if "torch" in d] == []


def test_a_single_box_has_no_majority_but_has_a_desired_state():
    report = fleet_drift.compare({"b1": box()}, {"b1": {"driver": "535.309.01-0+deb12u1"}})
    assert report["majority"] == {}
    assert report["drift"] == ["b1: driver is 535.261.03-1: desired 535.309.01-0+deb12u1"]


def test_long_values_are_shortened_and_pipes_escaped_in_the_table():
    report = fleet_drift.compare({"b1": box(kernel="a|b")})
    table = fleet_drift.markdown(report)
    assert "a\\|b" in table and "aaaaaaaaaaaa...aaaaaaaa" in table


def test_rows_must_be_a_mapping():
    with pytest.raises(TypeError):
        fleet_drift.compare([box()])  # type: ignore[arg-type]


def test_the_gpu_column_shows_a_blind_kernel_log_whole_and_marks_the_box():
    # The GPU collector's summary (gpu_metrics.Health.summary, health.json's "summary", fleet_row's gpu_health) of a
    # box whose kernel log cannot be read: healthy by default, but not like the others, and the reason not cut short.
    from ansible_collections.gpubox.gpubox.plugins.module_utils import gpu_metrics

    blind = gpu_metrics.KernelLog(False, 1796355937.0, "journalctl not found: No such file or directory")
    summary = gpu_metrics.health([], 0, kernel_log=blind, now=1796356000.0).summary()
    assert summary == (
        "healthy (but: kernel log unreadable since 2026-12-04T03:45:37Z (journalctl not found: No such file or "
        "directory): Xid events cannot be seen)"
    )
    rows = {"b1": box(gpu_health="healthy"), "b2": box(gpu_health=summary), "b3": box(gpu_health="healthy")}
    report = fleet_drift.compare(rows)
    assert report["drift"] == [f"b2: gpu_health is {summary}: majority healthy"]
    table = fleet_drift.markdown(report)
    assert f"**{summary}** (DRIFT: majority healthy)" in table  # whole, not shortened to 24 characters
    assert f"{'a' * 12}...{'a' * 8}" in table  # other long values still are


# A fleet of two groups the inventory asks to differ: 2 x RTX 3090 on the pinned stack (NVLink P2P) and
# 4 x RTX 4090 on lts-580 (PCIe only: no P2P, another KV plan, another driver, vLLM and torch).
MIXED = {
    "a1": box(),
    "a2": box(),
    "b1": box(p2p="disabled", kv_tokens_planned=180000, driver="580.95.05-0ubuntu1", vllm="0.32.0", torch="2.9.0"),
    "b2": box(p2p="disabled", kv_tokens_planned=180000, driver="580.95.05-0ubuntu1", vllm="0.32.0", torch="2.9.0"),
}
A, B = "pinned-0.7.3, 2 x 3090", "lts-580, 4 x 4090"
PEERS = {"a1": A, "a2": A, "b1": B, "b2": B}


def test_groups_asked_to_differ_are_not_drift_to_each_other():
    report = fleet_drift.compare(MIXED, peers=PEERS)
    assert report["drift"] == []
    assert report["peers"][B] == {
        "hosts": ["b1", "b2"],
        "majority": fleet_drift.compare({"b1": MIXED["b1"], "b2": MIXED["b2"]})["majority"],
    }
    assert report["majority"] == {}  # two groups: no fleet-wide majority
    assert f"Each box is compared with its peers' majority ({A}: a1, a2; {B}: b1, b2)." in fleet_drift.markdown(report)


def test_control_without_peer_groups_the_same_fleet_has_no_majority_and_a_third_box_drifts():
    # Control: the same rows compared fleet-wide. Two against two is no majority; a third 3090 box makes one, and
    # both 4090 boxes then drift on every value their group was asked to have.
    assert fleet_drift.compare(MIXED)["drift"] == []
    three = dict(MIXED, a3=box())
    drifted = {line.split(" is ")[0] for line in fleet_drift.compare(three)["drift"]}  # "box: field"
    assert {"b1: p2p", "b1: driver", "b2: vllm", "b2: kv_tokens_planned"} <= drifted
    assert fleet_drift.compare(three, peers=dict(PEERS, a3=PEERS["a1"]))["drift"] == []


def test_a_box_off_its_peers_majority_still_drifts():
    rows = dict(MIXED, b3=dict(MIXED["b1"], torch="2.8.0"))
    report = fleet_drift.compare(rows, peers=dict(PEERS, b3=PEERS["b1"]))
    assert report["drift"] == ["b3: torch is 2.8.0: majority 2.9.0"]


def test_a_box_the_peer_map_does_not_name_is_a_group_of_its_own():
    report = fleet_drift.compare(dict(MIXED, c1=box(kernel="6.1.0-99-amd64")), peers=PEERS)
    assert report["drift"] == [] and report["peers"]["c1"] == {"hosts": ["c1"], "majority": {}}


def test_peers_must_be_a_mapping():
    with pytest.raises(TypeError, match="peers must map"):
        fleet_drift.compare(MIXED, peers=["a1"])


def test_the_gateway_column_shows_maintenance_and_is_never_drift() -> None:
    rows = {"box1": {"model_id": "m"}, "box2": {"model_id": "m"}, "box3": {"model_id": "m"}}
    held = [{"box": "box2", "since": "2026-12-06T18:00:00+00:00", "reason": "fan"}]
    report = fleet_drift.compare(rows, maintenance=held)
    assert report["hosts"]["box2"]["gateway"] == {
        "value": "in maintenance since 2026-12-06T18:00:00+00:00 (fan)",
        "drift": [],
    }
    assert report["hosts"]["box1"]["gateway"]["value"] == "in its pool" and report["drift"] == []
    assert "in maintenance since 2026-12-06T18:00:00+00:00 (fan)" in fleet_drift.markdown(report)
    assert fleet_drift.compare(rows)["hosts"]["box1"]["gateway"]["value"] is None  # no gateway read


def test_the_last_canary_is_shown_whole_and_never_drift() -> None:
    why = "fail 2026-12-06T21:00 (pool_tiny): greedy answers differ from box2's on 4 of 4 prompt(s) (first: prompt 1)"
    rows = {"box1": {"model_id": "m", "canary": why}, "box2": {"model_id": "m"}, "box3": {"model_id": "m"}}
    report = fleet_drift.compare(rows)
    assert report["hosts"]["box1"]["canary"] == {"value": why, "drift": []} and report["drift"] == []
    assert why in fleet_drift.markdown(report)  # whole: the reason is the point
