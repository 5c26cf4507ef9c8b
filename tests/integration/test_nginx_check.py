"""The one nginx configuration checker (roles/gpubox/files/nginx-check), run on the front door's rendered file.

The roles' `validate:` hands it a candidate file meant for nginx's http context: it passes what Debian's nginx
accepts, refuses what it does not (naming nginx's reason), and leaves the live server's temp directories
(/var/lib/nginx/*) as they were: `nginx -t` creates and chowns the temp directories of the configuration it
tests, so the checker's own configuration names private ones (the LAN cache's former copy did not, and took
them from nginx's workers).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import live_proxies

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "roles" / "gpubox" / "files" / "nginx-check"
LIVE_TEMP = Path("/var/lib/nginx")


def _temp_dirs() -> dict[str, tuple[int, int, int] | None]:
    """Owner, group and mode of each of nginx's compiled-in temp directories (None: not there)."""
    out: dict[str, tuple[int, int, int] | None] = {}
    for name in ("body", "fastcgi", "proxy", "scgi", "uwsgi"):
        try:
            st = os.stat(LIVE_TEMP / name)
        except FileNotFoundError:
            out[name] = None
            continue
        out[name] = (st.st_uid, st.st_gid, st.st_mode)
    return out


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECKER), str(path)], capture_output=True, text=True, timeout=60)


def test_the_checker_passes_the_front_doors_file_refuses_a_broken_one_and_leaves_nginxs_temp_dirs(tmp_path):
    try:
        live_proxies.nginx_binary()
    except live_proxies.Missing as exc:
        pytest.fail(str(exc))
    live_proxies.self_signed(tmp_path)
    live_proxies.write_front_door(tmp_path, 8000, live_proxies.free_port(), {})
    before = _temp_dirs()
    good = _check(tmp_path / "front-door.conf")
    broken = tmp_path / "broken.conf"
    broken.write_text((tmp_path / "front-door.conf").read_text().replace("server_tokens off;", "server_tokens of;"))
    bad = _check(broken)
    assert good.returncode == 0, good.stderr
    assert bad.returncode != 0 and f'invalid value "of" in {broken}:' in bad.stderr, bad.stderr
    assert _temp_dirs() == before


def test_the_checker_says_how_to_call_it():
    usage = subprocess.run([sys.executable, str(CHECKER)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stderr.startswith("Usage: nginx-check FILE"), usage.stderr
