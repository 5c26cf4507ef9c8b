"""The dated archive snapshot a stack's driver packages come from, for the nvidia_driver role: pure.

A stack pins its driver to an exact build per distribution (``stacks.Stack.driver_versions``). When the
distribution's archive no longer carries that build (Ubuntu 22.04's jammy-updates now carries 535-server only as a
transitional package that pulls 580-server), the stack names the date of an archive snapshot that still does
(``stacks.Stack.apt_snapshot``): Ubuntu's snapshot service serves the archive as it was at a UTC time, at
``<service>/<YYYYMMDDTHHMMSSZ>/dists/<suite>/...``, with the archive's own signed Release files (docs/facts.md,
"Ubuntu snapshot service"). The role then:

- adds that snapshot as one more apt source (``Plan.sources``), checked against the keyring the archive's own
  sources use (``signed-by``): apt refuses an index the keyring did not sign, as for any source;
- pins it (``Plan.pin``, appended to the driver's preferences file) so that nothing comes from the snapshot's host
  but the driver packages at the pinned build: the driver's exact pin (priority 1001) is a specific pin and wins
  over this general one (-1), whichever comes first in the file;
- asks apt, before any change and in preflight, which versions the snapshot offers (``Plan.lookup``: a private apt
  state under a temporary directory, the same signature check, nothing outside that directory written).

``decide()`` is what the role's tasks call (filter gpubox.gpubox.driver_snapshot); tests/unit/test_driver_snapshot.py
and tests/integration/test_driver_snapshot_apt.py run its text through Ansible and through real apt.
"""

from __future__ import annotations

import datetime
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

FORMAT = "%Y%m%dT%H%M%SZ"
PATTERN = re.compile(r"\d{8}T\d{6}Z")
# Ubuntu's snapshot service serves the archive as it was at any time after 1 March 2023 (docs/facts.md).
FIRST = datetime.datetime(2023, 3, 1, tzinfo=datetime.timezone.utc)
KNOB = "nvidia_driver_apt_snapshot"
NONE = "none"  # the knob's value that turns a stack's snapshot off


def parse(value: str) -> datetime.datetime:
    """The UTC time of a snapshot ID ("20260101T000000Z"); ValueError when it is not one."""
    if not PATTERN.fullmatch(value):
        raise ValueError("not of the form YYYYMMDDTHHMMSSZ")
    return datetime.datetime.strptime(value, FORMAT).replace(tzinfo=datetime.timezone.utc)


def problem(value: Any, name: str, now: datetime.datetime | None = None) -> str | None:
    """None for a snapshot ID the service can serve (or "": none named); else one line naming ``name`` and the fix.

    A snapshot must be a real UTC time written YYYYMMDDTHHMMSSZ, not before the service's first (1 March 2023)
    and not in the future (a snapshot of a time still to come would change until then: not reproducible)."""
    if value is None or value == "":
        return None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    fix = (
        f"Fix: write a UTC time as YYYYMMDDTHHMMSSZ between {FIRST.strftime(FORMAT)} (the first the snapshot "
        f"service serves) and now, e.g. 20260101T000000Z"
    )
    if not isinstance(value, str):
        return f"{name} is {value!r}, not a snapshot time (a string). {fix}."
    try:
        when = parse(value)
    except ValueError as exc:
        reason = "not a date and time" if PATTERN.fullmatch(value) else str(exc)
        return f"{name} is {value!r}: {reason}. {fix}."
    if when < FIRST:
        first = FIRST.strftime(FORMAT)
        return f"{name} is {value!r}, before {first}: the snapshot service has no such snapshot. {fix}."
    if when > now:
        return f"{name} is {value!r}, in the future (now {now.strftime(FORMAT)}): not a snapshot yet. {fix}."
    return None


@dataclass(frozen=True)
class Source:
    """One archive snapshot as apt sources: ``service`` the service's base URL (its host is the origin the pin
    names), ``snapshot`` its ID, the ``suites`` and ``components`` the driver packages are published in, and the
    ``keyring`` the archive's own sources are checked against."""

    service: str
    snapshot: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    keyring: str

    @property
    def uri(self) -> str:
        return f"{self.service.rstrip('/')}/{self.snapshot}"

    @property
    def origin(self) -> str:
        """apt's origin of the snapshot's indexes: the host of its URI (apt_preferences(5), ``Pin: origin``)."""
        return urlsplit(self.service).hostname or ""

    def lines(self) -> list[str]:
        return [
            f"deb [signed-by={self.keyring}] {self.uri} {suite} {' '.join(self.components)}" for suite in self.suites
        ]

    def sources(self, version: str) -> str:
        """The content of the role's sources file (roles/nvidia_driver/vars/main.yml, __nvidia_driver_snapshot_file)."""
        head = [
            "# Managed by gpubox (Ansible): local edits are overwritten.",
            f"# The archive as it was at {self.snapshot}: the driver packages at {version} come from here, nothing",
            f"# else (the driver's preferences file pins {self.origin} to -1 but for that build).",
        ]
        return "\n".join(head + self.lines()) + "\n"

    def pin(self) -> str:
        """The preferences stanza that keeps every other package of the snapshot's host away."""
        return (
            f"# Nothing but the build above comes from {self.origin} (the archive snapshot {self.snapshot}).\n"
            f'Package: *\nPin: origin "{self.origin}"\nPin-Priority: -1\n'
        )

    def lookup(self, packages: Iterable[str]) -> str:
        """A bash script printing ``apt-cache madison`` of ``packages`` as the snapshot alone offers them.

        apt runs in a private state under a temporary directory (sources, lists, cache, an empty dpkg status),
        with the box's proxy settings (``Acquire::*::Proxy*`` of ``apt-config dump``) and none of its hooks; the
        index is checked against the keyring as for any source (an unsigned or wrongly signed one: apt's error,
        exit 100), and an index apt cannot fetch is an error too (``APT::Update::Error-Mode "any"``, apt-get's
        ``--error-on=any``: by default apt-get update exits 0 on a failed fetch). Nothing outside the directory is
        written, and the directory is removed."""
        lines = "\n".join(self.lines())
        names = " ".join(shlex.quote(name) for name in packages)
        return f"""set -euo pipefail
tmp=$(mktemp -d "${{TMPDIR:-/tmp}}/gpubox-driver-snapshot.XXXXXX")
trap 'rm -rf -- "$tmp"' EXIT
chmod 0755 "$tmp"
mkdir -p "$tmp/etc/apt.conf.d" "$tmp/etc/sources.list.d" "$tmp/etc/preferences.d" "$tmp/etc/trusted.gpg.d" \\
  "$tmp/state/lists/partial" "$tmp/cache/archives/partial"
: > "$tmp/state/status"
cat > "$tmp/etc/sources.list" <<'GPUBOX_SOURCES'
{lines}
GPUBOX_SOURCES
{{ apt-config dump | grep -E '^Acquire::[a-z]+::Proxy' || true
  printf 'Dir::Etc "%s/etc/";\\nDir::State "%s/state/";\\nDir::State::status "%s/state/status";\\n' "$tmp" "$tmp" "$tmp"
  printf 'Dir::Cache "%s/cache/";\\nAPT::Update::Error-Mode "any";\\n' "$tmp"
}} > "$tmp/apt.conf"
export APT_CONFIG="$tmp/apt.conf" LC_ALL=C
apt-get -q update >&2
apt-cache madison {names}
"""


@dataclass(frozen=True)
class Plan:
    """What the role does about the snapshot: ``snapshot`` "" for none; ``named_by`` where it came from;
    ``problems`` (the role refuses before any change); the text of its files and its look-up script."""

    snapshot: str = ""
    named_by: str = ""
    problems: list[str] = field(default_factory=list)
    origin: str = ""
    uri: str = ""
    sources: str = ""
    pin: str = ""
    lookup: str = ""


def decide(
    knob: Any,
    stack: Mapping[str, Any],
    distribution: str,
    version: str,
    service: str,
    suites: Iterable[str],
    components: Iterable[str],
    keyring: str,
    packages: Iterable[str],
    now: datetime.datetime | None = None,
) -> dict[str, Any]:
    """The snapshot a box's driver packages come from, as a dict (``Plan``).

    ``knob``: nvidia_driver_apt_snapshot ("": the stack's; "none": no snapshot; else a snapshot ID). The stack's
    snapshot for ``distribution`` ("<Distribution>-<major>") belongs to the stack's version of the driver: it is
    used when ``version`` is that version, not when nvidia_driver_version names another build. ``service`` "": the
    distribution has no snapshot service the role knows (roles/nvidia_driver/vars/<distribution>.yml)."""
    knob = "" if knob is None else knob
    stack_name = str(stack.get("name", "?"))
    if knob == NONE:
        return asdict(Plan(named_by=f"{KNOB}={NONE}"))
    if knob != "":
        snapshot, named_by = knob, KNOB
    else:
        own = (stack.get("driver_versions") or {}).get(distribution, "")
        snapshot = (stack.get("apt_snapshot") or {}).get(distribution, "") if version == own else ""
        named_by = f"gpubox_stack {stack_name}'s apt_snapshot (plugins/module_utils/stacks.py)"
    if not snapshot:
        return asdict(Plan())
    bad = problem(snapshot, named_by, now)
    if bad:
        return asdict(Plan(snapshot=str(snapshot), named_by=named_by, problems=[bad]))
    if not service:
        where = distribution.replace("-", " ")
        return asdict(
            Plan(
                snapshot=snapshot,
                named_by=named_by,
                problems=[
                    f"{named_by} is {snapshot}, but {where} has no archive snapshot service the driver role knows "
                    f"(roles/nvidia_driver/vars/{distribution}.yml). Fix: leave {KNOB} empty, or set it to {NONE}."
                ],
            )
        )
    source = Source(service, snapshot, tuple(suites), tuple(components), keyring)
    return asdict(
        Plan(
            snapshot=snapshot,
            named_by=named_by,
            origin=source.origin,
            uri=source.uri,
            sources=source.sources(version),
            pin=source.pin(),
            lookup=source.lookup(packages),
        )
    )


def foreign_sources(policy: str, origin: str, uri: str) -> list[str]:
    """The package files of ``apt-cache policy`` (no arguments) served from ``origin`` but not from ``uri``: another
    source on the box that uses the snapshot service (a whole archive at a snapshot), which the snapshot pin (origin
    ``origin`` at -1) would hide. Each as apt names it ("https://host/path suite/component")."""
    found: list[str] = []
    for line in policy.splitlines():
        match = re.match(r"^\s*-?\d+\s+(\S+)\s+(\S+)", line)
        if not match or urlsplit(match.group(1)).hostname != origin:
            continue
        if match.group(1).rstrip("/") != uri.rstrip("/"):
            found.append(f"{match.group(1)} {match.group(2)}")
    return sorted(set(found))
