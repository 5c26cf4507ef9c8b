"""bench/affinity_load.py end to end at a tiny load: three engine stand-ins named as the fleet's boxes, each
behind nginx with the front door's rendered file, HAProxy with the gateway's over the three; the fleet's own
client (harness/stream_load.py) with a session prefix; and the section bench/report.py writes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import affinity_load
from bench import report as bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()), reason="needs nginx")
def test_without_a_bound_every_session_keeps_its_box_and_the_report_shows_each_variant(tmp_path: Path) -> None:
    out = tmp_path / "affinity-load.json"
    argv = ["--seconds", "4", "--warmup", "1", "--clients", "6", "--hot-clients", "3", "--sessions", "2"]
    argv += ["--tokens", "5-10", "--ttft-ms", "10", "--itl-ms", "5", "--placements", "2"]
    argv += ["--variants", "no bound,default", "--out", str(out)]
    assert affinity_load.main(argv) == 0
    data = json.loads(out.read_text())
    assert list(data["results"]) == ["no bound", "default"]
    for result in data["results"].values():
        assert result["streams"] > 12 and (result["failed"], result["truncated"]) == (0, 0), result
        assert [p["session_prefix"] for p in result["placements"]] == ["", "p1-"]
        for placement in result["placements"]:
            # each stand-in says which box it is; only the fleet's names, from this run's boxes
            assert set(placement["load_per_box"]) <= set(affinity_load.BOXES) and placement["load_per_box"]
            assert all(name.startswith(placement["session_prefix"]) for name in placement["sessions_split"])
    unbound = data["results"]["no bound"]
    # consistent hashing alone: a session's streams all go to its box (what the bound trades away)
    assert all(p["session_share_on_own_box"] == 1.0 and p["sessions_split"] == [] for p in unbound["placements"])
    assert unbound["session_share_on_own_box"] == {"fleet_names": 1.0, "worst": 1.0, "mean": 1.0}
    text = bench.affinity_load_report(out)
    assert "| no bound | " in text and "| 1.00 / 1.00 / 1.00 |" in text and "| default | " in text
    assert "No run recorded (run: make bench-load" in bench.affinity_load_report(tmp_path / "none.json")


def test_an_unknown_variant_is_refused_by_name() -> None:
    with pytest.raises(SystemExit) as exc:
        affinity_load.main(["--variants", "default,fastest"])
    assert exc.value.code == 2
