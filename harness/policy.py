"""Two rules of the test suite, as pure functions the suite enforces (tests/conftest.py, tests/unit).

- No module edits ``sys.path`` outside a ``conftest.py``: the harness, the benches and the tools import
  each other as packages (the repository root is on the venv's path, `make venv`), never by path surgery.
- A test does not skip because something is missing: a CI image without nginx would otherwise go green.
  A skip is allowed only when its reason starts with one of ALLOWED_SKIPS: ``optional:`` for a dependency
  docs/testing.md names optional, ``not applicable:`` for a case that does not exist for this parameter.
"""

from __future__ import annotations

import ast

PATH_METHODS = {"insert", "append", "extend", "remove", "pop", "clear"}
ALLOWED_SKIPS = ("optional:", "not applicable:")


def _is_sys_path(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def sys_path_edits(source: str, filename: str = "<string>") -> list[int]:
    """The lines of ``source`` that change sys.path: sys.path.insert/append/extend/..., an assignment to
    sys.path or a slice of it, sys.path += ..."""
    lines = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in PATH_METHODS and _is_sys_path(node.func.value):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if _is_sys_path(target) or (isinstance(target, ast.Subscript) and _is_sys_path(target.value)):
                    lines.append(node.lineno)
    return sorted(lines)


def skip_refusal(reason: str) -> str | None:
    """Why a skip with this reason must fail the test instead; None when the skip is allowed."""
    text = reason.removeprefix("Skipped: ").strip()
    if text.startswith(ALLOWED_SKIPS):
        return None
    return (
        f"this test skipped ({text}); a missing server or tool fails its test. Install it "
        "(molecule/shared/host-setup.sh; promtool: make promtool), or, where docs/testing.md names the "
        f"dependency optional, start the skip's reason with one of {', '.join(ALLOWED_SKIPS)}"
    )
