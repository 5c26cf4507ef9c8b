"""TEST-ONLY archives of Ubuntu's shape (``dists/<suite>/<component>``), signed, for the driver's archive snapshot.

SIMULATED: Ubuntu's archive and its snapshot service (snapshot.ubuntu.com), which tests cannot reach. A test builds
the archive as it is now (jammy-updates carrying 535-server as a transitional package that pulls 580-server) and a
dated snapshot of it that still carries the pinned 535 build, each a signed suite with tiny real .debs (no payload),
and serves them on loopback. What is real: apt reading them, its signature check, its pins, its downloads. The
names and versions are Ubuntu's (plugins/module_utils/stacks.py); the packages' contents are not.

    root = build_suite(out, "jammy-updates", "restricted", [Package(...), ...], signer)
    with serve(root, "127.0.0.2") as url: ...

Reuses build_repo.py's package builder and signer (its throwaway key, made in the GnuPG home given).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import http.server
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import format_datetime
from pathlib import Path

from harness.aptrepo import build_repo as br
from harness.aptrepo import serve as srv

CODENAME = "jammy"


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    depends: tuple[str, ...] = ()


def stanza(deb: br.Deb, pool_path: str, data: Path) -> str:
    return (
        br.control_text(deb).rstrip("\n")
        + f"\nFilename: {pool_path}\nSize: {data.stat().st_size}\nSHA256: {br.file_digest(data, 'sha256')}\n"
    )


def release(suite: str, component: str, files: dict[str, bytes]) -> str:
    """An Ubuntu-like Release: Origin and Label Ubuntu (the snapshot serves the archive's own), no Valid-Until."""
    lines = [
        "Origin: Ubuntu",
        "Label: Ubuntu",
        f"Suite: {suite}",
        f"Codename: {CODENAME}",
        f"Date: {format_datetime(datetime.fromtimestamp(br.SOURCE_DATE_EPOCH, tz=timezone.utc), usegmt=True)}",
        "Architectures: amd64",
        f"Components: {component}",
        "SHA256:",
    ]
    lines += [f" {hashlib.sha256(data).hexdigest()} {len(data):>16} {name}" for name, data in sorted(files.items())]
    return "\n".join(lines) + "\n"


def build_suite(root: Path, suite: str, component: str, packages: Iterable[Package], signer: br.Signer | None) -> Path:
    """Write ``root``/dists/``suite`` (Release, and InRelease + Release.gpg when ``signer``) and its packages under
    ``root``/pool; returns ``root``. ``signer`` None leaves the suite unsigned."""
    pool = root / "pool" / component
    pool.mkdir(parents=True, exist_ok=True)
    stanzas = []
    for package in packages:
        deb = br.Deb(
            package.name,
            package.version,
            f"{package.name} (simulated: Ubuntu's name and version, no payload)",
            section=component,
            depends=package.depends,
        )
        data = br.stage_and_build(deb, pool, root / ".work")
        stanzas.append(stanza(deb, f"pool/{component}/{data.name}", data))
    if (root / ".work").is_dir():
        (root / ".work").rmdir()
    index = "\n".join(stanzas).encode()
    binary = f"{component}/binary-amd64"
    files = {f"{binary}/Packages": index, f"{binary}/Packages.gz": gzip.compress(index, mtime=0)}
    dist = root / "dists" / suite
    for name, data in files.items():
        (dist / name).parent.mkdir(parents=True, exist_ok=True)
        (dist / name).write_bytes(data)
    (dist / "Release").write_text(release(suite, component, files))
    if signer is not None:
        signer.sign(signer.fingerprint(), dist / "Release")
        signer.stop_agent()
    return root


@contextlib.contextmanager
def serve(root: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """serve.py's handler over ``root`` on ``host`` and a free port, in a thread; yields the base URL."""
    handler = functools.partial(srv.QuietHandler, directory=str(root))
    with http.server.ThreadingHTTPServer((host, 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://{host}:{server.server_address[1]}"
        finally:
            server.shutdown()
            thread.join(timeout=10)
