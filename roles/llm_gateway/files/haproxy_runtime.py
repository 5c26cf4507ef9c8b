#!/usr/bin/python3
"""gpubox's one client of HAProxy's unix sockets (the runtime API and the master CLI), roles/llm_gateway.

    haproxy_runtime.py ask SOCKET COMMAND
    haproxy_runtime.py old-workers MASTER_SOCKET
    haproxy_runtime.py stat ADMIN_SOCKET BACKEND
    haproxy_runtime.py backend-of ADMIN_SOCKET SERVER
    haproxy_runtime.py wait-drained ADMIN_SOCKET MASTER_SOCKET BACKEND SERVER TIMEOUT_S
    haproxy_runtime.py save-state ADMIN_SOCKET STATE_FILE
    haproxy_runtime.py wait-decisions DECISIONS_FILE SECONDS BOX...

The role installs it on the gateway (root only: both sockets are mode 0600) and its tasks, the unit's
reload and the tests run it; the tests import it. Standard library only, Python 3.9 and later.

- ask: one command and HAProxy's whole answer.
- old-workers: how many workers of a previous configuration are left (`show proc`, "# old workers"): a
  worker that has not soft-stopped keeps accepting connections, out of reach of the runtime API.
- stat: the servers of BACKEND ("*": of every backend) as JSON, {server: {"pool", "status", "requests", "errors",
  "in_flight", "weight"}} (requests: the HTTP responses it gave, by class; stot counts server-side connections,
  which HAProxy reuses; errors: its 5xx answers, broken responses and failed connections; weight: the effective one).
- backend-of: the backend (the pool) that holds SERVER (a box is in one pool).
- wait-drained: poll every 0.2 s until SERVER has no request in flight (scur, a stream counts until its
  last byte) and the master lists no old worker, at most TIMEOUT_S; print what it saw as JSON. The bound
  itself is no failure (the rebuild reports it and goes on); a socket refused during a reload is asked again.
- save-state: run by haproxy.service's ExecReload (the drop-in gpubox-server-state.conf) before the master
  is told to reload: `show servers state` (which boxes are drained or in maintenance, their health) goes to
  STATE_FILE, written whole (a temporary file renamed over it), and `load-server-state-from-file global`
  makes the new worker start from it. Without it a reload puts every box back in the pool, a box drained
  for its rebuild included. When HAProxy does not answer (not running yet), nothing is written and the
  reload goes on (exit 0).
- wait-decisions: a canary's window (playbooks/rebuild.yml): wait SECONDS, or until DECISIONS_FILE (written by
  playbooks/canary.yml: {box: {"decision": "promote"|"stop", ...}}) names every BOX; print {"decisions": {box:
  decision}, "waited_s"} (no file, or none named: no decision).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

ANSWERED = ("hrsp_1xx", "hrsp_2xx", "hrsp_3xx", "hrsp_4xx", "hrsp_5xx", "hrsp_other")
# What went wrong with a server: its 5xx answers, the responses that broke off, the connections that failed.
FAILED = ("hrsp_5xx", "eresp", "econ")


def ask(path: str, command: str, timeout: float = 5.0) -> str:
    """One command on an HAProxy unix socket and its whole answer (HAProxy closes after it)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(command.encode() + b"\n")
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data.decode()
            data += chunk


def proc_section(show_proc: str, section: str) -> list[list[str]]:
    """The fields of each line `show proc` lists under ``section`` ("# workers", "# old workers", ...)."""
    current, rows = "", []
    for line in show_proc.splitlines():
        if line.startswith("#"):
            current = line.strip()
        elif line.strip() and current == section:
            rows.append(line.split())
    return rows


def old_workers(show_proc: str) -> int:
    """The workers `show proc` lists under "# old workers"."""
    return len(proc_section(show_proc, "# old workers"))


def workers(show_proc: str) -> list[int]:
    """The process ids of the current workers, those `show proc` lists under "# workers"."""
    return [int(fields[0]) for fields in proc_section(show_proc, "# workers")]


def stat_rows(show_stat: str) -> list[dict[str, str]]:
    """`show stat` (CSV, its header line starting with "# ") as one dict per row."""
    lines = show_stat.splitlines()
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not an answer of `show stat`: {show_stat[:80]!r}")
    head = lines[0][2:].split(",")
    return [dict(zip(head, line.split(","))) for line in lines[1:] if line]


def servers(show_stat: str, backend: str) -> dict[str, dict[str, object]]:
    """{server: {pool, status, requests, errors, in_flight, weight}} of one backend (its BACKEND summary row aside);
    backend "*": of every pool (a box is in one)."""
    return {
        row["svname"]: {
            "pool": row["pxname"],
            "status": row["status"],
            "requests": sum(int(row.get(k) or 0) for k in ANSWERED),
            "errors": sum(int(row.get(k) or 0) for k in FAILED),
            "in_flight": int(row.get("scur") or 0),
            "weight": int(row.get("weight") or 0),
        }
        for row in stat_rows(show_stat)
        if row.get("pxname") == backend or (backend == "*" and row.get("type") == "2")
        if row.get("svname") != "BACKEND"
    }


def backend_of(show_stat: str, server: str) -> str:
    """The backend (the pool) that holds ``server``: a box's server name is its inventory name, in one pool."""
    found = sorted(
        {row["pxname"] for row in stat_rows(show_stat) if row.get("svname") == server and row.get("type") == "2"}
    )
    if len(found) != 1:
        raise LookupError(f"server {server} is in {len(found)} backends of the runtime API's stats ({found}), not one")
    return found[0]


def in_flight(show_stat: str, backend: str, server: str) -> int:
    found = servers(show_stat, backend)
    if server not in found:
        raise LookupError(f"server {backend}/{server} is not in the runtime API's stats (servers: {sorted(found)})")
    return int(found[server]["in_flight"])  # type: ignore[call-overload]


def wait_drained(admin: str, master: str, backend: str, server: str, limit: float, poll: float = 0.2) -> dict:
    start = time.monotonic()
    first: int | None = None
    left: int | None = None
    old: int | None = None
    while True:
        try:
            left, old = in_flight(ask(admin, "show stat"), backend, server), old_workers(ask(master, "show proc"))
        except OSError:  # a reload re-executes the master and rebinds the sockets: ask again
            left = old = None
        if first is None:
            first = left
        if (left == 0 and old == 0) or time.monotonic() - start >= limit:
            break
        time.sleep(poll)
    return {
        "seconds": round(time.monotonic() - start, 1),
        "in_flight_at_drain": first,
        "in_flight_left": left,
        "old_workers_left": old,
        "timed_out": not (left == 0 and old == 0),
        "timeout_s": limit,
    }


def decisions(path: str, boxes: list[str]) -> dict[str, str]:
    """{box: promote|stop} that an operator recorded in the canary decisions file for ``boxes`` (none: {})."""
    try:
        with open(path, encoding="utf-8") as fh:
            asked = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(asked, dict):
        return {}
    return {
        box: entry["decision"]
        for box, entry in asked.items()
        if box in boxes and isinstance(entry, dict) and entry.get("decision") in ("promote", "stop")
    }


def wait_decisions(path: str, limit: float, boxes: list[str], poll: float = 1.0) -> dict:
    """Wait ``limit`` seconds, or until the decisions file names every one of ``boxes``; what it named."""
    start = time.monotonic()
    while True:
        found = decisions(path, boxes)
        if len(found) == len(set(boxes)) or time.monotonic() - start >= limit:
            return {"decisions": found, "waited_s": round(time.monotonic() - start, 1)}
        time.sleep(min(poll, max(0.0, limit - (time.monotonic() - start))))


def save_state(admin: str, dest: str) -> str:
    """Write `show servers state` to dest whole; what happened, in one line."""
    try:
        data = ask(admin, "show servers state")
    except OSError as exc:
        return f"no state saved ({admin}: {exc})"
    if not data.startswith("1\n"):  # the state file format's version line
        return f"no state saved (unexpected answer: {data[:80]!r})"
    tmp = f"{dest}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, dest)
    return f"saved to {dest}"


USAGE = {"ask": 2, "old-workers": 1, "stat": 2, "backend-of": 2, "wait-drained": 5, "save-state": 2}


def main(argv: list[str]) -> int:
    if len(argv) >= 5 and argv[1] == "wait-decisions":
        try:
            limit = float(argv[3])
        except ValueError:
            print(f"haproxy_runtime wait-decisions: SECONDS is {argv[3]!r}: give seconds, e.g. 300", file=sys.stderr)
            return 2
        print(json.dumps(wait_decisions(argv[2], limit, argv[4:])))
        return 0
    if len(argv) < 2 or argv[1] not in USAGE or len(argv) != USAGE[argv[1]] + 2:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[1], argv[2:]
    if command == "save-state":
        said = save_state(args[0], args[1])
        if not said.startswith("saved"):
            print(f"haproxy_runtime save-state: {said}", file=sys.stderr)
        return 0
    try:
        if command == "ask":
            print(ask(args[0], args[1]).strip())
        elif command == "old-workers":
            print(old_workers(ask(args[0], "show proc")))
        elif command == "backend-of":
            print(backend_of(ask(args[0], "show stat"), args[1]))
        elif command == "stat":
            print(json.dumps(servers(ask(args[0], "show stat"), args[1]), sort_keys=True))
        else:
            try:
                limit = float(args[4])
            except ValueError:
                print(f"haproxy_runtime wait-drained: TIMEOUT_S is {args[4]!r}: give seconds, e.g. 60", file=sys.stderr)
                return 2
            print(json.dumps(wait_drained(args[0], args[1], args[2], args[3], limit)))
    except (OSError, LookupError, ValueError) as exc:
        print(f"haproxy_runtime {command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
