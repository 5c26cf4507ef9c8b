"""gpubox_tenants: the one parser (plugins/module_utils/tenants.py) and its place in the desired state.

- an empty list is one tenant, default, with gpubox_api_key and the front door's old limits;
- every class of bad input is one line naming gpubox_tenants[i].field and the fix, and no line quotes a key;
- a key of two tenants, two tenants of one name, a key in the wrong case of another (nginx's map would
  match it): refused or kept apart;
- preflight's validator (state_checks) refuses the same, and keeps the keys out of its public view.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks, tenants
from harness import ansible_vars

KEY_A = "team-a-key-0123456789abcdef"
KEY_A2 = "team-a-next-key-0123456789"
KEY_B = "team.b+key/0123456789=="
API_KEY = ansible_vars.TEST_KEY


def _tenant(**over: Any) -> dict[str, Any]:
    return {"name": "team-a", "keys": [KEY_A], **over}


def test_an_empty_list_is_one_default_tenant_with_the_api_key_and_the_old_limits() -> None:
    (only,) = tenants.parse([], API_KEY)
    assert only == tenants.Tenant("default", (API_KEY,), 20, 40, 256, "4m")
    assert tenants.public([only]) == [
        {
            "name": "default",
            "requests_per_s": 20,
            "burst": 40,
            "streams": 256,
            "body_max": "4m",
            "body_max_bytes": 4 << 20,
            "key_count": 1,
            "models": None,
        }
    ]


def test_tenants_take_their_own_limits_and_the_defaults_for_the_rest() -> None:
    got = tenants.parse(
        [
            _tenant(keys=[KEY_A, KEY_A2], requests_per_s="5", streams=2),
            {"name": "b", "keys": [KEY_B], "body_max": "1k"},
        ],
        KEY_B,
    )
    assert got == [
        tenants.Tenant("team-a", (KEY_A, KEY_A2), 5, 40, 2, "4m"),
        tenants.Tenant("b", (KEY_B,), 20, 40, 256, "1k"),
    ]


def test_a_tenant_may_be_given_models_and_uses_every_model_without() -> None:
    a, b = tenants.parse([_tenant(models=["qwen14b", "Qwen/Qwen2.5-7B"]), {"name": "b", "keys": [KEY_B]}], KEY_B)
    assert a.models == ("qwen14b", "Qwen/Qwen2.5-7B") and a.may_use("qwen14b") and not a.may_use("qwen72b-awq")
    assert b.models is None and b.may_use("anything")
    assert tenants.public([a])[0]["models"] == ["qwen14b", "Qwen/Qwen2.5-7B"]


@pytest.mark.parametrize(
    ("value", "expect"),
    [
        ("team-a", "gpubox_tenants must be a list of tenants"),
        ({"name": "a"}, "gpubox_tenants must be a list of tenants"),
        (["team-a"], "gpubox_tenants[0] must be a mapping"),
        ([_tenant(name="Team A")], "gpubox_tenants[0].name is 'Team A': give 1-32 of a-z"),
        ([_tenant(name="-a")], "gpubox_tenants[0].name is '-a'"),
        ([_tenant(name="a" * 33)], "gpubox_tenants[0].name is"),
        ([_tenant(name=None)], "gpubox_tenants[0].name is NoneType"),
        ([_tenant(keys=KEY_A)], "gpubox_tenants[0].keys must be a non-empty list"),
        ([_tenant(keys=[])], "gpubox_tenants[0].keys must be a non-empty list"),
        ([_tenant(keys=[KEY_A, "short"])], "gpubox_tenants[0].keys[1] must be 16 to 512 characters"),
        ([_tenant(keys=["has a space in it 0123456789"])], "gpubox_tenants[0].keys[0] must be 16 to 512"),
        ([_tenant(keys=['quote"in-it-0123456789'])], "gpubox_tenants[0].keys[0] must be 16 to 512"),
        ([_tenant(keys=[KEY_A, KEY_A])], "gpubox_tenants[0].keys lists one key twice"),
        ([_tenant(requests_per_s=0)], "gpubox_tenants[0].requests_per_s must be 1-100000, got 0"),
        ([_tenant(requests_per_s=-3)], "gpubox_tenants[0].requests_per_s must be 1-100000"),
        ([_tenant(requests_per_s=2.5)], "gpubox_tenants[0].requests_per_s must be a whole number"),
        ([_tenant(requests_per_s=True)], "gpubox_tenants[0].requests_per_s must be a whole number"),
        ([_tenant(streams=0)], "gpubox_tenants[0].streams must be 1-65535, got 0"),
        ([_tenant(burst=-1)], "gpubox_tenants[0].burst must be"),
        ([_tenant(body_max="0")], "gpubox_tenants[0].body_max is '0': write an nginx size above 0"),
        ([_tenant(body_max="1m; deny all")], "gpubox_tenants[0].body_max is"),
        ([_tenant(rate="5r/s")], "gpubox_tenants[0] has unknown keys ['rate']"),
        ([_tenant(models="qwen14b")], "gpubox_tenants[0].models must be a non-empty list of served model names"),
        ([_tenant(models=[])], "gpubox_tenants[0].models must be a non-empty list"),
        ([_tenant(models=["qwen 14b"])], "gpubox_tenants[0].models[0] is 'qwen 14b': give a served model name"),
        ([_tenant(models=["-x"])], "gpubox_tenants[0].models[0] is '-x'"),
        ([_tenant(models=[3])], "gpubox_tenants[0].models[0] is int"),
        ([_tenant(models=["a", "a"])], "gpubox_tenants[0].models lists one model twice"),
        ([_tenant(), _tenant(keys=[KEY_B])], "two tenants are named team-a"),
        ([_tenant(), {"name": "b", "keys": [KEY_A]}], "one key belongs to both team-a and b"),
    ],
)
def test_bad_tenants_are_one_line_each_naming_the_field_and_never_the_key(value: Any, expect: str) -> None:
    lines = tenants.problems(value, None)
    assert any(expect in line for line in lines), lines
    for line in lines:
        assert "\n" not in line
        assert KEY_A not in line and KEY_B not in line and "0123456789" not in line, line


def test_every_problem_of_the_list_is_reported_at_once() -> None:
    lines = tenants.problems([_tenant(name="A"), _tenant(keys=["short-key"], streams=0)], None)
    assert [line.split(" ", 1)[0] for line in lines] == [
        "gpubox_tenants[0].name",
        "gpubox_tenants[1].keys[0]",
        "gpubox_tenants[1].streams",
    ]


def test_the_api_key_must_be_one_of_the_tenants_keys() -> None:
    assert tenants.problems([_tenant()], KEY_A) == []
    (line,) = tenants.problems([_tenant()], API_KEY)
    assert line.startswith("gpubox_api_key (vault_gpubox_api_key) is none of gpubox_tenants' keys")
    assert API_KEY not in line
    (line,) = tenants.problems([], "short")
    assert "gpubox_tenants is empty, so its one tenant 'default' uses gpubox_api_key" in line


def test_the_key_map_is_exact_and_case_sensitive() -> None:
    # nginx lowercases both sides of a map's plain strings (a key in any case would pass): regular expressions.
    ((source, name),) = tenants.nginx_key_map([tenants.Tenant("b", (KEY_B, KEY_A), 1, 0, 1, "1k")])
    assert name == "b" and source.startswith("~^Bearer (") and source.endswith(")$")
    pattern = re.compile(source[1:])
    assert pattern.match(f"Bearer {KEY_B}") and pattern.match(f"Bearer {KEY_A}")
    for wrong in (f"Bearer {KEY_B.upper()}", f"bearer {KEY_B}", f"Bearer {KEY_B}x", f"Bearer x{KEY_A}",
                  "Bearer team-b+key/0123456789==", "Bearer team.bbkey/0123456789==", f"Bearer  {KEY_A}"):  # fmt: skip
        assert not pattern.match(wrong), wrong
    # Between the anchors nothing nginx would read as the end of a string, a variable or an escape.
    assert not set(source[len("~^Bearer (") : -len(")$")]) & set("\"'$;{}\\ \t\n")


# --------------------------------------------------------------------------- the desired state


def _state(**over: Any) -> state_checks.State:
    base = ansible_vars.facts("unit-tenants", groups=("gpu_2x3090",))
    return state_checks.validate({**base, **over})


def test_the_desired_state_checks_the_tenants_and_keeps_their_keys_out_of_its_public_view() -> None:
    state = _state(gpubox_tenants=[_tenant(keys=[KEY_A, API_KEY], streams=3)])
    assert state.errors == []
    public = state.public()
    assert "gpubox_tenants" not in public
    assert public["gpubox_tenant_limits"] == [
        {
            "name": "team-a",
            "requests_per_s": 20,
            "burst": 40,
            "streams": 3,
            "body_max": "4m",
            "body_max_bytes": 4 << 20,
            "key_count": 2,
            "models": None,
        }
    ]
    assert KEY_A not in repr(public) and API_KEY not in repr(public)
    assert [t.name for t in tenants.of_state(state.values)] == ["team-a"]
    default = _state().public()["gpubox_tenant_limits"]
    assert default == [
        {"name": "default", **tenants.DEFAULTS, "body_max_bytes": 4 << 20, "key_count": 1, "models": None}
    ]
    assert [tenants.size_bytes(s) for s in ("512", "1k", "2M", "1g")] == [512, 1024, 2 << 20, 1 << 30]


def test_the_desired_state_refuses_bad_tenants_one_line_each() -> None:
    errors = _state(gpubox_tenants=[_tenant(name="A", streams=0)]).errors
    assert [e.split(" ", 1)[0] for e in errors] == ["gpubox_tenants[0].name", "gpubox_tenants[0].streams"], errors
    errors = _state(gpubox_tenants=[_tenant()]).errors
    assert errors and errors[0].startswith("gpubox_api_key (vault_gpubox_api_key) is none of"), errors
    errors = _state(gpubox_tenants=[_tenant(keys=[API_KEY])], gpubox_front_door_enabled=False).errors
    assert errors and errors[0].startswith("gpubox_tenants lists tenants but gpubox_front_door_enabled is false")
    assert _state(gpubox_tenants=None).errors == [
        "gpubox_tenants is not set: use [] (one tenant, default, with gpubox_api_key) or list your tenants"
    ]
