"""dpkg's own list of packages, read with one ``dpkg-query --show`` (stdlib only).

``FORMAT`` is the --showformat every caller hands dpkg-query, with dpkg-query's own ``\\t`` and ``\\n``
escapes (so a task's argv holds no tab): the status abbreviation, name, architecture and version,
tab-separated. ``rows`` reads that output; the status is read two ways:

- ``settled``: wanted install or hold, installed, no error flag ("ii " / "hi "): nothing left for apt to do
  (the apt_present action plugin);
- ``on_disk``: dpkg's current state (the status's second letter) is neither n (not installed) nor c (only its
  configuration files left), so a package a stopped run left unpacked or half-configured counts, as in apt's
  cache, where a package has a current version in exactly those states (roles/nvidia_driver's plan).
"""

from __future__ import annotations

from dataclasses import dataclass

FORMAT = r"${db:Status-Abbrev}\t${Package}\t${Architecture}\t${Version}\n"


@dataclass(frozen=True)
class Row:
    status: str
    name: str
    arch: str
    version: str


def rows(text: str) -> list[Row]:
    """The lines of dpkg-query's output in ``FORMAT`` (a line of another shape is passed over)."""
    out = []
    for line in str(text or "").splitlines():
        fields = line.split("\t")
        if len(fields) == 4:
            out.append(Row(*fields))
    return out


def settled(status: str) -> bool:
    return len(status) == 3 and status[0] in "ih" and status[1] == "i" and status[2] == " "


def on_disk(status: str) -> bool:
    return len(status) >= 2 and status[1] not in "nc"
