#!/usr/bin/python3
"""Save HAProxy's server states before a reload, for the new worker to load (roles/llm_gateway).

    haproxy_save_state.py ADMIN_SOCKET STATE_FILE

Run by haproxy.service's ExecReload (the drop-in gpubox-server-state.conf) before the master is told to
reload: the runtime API's `show servers state` (which boxes are drained or in maintenance, their health)
goes to STATE_FILE, written whole (a temporary file renamed over it), and the configuration's
`load-server-state-from-file global` makes the new worker start from it. Without it a reload puts every
box back in the pool, a box drained for its rebuild included, which would then get new requests while its
vLLM restarts. When HAProxy does not answer (not running yet), nothing is written and the reload goes on.
"""

from __future__ import annotations

import os
import socket
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, dest = argv[1], argv[2]
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(path)
            sock.sendall(b"show servers state\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError as exc:
        print(f"haproxy_save_state: no state saved ({path}: {exc})", file=sys.stderr)
        return 0
    if not data.startswith(b"1\n"):  # the state file format's version line
        print(f"haproxy_save_state: no state saved (unexpected answer: {data[:80]!r})", file=sys.stderr)
        return 0
    tmp = f"{dest}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
