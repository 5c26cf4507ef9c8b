#!/usr/bin/env python3
"""Serve the TEST-ONLY CUDA apt repository built by build_repo.py over plain HTTP.

Runs inside each test container (as a systemd unit) so the repository is reachable on the
container's own loopback, standing in for developer.download.nvidia.com. Standard library only
(Debian 12's python3 is 3.11). Per-request logging is off; errors still go to stderr.

usage: serve.py --root DIR [--port 8089] [--bind 127.0.0.1]
       --port 0 picks a free port; the first line printed names the URL actually served.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import sys
from pathlib import Path


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Static files from the repo root; only failed requests are logged.

    HTTP/1.1 with keep-alive, as NVIDIA's CDN speaks: a caching proxy in front (apt-cacher-ng in
    molecule/fleet) pipelines several requests on one connection, which an HTTP/1.0 server
    closes after the first answer (seen: apt-cacher-ng's 503 "Connection closed, check DlMaxRetries").
    """

    protocol_version = "HTTP/1.1"

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if str(code).isdigit() and int(code) >= 400:
            super().log_request(code, size)


def check_root(root: Path) -> str | None:
    """An error message when `root` does not look like a built repository, else None."""
    if not root.is_dir():
        return f"--root {root} is not a directory: build it first with build_repo.py --out {root}"
    missing = [name for name in ("InRelease", "Packages") if not (root / name).is_file()]
    if missing:
        return f"--root {root} lacks {', '.join(missing)}: build it first with build_repo.py --out {root}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the gpubox test apt repository.")
    parser.add_argument("--root", required=True, type=Path, help="directory written by build_repo.py")
    parser.add_argument("--port", type=int, default=8089, help="TCP port (0: any free port)")
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    error = check_root(args.root)
    if error:
        print(f"serve.py: error: {error}", file=sys.stderr)
        return 2
    handler = functools.partial(QuietHandler, directory=str(args.root.resolve()))
    with http.server.ThreadingHTTPServer((args.bind, args.port), handler) as server:
        host, port = server.server_address[:2]
        print(f"serving {args.root} on http://{host}:{port}/", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
