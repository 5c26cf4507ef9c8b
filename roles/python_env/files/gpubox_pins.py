"""Compare an environment's installed distributions with requirement and constraint pins.

Run with the environment's own interpreter (stdlib only, Python >= 3.8). Prints one JSON object:
  satisfied     true when nothing below needs pip
  missing       required distributions that are not installed
  mismatched    installed distributions whose version differs from an exact (==) pin
  to_remove     installed distributions listed with --remove
  broken_scripts  "name==version" of pinned distributions whose console scripts are missing (an upgrade
                that moves a script between distributions, e.g. modelscope 1.23 -> 1.40 handing
                `modelscope` to modelscope-hub, deletes it when pip uninstalls the old one last)
  versions      installed version of every pinned or required distribution
With --lock HASHES (the hash lock python_env installs with pip --require-hashes), also:
  repair_lock     the lock's entries (name==version and every --hash) of the broken_scripts distributions, as a
                  requirements file for `pip install --force-reinstall --no-deps --require-hashes -r`
  repair_unlocked broken_scripts entries the lock has no entry for (the repair would have no hash to check)
Requirement lines must be installed; constraint lines only bind what is installed (pip semantics).
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import os
import re
import sys
import sysconfig

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def marker_applies(marker: str) -> bool:
    try:
        from pip._vendor.packaging.markers import Marker
    except ImportError:  # no pip in this environment: keep the line, it will be checked as written
        return True
    return Marker(marker).evaluate()


def parse_pins(path: str) -> dict[str, str | None]:
    """Map canonical name -> exact version ('==' pin) or None (name only / other specifier)."""
    pins: dict[str, str | None] = {}
    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            line = raw.split(" #", 1)[0].strip()
            if not line or line.startswith(("#", "-")):
                continue
            if ";" in line:
                line, marker = (part.strip() for part in line.split(";", 1))
                if not marker_applies(marker):
                    continue
            match = _NAME.match(line)
            if not match:
                raise SystemExit(f"{path}: cannot read the requirement line {raw.strip()!r}")
            spec = match.group(3).replace(" ", "")
            exact = spec[2:] if spec.startswith("==") and "," not in spec and "*" not in spec else None
            pins[canonical(match.group(1))] = exact
    return pins


def same_version(installed: str, pinned: str) -> bool:
    # PEP 440: a pin without a local label (2.5.1) matches a local build (2.5.1+cu124).
    if "+" not in pinned:
        installed = installed.split("+", 1)[0]
    return installed == pinned


def installed_versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonical(name), dist.version)
    return found


def missing_scripts(names: set[str]) -> list[str]:
    """name==version of the installed distributions in ``names`` with a console script not on disk."""
    scripts = sysconfig.get_path("scripts")
    broken = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or canonical(name) not in names:
            continue
        for entry in dist.entry_points:
            if entry.group == "console_scripts" and not os.path.exists(os.path.join(scripts, entry.name)):
                broken.add(f"{canonical(name)}=={dist.version}")
    return sorted(broken)


def lock_entries(text: str) -> dict[str, list[str]]:
    """canonical name==version -> the text of its entries (continuation lines joined) in a hash lock; a pin with
    extras has two, plain and with the extras."""
    entries: dict[str, list[str]] = {}
    for entry in re.sub(r"\\\n", " ", text).splitlines():
        if not entry.strip() or entry.lstrip().startswith("#"):
            continue
        head = entry.split("--hash", 1)[0].split(";", 1)[0].strip()
        match = _NAME.match(head)
        if not match or not match.group(3).replace(" ", "").startswith("=="):
            raise SystemExit(f"hash lock: cannot read the entry {entry.strip()[:80]!r}")
        name, version = canonical(match.group(1)), match.group(3).replace(" ", "")[2:]
        entries.setdefault(f"{name}=={version}", []).append(" ".join(entry.split()))
    return entries


def repair_from_lock(broken: list[str], lock_text: str) -> tuple[str, list[str]]:
    """The lock entries of ``broken`` (name==version) as a requirements text, and those the lock lacks."""
    entries = lock_entries(lock_text)
    found = [line for pin in broken for line in entries.get(pin, [])]
    return "".join(line + "\n" for line in found), [pin for pin in broken if pin not in entries]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requirements", action="append", default=[])
    parser.add_argument("--constraints", action="append", default=[])
    parser.add_argument("--remove", action="append", default=[])
    parser.add_argument("--lock", help="the hash lock: report the repair's entries (repair_lock)")
    args = parser.parse_args()

    installed = installed_versions()
    required: dict[str, str | None] = {}
    for path in args.requirements:
        required.update(parse_pins(path))
    constrained: dict[str, str | None] = {}
    for path in args.constraints:
        constrained.update(parse_pins(path))

    missing = sorted(name for name in required if name not in installed)
    mismatched = []
    for name in sorted(set(required) | set(constrained)):
        pin = required.get(name) or constrained.get(name)
        if pin and name in installed and not same_version(installed[name], pin):
            mismatched.append(f"{name} {installed[name]} (pinned {pin})")
    to_remove = sorted(canonical(name) for name in args.remove if canonical(name) in installed)
    pinned_installed = (set(required) | set(constrained)) & set(installed)
    broken = missing_scripts(pinned_installed)
    report = {
        "satisfied": not missing and not mismatched and not broken,
        "broken_scripts": broken,
        "missing": missing,
        "mismatched": mismatched,
        "to_remove": to_remove,
        "python": ".".join(str(part) for part in sys.version_info[:3]),
        "versions": {name: installed[name] for name in sorted(pinned_installed)},
    }
    if args.lock:
        with open(args.lock, encoding="utf-8") as handle:
            report["repair_lock"], report["repair_unlocked"] = repair_from_lock(broken, handle.read())
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
