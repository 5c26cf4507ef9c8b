"""A box's serving layer as it was, kept before a canary's change and put back when the canary fails (issue 48).

``save`` copies each named file (its bytes, mode and owner) and records each named symlink's target into a
directory of the box, with a manifest saying what existed; ``restore`` puts every file back whole (a temporary file
in the same directory, renamed over the path), removes a file that did not exist before, and points each link back
at its old target (a new link renamed over it, so the path is never missing). Nothing is downloaded: what a link
pointed at (the model store's kept version, the Python environment's directory) is still on the box, and a restore
whose link target is gone is refused before anything is changed. Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"


class SnapshotError(ValueError):
    """A snapshot that cannot be taken or put back; the message names the path."""


def _slot(path: str) -> str:
    return path.strip("/").replace("/", "__")


def save(dest: str, files: list[str], links: list[str]) -> dict[str, Any]:
    """Keep ``files`` and ``links`` in ``dest`` (written whole: a new directory renamed over the old one)."""
    for path in [*files, *links]:
        if not os.path.isabs(path):
            raise SnapshotError(f"{path!r} is not an absolute path")
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = Path(tempfile.mkdtemp(prefix=".snapshot.", dir=target.parent))
    manifest: dict[str, Any] = {"files": {}, "links": {}}
    for path in files:
        if os.path.islink(path):
            raise SnapshotError(f"{path} is a symlink; name it among the links")
        if not os.path.exists(path):
            manifest["files"][path] = None
            continue
        info = os.stat(path)
        shutil.copyfile(path, work / _slot(path))
        manifest["files"][path] = {
            "slot": _slot(path),
            "mode": info.st_mode & 0o7777,
            "uid": info.st_uid,
            "gid": info.st_gid,
        }
    for path in links:
        manifest["links"][path] = os.readlink(path) if os.path.islink(path) else None
    (work / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    os.chmod(work, 0o700)
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=".old.", dir=target.parent))
        os.rename(target, old / "snapshot")
    os.rename(work, target)
    if old is not None:
        shutil.rmtree(old)
    return manifest


def _link_target(path: str, target: str) -> str:
    return target if os.path.isabs(target) else os.path.join(os.path.dirname(path), target)


def plan(dest: str) -> tuple[dict[str, Any], list[str]]:
    """The manifest kept in ``dest`` and what a restore would change, or SnapshotError naming what is missing."""
    try:
        manifest = json.loads((Path(dest) / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise SnapshotError(f"no snapshot to restore in {dest}: {exc}") from exc
    changes = []
    for path, kept in manifest["files"].items():
        if kept is None:
            if os.path.lexists(path):
                changes.append(path)
            continue
        slot = Path(dest) / kept["slot"]
        if not slot.is_file():
            raise SnapshotError(f"the snapshot in {dest} lacks its copy of {path}")
        if (
            not os.path.isfile(path)
            or Path(path).read_bytes() != slot.read_bytes()
            or (os.stat(path).st_mode & 0o7777) != kept["mode"]
        ):
            changes.append(path)
    for path, target in manifest["links"].items():
        if target is None:
            continue
        if not os.path.exists(_link_target(path, target)):
            raise SnapshotError(f"{path} pointed at {target}, which is gone: the old version cannot be put back")
        if not os.path.islink(path) or os.readlink(path) != target:
            changes.append(path)
    return manifest, changes


def restore(dest: str) -> list[str]:
    """Put back what ``dest`` kept; the paths changed (checked whole before the first change)."""
    manifest, changes = plan(dest)
    for path in changes:
        if path in manifest["links"]:
            target = manifest["links"][path]
            fresh = f"{path}.gpubox-restore"
            if os.path.lexists(fresh):
                os.unlink(fresh)
            os.symlink(target, fresh)
            os.rename(fresh, path)
            continue
        kept = manifest["files"][path]
        if kept is None:
            os.unlink(path)
            continue
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".gpubox-restore.", dir=directory)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write((Path(dest) / kept["slot"]).read_bytes())
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, kept["mode"])
            os.chown(tmp, kept["uid"], kept["gid"])
            os.rename(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    return changes
