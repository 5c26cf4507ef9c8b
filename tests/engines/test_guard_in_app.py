"""The request guard (roles/vllm_service/files/gpubox_vllm_guard.py) inside each stack's vLLM release's own OpenAI app.

For every stack (the ``engine`` fixture), the release's app is built without an engine (in_engine.py's ``build``)
from its own parser, with the guard loaded by ``--middleware`` from roles/vllm_service/files on PYTHONPATH, as the
unit's PYTHONPATH does on the box. Every POST route it registers refuses each class of
tests/unit/test_vllm_guard.py's IN_APP_PROBES, naming the field; each of the release's cases
(engine_releases.KNOWN) reaches the route's handler in the app without the guard (the control) and is refused, or
passed on, by the app with it. The fields the guard reads are the release's request models' fields, but for those
another release has.

Run: make engines (pytest -m engines tests/engines)
"""

from __future__ import annotations

import functools
import importlib.util
import json
from types import ModuleType
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks
from ansible_collections.gpubox.gpubox.plugins.module_utils.vllm_cmdline import REQUEST_TEMPLATE_GUARD
from engine_releases import KNOWN
from stack_engines import GUARD_DIR, Engine, engine_of
from test_vllm_guard import IN_APP_SCRIPT, check_in_app, guard_fields, in_app_job

pytestmark = pytest.mark.engines


def _guard() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpubox_vllm_guard", GUARD_DIR / "gpubox_vllm_guard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _fields(stack: str) -> frozenset[str]:
    """The fields of the request models of the stack's release (engine_releases.KNOWN)."""
    engine = engine_of(stack)
    return frozenset(engine.run("fields", stdin=list(KNOWN[engine.release].request_models)))


def test_the_guard_is_checked_against_every_stacks_release() -> None:
    missing = {name: stack.vllm for name, stack in stacks.STACKS.items() if stack.vllm not in KNOWN}
    assert not missing, f"add each release's routes and request models to tests/engines/engine_releases.py: {missing}"


def test_the_guard_bounds_each_effect_on_every_route_of_the_releases_app(engine: Engine) -> None:
    """Every POST route of the release's app (0.32.0: responses, batch chat, Anthropic messages, scoring, ...) refuses
    each class of IN_APP_PROBES, naming the field; each case of the release is taken by its own request model in the
    app without the guard (it reaches the route's handler) and refused, or passed on, by the app with it."""
    known = KNOWN[engine.release]
    script = IN_APP_SCRIPT.format(build="from in_engine import build", guard=REQUEST_TEMPLATE_GUARD)
    got = engine.script(script, stdin=in_app_job(known.cases))
    assert known.routes <= set(got["routes"]), known.routes - set(got["routes"])
    check_in_app(got, known.cases, known.reached)


def test_the_app_loads_the_guard_and_refuses_a_request_template(engine: Engine) -> None:
    """The release's app built from ``--middleware`` with the guard (in_engine.py ``guarded``) refuses each field
    named below; any other body reaches vLLM whole, and the key check still stands behind the guard."""
    got = engine.run("guarded", "--middleware", REQUEST_TEMPLATE_GUARD)
    for case, param in (
        ("template", "chat_template"),
        ("kwargs", "chat_template_kwargs.chat_template"),
        ("kwargs_tokenize", "chat_template_kwargs.tokenize"),  # CVE-2025-62426
        ("mm_kwargs", "mm_processor_kwargs.code_revision"),  # CVE-2026-114053
        ("n", "n"),  # CVE-2026-34756
        ("guided", "guided_json"),  # CVE-2025-32381
        ("response_format", "response_format"),
        ("tokenize_kwargs", "chat_template_kwargs.tokenize"),  # /tokenize takes the same kwargs
    ):
        assert got[case]["status"] == 400, got[case]
        assert json.loads(got[case]["body"])["error"]["param"] == param, got[case]
    assert json.loads(got["best_of"]["body"])["error"]["param"] == "best_of", got["best_of"]
    # Any other body reaches vLLM whole: its own request model names the missing field (vLLM's 400, not the guard's).
    assert got["no_messages"]["status"] == 400 and "messages" in got["no_messages"]["body"], got["no_messages"]
    assert "request_chat_template" not in got["no_messages"]["body"]
    assert got["no_key"]["status"] == 401, got["no_key"]  # the key check still stands behind the guard


def test_the_fields_the_guard_reads_are_fields_of_the_releases_request_models(engine: Engine) -> None:
    """A renamed field would pass unguarded: every field the guard reads is one of the release's request models',
    but for those only another release has (0.7.3: 0.32.0's structured_outputs, text, ...; 0.32.0: the guided_*
    fields the guard keeps for 0.7.3)."""
    absent = guard_fields(_guard()) - _fields(engine.stack.name)
    assert absent == KNOWN[engine.release].guard_fields_absent, absent


def test_every_field_the_guard_reads_is_a_field_of_some_stacks_release(every_engine: dict[str, Engine]) -> None:
    """What one release lacks, another release has: no field of the guard is a field of no release."""
    for name in every_engine:
        absent = guard_fields(_guard()) - _fields(name)
        others = frozenset().union(*(_fields(other) for other in every_engine if other != name))
        assert absent <= others, (name, absent - others)


def _template_calls() -> list[Any]:
    return [pytest.param(name, id=name) for name, stack in stacks.STACKS.items()
            if stack.vllm in KNOWN and KNOWN[stack.vllm].template_call]  # fmt: skip


@pytest.mark.parametrize("engine", _template_calls(), indirect=True)
def test_the_guard_knows_the_template_call(engine: Engine) -> None:
    """The parameters of the call a request's chat_template_kwargs are unpacked into, and of the tokenizer method it
    ends in: the guard must never let a request set one of them (CVE-2025-62426)."""
    got = engine.run("template_call", KNOWN[engine.release].template_call)
    named = {p for p in got["vllm"] + got["hf"] if p not in ("self", "kwargs")}
    guard = _guard()
    assert named <= guard.TEMPLATE_CALL_PARAMETERS, named - guard.TEMPLATE_CALL_PARAMETERS
