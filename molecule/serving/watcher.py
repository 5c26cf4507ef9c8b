#!/usr/bin/env python3
"""TEST ONLY, runs inside the box: wait for a point of a converge, then strike (stdlib only).

    watcher.py --point NAME --when COND [--when COND ...] [--after S] --action kill|freeze --record F
    watcher.py --point NAME --strike --action kill|freeze --record F [--within S]
                                     strike now (the controller saw the point); a kill with --within
                                     looks for a process of ansible's for up to S seconds (a retrying
                                     task has none on the box between its tries)
    watcher.py --check MODEL_ROOT        invariants that must hold after any crash (JSON on stdout)

Conditions (all must hold at once):
    proc:REGEX              a process whose command line (NULs as spaces) matches REGEX
    log:PATH:REGEX          a line appended to PATH since the watcher started matches REGEX (e.g.
                            dpkg's "status half-installed nvidia-..." in /var/log/dpkg.log: dpkg is
                            unpacking it; reading a log never blocks the way /proc/PID/cmdline can
                            while the disk is busy)
    young:REGEX:MIN:MAX     such a process that has run between MIN and MAX seconds (a fresh start)
    file:GLOB:MIN           a file matching the recursive GLOB with at least MIN bytes
    staged:GLOB:SOURCE      a staging directory matching GLOB holds every file of SOURCE at its full
                            size (the download is complete) while the live link (the staging
                            directory's name before the "@", beside .staging) is not on that commit
--after S: the conditions must have held for S seconds (a process well into its work).

Actions:
    kill    SIGKILL every process of ansible's on the box: what runs under an sshd session (the
            module and its children: dpkg, pip, ...) and ansible's async jobs (async_wrapper and
            AnsiballZ processes, detached from the session). An SSH session lost mid-task.
            What systemd runs (units, the model client's transient unit) is left alone.
    freeze  SIGSTOP the work: ansible's processes as above, the engine and the model client (and what
            they started); then the controller restarts the container (a power cut: nothing of the
            converge runs after the point). Daemons of the box and the controller's own `podman exec`
            probes keep running for the moment until the restart.
The record (JSON: point, time, matched, struck pids) is written with fsync before the action's
effect can matter, so it survives the power cut.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

SELF = os.getpid()
# What a power cut must stop besides ansible's processes: the engine and the model client.
FROZEN = r"vllm\.entrypoints|modelscope|gpubox-model-fetch"


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command line) for every process but this one."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == SELF:
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        found[int(entry)] = (ppid, cmd)
    return found


def age(pid: int) -> float:
    """Seconds since pid started (field 22 of /proc/PID/stat, in clock ticks since boot)."""
    try:
        start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1.0
    return uptime - start / os.sysconf("SC_CLK_TCK")


def descendants(roots: set[int], procs: dict[int, tuple[int, str]]) -> set[int]:
    out = set(roots)
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _cmd) in procs.items():
            if ppid in out and pid not in out:
                out.add(pid)
                grew = True
    return out


def ansible_pids(procs: dict[int, tuple[int, str]]) -> set[int]:
    sessions = {pid for pid, (_pp, cmd) in procs.items() if re.match(r"sshd: \S+@notty", cmd)}
    jobs = {pid for pid, (_pp, cmd) in procs.items() if "async_wrapper" in cmd or "AnsiballZ_" in cmd}
    return (descendants(sessions, procs) - sessions) | descendants(jobs, procs)


LOG_START: dict[str, int] = {}
WANTED: dict[str, dict[str, int]] = {}  # staged: the hub's files and sizes, read once


def log_match(path: str, rx: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            fh.seek(LOG_START.setdefault(path, os.path.getsize(path)))
            for line in fh.read().decode(errors="replace").splitlines():
                if re.search(rx, line):
                    return line
    except OSError:
        LOG_START.setdefault(path, 0)
    return None


def holds(cond: str, procs: dict[int, tuple[int, str]]) -> str | None:
    """What matched, or None."""
    kind, _, arg = cond.partition(":")
    if kind == "log":
        path, _, rx = arg.partition(":")
        return log_match(path, rx)
    if kind == "proc":
        rx = re.compile(arg)
        return next((f"{pid} {cmd[:200]}" for pid, (_pp, cmd) in procs.items() if rx.search(cmd)), None)
    if kind == "young":
        rx_text, low, high = arg.rsplit(":", 2)
        rx = re.compile(rx_text)
        for pid, (_pp, cmd) in procs.items():
            if rx.search(cmd) and float(low) <= age(pid) <= float(high):
                return f"{pid} ({age(pid):.1f} s) {cmd[:200]}"
        return None
    if kind == "file":
        pattern, _, least = arg.rpartition(":")
        for path in glob.glob(pattern, recursive=True, include_hidden=True):
            try:
                if os.path.getsize(path) >= int(least):
                    return path
            except OSError:
                continue
        return None
    if kind == "staged":
        pattern, _, source = arg.rpartition(":")
        if source not in WANTED:  # the hub's copy does not change while a run is watched
            WANTED[source] = {
                p.relative_to(source).as_posix(): p.stat().st_size
                for p in Path(source).rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(source).parts)
            }
        wanted = WANTED[source]
        for staging in glob.glob(pattern):
            name, _, commit = Path(staging).name.partition("@")
            live = Path(staging).parent.parent / name
            if live.is_symlink() and Path(os.readlink(live)).name.startswith(f"{name}@{commit}"):
                continue  # already published
            try:
                if all(os.path.getsize(os.path.join(staging, rel)) == size for rel, size in wanted.items()):
                    return staging
            except OSError:
                continue
        return None
    raise SystemExit(f"watcher: unknown condition {cond!r}")


def write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def strike(action: str, procs: dict[int, tuple[int, str]]) -> list[int]:
    if action == "kill":
        targets = ansible_pids(procs)
        sig = signal.SIGKILL
    else:
        work = {pid for pid, (_pp, cmd) in procs.items() if re.search(FROZEN, cmd)}
        targets = ansible_pids(procs) | descendants(work, procs)
        sig = signal.SIGSTOP
    for pid in sorted(targets):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return sorted(targets)


def watch(args: argparse.Namespace) -> int:
    record = Path(args.record)
    for cond in args.when:  # lines from now on only
        if cond.startswith("log:"):
            log_match(cond[4:].partition(":")[0], r"(?!)")
    started, since = time.monotonic(), None
    # Every 5 ms while a staged download may be published, else every 50 ms. The conditions are tried in
    # their order, the first that fails ending the round, and /proc is read only for a round that needs
    # it: the file conditions come first, so the scan (some ms of CPU) runs only once they hold.
    interval = 0.005 if any(c.startswith("staged:") for c in args.when) else 0.05
    while time.monotonic() - started < args.timeout:
        procs: dict[int, tuple[int, str]] = {}
        matched: list[str] = []
        for cond in args.when:
            if not procs and cond.partition(":")[0] in ("proc", "young"):
                procs = processes()
            found = holds(cond, procs)
            if not found:
                break
            matched.append(found)
        if len(matched) == len(args.when):
            since = since or time.monotonic()
            if time.monotonic() - since >= args.after:
                procs = procs or processes()
                rec = {"point": args.point, "time": time.time(), "matched": matched, "action": args.action}
                if args.action == "kill":
                    rec["struck"] = strike("kill", procs)
                    write_record(record, rec)
                else:
                    write_record(record, rec)  # first: after the freeze nothing may run
                    strike("freeze", procs)
                print(f"struck {args.point}", flush=True)  # its own log (the controller reads the record)
                return 0
        else:
            since = None
        time.sleep(interval)
    return 1


def check(root: str) -> int:
    """Invariants after a crash: the live path is absent or a complete model matching its manifest,
    and no half-published version is live."""
    out: dict = {"root": root, "live": None, "problems": []}
    live = Path(root) / "tiny-qwen2"
    if live.is_symlink():
        target = live.resolve()
        out["live"] = str(target)
        if "/.versions/" not in str(target):
            out["problems"].append(f"live link points outside .versions: {target}")
        try:
            manifest = json.loads((target / ".gpubox-manifest.json").read_text())
            for f in manifest["files"]:
                digest = hashlib.sha256((target / f["path"]).read_bytes()).hexdigest()
                if digest != f["sha256"]:
                    out["problems"].append(f"{f['path']}: sha256 differs from the manifest")
        except (OSError, ValueError, KeyError) as exc:
            out["problems"].append(f"live model unreadable or without manifest: {exc}")
    elif live.exists():
        out["problems"].append(f"{live} is not the store's symlink")
    print(json.dumps(out))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--point")
    ap.add_argument("--when", action="append", default=[])
    ap.add_argument("--after", type=float, default=0.0)
    ap.add_argument("--action", choices=["kill", "freeze"])
    ap.add_argument("--record")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--check")
    ap.add_argument("--strike", action="store_true")
    ap.add_argument("--within", type=float, default=0.0)
    args = ap.parse_args()
    if args.check:
        return check(args.check)
    if args.strike and args.point and args.action and args.record:
        procs = processes()
        end = time.monotonic() + args.within
        while args.action == "kill" and not ansible_pids(procs) and time.monotonic() < end:
            time.sleep(0.1)
            procs = processes()
        rec = {"point": args.point, "time": time.time(), "matched": ["controller"], "action": args.action}
        if args.action == "kill":
            rec["struck"] = strike("kill", procs)
            write_record(Path(args.record), rec)
        else:
            write_record(Path(args.record), rec)
            strike("freeze", procs)
        return 0
    if not (args.point and args.when and args.action and args.record):
        ap.error("--point, --when, --action and --record are needed")
    return watch(args)


if __name__ == "__main__":
    sys.exit(main())
