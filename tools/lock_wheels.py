#!/usr/bin/env python3
"""Write a hash lock of a pin set from PyPI's own file list (make lock-wheels), or check one offline.

    python tools/lock_wheels.py roles/python_env/files/constraints-vllm-0.7.3.txt \
        --out roles/python_env/files/constraints-vllm-0.7.3.hashes.txt
    python tools/lock_wheels.py CONSTRAINTS --out LOCK --check     # offline: same pins, every one hashed

Trust boundary (design.md): the LAN cache's PyPI proxy and any mirror are untrusted for wheels, as
they are for models. The lock is written on purpose, from PyPI's simple index over https (PEP 503: each
file's link carries ``#sha256=``), and checked in beside its constraints; python_env then installs
with ``pip install --require-hashes --requirement LOCK``, so a file whose sha256 the lock does not name
is refused whatever the index page that served it says. Every file PyPI has for a pinned version is
listed (all platforms and the sdist): pip accepts any one of them, so one lock serves every box.

The input is a constraints file of ``name==version`` lines (comments, blank lines and environment
markers allowed); the output keeps the order and markers and adds the hashes. Extras: pip in
``--require-hashes`` mode refuses a dependency that asks for ``name[extra]`` unless the lock itself names
``name[extra]==version`` ("all requirements must have their versions pinned with =="), and a constraints
file cannot carry extras; so the constraints list them in one comment line, ``# lock-extras: a[x] b[y]``
(walked from ``pip install --dry-run --report``), and the lock writes those pins twice, plain and with the
extras (a dependency on the plain name is resolved before the extras line is expanded).
Exit status: 0 done or in step; 1 a pin PyPI has no file for, or a lock out of step with its constraints (``--check``).
"""

from __future__ import annotations

import argparse
import html.parser
import re
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

INDEX = "https://pypi.org/simple"
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[A-Za-z0-9._,-]*\])?\s*==\s*([^\s;#\\]+)\s*(;[^#\\]*)?")
_EXTRAS = re.compile(r"^#\s*lock-extras:(.*)$", re.M)
_EXTRA = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\[([A-Za-z0-9._,-]+)\]$")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    marker: str = ""
    extras: str = ""  # "standard" or "a,b": written as name[extras]==version

    @property
    def key(self) -> tuple[str, str, str, str]:
        return normalize(self.name), self.version, self.marker, self.extras


def normalize(name: str) -> str:
    """A project name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_extras(text: str) -> dict[str, str]:
    """normalized name -> "extra[,extra]" from the constraints' ``# lock-extras:`` lines."""
    extras: dict[str, str] = {}
    for line in _EXTRAS.findall(text):
        for word in line.split():
            found = _EXTRA.match(word)
            if not found:
                raise ValueError(f"# lock-extras: {word!r} is not name[extra]")
            extras[normalize(found.group(1))] = ",".join(sorted(found.group(2).split(",")))
    return extras


def read_pins(text: str) -> list[Pin]:
    """The pins of a constraints file or a lock, each with the extras the constraints' ``# lock-extras:`` name."""
    extras = read_extras(text)
    pins = []
    for line in text.splitlines():
        if line.lstrip().startswith(("#", "--")) or not line.strip():
            continue
        found = _PIN.match(line)
        if not found:
            raise ValueError(f"not a name==version pin: {line!r}")
        written = ",".join(sorted((found.group(2) or "[]")[1:-1].split(","))).strip(",")
        name = found.group(1)
        pins.append(
            Pin(name, found.group(3), (found.group(4) or "").strip(), written or extras.get(normalize(name), ""))
        )
    return pins


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]


def file_version(filename: str, project: str) -> str | None:
    """The version a distribution file's name carries (wheel or sdist), None when it is another project's."""
    if filename.endswith(".whl"):
        parts = filename[:-4].split("-")
        name, version = parts[0], parts[1] if len(parts) > 1 else ""
    else:
        stem = re.sub(r"\.(tar\.gz|tar\.bz2|zip|tgz)$", "", filename)
        name, _, version = stem.rpartition("-")
    return version if normalize(name) == normalize(project) else None


def hashes_from_page(page: str, pin: Pin) -> list[str]:
    """The sha256 of every file of pin's version that a PEP 503 page links, sorted."""
    links = _Links()
    links.feed(page)
    found = set()
    for href in links.hrefs:
        url, _, fragment = href.partition("#")
        filename = url.rsplit("/", 1)[-1]
        if file_version(filename, pin.name) == pin.version and fragment.startswith("sha256="):
            found.add(fragment.removeprefix("sha256="))
    return sorted(found)


def fetch_page(index: str, name: str) -> str:
    request = urllib.request.Request(f"{index.rstrip('/')}/{normalize(name)}/", headers={"Accept": "text/html"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.read().decode("utf-8")


def render(source: str, pins: list[Pin], hashes: dict[Pin, list[str]]) -> str:
    out = [
        f"# Hash lock of {source}: every pin with the sha256 of each file PyPI has for it (all platforms),",
        "# from PyPI's simple index. Written by `make lock-wheels` (tools/lock_wheels.py); refresh it on purpose",
        "# with the constraints. python_env installs it with pip --require-hashes: a file whose hash is not",
        "# here is refused, whichever index or cache served it.",
    ]
    for pin in pins:
        # A pin with extras is written twice, plain and with its extras: pip resolves a dependency on the plain
        # name (e.g. pydantic>=2.0) before it expands name[extra]==version, and then finds it unpinned.
        for extras in ["", pin.extras] if pin.extras else [""]:
            head = f"{pin.name}{f'[{extras}]' if extras else ''}=={pin.version}" + (
                f" {pin.marker}" if pin.marker else ""
            )
            out.append(head + " \\")
            lines = [f"    --hash=sha256:{h}" for h in hashes[pin]]
            out += [line + " \\" for line in lines[:-1]] + lines[-1:]
    return "\n".join(out) + "\n"


def lock_problems(constraints: str, lock: str) -> list[str]:
    """Why a lock is out of step with its constraints: other pins, or a pin without a hash."""
    pins = read_pins(constraints)
    # a pin with extras is in the lock twice: plain and with its extras (render)
    want = {p.key for p in pins} | {Pin(p.name, p.version, p.marker).key for p in pins if p.extras}
    joined = re.sub(r"\\\n", " ", lock)
    have, problems = set(), []
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pin = read_pins(line.split("--hash")[0])[0]
        have.add(pin.key)
        if not _HASH.search(line):
            problems.append(f"{pin.name}=={pin.version} has no --hash=sha256")

    def show(name: str, version: str, extras: str) -> str:
        return f"{name}[{extras}]=={version}" if extras else f"{name}=={version}"

    problems += [f"{show(n, v, e)} is in the constraints but not in the lock" for n, v, _, e in sorted(want - have)]
    problems += [f"{show(n, v, e)} is in the lock but not in the constraints" for n, v, _, e in sorted(have - want)]
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("constraints", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--index", default=INDEX, help="a PEP 503 index over https (default PyPI's)")
    ap.add_argument("--check", action="store_true", help="offline: fail when the lock is out of step")
    args = ap.parse_args()
    text = args.constraints.read_text()
    if args.check:
        problems = lock_problems(text, args.out.read_text() if args.out.exists() else "")
        for problem in problems:
            print(f"lock_wheels: {args.out}: {problem}; run make lock-wheels", file=sys.stderr)
        return 1 if problems else 0
    if not args.index.startswith("https://"):
        print(f"lock_wheels: --index {args.index} is not https: a lock is written only from a trusted index")
        return 1
    pins = read_pins(text)
    hashes = {}
    for pin in pins:
        hashes[pin] = hashes_from_page(fetch_page(args.index, pin.name), pin)
        if not hashes[pin]:
            print(f"lock_wheels: {args.index} has no file for {pin.name}=={pin.version}", file=sys.stderr)
            return 1
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(render(args.constraints.as_posix(), pins, hashes))
    tmp.replace(args.out)
    print(f"lock_wheels: {args.out}: {len(pins)} pins, {sum(map(len, hashes.values()))} file hashes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
