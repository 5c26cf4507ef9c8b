"""roles/llm_gateway/files/haproxy_runtime.py, the one client of HAProxy's sockets, on HAProxy's answers
(the layouts of HAProxy 2.6's `show proc` and `show stat`, as tests/integration/test_gateway_reload.py and
test_gateway_state.py get them from the real server); its socket path runs there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.live_proxies import RUNTIME_CLIENT, haproxy_runtime

SHOW_PROC = """#<PID>          <type>          <reloads>       <uptime>        <version>
4100            master          2 [failed: 0]   0d00h01m02s     2.6.12-1+deb12u1
# workers
4180            worker          0               0d00h00m03s     2.6.12-1+deb12u1
# old workers
4150            worker          1               0d00h00m40s     2.6.12-1+deb12u1
4120            worker          2               0d00h01m01s     2.6.12-1+deb12u1
# programs

"""

HEAD = (
    "# pxname,svname,qcur,qmax,scur,smax,slim,stot,econ,eresp,weight,status,"
    "hrsp_1xx,hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,hrsp_other,type"
)
SHOW_STAT = f"""{HEAD}
gpubox_front,FRONTEND,,,3,9,,120,,,,OPEN,0,100,0,2,0,0,0
pool_tiny,box1,0,0,2,5,,40,0,0,100,UP,0,30,0,1,0,0,2
pool_tiny,box2,0,0,0,4,,35,2,1,10,DRAIN,0,20,0,0,1,0,2
pool_tiny,BACKEND,0,0,2,9,,75,2,1,110,UP,0,50,0,1,1,0,1
pool_big,box3,0,0,1,1,,7,0,0,100,UP,0,7,0,0,0,0,2
pool_big,BACKEND,0,0,1,1,,7,0,0,100,UP,0,7,0,0,0,0,1

"""


def test_old_workers_are_counted_from_their_section_only() -> None:
    assert haproxy_runtime.old_workers(SHOW_PROC) == 2
    assert haproxy_runtime.old_workers(SHOW_PROC.replace("# old workers", "# more workers")) == 0  # control


def test_the_current_workers_are_the_pids_of_their_section_only() -> None:
    assert haproxy_runtime.workers(SHOW_PROC) == [4180]
    assert haproxy_runtime.workers(SHOW_PROC.replace("# workers", "# other")) == []  # control: not the old ones


def test_stat_gives_each_box_its_state_answers_and_streams_in_flight() -> None:
    assert haproxy_runtime.servers(SHOW_STAT, "pool_tiny") == {
        "box1": {"pool": "pool_tiny", "status": "UP", "requests": 31, "errors": 0, "in_flight": 2, "weight": 100},
        # errors: its 5xx answer, a broken response and two failed connections
        "box2": {"pool": "pool_tiny", "status": "DRAIN", "requests": 21, "errors": 4, "in_flight": 0, "weight": 10},
    }
    assert sorted(haproxy_runtime.servers(SHOW_STAT, "*")) == ["box1", "box2", "box3"]
    assert haproxy_runtime.in_flight(SHOW_STAT, "pool_tiny", "box1") == 2
    with pytest.raises(LookupError, match="pool_tiny/box9 is not in the runtime API's stats"):
        haproxy_runtime.in_flight(SHOW_STAT, "pool_tiny", "box9")
    # A box's pool, for a drain: the one backend that holds it.
    assert haproxy_runtime.backend_of(SHOW_STAT, "box3") == "pool_big"
    with pytest.raises(LookupError, match="server box9 is in 0 backends"):
        haproxy_runtime.backend_of(SHOW_STAT, "box9")
    with pytest.raises(ValueError, match="not an answer of `show stat`"):
        haproxy_runtime.stat_rows("Unknown command.\n")


def test_wait_drained_reports_a_socket_that_never_answers_as_timed_out(tmp_path: Path) -> None:
    seen = haproxy_runtime.wait_drained(str(tmp_path / "a.sock"), str(tmp_path / "m.sock"), "b", "s", 0.3, poll=0.1)
    assert seen["timed_out"] and seen["in_flight_left"] is None and seen["timeout_s"] == 0.3


def test_the_script_names_its_usage_and_a_bad_timeout(tmp_path: Path) -> None:
    usage = subprocess.run([sys.executable, str(RUNTIME_CLIENT), "drain"], capture_output=True, text=True)
    assert usage.returncode == 2 and "wait-drained ADMIN_SOCKET" in usage.stderr
    argv = [sys.executable, str(RUNTIME_CLIENT), "wait-drained", "a", "m", "b", "s", "soon"]
    bad = subprocess.run(argv, capture_output=True, text=True)
    assert bad.returncode == 2 and "TIMEOUT_S is 'soon'" in bad.stderr
    stat = subprocess.run([sys.executable, str(RUNTIME_CLIENT), "stat", str(tmp_path / "none.sock"), "b"],
                          capture_output=True, text=True)  # fmt: skip
    assert stat.returncode == 1 and "haproxy_runtime stat:" in stat.stderr and not stat.stdout
    assert json.loads(json.dumps(haproxy_runtime.ANSWERED))  # the classes `requests` sums


def test_a_canarys_window_ends_with_the_operators_decisions_or_its_time(tmp_path: Path) -> None:
    path = tmp_path / "canary-decision.json"
    assert haproxy_runtime.wait_decisions(str(path), 0.2, ["box1"], poll=0.05)["decisions"] == {}  # no file: no word
    path.write_text(json.dumps({"box1": {"decision": "promote"}, "box2": {"decision": "maybe"}, "box9": "stop"}))
    seen = haproxy_runtime.wait_decisions(str(path), 30, ["box1"], poll=0.05)
    assert seen == {"decisions": {"box1": "promote"}, "waited_s": seen["waited_s"]} and seen["waited_s"] < 5
    # box2's word is not a decision: the window runs out, with box1's alone
    assert haproxy_runtime.wait_decisions(str(path), 0.2, ["box1", "box2"], poll=0.05)["decisions"] == {
        "box1": "promote"
    }
    path.write_text("not json")
    assert haproxy_runtime.decisions(str(path), ["box1"]) == {}
