"""Per-tenant request and error counts of the front door, from its access log, as Prometheus text.

Pure functions on the standard library (no Ansible import), Python 3.9 like gpu_metrics.py: the box's collector
roles/metrics/files/gpubox-tenant-metrics loads this file from /usr/local/lib/gpubox (the gpu_check_library
module installs it there), reads what the front door logged since its last run and writes what render() returns
into node-exporter's textfile directory; tests/unit/test_tenant_metrics.py tests it, and
tests/integration/test_tenant_metrics_live.py runs it over the real nginx's log.

The log's format is the front door's `gpubox_front_door` (roles/front_door/templates/gpubox-front-door.conf.j2):
nginx's "combined" fields, then `tenant=<name or -> conn=<address>`. A line of any other shape is counted as
unparsed, never guessed at. The counts are kept in a state (the log file's identity, how far it was read, the
counts), so each run reads only what arrived since the last one and a counter never goes down:
- the log rotated as Debian's logrotate rotates nginx's logs (the file renamed to `<log>.1`, same inode, a new
  empty file in its place; `delaycompress` keeps .1 uncompressed): the rest of the old file is read from `.1`
  before the new one, and `.1` is read again on the next runs while it is the same file (nginx writes to it until
  its USR1 reopen);
- the log truncated, or replaced by another file with the old one gone: read again from its start; the counts
  stay and `gpubox_front_door_log_restarts_total` says lines may have been missed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "gpubox_front_door_"
STATE_VERSION = 1
# The label value of a request whose key named no tenant (the log's "-"): a tenant's name is 1-32 of a-z, 0-9,
# '_' and '-' starting with a letter or digit (tenants.py), so it can never be "(none)".
NO_TENANT = "(none)"
# One line of log_format gpubox_front_door. nginx writes '"' and bytes outside printable ASCII inside a variable as
# \xNN, so a quoted field holds no '"'.
_LINE = re.compile(
    r'^\S+ - - \[[^\]]*\] "[^"]*" (?P<status>[1-5][0-9]{2}) [0-9]+ "[^"]*" "[^"]*" '
    r"tenant=(?P<tenant>-|[a-z0-9][a-z0-9_-]{0,31}) conn=\S+$"
)
CODES = ("1xx", "2xx", "3xx", "4xx", "5xx")


class StateError(ValueError):
    """The state file cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class Request:
    """One logged request: the tenant ('' for none) and the HTTP status."""

    tenant: str
    status: int

    @property
    def code(self) -> str:
        return f"{self.status // 100}xx"


def parse_line(line: str) -> Request | None:
    """The request of one access-log line, or None when the line is not of the front door's format."""
    match = _LINE.match(line.rstrip("\r\n"))
    if not match:
        return None
    tenant = match.group("tenant")
    return Request(tenant="" if tenant == "-" else tenant, status=int(match.group("status")))


@dataclass(frozen=True)
class FileId:
    """Which file a path named when it was opened (st_dev, st_ino) and how long it was (st_size)."""

    dev: int
    ino: int
    size: int

    def same(self, other: Mapping[str, Any] | None) -> bool:
        return bool(other) and other.get("dev") == self.dev and other.get("ino") == self.ino  # type: ignore[union-attr]


@dataclass
class State:
    """What the collector keeps between runs: the files it follows and the counts so far."""

    current: dict[str, int] | None = None  # {dev, ino, offset} of the log
    rotated: dict[str, int] | None = None  # {dev, ino, offset} of the log's last file, now <log>.1
    requests: dict[str, dict[str, int]] = field(default_factory=dict)  # tenant ('' none) -> code -> count
    refused_keys: int = 0
    unparsed: int = 0
    read_errors: int = 0
    restarts: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "current": self.current,
            "rotated": self.rotated,
            "requests": self.requests,
            "refused_keys": self.refused_keys,
            "unparsed": self.unparsed,
            "read_errors": self.read_errors,
            "restarts": self.restarts,
        }


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StateError(f"{where} is {value!r}, not a count")
    return value


def _position(value: Any, where: str) -> dict[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"dev", "ino", "offset"}:
        raise StateError(f"{where} is {value!r}, not {{dev, ino, offset}}")
    return {key: _count(value[key], f"{where}.{key}") for key in ("dev", "ino", "offset")}


def load_state(data: Any) -> State:
    """The state from its JSON (an empty state for None: the first run); StateError naming the field when the
    JSON is not a state this version wrote."""
    if data is None:
        return State()
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise StateError(f"it is not a version {STATE_VERSION} state")
    requests = data.get("requests")
    if not isinstance(requests, dict):
        raise StateError(f"requests is {requests!r}, not a mapping")
    counts: dict[str, dict[str, int]] = {}
    for tenant, codes in requests.items():
        if tenant != "" and parse_line(f'- - - [-] "-" 200 0 "-" "-" tenant={tenant} conn=-') is None:
            raise StateError(f"requests names {tenant!r}, not a tenant")
        if not isinstance(codes, dict) or not set(codes) <= set(CODES):
            raise StateError(f"requests[{tenant!r}] is {codes!r}, not counts per {'/'.join(CODES)}")
        counts[tenant] = {code: _count(n, f"requests[{tenant!r}][{code}]") for code, n in codes.items()}
    return State(
        current=_position(data.get("current"), "current"),
        rotated=_position(data.get("rotated"), "rotated"),
        requests=counts,
        **{key: _count(data.get(key, 0), key) for key in ("refused_keys", "unparsed", "read_errors", "restarts")},
    )


@dataclass(frozen=True)
class Read:
    """One stretch of a file to read: which file ('current' or 'rotated') from which offset."""

    which: str
    start: int


def plan(state: State, current: FileId | None, rotated: FileId | None) -> tuple[list[Read], int]:
    """What to read this run, in order, and how many restarts it counts (a file whose unread rest is lost).

    ``current``: the log as opened now (None: it is not there); ``rotated``: ``<log>.1`` as opened now (None: not
    there). A file the state followed is read on from its offset wherever it is now: the log itself, or ``.1``
    after a rotation (read first, then the new log from its start). A file shorter than its offset was truncated:
    read from 0. The log followed and found neither in its place nor in ``.1`` is a restart.
    """
    reads: list[Read] = []
    restarts = 0

    def start_of(position: Mapping[str, int], now: FileId) -> int:
        nonlocal restarts
        if now.size < position["offset"]:
            restarts += 1
            return 0
        return position["offset"]

    followed = state.current
    if rotated is not None and not (current is not None and (current.dev, current.ino) == (rotated.dev, rotated.ino)):
        for position in (followed, state.rotated):
            if position and rotated.same(position):
                reads.append(Read("rotated", start_of(position, rotated)))
                break
    if current is not None and current.same(followed):
        reads.append(Read("current", start_of(followed, current)))  # type: ignore[arg-type]
        return reads, restarts
    if followed and not (rotated is not None and rotated.same(followed)):
        restarts += 1
    if current is not None:
        reads.append(Read("current", 0))
    return reads, restarts


def advance(state: State, current: FileId | None, rotated: FileId | None, read: Callable[[str, int], bytes]) -> State:
    """Count what the log holds since the last run: ``read(which, start)`` returns the bytes of 'current' or
    'rotated' from ``start`` to the size it had when opened. The state now follows the files as they are."""
    reads, restarts = plan(state, current, rotated)
    state.restarts += restarts
    positions: dict[str, dict[str, int] | None] = {"current": None, "rotated": None}
    for step in reads:
        ident = current if step.which == "current" else rotated
        lines, used = complete_lines(read(step.which, step.start))
        count_lines(state, lines)
        positions[step.which] = {"dev": ident.dev, "ino": ident.ino, "offset": step.start + used}  # type: ignore[union-attr]
    state.current, state.rotated = positions["current"], positions["rotated"]
    return state


def count_lines(state: State, lines: Iterable[str]) -> None:
    """Add each complete line's request (or an unparsed line) to the counts."""
    for line in lines:
        request = parse_line(line)
        if request is None:
            state.unparsed += 1
            continue
        codes = state.requests.setdefault(request.tenant, {})
        codes[request.code] = codes.get(request.code, 0) + 1
        if request.tenant == "" and request.status == 401:
            state.refused_keys += 1


def complete_lines(data: bytes) -> tuple[list[str], int]:
    """The complete lines of ``data`` (text; nginx writes ASCII, anything else is kept byte for byte as latin-1)
    and how many bytes they take: a last line without its newline is left for the next run."""
    end = data.rfind(b"\n") + 1
    # Split on "\n" alone (str.splitlines would also split on \r, \x0b, \x1c..\x1e and \x85 inside a line).
    return data[:end].decode("latin-1").split("\n")[:-1], end


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(state: State, readable: bool, now: float, model: str = "") -> str:
    """The textfile: the counters of ``state``, whether this run could read the log, and when it ran; ``model``
    (the box's served model name, the one model its front door serves) labels the requests, so that a fleet's sum
    by tenant and model is the requests each tenant made of each model."""
    blocks: list[str] = []

    def block(name: str, kind: str, help_text: str, samples: list[tuple[Mapping[str, str], float]]) -> None:
        lines = [f"# HELP {PREFIX}{name} {help_text}", f"# TYPE {PREFIX}{name} {kind}"]
        for labels, value in samples:
            text = ",".join(f'{key}="{_escape(val)}"' for key, val in sorted(labels.items()))
            lines.append(f"{PREFIX}{name}{{{text}}} {_fmt(value)}" if text else f"{PREFIX}{name} {_fmt(value)}")
        blocks.append("\n".join(lines))

    block(
        "requests_total",
        "counter",
        f"Requests the front door answered, by the tenant the key named ({NO_TENANT}: no key or an unknown one), "
        "the status class and the model the box serves.",
        [
            ({"tenant": tenant or NO_TENANT, "code": code, **({"model": model} if model else {})}, n)
            for tenant, codes in sorted(state.requests.items())
            for code, n in sorted(codes.items())
        ],
    )
    block(
        "refused_keys_total",
        "counter",
        "Requests the front door refused with 401 because their key named no tenant (missing, unknown, retired).",
        [({}, state.refused_keys)],
    )
    block(
        "log_lines_unparsed_total",
        "counter",
        "Access-log lines not of the front door's format.",
        [({}, state.unparsed)],
    )
    block(
        "log_read_errors_total",
        "counter",
        "Runs that could not read the front door's access log.",
        [({}, state.read_errors)],
    )
    block(
        "log_restarts_total",
        "counter",
        "Times the access log was read again from its start (truncated, or replaced before its rest was read).",
        [({}, state.restarts)],
    )
    block(
        "log_readable",
        "gauge",
        "1 when the last run could read the front door's access log.",
        [({}, 1 if readable else 0)],
    )
    block(
        "log_last_run_timestamp_seconds", "gauge", "When the tenant counts were last brought up to date.", [({}, now)]
    )
    return "\n".join(blocks) + "\n"
