"""Every gpubox systemd unit, rendered from its role's real defaults and the topologies' group_vars, scores
an exposure of at most 2.5 in `systemd-analyze security --offline=yes` (issue 9), so it cannot creep up.

The score is systemd's own (this machine's systemd 252); tools/unit_security.py renders and scores, and
`make bench` prints the same numbers into bench/results.md.
"""

from __future__ import annotations

import pytest

import unit_security

TOPOLOGIES = ("gpu_2x3090", "gpu_4x4090")


@pytest.fixture(scope="module", params=TOPOLOGIES)
def rendered(request) -> dict[str, str]:
    return unit_security.render_units(request.param)


def test_every_unit_template_is_measured() -> None:
    root = unit_security.ROOT
    templates = {p.relative_to(root).as_posix() for p in root.glob("roles/*/templates/*.service.j2")}
    assert templates == {template for _roles, template in unit_security.UNITS.values()}
    hardening = {p.relative_to(root).as_posix() for p in root.glob("roles/*/templates/*hardening*.conf.j2")}
    assert hardening == {template for _roles, template, _packaged in unit_security.DROP_INS.values()}


@pytest.mark.parametrize("unit", [*sorted({**unit_security.UNITS, **unit_security.DROP_INS}), unit_security.FETCH_UNIT])
def test_exposure_at_most_2_5(rendered: dict[str, str], unit: str) -> None:
    result = unit_security.exposure(unit, rendered[unit])
    assert result.score <= unit_security.MAX_EXPOSURE, result.report


def test_vllm_unit_keeps_what_cuda_needs(rendered: dict[str, str]) -> None:
    unit = rendered["vllm.service"]
    lines = set(unit.splitlines())
    # The GPUs stay reachable and JIT-compiled kernels can run: the two settings stay off on purpose.
    assert not any(line.startswith(("PrivateDevices=", "MemoryDenyWriteExecute=")) for line in lines)
    assert "DeviceAllow=char-nvidia* rw" in lines
    assert {"CapabilityBoundingSet=", "SystemCallFilter=@system-service", "IPAddressDeny=any"} <= lines
    assert "IPAddressAllow=localhost" in lines


def test_a_loosened_unit_scores_worse() -> None:
    # The measurement is real: the same unit without its hardening block scores above the ceiling.
    unit = unit_security.render_units()["vllm.service"]
    head, _sep, _rest = unit.partition("NoNewPrivileges=yes")
    loose = head + "\n[Install]\nWantedBy=multi-user.target\n"
    assert unit_security.exposure("vllm.service", loose).score > unit_security.MAX_EXPOSURE


def test_parse_exposure_reads_the_overall_line() -> None:
    assert unit_security.parse_exposure("x\n→ Overall exposure level for a.service: 1.4 OK 🙂\n") == 1.4
    with pytest.raises(ValueError, match="Overall exposure"):
        unit_security.parse_exposure("Failed to open unit")
