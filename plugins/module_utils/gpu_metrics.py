"""GPU metrics of a box, from `nvidia-smi --query-gpu` and the kernel log's `NVRM: Xid` lines, as Prometheus text.

Pure functions on the standard library (no Ansible import), Python 3.9 like gpu_parsers.py: the box's
collector roles/metrics/files/gpubox-gpu-metrics loads this file from /usr/local/lib/gpubox (the
gpu_check_library module installs it there) and writes what render() returns into node-exporter's textfile
directory; tests/unit/test_gpu_metrics.py tests it on a real H200 capture and on the derived RTX boxes.

Field names are driver 535's (the pinned branch): `clocks_throttle_reasons.*` and `clocks.sm`, which driver 580
still accepts and prints as `clocks_event_reasons.*` and `clocks.current.sm` in its header
(tests/fixtures/nvidia-smi/_reference/h200x1: the same query under both spellings). A value the card does not
have (`[N/A]`, `[Not Supported]`: ECC and retired pages on most GeForce cards) is left out, not written as 0.

The kernel log is read or it is not: a run that could not read it says so (KernelLog, `gpubox_gpu_kernel_log_readable
0`, a line in the health verdict) instead of counting no Xid, and `kernel_log_unhealthy_after` decides whether that
takes the box out of the fleet (roles/metrics: metrics_gpu_kernel_log_unhealthy_after_sec says why not by default).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as _field
from typing import Any

# (query field, metric name without the gpubox_gpu_ prefix, scale to the metric's unit, help text).
# Throttle reasons are one metric with a reason label (THROTTLE_FIELDS), PCIe link state one with kind labels.
GAUGES: tuple[tuple[str, str, float, str], ...] = (
    ("temperature.gpu", "temperature_celsius", 1.0, "GPU core temperature"),
    ("temperature.memory", "memory_temperature_celsius", 1.0, "GPU memory (HBM) temperature"),
    ("power.draw", "power_draw_watts", 1.0, "board power draw"),
    ("enforced.power.limit", "power_limit_watts", 1.0, "power limit the driver enforces"),
    ("power.max_limit", "power_max_limit_watts", 1.0, "highest power limit the board allows"),
    ("clocks.sm", "sm_clock_hertz", 1e6, "current SM clock"),
    ("clocks.max.sm", "sm_clock_max_hertz", 1e6, "maximum SM clock"),
    ("clocks.mem", "memory_clock_hertz", 1e6, "current memory clock"),
    ("clocks.max.mem", "memory_clock_max_hertz", 1e6, "maximum memory clock"),
    ("memory.used", "memory_used_bytes", 1048576.0, "framebuffer memory used"),
    ("memory.total", "memory_total_bytes", 1048576.0, "framebuffer memory in total"),
    ("utilization.gpu", "utilization_ratio", 0.01, "share of the last sample period a kernel ran"),
    ("utilization.memory", "memory_utilization_ratio", 0.01, "share of the last sample period memory was busy"),
    ("fan.speed", "fan_speed_ratio", 0.01, "fan speed, share of its maximum"),
    ("ecc.errors.corrected.volatile.total", "ecc_corrected_errors", 1.0, "corrected ECC errors since load"),
    ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected_errors", 1.0, "uncorrected ECC errors since load"),
    ("retired_pages.single_bit_ecc.count", "retired_pages_single_bit", 1.0, "pages retired: single-bit"),
    ("retired_pages.double_bit.count", "retired_pages_double_bit", 1.0, "pages retired: double-bit"),
)  # fmt: skip
FLAGS: tuple[tuple[str, str, str], ...] = (
    ("persistence_mode", "persistence_mode", "1 when persistence mode is on"),
    ("ecc.mode.current", "ecc_enabled", "1 when ECC is on (absent where the card has none)"),
    ("retired_pages.pending", "retired_pages_pending", "1 when a retired page waits for a reset to take effect"),
)
THROTTLE_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sync_boost",
)
THROTTLE_FIELDS = tuple(f"clocks_throttle_reasons.{r}" for r in THROTTLE_REASONS)
PCIE_FIELDS = (
    ("pcie.link.gen.current", "gen", "current"),
    ("pcie.link.gen.max", "gen", "max"),
    ("pcie.link.width.current", "width", "current"),
    ("pcie.link.width.max", "width", "max"),
)
IDENTITY = ("index", "uuid", "name", "pci.bus_id")
FIELDS: tuple[str, ...] = (
    IDENTITY
    + tuple(gauge[0] for gauge in GAUGES)
    + tuple(flag[0] for flag in FLAGS)
    + THROTTLE_FIELDS
    + tuple(pcie[0] for pcie in PCIE_FIELDS)
    + ("pstate",)
)
PREFIX = "gpubox_gpu_"

# Xid classes per driver branch (the branch is a plain parameter, 535 by default: the pinned stack's driver).
# Sources: NVIDIA's Xid catalog https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (codes,
# mnemonics, resolution buckets, the "Xid 154 linkage" column); the GPU recovery actions Xid 154 reports
# (None, GPU reset, node reboot, drain P2P, drain and reset):
# https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html; the device
# plugin's application errors: https://github.com/NVIDIA/k8s-device-plugin/blob/main/internal/rm/health.go.
#
# fatal (both branches; metrics_gpu_fatal_xids): 79 the GPU has fallen off the bus, 48 a double-bit ECC error,
# 74 an NVLink error, 95 an uncontained ECC error (the catalog), 46 the GPU stopped processing (with 48, a "drain"
# check of https://docs.nvidia.com/health-validation/reference/checks/xid.md).
FATAL_XIDS_535 = (46, 48, 74, 79, 95)
# application: what NVIDIA's k8s device plugin skips as an application's own error that leaves the GPU healthy
# (13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing for that channel, 45
# preemptive cleanup after an earlier error, 68 video processor exception, 109 context switch timeout): counted
# and alerted on, never a reason to take the box out, on either branch.
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
# gsp (580 only): 119 GSP RPC timeout (the driver waited for the GPU's GSP firmware and gave up, e.g. "Timeout
# after 45s of waiting for RPC response from GPU0 GSP") and 120 a GSP error (a GSP firmware exception). R580's
# open kernel modules run every GPU on GSP firmware, so these are how an R580 GPU hangs; the gpubox 535 stack
# (Ubuntu's proprietary -server modules on GeForce cards) does not run GSP firmware there, so on 535 they are
# "other": counted and alerted on, as any code the branch's catalog does not list.
GSP_XIDS_580 = (119, 120)
# recovery (580 only): 154, the driver says the GPU's recovery action changed ("GPU recovery action changed from
# 0x0 (None) to 0x1 (GPU Reset Required)"): the GPU needs a reset or the node a reboot before it serves again.
RECOVERY_XIDS_580 = (154,)
DRIVER_BRANCHES = (535, 580)
DEFAULT_DRIVER_BRANCH = 535
XID_CLASSES = ("fatal", "gsp", "recovery", "application", "other")
FATAL_XIDS = FATAL_XIDS_535


def _branch(driver_branch: int) -> int:
    if isinstance(driver_branch, bool) or driver_branch not in DRIVER_BRANCHES:
        raise ValueError(
            f"driver branch {driver_branch!r} has no Xid catalog here: use one of "
            f"{', '.join(map(str, DRIVER_BRANCHES))} (the stack's driver branch)"
        )
    return int(driver_branch)


def xid_catalog(driver_branch: int = DEFAULT_DRIVER_BRANCH) -> dict[int, str]:
    """Xid code -> class (fatal, gsp, recovery, application) of a driver branch; a code not listed is "other"."""
    catalog = {code: "application" for code in APPLICATION_XIDS}
    catalog.update({code: "fatal" for code in FATAL_XIDS_535})
    if _branch(driver_branch) >= 580:
        catalog.update({code: "gsp" for code in GSP_XIDS_580})
        catalog.update({code: "recovery" for code in RECOVERY_XIDS_580})
    return catalog


def xid_class(code: int, driver_branch: int = DEFAULT_DRIVER_BRANCH) -> str:
    """The class of one Xid code on a driver branch (XID_CLASSES)."""
    return xid_catalog(driver_branch).get(int(code), "other")


def fatal_xids(driver_branch: int = DEFAULT_DRIVER_BRANCH) -> tuple[int, ...]:
    """The codes that take a box out of the fleet on a branch: fatal, and on 580 also gsp and recovery."""
    return tuple(sorted(c for c, kind in xid_catalog(driver_branch).items() if kind in ("fatal", "gsp", "recovery")))


# `NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus.`; older drivers print the
# bus without `PCI:` (`NVRM: Xid (0000:01:00): 3, C 00000005 ...`). Sources in tests/unit/test_gpu_metrics.py.
XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})[^)]*\): (?P<code>\d+)"
)
_MISSING = {"", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]", "Unknown Error"}
_MISSING |= {"[GPU is lost]", "GPU is lost"}


class MetricsError(ValueError):
    """nvidia-smi's answer is not what was asked for; the message says what it was."""


@dataclass(frozen=True)
class KernelLog:
    """Whether this run could read the kernel log; when not, since when (the first run of this unreadable spell,
    kept across runs in the collector's state) and why (the command and what it said)."""

    readable: bool
    since: float | None = None
    error: str = ""


@dataclass(frozen=True)
class Health:
    """The GPU health verdict: ``problems`` lists every problem, ``tolerated`` those among them that leave the box in
    the fleet (an unreadable kernel log, until ``kernel_log_unhealthy_after``); healthy while no other is left."""

    problems: list[str] = _field(default_factory=list)
    tolerated: list[str] = _field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.untolerated

    @property
    def untolerated(self) -> list[str]:
        return [p for p in self.problems if p not in self.tolerated]

    def summary(self) -> str:
        """One line for a report cell (the drift report's GPU column): healthy, healthy (but: ...), unhealthy: ..."""
        if not self.problems:
            return "healthy"
        if self.healthy:
            return "healthy (but: " + "; ".join(self.tolerated) + ")"
        return "unhealthy: " + "; ".join(self.problems)

    def as_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "problems": self.problems,
            "tolerated": self.tolerated,
            "summary": self.summary(),
        }


def _value(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return None if text in _MISSING else text


def _number(text: str | None) -> float | None:
    text = _value(text)
    if text is None:
        return None
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        return None


def parse_query(text: str, fields: Sequence[str] = FIELDS) -> list[dict[str, str | None]]:
    """Rows of `--query-gpu=<fields> --format=csv,noheader,nounits`, each a mapping field -> value (None: N/A)."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        # A GPU's name has no comma in NVIDIA's product names; a row of another length is not this query's.
        if len(cells) != len(fields):
            raise MetricsError(
                f"nvidia-smi line {number} has {len(cells)} values for {len(fields)} fields: {line[:200]!r}"
            )
        rows.append({field: _value(cell) for field, cell in zip(fields, cells)})
    return rows


def parse_xids(lines: Iterable[str]) -> list[tuple[str, int, float | None]]:
    """(bus 0000:01:00, Xid code, time or None) of every `NVRM: Xid` line; with `journalctl -o short-unix` the
    line starts with the time in seconds."""
    out = []
    for line in lines:
        match = XID_LINE.search(line)
        if not match:
            continue
        head = line.split(None, 1)[0] if line.strip() else ""
        try:
            when: float | None = float(head)
        except ValueError:
            when = None
        out.append((match.group("bus").lower(), int(match.group("code")), when))
    return out


JOURNAL_CURSOR = "-- cursor: "
EMPTY_KERNEL_LOG = (
    "journalctl shows no kernel line of this boot (journald keeps none, rotated them away, or may not be read)"
)


def journal_answer(returncode: int, stdout: str, stderr: str, had_cursor: bool) -> tuple[list[str], str, str]:
    """(lines, cursor, error) of `journalctl -k -b -o short-unix --show-cursor -q [--after-cursor=C]`'s answer.

    ``error`` is '' when the kernel log was read, else why not: journalctl failed (a bad cursor, no journal of this
    boot), printed no line but a complaint (no journal file may be opened: permissions), or, while no run of this boot
    has read a line yet (``had_cursor`` False), printed nothing: every boot logs the kernel's own start, so a kernel
    log of this boot without a line is one the journal does not have. ``cursor`` is '' when none was printed.
    """
    lines, cursor = [], ""
    for line in stdout.splitlines():
        if line.startswith(JOURNAL_CURSOR):
            cursor = line[len(JOURNAL_CURSOR) :].strip()
        elif line.strip():
            lines.append(line)
    said = [ln.strip() for ln in (stderr.strip() or stdout.strip()).splitlines() if ln.strip()]
    if returncode != 0:
        why = said[0][:200] if said else "nothing said under -q (journalctl -k -b says why)"
        return [], "", f"journalctl exit {returncode}: {why}"
    complaint = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if not lines and complaint:
        return [], "", f"journalctl printed no line and said: {complaint[0][:200]}"
    if not lines and not had_cursor:
        return [], "", EMPTY_KERNEL_LOG
    return lines, cursor, ""


def unreadable_since(previous: float | None, readable: bool, now: float) -> float | None:
    """The start of the current unreadable spell: None while the log is read, else the first run that could not."""
    if readable:
        return None
    return previous if previous is not None and previous <= now else now


def _iso(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def kernel_log_problem(log: KernelLog) -> str:
    """The health verdict's line for an unreadable kernel log ('' when it was read)."""
    if log.readable:
        return ""
    since = f" since {_iso(log.since)}" if log.since is not None else ""
    return f"kernel log unreadable{since} ({log.error or 'no reason given'}): Xid events cannot be seen"


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Mapping[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}"


def _fmt(value: float) -> str:
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def _short_bus(bus_id: str) -> str:
    """00000000:01:00.0 -> 0000:01:00 (the form Xid lines name a GPU by)."""
    match = re.search(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})", bus_id or "")
    return f"{match.group(1)[-4:]}:{match.group(2)}:{match.group(3)}".lower() if match else ""


def render(
    rows: Sequence[Mapping[str, str | None]],
    expected: int,
    xids: Sequence[tuple[str, int, float | None]] = (),
    fatal_xids: Iterable[int] = FATAL_XIDS,
    error: str = "",
    now: float = 0.0,
    memory_share: float | None = None,
    p2p_enabled: bool | None = None,
    kernel_log: KernelLog | None = None,
    driver_branch: int = DEFAULT_DRIVER_BRANCH,
) -> str:
    """The textfile: per GPU gauges (labels gpu, uuid, name, bus_id), per box counts, Xids and the collector state.

    ``rows``: parse_query's; ``expected``: gpubox_gpu_count; ``xids``: parse_xids' of this boot; ``error``: why
    nvidia-smi gave no rows ('' when it did); ``now``: the collection time (seconds since the epoch);
    ``memory_share``: the fraction of each GPU's memory vLLM is planned to take (gpubox_gpu_memory_utilization),
    left out when None; ``p2p_enabled``: the last GPU check's peer-to-peer verdict, left out when unknown;
    ``kernel_log``: whether the Xid counts could be read at all (left out when None: nobody looked);
    ``driver_branch``: the driver branch whose Xid catalog classes the events (xid_class).
    """
    fatal = sorted({int(c) for c in fatal_xids})
    catalog = xid_catalog(driver_branch)
    series: dict[str, list[str]] = {}
    helps: dict[str, tuple[str, str]] = {}

    def put(name: str, labels: Mapping[str, Any], value: float, help_text: str, kind: str = "gauge") -> None:
        full = name if name.startswith("gpubox_") else PREFIX + name
        helps.setdefault(full, (help_text, kind))
        series.setdefault(full, []).append(f"{full}{_labels(labels) if labels else ''} {_fmt(value)}")

    for row in rows:
        ident = {
            "gpu": row.get("index") or "",
            "uuid": row.get("uuid") or "",
            "name": row.get("name") or "",
            "bus_id": row.get("pci.bus_id") or "",
        }
        for field, name, scale, help_text in GAUGES:
            number = _number(row.get(field))
            if number is not None:
                put(name, ident, number * scale, help_text)
        for field, name, help_text in FLAGS:
            text = _value(row.get(field))
            if text is not None:
                put(name, ident, 1 if text.lower() in ("enabled", "yes", "active", "1") else 0, help_text)
        for reason, field in zip(THROTTLE_REASONS, THROTTLE_FIELDS):
            text = _value(row.get(field))
            if text is not None:
                put(
                    "throttle_active", {**ident, "reason": reason}, 1 if text == "Active" else 0,
                    "1 while this clock event reason holds the clocks down (gpu_idle: nothing to run)",
                )  # fmt: skip
        for field, what, kind in PCIE_FIELDS:
            number = _number(row.get(field))
            if number is not None:
                put(f"pcie_link_{what}", {**ident, "kind": kind}, number, f"PCIe link {what}, current and maximum")
        pstate = _value(row.get("pstate"))
        if pstate and re.fullmatch(r"P\d+", pstate):
            put("pstate", ident, int(pstate[1:]), "performance state (0 fastest, 12 slowest)")
    put("gpubox_gpus_seen", {}, len(rows), "GPUs nvidia-smi answered for (0 when it failed)")
    put("gpubox_gpus_expected", {}, int(expected), "GPUs the inventory expects (gpubox_gpu_count)")
    if memory_share is not None:
        put(
            "memory_planned_share", {}, float(memory_share),
            "fraction of each GPU's memory vLLM is planned to take (gpubox_gpu_memory_utilization)",
        )  # fmt: skip
    if p2p_enabled is not None:
        put("p2p_enabled", {}, 1 if p2p_enabled else 0, "the last GPU check's peer-to-peer verdict (1: enabled)")
    counts: dict[tuple[str, int], int] = {}
    last: dict[str, float] = {}
    for bus, code, when in xids:
        counts[(bus, code)] = counts.get((bus, code), 0) + 1
        if when is not None:
            last[bus] = max(last.get(bus, 0.0), when)
    for (bus, code), count in sorted(counts.items()):
        put(
            "xid_events_total", {"bus": bus, "code": code, "fatal": "true" if code in fatal else "false"}, count,
            "NVRM: Xid events in the kernel log of this boot, by GPU bus and code", "counter",
        )  # fmt: skip
    for bus, when in sorted(last.items()):
        put("xid_last_timestamp_seconds", {"bus": bus}, when, "time of the last Xid event of this boot")
    put("xid_events", {}, sum(counts.values()), "Xid events of this boot, every code (0: none)")
    by_class = dict.fromkeys(XID_CLASSES, 0)
    for (_bus, code), count in counts.items():
        by_class[catalog.get(code, "other")] += count
    for kind, count in by_class.items():
        put(
            "xid_class_events", {"class": kind, "branch": int(driver_branch)}, count,
            "Xid events of this boot by the class NVIDIA's catalog for the driver branch gives them",
        )  # fmt: skip
    fatal_seen = sum(n for (_bus, code), n in counts.items() if code in fatal)
    put("fatal_xid_events", {}, fatal_seen, f"Xid events of a fatal code ({', '.join(map(str, fatal))}) this boot")
    if kernel_log is not None:
        put(
            "kernel_log_readable", {}, 1 if kernel_log.readable else 0,
            "1 when this run could read the kernel log; 0: the Xid counts are blind, not zero",
        )  # fmt: skip
        if not kernel_log.readable:
            if kernel_log.since is not None:
                put(
                    "kernel_log_unreadable_since_seconds", {}, kernel_log.since,
                    "first run of this spell that could not read the kernel log",
                )  # fmt: skip
            put("kernel_log_error", {"error": kernel_log.error[:200]}, 1, "why the kernel log could not be read")
    put("collector_success", {}, 0 if error else 1, "1 when nvidia-smi answered the query")
    if error:
        put("collector_error", {"error": error[:200]}, 1, "why nvidia-smi gave no answer")
    if now:
        put("collector_timestamp_seconds", {}, now, "when this file was written")
    lines = []
    for full, values in series.items():
        help_text, kind = helps[full]
        lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}", *values]
    return "\n".join(lines) + "\n"


def health(
    rows: Sequence[Mapping[str, str | None]],
    expected: int,
    xids: Sequence[tuple[str, int, float | None]] = (),
    fatal_xids: Iterable[int] = FATAL_XIDS,
    error: str = "",
    kernel_log: KernelLog | None = None,
    now: float = 0.0,
    kernel_log_unhealthy_after: float = -1.0,
) -> Health:
    """Why this box should take no requests: nvidia-smi failed, a GPU is missing, a fatal Xid; and whether the kernel
    log could be read. An unreadable kernel log is a tolerated problem (listed, the box stays in) unless
    ``kernel_log_unhealthy_after`` >= 0 and it has been unreadable that many seconds (0: at once) by ``now``."""
    problems = []
    if error:
        problems.append(f"nvidia-smi failed: {error[:200]}")
    elif len(rows) < int(expected):
        problems.append(f"nvidia-smi sees {len(rows)} GPU(s), the inventory expects {expected}")
    fatal = {int(c) for c in fatal_xids}
    for bus, code, _when in xids:
        if code in fatal:
            problems.append(f"Xid {code} on {bus}")
    tolerated = []
    if kernel_log is not None and not kernel_log.readable:
        line = kernel_log_problem(kernel_log)
        problems.append(line)
        since = kernel_log.since if kernel_log.since is not None else now
        if kernel_log_unhealthy_after < 0 or now - since < kernel_log_unhealthy_after:
            tolerated.append(line)
    return Health(list(dict.fromkeys(problems)), tolerated)
