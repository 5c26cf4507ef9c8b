"""The collection's Python imports form no cycle, and vLLM 0.7.3's word lists are a leaf (issue 20, item 2).

Every import of one of the collection's own modules counts, at module level or inside a function (a cycle
broken only by a function-level import is still a cycle); imports under ``if TYPE_CHECKING:`` are for
annotations only and never run, so they do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "ansible_collections.gpubox.gpubox.plugins."
PLUGINS = ROOT / "plugins"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PLUGINS).with_suffix("").parts)


def _imports(path: Path) -> set[str]:
    """The collection modules ``path`` imports (as 'module_utils.x'), TYPE_CHECKING blocks left out."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            base = node.module[len(PACKAGE) :]
            for alias in node.names:
                # "from ...module_utils import x" names a module; "from ...module_utils.x import y" names x
                found.add(f"{base}.{alias.name}" if base.count(".") == 0 else base)
        elif isinstance(node, ast.Import):
            found.update(a.name[len(PACKAGE) :] for a in node.names if a.name.startswith(PACKAGE))
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PLUGINS.rglob("*.py") if p.name != "__init__.py"}
    return {name: {m for m in _imports(path) if m in files} for name, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_the_collections_imports_form_no_cycle() -> None:
    graph = _graph()
    assert graph["module_utils.state_checks"] >= {"module_utils.model_catalog", "module_utils.vllm_words"}
    assert _cycles(graph) == []


def test_the_vllm_word_lists_import_nothing_of_ours() -> None:
    assert _graph()["module_utils.vllm_words"] == set()


def test_a_cycle_is_found() -> None:
    # The walk itself can fail: state_checks -> model_catalog -> state_checks, as it was before the leaf module.
    graph = _graph()
    graph["module_utils.model_catalog"] = graph["module_utils.model_catalog"] | {"module_utils.state_checks"}
    assert ["module_utils.model_catalog", "module_utils.state_checks", "module_utils.model_catalog"] in _cycles(
        graph
    ) or ["module_utils.state_checks", "module_utils.model_catalog", "module_utils.state_checks"] in _cycles(graph)


def test_a_function_level_import_counts_and_type_checking_does_not(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        f"    from {PACKAGE}module_utils.a import A\n"
        "def f():\n"
        f"    from {PACKAGE}module_utils import b\n"
    )
    assert _imports(source) == {"module_utils.b"}
