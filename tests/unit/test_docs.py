"""Every repo path, link and make target that the docs or an error message name exists.

Read: every Markdown file of the checkout (README.md, CHANGELOG.md, CONTRIBUTING.md, docs/, the roles' and
the harness's READMEs, bench/results.md), and the error messages (string literals of
plugins/**/*.py but docstrings; `msg`/`fail_msg` of roles/**/tasks/*.yml). A path is a word that starts with one of
the repo's top-level directories (`roles/x/y.yml`, `plugins/...`, `tools/...`); it must exist relative
to the repo root (or, in a role's README, to the role). Placeholders are skipped (`<inventory>`,
`{{ var }}`, an all-capitals segment such as `OWNER/NAME`); a glob must match something. A path in
`inventories/mybox/` (the copy of inventories/production the quick start makes) is looked up in
inventories/production, and may be a file the user creates there: its directory must exist. A make
target (`make X` in a code span or code block of the docs, or anywhere in a message) must be a target
of the Makefile. A relative Markdown link (`[text](fleet.md#lan-cache)`) must name a file that exists and,
with an anchor, a heading of it (GitHub's anchors). A citation of the facts file anywhere in the checkout
is `docs/facts.md`, and a section it names in quotes right after it is a heading there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TOP_DIRS = (
    "roles",
    "plugins",
    "tools",
    "playbooks",
    "molecule",
    "docs",
    "inventories",
    "tests",
    "bench",
    "meta",
    "templates",
    "collections",
    ".config",
    ".github",
    ".ci",
)
PATH_RE = re.compile(r"(?<![\w./~$-])(?:" + "|".join(re.escape(d) for d in TOP_DIRS) + r")/[\w./*?<>{}@-]*")
MAKE_RE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")
# English after "make" in a message ('make its parent ...'), not a target.
NOT_TARGETS = {"its", "it", "sure", "the", "a", "them", "progress", "room", "space", "one"}
USER_COPY = "inventories/mybox"


SKIP_DIRS = {".git", ".venv", ".lockvenv", ".ansible", ".cache", "collections", ".pytest_cache", ".ruff_cache"}
LINK_RE = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FACTS = ROOT / "docs" / "facts.md"
# A citation of the facts file: its path as written, then an optional section name in quotes.
FACTS_CITE_RE = re.compile(r"([\w./-]*facts\.md)(?:[,:]? *\(?[\"\u201c]([^\"\u201d\n]+)[\"\u201d])?")


def _tracked(pattern: str) -> list[Path]:
    return sorted(p for p in ROOT.rglob(pattern) if p.is_file() and not SKIP_DIRS & set(p.relative_to(ROOT).parts))


def doc_files() -> list[Path]:
    return _tracked("*.md")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but '-' and '_' dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in doc.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"^#{1,6} (.+?)#*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def link_problems(doc: Path) -> list[str]:
    """Relative links of a Markdown file whose file or heading does not exist."""
    problems = []
    for target in LINK_RE.findall(doc.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            problems.append(f"link {target} (no {path})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"link {target} (no heading #{anchor} in {shown(dest)})")
    return problems


def facts_citation_problems(text: str) -> list[str]:
    """Citations of the facts file that are not `docs/facts.md`, or name a section it does not have."""
    problems = []
    sections = {re.sub(r"^#+ ", "", line).strip() for line in FACTS.read_text().splitlines() if line.startswith("#")}
    for path, section in FACTS_CITE_RE.findall(text):
        if path != "docs/facts.md":
            problems.append(f"{path} (cite it as docs/facts.md)")
        elif section and section not in sections:
            problems.append(f'docs/facts.md "{section}" (no such section; it has: {", ".join(sorted(sections))})')
    return problems


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _strings(node: ast.AST) -> list[str]:
    """String literals of a module but its docstrings; an f-string's literal parts joined ({} for a field)."""
    out = []
    skip = _docstrings(node)
    for sub in ast.walk(node):
        if id(sub) in skip:
            continue
        if isinstance(sub, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in sub.values))
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            out.append(sub.value)
    return out


def _task_messages(data) -> list[str]:
    out = []
    if isinstance(data, dict):
        for key, value in data.items():
            if key in ("msg", "fail_msg") and value is not None:
                out.extend(value if isinstance(value, list) else [value])
            else:
                out.extend(_task_messages(value))
    elif isinstance(data, list):
        for item in data:
            out.extend(_task_messages(item))
    return [str(m) for m in out]


def message_sources() -> dict[str, list[str]]:
    sources = {}
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        sources[str(path.relative_to(ROOT))] = _strings(ast.parse(path.read_text()))
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        sources[str(path.relative_to(ROOT))] = _task_messages(yaml.safe_load(path.read_text()))
    return sources


def make_targets() -> set[str]:
    targets = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([\w./$()-][\w./$() -]*?)\s*::?(?!=)", line)
        if m and not line.startswith(("\t", "#")):
            targets.update(m.group(1).split())
    return targets


def _is_placeholder(path: str) -> bool:
    if any(c in path for c in "<>{}"):
        return True
    return any(seg.isupper() and seg.isalpha() for seg in re.split(r"[/.]", path) if seg)


def path_problem(path: str, bases: list[Path]) -> str | None:
    path = path.rstrip(".,:;)]'\"`")
    if not path or _is_placeholder(path):
        return None
    if path == USER_COPY or path.startswith(USER_COPY + "/"):
        copied = ROOT / "inventories" / "production" / path[len(USER_COPY) :].lstrip("/")
        if copied.exists() or copied.parent.is_dir():
            return None
        return f"{path} (as {copied.relative_to(ROOT)} of the copied inventory)"
    for base in bases:
        if any(c in path for c in "*?["):
            if list(base.glob(path)):
                return None
        elif (base / path).exists():
            return None
    return path


def _code(text: str) -> str:
    """The code spans and indented code lines of a markdown text."""
    spans = re.findall(r"`([^`\n]+)`", text)
    blocks = [line for line in text.splitlines() if line.startswith("    ")]
    return "\n".join(spans + blocks)


def doc_problems(doc: Path) -> list[str]:
    text = doc.read_text()
    bases = [ROOT] + ([doc.parent] if doc.parent != ROOT else [])
    found = [p for p in (path_problem(m, bases) for m in PATH_RE.findall(text)) if p]
    targets = make_targets()
    found += [f"make {t}" for t in MAKE_RE.findall(_code(text)) if t not in targets]
    found += link_problems(doc)
    return sorted(set(found))


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_names_only_what_exists(doc: Path) -> None:
    name = str(doc.relative_to(ROOT))
    problems = [p for p in doc_problems(doc) if p not in ELSEWHERE.get(name, ())]
    assert not problems, f"{name} names what does not exist: {problems}"


# Problems the link check found that stay on purpose, by file (none now).
ELSEWHERE: dict[str, tuple[str, ...]] = {}


def test_error_messages_name_only_what_exists() -> None:
    targets = make_targets()
    problems = []
    for source, messages in message_sources().items():
        for message in messages:
            for m in PATH_RE.findall(message):
                problem = path_problem(m, [ROOT])
                if problem:
                    problems.append(f"{source}: {problem}")
            problems += [f"{source}: make {t}" for t in MAKE_RE.findall(message) if t not in targets | NOT_TARGETS]
    assert not problems, "error messages name what does not exist:\n" + "\n".join(sorted(set(problems)))


def test_the_checker_finds_what_is_missing(tmp_path: Path) -> None:
    assert path_problem("tools/role_readme.py", [ROOT]) is None
    assert path_problem("plugins/module_utils/gpubox_models.py).", [ROOT]) == "plugins/module_utils/gpubox_models.py"
    assert path_problem("roles/<role>/README.md", [ROOT]) is None
    assert path_problem("roles/*/meta/argument_specs.yml", [ROOT]) is None
    assert path_problem("roles/*/nothing.yml", [ROOT]) == "roles/*/nothing.yml"
    assert path_problem("inventories/mybox/group_vars/all.yml", [ROOT]) is None
    assert path_problem("inventories/mybox/nowhere/x.yml", [ROOT])
    assert {"demo", "test", "plan", "unit"} <= make_targets()
    doc = tmp_path / "x.md"
    doc.write_text("Run `make plan` and `make nothing-here`; see tools/nothing.py and docs/ .\n")
    assert doc_problems(doc) == ["make nothing-here", "tools/nothing.py"]


def test_facts_are_cited_from_the_repo() -> None:
    """Every file of the checkout that cites the facts file cites docs/facts.md (which exists) and its real sections."""
    assert FACTS.is_file()
    problems = []
    for path in _tracked("*"):
        if path.suffix in {".gz", ".deb", ".png", ".whl", ".pyc", ".json"} or path in (FACTS, Path(__file__)):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        problems += [f"{path.relative_to(ROOT)}: {p}" for p in facts_citation_problems(text)]
    assert not problems, "\n".join(problems)


def test_the_link_and_citation_checks_find_what_is_missing(tmp_path: Path) -> None:
    assert slug("LAN cache (`roles/fleet_cache`)") == "lan-cache-rolesfleet_cache"
    assert (
        slug("Crash consistency (`molecule/serving`, its converge)") == "crash-consistency-moleculeserving-its-converge"
    )
    other = tmp_path / "other.md"
    other.write_text("# Title\n\n## Two words\n\n```\n# not a heading\n```\n\n## Two words\n")
    assert anchors(other) == {"title", "two-words", "two-words-1"}
    doc = tmp_path / "x.md"
    doc.write_text(
        "[a](other.md#two-words) [b](other.md#not-a-heading) [c](missing.md) [d](https://example.org/x) "
        "[e](#title) [f](other.md)\n\n# Title\n"
    )
    assert link_problems(doc) == [
        f"link other.md#not-a-heading (no heading #not-a-heading in {other})",
        "link missing.md (no missing.md)",
    ]
    assert facts_citation_problems('see docs/facts.md, "ModelScope" and docs/facts.md') == []
    assert facts_citation_problems('(shared/docs/facts.md, "ModelScope API") facts.md') == [
        "shared/docs/facts.md (cite it as docs/facts.md)",
        "facts.md (cite it as docs/facts.md)",
    ]
    assert facts_citation_problems('docs/facts.md ("Nowhere")')[0].startswith(
        'docs/facts.md "Nowhere" (no such section'
    )
