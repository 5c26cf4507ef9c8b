"""The published model's manifest and its re-hash: stdlib only, shared by the model store and the box.

Used by module_utils/model_publish.py (the model_store module: verification before and after a
download, the kept-copy check of a rollback), by the model_verify module (``make verify``), and by the
optional weekly re-hash on the box: the module ``gpubox.gpubox.gpu_check_library`` (``library:
model_manifest``) writes this very file, as shipped to the box inside its own payload, to
/usr/local/lib/gpubox/model_manifest.py, where ``gpubox-model-verify`` (roles/model_store/files, run by
``gpubox-model-verify.service``) imports it: :func:`verify_live` re-hashes every file of the live model
against the manifest the store wrote when it published that version, and :func:`write_fact` records
the result (one rename; Ansible reads it as ``ansible_local.gpubox_model_verify``). So it imports
nothing but the standard library and runs on Python >= 3.9.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

MANIFEST_NAME = ".gpubox-manifest.json"
MANIFEST_SCHEMA = 1

ByteCallback = Optional[Callable[[int], None]]


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str


def _safe_relpath(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


@dataclass(frozen=True)
class FileProblem:
    path: str
    kind: str  # "missing" | "size" | "sha256"
    expected: str
    actual: str

    def describe(self) -> str:
        if self.kind == "missing":
            return f"{self.path}: missing (expected {self.expected})"
        return f"{self.path}: {self.kind} mismatch, expected {self.expected}, got {self.actual}"


class NotInside(Exception):
    """A member path that is not a plain file reached through plain directories of its base."""


def open_parent(directory: Path, rel: str) -> int:
    """A directory fd of rel's parent inside directory, reached without following any symlink
    (O_NOFOLLOW | O_DIRECTORY at every step): a symlinked directory on the way is NotInside."""
    if not _safe_relpath(rel):
        raise NotInside(f"{rel!r} is not a plain relative path")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    for part in rel.split("/")[:-1]:
        try:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise NotInside(f"{rel!r}: {part!r} is not a plain directory") from exc
            raise
        os.close(fd)
        fd = nxt
    return fd


def open_member(directory: Path, rel: str) -> int:
    """Open directory/rel read-only without following any symlink on the way or at the end: a
    symlinked directory or file, or anything but a regular file, is NotInside, never its target."""
    parts = rel.split("/")
    fd = open_parent(directory, rel)
    try:
        try:
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotInside(f"{rel!r} is a symlink") from exc
            raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise NotInside(f"{rel!r} is not a regular file")
    return leaf


def sha256_fd(fd: int, on_bytes: ByteCallback = None) -> str:
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb", closefd=False) as fh:
        while block := fh.read(4 << 20):
            digest.update(block)
            if on_bytes:
                on_bytes(len(block))
    return digest.hexdigest()


def sha256_file(path: Path, on_bytes: ByteCallback = None) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        return sha256_fd(fd, on_bytes)
    finally:
        os.close(fd)


def verify_file(directory: Path, f: RemoteFile, *, rehash: bool, on_bytes: ByteCallback = None) -> FileProblem | None:
    try:
        fd = open_member(directory, f.path)
    except FileNotFoundError:
        return FileProblem(f.path, "missing", f"{f.size} bytes, sha256 {f.sha256}", "")
    except NotInside as exc:
        return FileProblem(f.path, "missing", "a regular file", f"refused: {exc}")
    try:
        size = os.fstat(fd).st_size
        if size != f.size:
            return FileProblem(f.path, "size", f"{f.size} bytes", f"{size} bytes")
        if rehash:
            actual = sha256_fd(fd, on_bytes)
            if actual != f.sha256:
                return FileProblem(f.path, "sha256", f"sha256 {f.sha256}", f"sha256 {actual}")
    finally:
        os.close(fd)
    return None


def verify_dir(
    directory: Path, files: Iterable[RemoteFile], *, rehash: bool, on_bytes: ByteCallback = None
) -> list[FileProblem]:
    """Check every listed file: size always, sha256 when rehash. Returns the problems, [] when all good."""
    problems = []
    for f in files:
        problem = verify_file(directory, f, rehash=rehash, on_bytes=on_bytes)
        if problem:
            problems.append(problem)
    return problems


def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")


def manifest_digest(body: dict[str, Any]) -> str:
    """sha256 over the canonical JSON of every field but manifest_sha256 itself."""
    return hashlib.sha256(_canonical({k: v for k, v in body.items() if k != "manifest_sha256"})).hexdigest()


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest in directory, or None when absent, unreadable or not matching its own digest."""
    try:
        body = json.loads((directory / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("schema") != MANIFEST_SCHEMA:
        return None
    if body.get("manifest_sha256") != manifest_digest(body):
        return None
    return body


def verify_live(root: Path, name: str) -> dict[str, Any]:
    """Re-hash the live model root/name against its manifest: per-file status, ok, the problems."""
    live_path = Path(root) / name
    result: dict[str, Any] = {
        "ok": False,
        "path": str(live_path),
        "version_path": "",
        "commit": "",
        "files": [],
        "problems": [],
        "bytes_hashed": 0,
    }
    live = live_path.resolve() if live_path.is_symlink() else None
    if live is None or not live.is_dir():
        result["problems"] = [f"{live_path} is not a link to a published version: run the model_store role"]
        return result
    result["version_path"] = str(live)
    manifest = read_manifest(live)
    if manifest is None:
        result["problems"] = [f"{live} has no intact manifest: run the model_store role with model_store_rehash: true"]
        return result
    result["commit"] = manifest.get("commit", "")
    files = [RemoteFile(f["path"], f["size"], f["sha256"]) for f in manifest["files"]]
    hashed = [0]

    def count(n: int) -> None:
        hashed[0] += n

    problems = {p.path: p.describe() for p in verify_dir(live, files, rehash=True, on_bytes=count)}
    result["files"] = [
        {
            "path": f.path,
            "ok": f.path not in problems,
            "status": problems.get(f.path, "").removeprefix(f"{f.path}: ") or "ok",
        }
        for f in files
    ]
    result["problems"] = list(problems.values())
    result["ok"] = not problems
    result["bytes_hashed"] = hashed[0]
    return result


def fact_of(result: dict[str, Any], source: str) -> dict[str, Any]:
    """What the local fact ansible_local.gpubox_model_verify holds (playbooks/verify.yml writes the same keys)."""
    fact = {k: result[k] for k in ("ok", "commit", "version_path", "problems", "bytes_hashed")}
    fact["failed_files"] = [f["path"] for f in result["files"] if not f["ok"]]
    fact["checked_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    fact["source"] = source
    return fact


def write_fact(path: Path, fact: dict[str, Any]) -> None:
    """Write the fact file whole: a temporary file in its directory, fsync, rename(2)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(fact, indent=2, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
