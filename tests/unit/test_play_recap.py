"""harness.ansible_vars.play_recap: the counters per host of an ansible-playbook run's last PLAY RECAP, which
the crash suite, the day-two suites and the fleet's second-run test read."""

from __future__ import annotations

from harness.ansible_vars import play_recap

RUN = """PLAY [one] *********************************************************************
ok: [box1]

PLAY RECAP *********************************************************************
box1                       : ok=9    changed=9    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0

PLAY [again] *******************************************************************

PLAY RECAP *********************************************************************
gpubox-m-fleet-box2        : ok=112  changed=0    unreachable=0    failed=0    skipped=31   rescued=0    ignored=1
gpubox-m-fleet-gw          : ok=65   changed=3    unreachable=0    failed=1    skipped=10   rescued=1    ignored=0
"""


def test_every_host_of_the_last_recap_with_every_counter() -> None:
    recap = play_recap(RUN)
    assert list(recap) == ["gpubox-m-fleet-box2", "gpubox-m-fleet-gw"]
    assert recap["gpubox-m-fleet-box2"] == {
        "ok": 112, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 31, "rescued": 0, "ignored": 1
    }  # fmt: skip
    assert recap["gpubox-m-fleet-gw"]["changed"] == 3 and recap["gpubox-m-fleet-gw"]["rescued"] == 1


def test_a_run_that_printed_no_recap_has_no_counters() -> None:
    assert play_recap("ERROR! the playbook could not be parsed\n") == {}
    assert play_recap("PLAY RECAP ****\n") == {}
