"""The gateway's pools: the boxes behind one gateway grouped by the model they serve, and who may use which.

roles/llm_gateway reads each box's front door fact (roles/front_door writes it from the box's desired state at
each converge: its served model name, model id and commit, stack, and its tenants without their keys) and its
keys file ("<key> <tenant>" a line). From those alone, nothing restated in the gateway's variables:

- a **pool** is the boxes serving one served model name (gpubox_served_model_name); the gateway routes a request
  to the pool its body's "model" names, and its HAProxy backend is named after it;
- the boxes of a pool must serve the same model id, commit and stack (a request may land on any of them), and
  every box must accept the same keys for the same tenants with the same models (gpubox_tenants): otherwise the
  pool is refused before any change, each problem naming the boxes and the values;
- a tenant's **grants** are the pools its ``models`` name (every pool when it names none): /v1/models answers
  them, and a request for any other model is not found.

Tested in tests/unit/test_gateway_pools.py; the rendered HAProxy file in tests/integration/test_gateway_pools.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# HAProxy's proxy names: letters, digits and "-_.:" (a served name may also hold "@+/").
_BACKEND_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
# What must be the same on every box of a pool, with the variable that sets it.
AGREE = (
    ("model_id", "gpubox_model_id"),
    ("model_commit", "gpubox_model_revision (or its model lock entry)"),
    ("stack", "gpubox_stack"),
)
# The date the gateway gives for every model it lists (OpenAI's "created"; the boxes' own is their start time).
CREATED = 0


def backend_name(served_name: str) -> str:
    return "pool_" + _BACKEND_CHARS.sub("_", served_name)


def _tenant_view(tenants: Any) -> dict[str, Any]:
    """{tenant: sorted models or None} of one box's fact."""
    out: dict[str, Any] = {}
    for t in tenants if isinstance(tenants, Sequence) else []:
        if isinstance(t, Mapping) and isinstance(t.get("name"), str):
            models = t.get("models")
            out[t["name"]] = None if models is None else sorted(str(m) for m in models)
    return out


def pools(
    boxes: Mapping[str, Mapping[str, Any]], keys: Mapping[str, str], addresses: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The gateway's pools from each box's front door fact (``boxes``: {box: fact}) and keys file content
    (``keys``: {box: text}, SECRET: never in the result's problems); ``addresses``: {box: the address the gateway
    connects to} (default: the box's name).

    Returns {pools: [{name, backend, boxes}], servers: [{name, address, port, pool}], tenants: [{name, models}],
    grants: {tenant: [pool names]}, grant_pairs: ["tenant/model"], key_map: "<key> <tenant>\\n" lines (SECRET),
    models: {tenant: OpenAI model list entries}, problems: [one line each]}."""
    problems: list[str] = []
    by_pool: dict[str, list[str]] = {}
    for box in sorted(boxes):
        fact = boxes[box]
        name = fact.get("served_model_name") if isinstance(fact, Mapping) else None
        if not isinstance(name, str) or not name:
            problems.append(
                f"llm_gateway_backends: {box}'s front door fact names no served model (converged before pools "
                "existed): converge it first (site.yml), then run playbooks/gateway.yml"
            )
            continue
        by_pool.setdefault(name, []).append(box)
    backends: dict[str, str] = {}
    for name in sorted(by_pool):
        backend = backend_name(name)
        if backend in backends:
            problems.append(
                f"gpubox_served_model_name: {backends[backend]} and {name} give one HAProxy backend name ({backend}): "
                "rename one of them"
            )
        backends[backend] = name
        members = by_pool[name]
        for field, variable in AGREE:
            values: dict[str, list[str]] = {}
            for box in members:
                values.setdefault(str(boxes[box].get(field)), []).append(box)
            if len(values) > 1:
                shown = "; ".join(f"{value} on {', '.join(hosts)}" for value, hosts in sorted(values.items()))
                problems.append(
                    f"the pool of {name} disagrees on {field} ({shown}): a request may land on any of its boxes, so "
                    f"give them one {variable} (the group_vars of their group) and converge them, or serve the "
                    "other one under another gpubox_served_model_name"
                )
    views = {box: _tenant_view(boxes[box].get("tenants")) for box in sorted(boxes) if isinstance(boxes[box], Mapping)}
    distinct = {repr(sorted(v.items())) for v in views.values()}
    if len(distinct) > 1:
        problems.append(
            "llm_gateway_backends: the boxes name different tenants or models for them (gpubox_tenants: "
            + "; ".join(f"{box}: {_shown(view)}" for box, view in views.items())
            + "): give every box behind one gateway the same gpubox_tenants and converge them"
        )
    key_lines = {box: _key_lines(text) for box, text in keys.items()}
    if len({repr(v) for v in key_lines.values()}) > 1:
        problems.append(
            "llm_gateway_backends: the boxes accept different keys or give a key to different tenants (their "
            "gpubox_tenants, or vault_gpubox_api_key when it is []): give every box behind one gateway the same "
            "tenants (in the group_vars of their group) and converge them"
        )
    first = next(iter(key_lines.values()), [])
    if not first and keys:
        problems.append("llm_gateway_backends: the boxes accept no key: converge them (site.yml) first")
    view = next(iter(views.values()), {})
    tenants_known = {pair[1] for pair in first}
    if "" in tenants_known:
        problems.append(
            "llm_gateway_backends: the boxes' keys files name no tenant (converged before pools existed): converge "
            "them first (site.yml), then run playbooks/gateway.yml"
        )
    for tenant in sorted(tenants_known - set(view) - {""}):
        problems.append(f"llm_gateway_backends: a key names tenant {tenant}, which the boxes' facts do not list")
    served = sorted(by_pool)
    grants: dict[str, list[str]] = {}
    for tenant, models in sorted(view.items()):
        if models is not None:
            for model in models:
                if model not in by_pool:
                    problems.append(
                        f"gpubox_tenants: tenant {tenant}'s models name {model}, which no box behind this gateway "
                        f"serves (they serve {', '.join(served) or 'nothing'}): name a served model "
                        "(gpubox_served_model_name) or leave models out for every model"
                    )
        grants[tenant] = [m for m in served if models is None or m in models]
    return {
        "pools": [{"name": name, "backend": backend_name(name), "boxes": by_pool[name]} for name in served],
        "servers": [
            {"name": box, "address": (addresses or {}).get(box, box), "port": int(boxes[box].get("port")), "pool": name}
            for name in served
            for box in by_pool[name]
        ],
        "tenants": [{"name": t, "models": view[t]} for t in sorted(view)],
        "grants": grants,
        "grant_pairs": [f"{t}/{m}" for t, models in grants.items() for m in models],
        "key_map": "".join(f"{key} {tenant}\n" for key, tenant in first),
        "models": {
            t: [{"id": m, "object": "model", "created": CREATED, "owned_by": "gpubox"} for m in models]
            for t, models in grants.items()
        },
        "problems": problems,
    }


def _key_lines(text: Any) -> list[tuple[str, str]]:
    """The sorted (key, tenant) pairs of a box's keys file; a line of one word (a box converged before keys named
    their tenant) is a key of tenant ''."""
    pairs = []
    for line in str(text or "").splitlines():
        words = line.split()
        if words:
            pairs.append((words[0], words[1] if len(words) > 1 else ""))
    return sorted(pairs)


def _shown(view: Mapping[str, Any]) -> str:
    return ", ".join(f"{t} {'all' if m is None else '[' + ' '.join(m) + ']'}" for t, m in sorted(view.items())) or "-"
