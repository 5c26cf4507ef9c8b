#!/usr/bin/env python3
"""List every assertion of the test suite, one line each, sorted: diff the list from before and after
the suite is restructured to see that none was dropped.

    <scenario>\t<file>\t<task or test>\t<condition>

- molecule/<scenario>/*.yml (molecule.yml aside), the molecule/shared playbooks the scenario runs (the
  base .config/molecule/config.yml's create/prepare/destroy unless its molecule.yml replaces them) and
  every playbook or task file under molecule/ they import or include: each assert task (one line per
  `that`), each `failed_when` and `until` condition, and each fail task's `when`;
- Python under molecule/<scenario>/, tests/unit (scenario `unit`), tests/integration (scenario
  `integration`) and the harness package harness/ (scenario `harness`): each pytest test function
  (`test function`), each `assert` statement and each `check(ok, what)` call (the suites converge.yml
  runs), named <file>::<function>.

A test moved between tests/unit and tests/integration, or a helper moved into harness/, changes its
scenario and file but not its function and condition: `--moved` prints the lines without the first two
columns (and the file in the task's name), for a diff across such a move.

    python tools/list_assertions.py > before.tsv   # restructure, then again > after.tsv; diff them
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / ".config" / "molecule" / "config.yml"
ASSERT_MODULES = ("assert", "ansible.builtin.assert", "ansible.legacy.assert")
FAIL_MODULES = ("fail", "ansible.builtin.fail", "ansible.legacy.fail")
CONDITION_KEYS = ("failed_when", "until")
INCLUDE_KEYS = tuple(
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in ("import_playbook", "import_tasks", "include_tasks")
)


@dataclass(frozen=True, order=True)
class Assertion:
    scenario: str
    file: str
    task: str
    condition: str

    def line(self) -> str:
        return "\t".join((self.scenario, self.file, self.task, self.condition))


class _Loader(yaml.SafeLoader):
    """Safe YAML that reads Ansible's tags (!unsafe, !vault) as their plain value."""


_Loader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node))


def one_line(value: Any) -> str:
    """A condition as one line: booleans as Ansible writes them, whitespace (tabs, newlines) collapsed."""
    if isinstance(value, bool):
        return str(value).lower()
    return " ".join(str(value).split())


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def task_assertions(task: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(task name, condition) for each assertion one task makes."""
    module = next((m for m in (*ASSERT_MODULES, *FAIL_MODULES) if m in task), None)
    name = one_line(task.get("name") or f"(unnamed {module or 'task'})")
    if module in ASSERT_MODULES:
        args = task[module] if isinstance(task[module], dict) else {}
        for cond in as_list(args.get("that", [])):
            yield name, one_line(cond)
    if module in FAIL_MODULES and "when" in task:
        for cond in as_list(task["when"]):
            yield name, "fail when: " + one_line(cond)
    for key in CONDITION_KEYS:
        if key in task:
            for cond in as_list(task[key]):
                yield name, f"{key}: {one_line(cond)}"


def yaml_assertions(data: Any) -> Iterator[tuple[str, str]]:
    """Every assertion anywhere in a loaded playbook or task file (plays, blocks, rescue, handlers)."""
    if isinstance(data, list):
        for item in data:
            yield from yaml_assertions(data=item)
    elif isinstance(data, dict):
        yield from task_assertions(data)
        for value in data.values():
            if isinstance(value, (list, dict)):
                yield from yaml_assertions(value)


def includes(data: Any) -> Iterator[str]:
    """The files a playbook or task file imports or includes, as written (templated ones left out)."""
    if isinstance(data, list):
        for item in data:
            yield from includes(item)
    elif isinstance(data, dict):
        for key in INCLUDE_KEYS:
            target = data.get(key)
            if isinstance(target, dict):
                target = target.get("file")
            if isinstance(target, str):
                target = target.replace("{{ playbook_dir }}/", "")
                if "{{" not in target:
                    yield target
        for value in data.values():
            if isinstance(value, (list, dict)):
                yield from includes(value)


def load_yaml(path: Path) -> Any:
    try:
        return yaml.load(path.read_text(), Loader=_Loader)
    except yaml.YAMLError as err:
        raise SystemExit(f"list_assertions: {path.relative_to(ROOT)} is not valid YAML: {err}") from err


def scenario_playbooks(scenario_dir: Path, base: dict[str, Any]) -> list[Path]:
    """The scenario's own YAML files and the playbooks molecule runs for it from elsewhere."""
    own = sorted(p for p in scenario_dir.glob("*.yml") if p.name != "molecule.yml")
    molecule_yml = load_yaml(scenario_dir / "molecule.yml") or {}
    playbooks: dict[str, Any] = {}
    for config in (base, molecule_yml):
        for section in ("ansible", "provisioner"):
            playbooks.update((config.get(section) or {}).get("playbooks") or {})
    named = [(scenario_dir / p).resolve() for p in playbooks.values() if isinstance(p, str)]
    return [*own, *(p for p in named if p.is_file() and p not in own)]


def reachable(entries: list[Path], scenario_dir: Path) -> list[Path]:
    """The entries and every file under molecule/ they import or include, transitively."""
    molecule_dir = (ROOT / "molecule").resolve()
    seen: list[Path] = []
    todo = [p.resolve() for p in entries]
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.append(path)
        for target in includes(load_yaml(path)):
            for base in (path.parent, scenario_dir):
                candidate = (base / target).resolve()
                if candidate.is_file():
                    if candidate.is_relative_to(molecule_dir):
                        todo.append(candidate)
                    break
    return seen


def scenario_yaml_assertions(scenario_dir: Path, base: dict[str, Any]) -> list[Assertion]:
    scenario = scenario_dir.name
    found = []
    for path in reachable(scenario_playbooks(scenario_dir, base), scenario_dir.resolve()):
        rel = str(path.relative_to(ROOT.resolve()))
        found += [Assertion(scenario, rel, task, cond) for task, cond in yaml_assertions(load_yaml(path))]
    return found


def python_assertions(source: str, rel: str, scenario: str) -> list[Assertion]:
    """Test functions, assert statements and check(ok, what) calls of one Python file."""
    try:
        tree = ast.parse(source, filename=rel)
    except SyntaxError as err:
        raise SystemExit(f"list_assertions: {rel} does not parse: {err}") from err
    found: list[Assertion] = []
    name = Path(rel).name
    pytest_file = name.startswith("test_") or name.endswith("_test.py")

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{where}::{child.name}"
                in_test_class = not isinstance(node, ast.ClassDef) or node.name.startswith("Test")
                is_test = not isinstance(child, ast.ClassDef) and child.name.startswith("test") and in_test_class
                if pytest_file and is_test:
                    found.append(Assertion(scenario, rel, inner, "test function"))
            elif isinstance(child, ast.Assert):
                found.append(Assertion(scenario, rel, where, one_line("assert " + ast.unparse(child.test))))
            elif isinstance(child, ast.Call) and is_check_call(child):
                found.append(Assertion(scenario, rel, where, one_line(ast.unparse(child))))
            visit(child, inner)

    visit(tree, rel)
    return found


def is_check_call(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "check" and len(call.args) + len(call.keywords) >= 2


def python_files(scenario_dir: Path) -> list[Path]:
    return sorted(p for p in scenario_dir.rglob("*.py") if "__pycache__" not in p.parts)


def list_assertions() -> list[str]:
    """Every assertion line of the suite, sorted."""
    base = load_yaml(BASE_CONFIG) or {}
    found: list[Assertion] = []
    for molecule_yml in sorted((ROOT / "molecule").glob("*/molecule.yml")):
        scenario_dir = molecule_yml.parent
        found += scenario_yaml_assertions(scenario_dir, base)
        for path in python_files(scenario_dir):
            found += python_assertions(path.read_text(), str(path.relative_to(ROOT)), scenario_dir.name)
    for scenario, where in (("unit", "tests/unit"), ("integration", "tests/integration")):
        for path in sorted((ROOT / where).glob("*.py")):
            found += python_assertions(path.read_text(), str(path.relative_to(ROOT)), scenario)
    for path in python_files(ROOT / "harness"):
        found += python_assertions(path.read_text(), str(path.relative_to(ROOT)), "harness")
    return [a.line() for a in sorted(found)]


def without_place(line: str) -> str:
    """A line of list_assertions() without its scenario and file: the same across a move between suites."""
    _scenario, file, task, condition = line.split("\t", 3)
    name = task.split("::", 1)[1] if task.startswith(file + "::") else "" if task == file else task
    return f"{Path(file).name}::{name}\t{condition}" if name or task == file else f"{task}\t{condition}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the list here instead of printing it")
    parser.add_argument("--moved", action="store_true", help="without scenario and directory (a diff across moves)")
    args = parser.parse_args(argv)
    lines = list_assertions()
    if args.moved:
        lines = sorted(without_place(line) for line in lines)
    text = "".join(line + "\n" for line in lines)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
