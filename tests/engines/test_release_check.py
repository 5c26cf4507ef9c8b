"""make stack-add's verdict on a release's parser (tools/stack_proposal.py), on each CPU-engine stack's real parser.

tests/unit/test_stack_add.py checks the verdict on a recorded run of vLLM 0.32.0's parser; here the same functions read
the live one, on the command lines test_command_lines already parsed (no second import of vLLM). A release read
against its own stack's command lines reproduces its registered record; the control: another stack's lines, which
carry a flag this release removed, fail by that flag's name, with the option that replaced it as the nearest one.
"""

from __future__ import annotations

import pytest

import stack_proposal
from ansible_collections.gpubox.gpubox.plugins.module_utils import desired_state_schema as schema
from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks
from stack_engines import CPU_ENGINES, engine_of
from test_command_lines import _runs, cases

pytestmark = pytest.mark.engines
WORDS = ("dtypes", "kv_cache_dtypes", "quantizations", "block_sizes", "engine", "families")


@pytest.mark.parametrize("name", CPU_ENGINES)
def test_a_release_read_against_its_own_stack_is_its_registered_record(name: str) -> None:
    stack = stacks.STACKS[name]
    check = {"cases": cases(name), "runs": _runs(name)}
    verdict = stack_proposal.evaluate(stack.vllm, stack, check)
    assert verdict["status"] == "passed", verdict
    derived = stack_proposal.derive_release(stack.vllm, stack, check)
    for key in WORDS:
        assert set(getattr(derived, key)) == set(getattr(stack.words, key)), key
    assert set(derived.removed_flags) == set(stack.words.removed_flags)


def _older(name: str) -> list[str]:
    removed = set(stacks.STACKS[name].words.removed_flags)
    return [o for o in stacks.NAMES if o != name and removed & {f.name for f, _ in schema.command_line(o)}]


@pytest.mark.parametrize(("name", "other"), [(n, o) for n in CPU_ENGINES for o in _older(n)])
def test_control_another_stacks_lines_fail_on_the_release_by_the_removed_flag(name: str, other: str) -> None:
    stack, base = stacks.STACKS[name], stacks.STACKS[other]
    check = {"cases": cases(other), "runs": engine_of(name).run("parse", stdin=cases(other))}
    verdict = stack_proposal.evaluate(stack.vllm, base, check)
    assert verdict["status"] == "failed"
    gone = set(stack.words.removed_flags) & {flag.name for flag, _ in schema.command_line(other)}
    assert gone and all(verdict["flags"][flag].startswith("NOT an option") for flag in gone), verdict["flags"]
    assert set(stack_proposal.derive_release(stack.vllm, base, check).removed_flags) >= gone
