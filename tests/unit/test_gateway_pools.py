"""The gateway's pools from the boxes' facts (plugins/module_utils/gateway_pools.py): the boxes by the model they
serve, what each tenant may use, and every disagreement refused with the boxes and values named, never a key."""

from __future__ import annotations

from ansible_collections.gpubox.gpubox.plugins.module_utils import gateway_pools

KEYS = "key-a-0123456789abcdef a\nkey-ops-0123456789abcdef ops\n"
TENANTS = [{"name": "a", "models": ["qwen14b"]}, {"name": "ops", "models": None}]


def _fact(served: str, port: int = 443, **over: object) -> dict:
    fact = {"served_model_name": served, "model_id": f"Qwen/{served}", "model_commit": "c" * 40, "stack": "pinned",
            "port": port, "tenants": TENANTS}  # fmt: skip
    fact.update(over)
    return fact


def test_pools_by_served_model_and_grants() -> None:
    boxes = {"box1": _fact("qwen14b"), "box2": _fact("qwen14b", 8443), "box3": _fact("qwen72b-awq")}
    plan = gateway_pools.pools(boxes, dict.fromkeys(boxes, KEYS), {"box2": "10.0.0.2"})
    assert plan["problems"] == []
    assert plan["pools"] == [
        {"name": "qwen14b", "backend": "pool_qwen14b", "boxes": ["box1", "box2"]},
        {"name": "qwen72b-awq", "backend": "pool_qwen72b-awq", "boxes": ["box3"]},
    ]
    assert plan["servers"] == [
        {"name": "box1", "address": "box1", "port": 443, "pool": "qwen14b"},
        {"name": "box2", "address": "10.0.0.2", "port": 8443, "pool": "qwen14b"},
        {"name": "box3", "address": "box3", "port": 443, "pool": "qwen72b-awq"},
    ]
    assert plan["grants"] == {"a": ["qwen14b"], "ops": ["qwen14b", "qwen72b-awq"]}
    assert plan["grant_pairs"] == ["a/qwen14b", "ops/qwen14b", "ops/qwen72b-awq"]
    assert [m["id"] for m in plan["models"]["ops"]] == ["qwen14b", "qwen72b-awq"]
    assert plan["key_map"] == "key-a-0123456789abcdef a\nkey-ops-0123456789abcdef ops\n"


def test_a_pool_that_disagrees_is_refused_naming_boxes_and_values() -> None:
    boxes = {"box1": _fact("qwen14b"), "box2": _fact("qwen14b", stack="lts-580", model_commit="d" * 40)}
    problems = gateway_pools.pools(boxes, dict.fromkeys(boxes, KEYS))["problems"]
    assert len(problems) == 2
    assert "pool of qwen14b disagrees on model_commit" in problems[0] and "box2" in problems[0]
    assert "disagrees on stack (lts-580 on box2; pinned on box1)" in problems[1] and "gpubox_stack" in problems[1]


def test_tenants_keys_and_models_must_agree_and_name_served_models() -> None:
    other = [{"name": "a", "models": None}, {"name": "ops", "models": None}]
    boxes = {"box1": _fact("qwen14b"), "box2": _fact("qwen14b", tenants=other)}
    problems = gateway_pools.pools(boxes, dict.fromkeys(boxes, KEYS))["problems"]
    assert len(problems) == 1 and "different tenants or models" in problems[0] and "box2: a all" in problems[0]
    boxes = {"box1": _fact("qwen14b"), "box2": _fact("qwen14b")}
    keys = {"box1": KEYS, "box2": KEYS.replace(" ops", " a")}
    problems = gateway_pools.pools(boxes, keys)["problems"]
    assert problems and "accept different keys" in problems[0] and "key-" not in " ".join(problems)
    boxes = {"box1": _fact("qwen72b-awq")}  # tenant a names qwen14b, which nothing behind the gateway serves
    problems = gateway_pools.pools(boxes, {"box1": KEYS})["problems"]
    assert problems == [
        "gpubox_tenants: tenant a's models name qwen14b, which no box behind this gateway serves (they serve "
        "qwen72b-awq): name a served model (gpubox_served_model_name) or leave models out for every model"
    ]


def test_boxes_converged_before_pools_are_refused() -> None:
    old = _fact("qwen14b")
    del old["served_model_name"]
    problems = gateway_pools.pools({"box1": old}, {"box1": "key-a-0123456789abcdef\n"})["problems"]
    assert any("box1's front door fact names no served model" in p for p in problems)
    assert any("keys files name no tenant" in p for p in problems)


def test_backend_names_hold_only_haproxy_characters() -> None:
    assert gateway_pools.backend_name("Qwen/Qwen2.5@7b+x") == "pool_Qwen_Qwen2.5_7b_x"
    boxes = {"box1": _fact("a/b"), "box2": _fact("a@b")}
    tenants_all = [{"name": "ops", "models": None}]
    for fact in boxes.values():
        fact["tenants"] = tenants_all
    problems = gateway_pools.pools(boxes, dict.fromkeys(boxes, "key-ops-0123456789abcdef ops\n"))["problems"]
    assert problems == [
        "gpubox_served_model_name: a/b and a@b give one HAProxy backend name (pool_a_b): rename one of them"
    ]
