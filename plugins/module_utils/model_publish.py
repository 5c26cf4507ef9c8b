"""Verified model store: the work of the gpubox.gpubox.model_store module, without Ansible.

The module is a thin wrapper: it declares its options once (``argument_spec``) and passes
``module.params`` whole to :class:`Request`, then calls :func:`run_model_store`. Everything else
lives here: the hub listing, verification, manifest, disk check, the modelscope client run and
the atomic publish. Shared by the module and tests/unit/test_modelstore.py.

On-disk layout under the store root (default /data/models):

    <root>/<name>                      symlink -> .versions/<name>@<commit>   (the live path)
    <root>/.versions/<name>@<commit>/  a complete, verified model + .gpubox-manifest.json (root's)
    <root>/.staging/                   root's, 0711: the download user may pass, not list or create
    <root>/.staging/<name>@<commit>/   the download user's, 0700: download in progress (kept for resume)
    <root>/.staging/.publish-<name>@<commit>/  root's, 0700: the next version while it is assembled

Least privilege: the modelscope client is the part that reads what the hub sends (the file list it
fetches itself, the bytes), so it never runs as root. It runs as ``download_user`` and can write only
its staging directory: under systemd (every real box) it is a transient service with a file-system
sandbox (ProtectSystem=strict, one ReadWritePaths, PrivateTmp, no capabilities) stopped with its
whole cgroup when the run ends or fails; without systemd (unit tests on a CI machine) it is a child
process under that user, killed with its process group and by PR_SET_PDEATHSIG if the module dies.
Publishing is the only root step: it moves exactly the files of the verified listing out of staging,
each checked to be a regular file inside staging (no symlink on the way, one link, the download
user's or one of our own published inodes), into a root-owned directory; everything else the client
wrote is left out and reported. That directory becomes a version by rename(2), and the live path only
ever changes by rename(2) of a new symlink over the old one, so a reader of <root>/<name> sees either
the old complete model or the new complete model, never a mix.

Every failure is a ModelStoreError whose message names the path and the fix (OSErrors included: disk
full, read-only file system, permission denied); the progress file then says "failed".

Runs on the managed host (Python >= 3.10).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
import urllib.error
import urllib.parse
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ansible.module_utils.urls import ConnectionError as UrlConnectionError
from ansible.module_utils.urls import open_url

from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_catalog import config_mismatches

# The manifest and the re-hash are model_manifest's (stdlib only: the box's weekly re-hash runs the same
# file); imported here by name, the names model_publish's callers and tests use.
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_manifest import (
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    FileProblem,
    NotInside,
    RemoteFile,
    _safe_relpath,
    manifest_digest,
    open_member,
    open_parent,
    read_manifest,
    verify_dir,
)

VERSIONS_DIR = ".versions"
STAGING_DIR = ".staging"
PARTIAL_SUFFIX = ".incomplete"  # the modelscope client's name for a partly received file
CLIENT_DIR = ".gpubox-client"  # inside a staging dir: the client's HOME and cache, never published
# What the modelscope client writes beside the files in its local_dir (metadata, partial downloads).
CLIENT_BOOKKEEPING = (".msc", ".mv", "._____temp", ".mdl")
PUBLISH_PREFIX = ".publish-"
DIR_MODE = 0o755
FILE_MODE = 0o644
STAGING_ROOT_MODE = 0o711
SYSTEMD_RUN = "/usr/bin/systemd-run"
SYSTEMCTL = "/usr/bin/systemctl"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelStoreError(Exception):
    """A failure the caller should report as-is: every message names the input and the fix."""


class ListingError(ModelStoreError):
    pass


class DiskSpaceError(ModelStoreError):
    pass


# --------------------------------------------------------------------------------------------------
# Hub listing
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Listing:
    model_id: str
    revision: str  # what was asked for: a branch, tag or commit
    commit: str  # what the hub resolved it to
    files: tuple[RemoteFile, ...]

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)


def split_model_id(model_id: str) -> tuple[str, str]:
    owner, sep, name = model_id.partition("/")
    if not sep or not owner or not name or "/" in name:
        raise ModelStoreError(f"model_id {model_id!r} must look like OWNER/NAME, e.g. Qwen/Qwen2.5-7B-Instruct")
    return owner, name


def listing_url(endpoint: str, model_id: str, revision: str) -> str:
    owner, name = split_model_id(model_id)
    query = urllib.parse.urlencode({"Revision": revision, "Recursive": "True"})
    base = endpoint.rstrip("/")
    return f"{base}/api/v1/models/{urllib.parse.quote(owner)}/{urllib.parse.quote(name)}/repo/files?{query}"


def parse_listing(payload: Any, model_id: str, revision: str) -> Listing:
    """Turn the hub's repo/files answer into a Listing; reject anything we could not verify against."""
    where = f"the hub listing of {model_id}@{revision}"
    if not isinstance(payload, dict):
        raise ListingError(f"{where} is not a JSON object")
    if payload.get("Success") is False or payload.get("Code") not in (None, 200, "200"):
        raise ListingError(f"{where} was refused: {payload.get('Message') or payload.get('Code')}")
    data = payload.get("Data")
    entries = data.get("Files") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ListingError(f"{where} has no Data.Files list")
    files: list[RemoteFile] = []
    commits: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("Type", "blob") == "tree":
            continue
        path, size, sha = entry.get("Path"), entry.get("Size"), str(entry.get("Sha256") or "").lower()
        if not isinstance(path, str) or not _safe_relpath(path) or path.split("/")[-1] == MANIFEST_NAME:
            raise ListingError(f"{where} names an unusable path {path!r}")
        if not isinstance(size, int) or size < 0:
            raise ListingError(f"{where} gives {path} no valid Size ({size!r})")
        if not _SHA256_RE.match(sha):
            raise ListingError(f"{where} gives {path} no sha256 ({sha!r}); it cannot be verified")
        files.append(RemoteFile(path, size, sha))
        if entry.get("Revision"):
            commits.add(str(entry["Revision"]))
    if not files:
        raise ListingError(f"{where} lists no files: check model_id and revision")
    if len({f.path for f in files}) != len(files):
        raise ListingError(f"{where} lists a path twice")
    commit = sorted(commits)[0] if len(commits) == 1 else _content_id(files)
    return Listing(model_id, revision, commit, tuple(sorted(files, key=lambda f: f.path)))


def _content_id(files: Iterable[RemoteFile]) -> str:
    """Stand-in for a commit id when the listing carries none (or several): derived from content."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{f.size}\0{f.sha256}\n".encode())
    return "content-" + digest.hexdigest()[:32]


def fetch_listing(
    endpoint: str, model_id: str, revision: str, timeout: float = 60.0, cafile: str | None = None
) -> Listing:
    url = listing_url(endpoint, model_id, revision)
    try:
        response = open_url(
            url,
            headers={"Accept": "application/json"},
            http_agent="gpubox",
            timeout=timeout,
            ca_path=cafile,
            use_netrc=False,
        )
        with contextlib.closing(response):
            payload = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise ListingError(
            f"GET {url} answered HTTP {exc.code}: check model_id {model_id!r} and revision {revision!r}"
        ) from exc
    except (urllib.error.URLError, UrlConnectionError, OSError) as exc:
        raise ListingError(f"GET {url} failed ({exc}): check the endpoint and the network") from exc
    except ValueError as exc:
        raise ListingError(f"GET {url} did not return JSON ({exc})") from exc
    return parse_listing(payload, model_id, revision)


# --------------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------------
class IntegrityError(ModelStoreError):
    def __init__(self, message: str, problems: list[FileProblem]) -> None:
        super().__init__(message)
        self.problems = problems


def extra_files(directory: Path, files: Iterable[RemoteFile]) -> list[str]:
    """Relative paths of entries in directory that are not in the listing: what the client wrote
    besides the model (its bookkeeping such as .msc/.mv, or anything a hub made it write). Its own
    HOME/cache directory is left out; symlinks are listed, never followed."""
    wanted = {f.path for f in files} | {MANIFEST_NAME}
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):
        base = Path(dirpath)
        if base == directory and CLIENT_DIR in dirnames:
            dirnames.remove(CLIENT_DIR)
        links = [d for d in dirnames if (base / d).is_symlink()]
        for name in sorted(filenames + links):
            rel = (base / name).relative_to(directory).as_posix()
            if rel not in wanted:
                found.append(rel)
    return sorted(found)


# --------------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------------
def manifest_body(listing: Listing, endpoint: str = "") -> dict[str, Any]:
    return {
        "schema": MANIFEST_SCHEMA,
        "model_id": listing.model_id,
        "revision": listing.revision,
        "commit": listing.commit,
        "endpoint": endpoint,
        "total_size": listing.total_size,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in listing.files],
    }


def write_manifest(directory: Path, listing: Listing, endpoint: str = "") -> dict[str, Any]:
    body = manifest_body(listing, endpoint)
    body["manifest_sha256"] = manifest_digest(body)
    write_file_atomic(directory / MANIFEST_NAME, json.dumps(body, indent=2, sort_keys=True) + "\n", FILE_MODE)
    return body


def manifest_matches(manifest: dict[str, Any] | None, listing: Listing) -> bool:
    if not manifest:
        return False
    want = manifest_body(listing)
    return all(manifest.get(k) == want[k] for k in ("model_id", "commit", "files"))


# --------------------------------------------------------------------------------------------------
# Disk space
# --------------------------------------------------------------------------------------------------
def staged_bytes(staging: Path, files: Iterable[RemoteFile]) -> int:
    """Bytes of the listing already on disk in staging (complete files and resumable partials)."""
    total = 0
    for f in files:
        for candidate in (staging / f.path, staging / (f.path + PARTIAL_SUFFIX)):
            try:
                size = candidate.stat().st_size
            except OSError:
                continue
            if size <= f.size:
                total += size
                break
    return total


def free_bytes(path: Path) -> int:
    """Free bytes for an unprivileged writer on the filesystem holding path (or its nearest parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    return f"{n} B"


def check_disk_space(root: Path, total: int, staged: int, free: int, reserve: int = 0) -> int:
    """Raise DiskSpaceError unless free >= total - staged + reserve; return the bytes still to fetch."""
    needed = max(0, total - staged)
    shortfall = needed + reserve - free
    if shortfall > 0:
        raise DiskSpaceError(
            f"gpubox_model_root {root} has {human_bytes(free)} free but the download needs "
            f"{human_bytes(needed)} more (listing {human_bytes(total)}, {human_bytes(staged)} already staged)"
            + (f" plus a reserve of {human_bytes(reserve)}" if reserve else "")
            + f": short by {human_bytes(shortfall)} ({shortfall} bytes). Free space there or point "
            "gpubox_model_root at a larger filesystem."
        )
    return needed


# --------------------------------------------------------------------------------------------------
# Layout and atomic publish
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StoreLayout:
    root: Path
    name: str

    def __post_init__(self) -> None:
        if not self.root.is_absolute():
            raise ModelStoreError(f"gpubox_model_root {str(self.root)!r} must be an absolute path")
        if not _NAME_RE.match(self.name):
            raise ModelStoreError(
                f"model name {self.name!r} must be one path component of letters, digits, '.', '_' or '-'"
            )

    @property
    def live(self) -> Path:
        return self.root / self.name

    @property
    def versions(self) -> Path:
        return self.root / VERSIONS_DIR

    @property
    def staging_root(self) -> Path:
        return self.root / STAGING_DIR

    def staging(self, commit: str) -> Path:
        return self.staging_root / f"{self.name}@{commit}"

    @property
    def lock_path(self) -> Path:
        return self.staging_root / f"{self.name}.lock"

    def version_dirs(self) -> list[Path]:
        if not self.versions.is_dir():
            return []
        prefix = f"{self.name}@"
        return sorted(p for p in self.versions.iterdir() if p.name.startswith(prefix) and p.is_dir())

    def versions_for(self, commit: str) -> list[Path]:
        base = f"{self.name}@{commit}"
        return [p for p in self.version_dirs() if p.name == base or p.name.startswith(base + ".")]

    def new_version_path(self, commit: str) -> Path:
        """The first free <name>@<commit>[.N] directory name (N > 1 when re-publishing a commit)."""
        base = self.versions / f"{self.name}@{commit}"
        candidate, n = base, 1
        while candidate.exists() or candidate.is_symlink():
            n += 1
            candidate = base.with_name(f"{base.name}.{n}")
        return candidate


def check_store_dir(path: Path, name: str = "gpubox_model_root") -> None:
    """Refuse an existing store directory that is not root's alone (state_checks' one rule)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise os_error(exc, f"reading {path}") from exc
    problem = state_checks.store_root_problem(
        name, str(path), st.st_uid, stat.S_IMODE(st.st_mode), stat.S_ISDIR(st.st_mode)
    )
    if problem:
        raise ModelStoreError(problem)


def make_dir(path: Path, mode: int) -> bool:
    """Create path (not its parents' modes) with mode; False when it already existed (then untouched)."""
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        return False
    os.chmod(path, mode)  # mkdir's mode is masked by the umask
    return True


def ensure_layout(layout: StoreLayout) -> None:
    """The root and the store's own directories: created with their modes when absent; when present,
    never chmod-ed or chown-ed, only checked (root's, not writable by others)."""
    missing = []
    probe = layout.root
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for path in reversed(missing):
        make_dir(path, DIR_MODE)
    check_store_dir(layout.root)
    make_dir(layout.versions, DIR_MODE)
    check_store_dir(layout.versions, f"the store's {VERSIONS_DIR} directory")
    make_dir(layout.staging_root, STAGING_ROOT_MODE)
    check_store_dir(layout.staging_root, f"the store's {STAGING_DIR} directory")
    live = layout.live
    if live.exists() and not live.is_symlink():
        raise ModelStoreError(
            f"{live} is a real directory or file, not the symlink this store manages; move it away "
            f"(e.g. to {live}.manual) or remove it, then re-run"
        )


def live_target(layout: StoreLayout) -> Path | None:
    """The version directory the live symlink points at, when it resolves to a directory."""
    if not layout.live.is_symlink():
        return None
    target = layout.live.resolve()
    return target if target.is_dir() else None


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: Path, text: str, mode: int = FILE_MODE) -> None:
    """Write path whole or not at all: a temp file beside it, fsync, rename(2); the temp file is
    removed when any step fails (e.g. ENOSPC), so nothing half-written is left."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def swap_symlink(link: Path, target: Path) -> None:
    """Point link at target (stored relative) with one rename(2): readers never see it missing."""
    relative = os.path.relpath(target, link.parent)
    tmp = link.with_name(f".{link.name}.link-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(relative, tmp)
    os.replace(tmp, link)
    fsync_path(link.parent)


def set_tree_ownership(directory: Path, uid: int | None, gid: int | None) -> None:
    """Directories 0755, files 0644, owned by uid:gid: readable by the service, writable only by the owner."""
    for dirpath, _dirnames, filenames in os.walk(directory):
        for entry in [dirpath] + [os.path.join(dirpath, f) for f in filenames]:
            if uid is not None or gid is not None:
                os.chown(entry, -1 if uid is None else uid, -1 if gid is None else gid, follow_symlinks=False)
            os.chmod(entry, DIR_MODE if entry == dirpath else FILE_MODE)


def fsync_tree(directory: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(directory):
        for name in filenames:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))


def publish(layout: StoreLayout, assembled: Path, commit: str) -> Path:
    """Move an assembled, verified directory into .versions with rename(2), then swap the live symlink."""
    target = layout.new_version_path(commit)
    os.rename(assembled, target)
    fsync_path(layout.versions)
    fsync_path(layout.staging_root)
    swap_symlink(layout.live, target)
    return target


def _inodes(directory: Path | None) -> set[tuple[int, int]]:
    found: set[tuple[int, int]] = set()
    if directory is None:
        return found
    for dirpath, _dirnames, filenames in os.walk(directory):
        for name in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                found.add((st.st_dev, st.st_ino))
    return found


def assemble(
    layout: StoreLayout,
    staging: Path,
    listing: Listing,
    download_uid: int,
    own_inodes: set[tuple[int, int]],
) -> Path:
    """The only root step on what the client wrote: move exactly the listed files out of staging into
    a fresh root-owned directory. Each must be reached through plain directories (no symlink), be a
    regular file with one link written by the download user, or one of our own published inodes (a
    repair's hard-linked seed). Anything else is refused; files not listed stay behind."""
    target = layout.staging_root / f"{PUBLISH_PREFIX}{staging.name}"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(mode=0o700)
    for f in listing.files:
        fd = open_member(staging, f.path)  # verified moments ago; re-checked here without following links
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        ours = (st.st_dev, st.st_ino) in own_inodes
        if not ours and (st.st_uid != download_uid or st.st_nlink != 1):
            raise ModelStoreError(
                f"refused to publish {staging / f.path}: owned by uid {st.st_uid} with {st.st_nlink} links, not a "
                f"file the download user (uid {download_uid}) wrote. Nothing was published; remove {staging} and re-run"
            )
        for parent in reversed(Path(f.path).parents[:-1]):
            make_dir(target / parent, 0o700)
        leaf = f.path.rsplit("/", 1)[-1]
        src_dir, dst_dir = open_parent(staging, f.path), open_parent(target, f.path)
        try:  # renameat(2) between directory fds: no symlink on either side is followed
            os.rename(leaf, leaf, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        finally:
            os.close(src_dir)
            os.close(dst_dir)
    return target  # ownership and modes: set once by the caller, after the manifest is written


def prune_versions(layout: StoreLayout, keep: int, also_keep: Path | None = None) -> list[Path]:
    """Remove this model's old version dirs, keeping the live one, also_keep and the newest up to keep."""
    live = live_target(layout)
    protected = [p for p in (live, also_keep) if p is not None]

    def published_at(p: Path) -> float:
        try:
            return (p / MANIFEST_NAME).stat().st_mtime
        except OSError:
            return 0.0

    others = sorted((p for p in layout.version_dirs() if p not in protected), key=published_at, reverse=True)
    room = max(0, keep - len(protected))
    removed = others[room:]
    for path in removed:
        shutil.rmtree(path)
    return removed


def prune_staging(layout: StoreLayout, keep_commit: str | None = None) -> list[Path]:
    """Remove this model's staging and publish dirs except keep_commit's (left by an abandoned
    revision, or by a run stopped after its publish)."""
    removed = []
    if not layout.staging_root.is_dir():
        return removed
    keep = f"{layout.name}@{keep_commit}"
    for path in layout.staging_root.iterdir():
        name = path.name.removeprefix(PUBLISH_PREFIX)
        if path.is_dir() and not path.is_symlink() and name.startswith(f"{layout.name}@") and name != keep:
            shutil.rmtree(path)
            removed.append(path)
    return removed


def resume_assembly(layout: StoreLayout, staging: Path, uid: int, gid: int) -> list[str]:
    """A run stopped between assemble and publish left the verified files in .publish-<name>@<commit>
    (root's): move them back into staging, given to the download user, so nothing is fetched again."""
    pending = layout.staging_root / f"{PUBLISH_PREFIX}{staging.name}"
    if not pending.is_dir() or pending.is_symlink():
        return []
    moved = []
    for dirpath, _dirnames, filenames in os.walk(pending):
        for name in filenames:
            src = Path(dirpath) / name
            rel = src.relative_to(pending).as_posix()
            if rel == MANIFEST_NAME or (name.startswith(".") and ".tmp-" in name):
                continue
            dst = staging / rel
            parents = [staging / parent for parent in reversed(Path(rel).parents[:-1])]
            for parent in parents:
                if make_dir(parent, 0o755):
                    os.chown(parent, uid, gid)
            if any(p.is_symlink() or not p.is_dir() for p in parents):
                continue  # the client made a link of that directory: the file is fetched again instead
            if dst.is_symlink() or dst.exists():
                if dst.is_dir() and not dst.is_symlink():
                    continue
                dst.unlink()
            os.rename(src, dst)
            os.chown(dst, uid, gid, follow_symlinks=False)
            moved.append(rel)
    shutil.rmtree(pending)
    return moved


# --------------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------------
@dataclass
class Progress:
    state: str = "running"  # running | done | failed
    phase: str = "starting"
    bytes_done: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    write_error: str = ""  # why the progress file could not be written last time (it is not fatal)

    def message(self) -> str:
        if self.bytes_total:
            pct = 100.0 * self.bytes_done / self.bytes_total
            return (
                f"{self.phase}: {human_bytes(self.bytes_done)} of {human_bytes(self.bytes_total)} "
                f"({pct:.0f}%), {self.files_done}/{self.files_total} files"
            )
        return self.phase

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "phase": self.phase,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "files_done": self.files_done,
            "files_total": self.files_total,
            "message": self.message(),
            "updated": round(time.time(), 1),
            # Who writes this file: the poll loop (model_store_progress) ends when that process is gone.
            "pid": os.getpid(),
            "pid_start": process_start(os.getpid()),
        }


def process_start(pid: int) -> str:
    """The start time of pid in clock ticks since boot (field 22 of /proc/PID/stat): with the pid it
    names one process, even after the pid is reused. Empty when unknown."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return data.rsplit(")", 1)[-1].split()[19] if ")" in data else ""


def write_progress(path: Path | None, progress: Progress) -> None:
    """Best effort: a progress file that cannot be written (full or read-only disk) never fails the
    run; the reason is kept, and the poll loop also ends when the writing process is gone."""
    if path is None:
        return
    try:
        write_file_atomic(path, json.dumps(progress.as_dict()) + "\n", FILE_MODE)
        progress.write_error = ""
    except OSError as exc:
        progress.write_error = f"{path}: {exc.strerror or exc}"
        with contextlib.suppress(OSError):
            path.with_name(f".{path.name}.tmp-{os.getpid()}").unlink()


def staging_progress(staging: Path, files: Iterable[RemoteFile]) -> tuple[int, int]:
    """(bytes on disk, complete files) for the listed files in staging."""
    files = list(files)
    done = staged_bytes(staging, files)
    complete = 0
    for f in files:
        with contextlib.suppress(OSError):
            complete += (staging / f.path).stat().st_size == f.size
    return done, complete


# --------------------------------------------------------------------------------------------------
# The request (the module's options) and the result
# --------------------------------------------------------------------------------------------------
CLIENT_LOG_TAIL = 3000  # characters of the client's output quoted in an error
LEGACY_BEFORE = (1, 38)  # modelscope < 1.38 is the legacy generation (docs/facts.md)


@dataclass(frozen=True)
class Request:
    """What the model_store module was asked: its options exactly as AnsibleModule checked them
    (``Request(**module.params, check_mode=module.check_mode)``). The defaults live in the module's
    argument_spec (and its DOCUMENTATION), nowhere else.

    Construction checks what the argument_spec cannot: the model id, revision and store root with the
    one validator of the desired state (``state_checks.check``, so the module refuses exactly what
    preflight refuses) and the numeric bounds. A refusal raises ModelStoreError naming the option.
    """

    model_id: str
    revision: str
    endpoint: str
    root: str
    name: str | None
    modelscope_bin: str
    owner: str | None
    group: str | None
    rehash: bool
    timeout: int
    progress_file: str | None
    retries: int
    keep_versions: int
    reserve_bytes: int
    ca_bundle: str | None
    # The config.json facts preflight planned from (catalog entry or gpubox_model_config); a download
    # whose config.json disagrees is never published.
    expected_config: dict[str, Any] | None
    # The unprivileged user the client runs as (never root) and whether http:// endpoints are allowed.
    download_user: str
    allow_http: bool
    check_mode: bool = False

    def __post_init__(self) -> None:
        problems = []
        for option, fact in (
            ("model_id", "gpubox_model_id"),
            ("revision", "gpubox_model_revision"),
            ("root", "gpubox_model_root"),
        ):
            value, error = state_checks.check(fact, getattr(self, option))
            if error:
                problems.append(f"{option}: {error}")
            else:
                object.__setattr__(self, option, value)  # the normalized value (root: normpath)
        bounds = (("retries", 0), ("reserve_bytes", 0), ("keep_versions", 1), ("timeout", 1))
        problems += [
            f"{option} must be an integer >= {low}, got {getattr(self, option)!r}"
            for option, low in bounds
            if not isinstance(getattr(self, option), int)
            or isinstance(getattr(self, option), bool)
            or getattr(self, option) < low
        ]
        scheme = urllib.parse.urlsplit(self.endpoint).scheme if isinstance(self.endpoint, str) else ""
        if scheme == "http" and not self.allow_http:
            problems.append(
                f"endpoint {self.endpoint!r} is plain http: anyone on the path could change what is downloaded. "
                "Use https, or for a LAN mirror set model_store_allow_http: true (module option allow_http; "
                "every live file is then re-hashed against the manifest on each run)"
            )
        elif scheme not in ("http", "https"):
            problems.append(f"endpoint must be an https URL, got {self.endpoint!r}")
        elif scheme == "http":
            object.__setattr__(self, "rehash", True)  # http only with the full manifest check
        if not isinstance(self.download_user, str) or not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", self.download_user):
            problems.append(
                f"download_user must be the name of an unprivileged system user (model_store_download_user), "
                f"got {self.download_user!r}"
            )
        elif self.download_user == "root":
            problems.append(
                "download_user must not be root: the client reads what the hub sends (model_store_download_user)"
            )
        if problems:
            raise ModelStoreError("; ".join(problems))

    @property
    def model_name(self) -> str:
        return self.name or split_model_id(self.model_id)[1]


@dataclass
class StoreResult:
    changed: bool
    path: str
    commit: str
    revision: str
    total_bytes: int
    files: int
    version_path: str = ""
    manifest_sha256: str = ""
    downloaded: bool = False
    attempts: int = 0
    client_version: str = ""
    sandbox: str = ""
    refused_files: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    removed_versions: list[str] = field(default_factory=list)
    msg: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# --------------------------------------------------------------------------------------------------
# The modelscope client
# --------------------------------------------------------------------------------------------------
def client_argv(req: Request, staging: Path) -> list[str]:
    """The CLI call; the legacy-style flags are accepted by both client generations. No secrets here."""
    return [
        req.modelscope_bin,
        "download",
        "--model",
        req.model_id,
        "--revision",
        req.revision,
        "--local_dir",
        str(staging),
    ]


PASSED_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "LANG", "TZ")


def client_env(req: Request, staging: Path) -> dict[str, str]:
    """The whole environment of the CLI (nothing else of the module's is inherited). Both client
    generations are served: >= 1.38 reads MODELSCOPE_ENDPOINT (and then ignores MODELSCOPE_DOMAIN);
    <= 1.37 reads only MODELSCOPE_DOMAIN and always uses https. Its HOME and cache are inside its
    staging directory, the only place it may write."""
    env = {name: os.environ[name] for name in PASSED_ENV if name in os.environ}
    # The client's download tuning (MODELSCOPE_DOWNLOAD_MAX_RETRIES, ...): settings, never secrets.
    env |= {name: value for name, value in os.environ.items() if name.startswith("MODELSCOPE_DOWNLOAD_")}
    env["PATH"] = f"{Path(req.modelscope_bin).parent}:/usr/local/bin:/usr/bin:/bin"
    env["HOME"] = str(staging / CLIENT_DIR / "home")
    env["MODELSCOPE_CACHE"] = str(staging / CLIENT_DIR / "cache")
    env["MODELSCOPE_ENDPOINT"] = req.endpoint.rstrip("/")
    url = urllib.parse.urlsplit(req.endpoint)
    if url.scheme == "https":
        env["MODELSCOPE_DOMAIN"] = url.netloc
    if req.ca_bundle:
        env["REQUESTS_CA_BUNDLE"] = req.ca_bundle
        env["SSL_CERT_FILE"] = req.ca_bundle
    env["TQDM_DISABLE"] = "1"  # no progress bars in the captured log; we report progress ourselves
    env["PYTHONUNBUFFERED"] = "1"
    return env


def systemd_running() -> bool:
    """systemd is PID 1 here (sd_booted's test) and systemd-run is installed: sandbox the client."""
    return os.path.isdir("/run/systemd/system") and os.access(SYSTEMD_RUN, os.X_OK)


def client_unit(layout: StoreLayout) -> str:
    """One transient unit name per model: a run stops what a killed earlier run left behind."""
    return f"gpubox-model-fetch-{re.sub(r'[^A-Za-z0-9_.-]', '_', layout.name)}.service"


def sandbox_properties(staging: Path, user: str, runtime_max: int) -> list[str]:
    """The transient unit of the client: its user, one writable directory, nothing else."""
    return [
        f"User={user}",  # and its primary group
        f"WorkingDirectory={staging}",
        "UMask=0022",
        "ProtectSystem=strict",
        f"ReadWritePaths={staging}",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "PrivateDevices=yes",
        # PrivateDevices keeps the host's /dev/shm (world-writable): a private one instead, so a hostile
        # listing's /dev/shm/... lands nowhere the box can see (found by molecule/crash's hostile hub).
        "TemporaryFileSystem=/dev/shm:mode=1777",
        "PrivateIPC=yes",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
        "RestrictSUIDSGID=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectKernelLogs=yes",
        "ProtectControlGroups=yes",
        "ProtectClock=yes",
        "ProtectHostname=yes",
        "LockPersonality=yes",
        "RestrictRealtime=yes",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "SystemCallFilter=@system-service",
        "SystemCallFilter=~@privileged @resources",
        "SystemCallErrorNumber=EPERM",
        "SystemCallArchitectures=native",
        "RestrictNamespaces=yes",
        "ProtectProc=invisible",
        "ProcSubset=pid",
        "RemoveIPC=yes",
        "PrivateUsers=yes",
        "PrivateMounts=yes",
        "AmbientCapabilities=",
        "DevicePolicy=closed",
        "KeyringMode=private",
        # Not MemoryDenyWriteExecute: Python's ctypes callbacks may need writable+executable memory.
        # Not PrivateNetwork/IPAddressDeny: it downloads from the hub (or a LAN mirror) over the network.
        "KillMode=control-group",
        f"RuntimeMaxSec={max(1, runtime_max)}",
    ]


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    """In the client (fallback path): SIGKILL when the module that started it dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ClientRun:
    """One run of the client as the download user, sandboxed by systemd where it runs, and always
    stopped (with everything it started) by stop(): on success, failure, timeout or SIGTERM."""

    def __init__(self, req: Request, layout: StoreLayout, staging: Path, log: Any, runtime_max: int) -> None:
        self.argv = client_argv(req, staging)
        self.env = client_env(req, staging)
        self.unit = client_unit(layout)
        self.user = req.download_user
        self.uid, self.gid = _download_ids(req)
        self.staging = staging
        self.log = log
        self.runtime_max = runtime_max
        self.sandbox = "systemd" if systemd_running() else "user"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if self.sandbox == "systemd":
            self._systemctl("stop", self.unit)  # left running by an earlier run that was killed
            self._systemctl("reset-failed", self.unit)
            argv = [SYSTEMD_RUN, "--quiet", "--collect", "--wait", "--pipe", f"--unit={self.unit}"]
            argv += [f"--property={p}" for p in sandbox_properties(self.staging, self.user, self.runtime_max)]
            argv += [f"--setenv={k}={v}" for k, v in sorted(self.env.items())]
            self.proc = subprocess.Popen(
                [*argv, "--", *self.argv], stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT
            )
            return
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=str(self.staging),
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            umask=0o022,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def poll(self, timeout: float) -> int | None:
        if self.proc is None:
            raise AssertionError("poll() before start()")
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """Stop the client and anything it started; a no-op once it has ended on its own."""
        if self.sandbox == "systemd":
            self._systemctl("stop", self.unit)  # the whole cgroup, SIGTERM then SIGKILL
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM) if self.sandbox == "user" else self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL) if self.sandbox == "user" else self.proc.kill()
                self.proc.wait()
        elif self.sandbox == "user":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # anything it left in its process group

    @staticmethod
    def _systemctl(*args: str) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([SYSTEMCTL, *args], capture_output=True, timeout=120, check=False)


def client_version(modelscope_bin: str) -> tuple[int, ...] | None:
    """The modelscope version installed beside the CLI (same environment), None when unknown."""
    python = Path(modelscope_bin).parent / "python"
    code = "import importlib.metadata as m; print(m.version('modelscope'))"
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", out.stdout.strip())
    return tuple(int(x) for x in found.groups() if x is not None) if found else None


def check_client(req: Request) -> str:
    """Refuse a combination the client cannot do, before anything is downloaded."""
    if not os.access(req.modelscope_bin, os.X_OK):
        raise ModelStoreError(
            f"modelscope_bin {req.modelscope_bin!r} is not an executable; install the serving environment "
            "first (python_env, into gpubox_env_prefix) or point modelscope_bin at its bin/modelscope"
        )
    version = client_version(req.modelscope_bin)
    if version and version < LEGACY_BEFORE and urllib.parse.urlsplit(req.endpoint).scheme != "https":
        raise ModelStoreError(
            f"modelscope {'.'.join(map(str, version))} (before 1.38) only speaks https, but endpoint is "
            f"{req.endpoint!r}; use an https endpoint or modelscope >= 1.38"
        )
    return ".".join(map(str, version)) if version else "unknown"


def client_errors(path: Path, limit: int = 20) -> str:
    """The error lines of the client's last run (its log also holds banners and info lines)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    last_run = text.rsplit("\n=== ", 1)[-1]
    lines = [ln.strip() for ln in last_run.splitlines() if re.search(r"error|fail|mismatch|denied|refused", ln, re.I)]
    return "\n".join(lines[-limit:])[-CLIENT_LOG_TAIL:]


@contextlib.contextmanager
def store_lock(path: Path) -> Iterator[None]:
    """One run per model at a time on this host (a second run waits for the first)."""
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def run_client(
    req: Request,
    layout: StoreLayout,
    staging: Path,
    listing: Listing,
    deadline: float,
    progress: Progress,
    progress_path: Path | None,
    log_path: Path,
    result: StoreResult,
) -> int:
    """Run the modelscope CLI once as the download user, updating progress every second; stop it at
    the deadline. It never outlives this call: stopped in ``finally`` on any exit (an error, a
    SIGTERM turned into an exception, the deadline). A Popen of its own, not run_command: the run takes
    hours, is watched every second (progress file) and stopped as a whole."""
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(client_argv(req, staging))}\n".encode())
        log.flush()
        run = ClientRun(req, layout, staging, log, int(deadline - time.monotonic()) + 1)
        result.sandbox = run.sandbox
        try:
            try:
                run.start()
            except OSError as exc:
                raise ModelStoreError(
                    f"cannot run modelscope_bin {req.modelscope_bin!r} as {req.download_user} ({exc}); point it "
                    "at the serving environment's modelscope CLI, readable and executable by model_store_download_user"
                ) from exc
            while True:
                rc = run.poll(1.0)
                if rc is not None:
                    return rc
                progress.bytes_done, progress.files_done = staging_progress(staging, listing.files)
                write_progress(progress_path, progress)
                if time.monotonic() > deadline:
                    raise ModelStoreError(
                        f"the download of {req.model_id}@{req.revision} did not finish within timeout "
                        f"{req.timeout}s; {staging} is kept and a re-run resumes from it (or raise the timeout)"
                    )
        finally:
            run.stop()


# --------------------------------------------------------------------------------------------------
# The store: converge the live path to the listing
# --------------------------------------------------------------------------------------------------
def _ids(req: Request) -> tuple[int, int]:
    """Owner and group of published files: root's when not given, never left as the download user's."""
    import grp
    import pwd

    try:
        uid = pwd.getpwnam(req.owner).pw_uid if req.owner else 0
        gid = grp.getgrnam(req.group).gr_gid if req.group else 0
    except KeyError as exc:
        raise ModelStoreError(f"owner {req.owner!r} or group {req.group!r} does not exist on this host") from exc
    if req.owner and req.owner == req.download_user:
        raise ModelStoreError(
            f"owner {req.owner!r} is the download user: published files must not be writable by the client "
            "(model_store_owner and model_store_download_user must differ)"
        )
    return uid, gid


def _download_ids(req: Request) -> tuple[int, int]:
    import pwd

    try:
        entry = pwd.getpwnam(req.download_user)
    except KeyError as exc:
        raise ModelStoreError(
            f"download_user {req.download_user!r} does not exist on this host: the model_store role creates "
            "model_store_download_user; create it (a system user without a login shell) or choose another"
        ) from exc
    if entry.pw_uid == 0:
        raise ModelStoreError(f"download_user {req.download_user!r} has uid 0: choose an unprivileged user")
    return entry.pw_uid, entry.pw_gid


def _discard(staging: Path, problems: list[FileProblem]) -> None:
    """Delete what failed verification so the next client run fetches it again, without following a
    symlink: a file (or symlink) is unlinked in its parent found by open_parent; a path whose parent
    is not a plain directory loses its whole top-level entry (rmtree never follows links)."""
    for p in problems:
        if p.kind == "missing" and not p.actual:
            continue
        try:
            parent = open_parent(staging, p.path)
        except NotInside:
            top = staging / p.path.split("/")[0]
            if top.is_symlink() or not top.is_dir():
                top.unlink(missing_ok=True)
            else:
                shutil.rmtree(top)
            continue
        except FileNotFoundError:
            continue
        try:
            leaf = p.path.rsplit("/", 1)[-1]
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.lstat(leaf, dir_fd=parent).st_mode):
                    # rmtree(dir_fd=) needs Python 3.11 (the box may run 3.10): the same directory by its fd
                    shutil.rmtree(f"/proc/self/fd/{parent}/{leaf}")
                else:
                    os.unlink(leaf, dir_fd=parent)
        finally:
            os.close(parent)


def _give_to(path: Path, uid: int, gid: int) -> None:
    """chown path and everything under it to uid:gid without following symlinks (lchown)."""
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, uid, gid, follow_symlinks=False)


def _seed_from(live: Path, staging: Path, listing: Listing, bad: set[str]) -> None:
    """Into a staging dir this run just created (nothing of the client's in it yet): hard-link the
    live files that passed a re-hash, so a repair fetches only the bad ones. The links stay root's
    inodes of the live version (assemble accepts exactly those)."""
    for f in listing.files:
        src, dst = live / f.path, staging / f.path
        if f.path in bad:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            return  # not possible here (e.g. another filesystem): the client fetches everything


def _check_config(req: Request, staging: Path, listing: Listing) -> None:
    """Refuse to publish a model whose config.json is not the model preflight planned the memory for."""
    if req.expected_config is None:
        return
    try:
        fd = open_member(staging, "config.json")
        with os.fdopen(fd, "rb") as fh:
            config = json.loads(fh.read(1 << 20).decode("utf-8"))
    except (OSError, ValueError, NotInside) as exc:
        raise ModelStoreError(f"{req.model_id}@{listing.commit} has no readable config.json ({exc})") from exc
    problems = config_mismatches(req.expected_config, config)
    if problems:
        raise ModelStoreError(
            f"{req.model_id}@{listing.commit} is not the model preflight planned from (gpubox_model_id / "
            f"gpubox_model_config): {'; '.join(problems)}. Nothing was published; the live path is unchanged. "
            "Fix: correct the catalog entry or gpubox_model_config, or pin gpubox_model_revision."
        )


_OS_FIXES = {
    errno.ENOSPC: "free space on that file system or point gpubox_model_root at a larger one",
    errno.EDQUOT: "raise the disk quota there or point gpubox_model_root at another file system",
    errno.EROFS: "the file system is read-only: remount it read-write or point gpubox_model_root elsewhere",
    errno.EACCES: "check the ownership and mode of that path (the store runs as root, the client as "
    "model_store_download_user) and any mandatory access control",
    errno.EPERM: "check the ownership, attributes (chattr) and mount options of that path",
    errno.EIO: "the disk reported an I/O error: check it (dmesg, smartctl) before re-running",
}


def os_error(exc: OSError, doing: str) -> ModelStoreError:
    """An OSError as a failure that names the path, the cause and what to do."""
    where = exc.filename if exc.filename is not None else "?"
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    name = errno.errorcode.get(exc.errno or 0, "error")
    fix = _OS_FIXES.get(exc.errno or 0, "fix the cause and re-run")
    return ModelStoreError(
        f"{doing} failed at {where}: {exc.strerror or exc} ({name}). {fix}. The live model is unchanged; "
        "a re-run resumes from what was downloaded."
    )


class Stopped(ModelStoreError):
    """The module was asked to stop (SIGTERM): the client is stopped with it."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    def handler(signum: int, _frame: Any) -> None:
        raise Stopped(f"stopped by signal {signum}; the live model is unchanged and a re-run resumes")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: nothing to install
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_model_store(req: Request, free: Callable[[Path], int] = free_bytes) -> StoreResult:
    """The module's work, without Ansible: raises ModelStoreError on any failure (an OSError
    anywhere becomes one naming the path and the fix); the progress file then says "failed"."""
    started = time.monotonic()
    deadline = started + req.timeout
    layout = StoreLayout(Path(req.root), req.model_name)
    progress_path = Path(req.progress_file) if req.progress_file else None
    progress = Progress(phase="reading the hub listing")
    write_progress(progress_path, progress)
    try:
        with stop_on_sigterm():
            try:
                result = _run(req, layout, deadline, free, progress, progress_path)
            except OSError as exc:
                raise os_error(exc, progress.phase) from exc
    except ModelStoreError as exc:
        progress.state, progress.phase = "failed", f"failed: {str(exc)[:300]}"
        write_progress(progress_path, progress)
        raise
    progress.state, progress.phase = "done", result.msg
    progress.bytes_done = progress.bytes_total
    progress.files_done = progress.files_total
    write_progress(progress_path, progress)
    return result


def _run(
    req: Request,
    layout: StoreLayout,
    deadline: float,
    free: Callable[[Path], int],
    progress: Progress,
    progress_path: Path | None,
) -> StoreResult:
    listing = fetch_listing(
        req.endpoint, req.model_id, req.revision, timeout=min(120.0, float(req.timeout)), cafile=req.ca_bundle
    )
    progress.bytes_total, progress.files_total = listing.total_size, len(listing.files)
    result = StoreResult(
        changed=False,
        path=str(layout.live),
        commit=listing.commit,
        revision=req.revision,
        total_bytes=listing.total_size,
        files=len(listing.files),
    )
    if not req.check_mode:
        ensure_layout(layout)
        with store_lock(layout.lock_path):
            return _converge(req, layout, listing, result, deadline, free, progress, progress_path)
    if layout.live.exists() and not layout.live.is_symlink():
        raise ModelStoreError(f"{layout.live} is a real directory, not the symlink this store manages")
    return _converge(req, layout, listing, result, deadline, free, progress, progress_path)


def _converge(
    req: Request,
    layout: StoreLayout,
    listing: Listing,
    result: StoreResult,
    deadline: float,
    free: Callable[[Path], int],
    progress: Progress,
    progress_path: Path | None,
) -> StoreResult:
    # 1. Is the live version already this commit, intact?
    live = live_target(layout)
    live_manifest = read_manifest(live) if live else None
    bad_live: list[FileProblem] = []
    if live and manifest_matches(live_manifest, listing):
        progress.phase = "verifying the live model" + (" (sha256)" if req.rehash else " (sizes)")
        write_progress(progress_path, progress)
        bad_live = verify_dir(live, listing.files, rehash=req.rehash)
        if not bad_live:
            result.version_path, result.manifest_sha256 = str(live), live_manifest["manifest_sha256"]
            result.msg = f"{req.model_id}@{listing.commit} is already live at {layout.live}"
            if not req.check_mode:
                prune_staging(layout)  # what a run stopped after its publish left behind
            return result
        result.repaired = [p.describe() for p in bad_live]

    # 2. Is an earlier, intact copy of this commit kept in .versions (a rollback)?
    for candidate in layout.versions_for(listing.commit):
        if candidate == live or not manifest_matches(read_manifest(candidate), listing):
            continue
        if verify_dir(candidate, listing.files, rehash=True):
            continue
        result.changed = True
        if not req.check_mode:
            swap_symlink(layout.live, candidate)
            result.removed_versions = [str(p) for p in prune_versions(layout, req.keep_versions, also_keep=live)]
        result.version_path = str(candidate)
        result.manifest_sha256 = read_manifest(candidate)["manifest_sha256"]
        result.msg = f"switched {layout.live} to the kept copy {candidate.name}"
        return result

    # 3. Download into staging (kept between runs), verify, publish.
    staging = layout.staging(listing.commit)
    staged = staged_bytes(staging, listing.files) if staging.is_dir() else 0
    check_disk_space(layout.root, listing.total_size, staged, free(layout.root), req.reserve_bytes)
    result.changed = True
    if req.check_mode:
        result.msg = f"would download {req.model_id}@{listing.commit} into {staging} and publish it"
        return result
    result.client_version = check_client(req)
    uid, gid = _ids(req)
    dl_uid, dl_gid = _download_ids(req)
    fresh = make_dir(staging, 0o700)
    if fresh and live and bad_live and req.rehash:
        _seed_from(live, staging, listing, {p.path for p in bad_live})
    if fresh or staging.lstat().st_uid != dl_uid:  # new, or left by a store that ran the client as root
        _give_to(staging, dl_uid, dl_gid)
    resume_assembly(layout, staging, dl_uid, dl_gid)
    log_path = layout.staging_root / f"client-{layout.name}@{listing.commit}.log"
    problems: list[FileProblem] = []
    rc = 0
    for attempt in range(1, req.retries + 2):
        result.attempts = attempt
        progress.phase = f"downloading (attempt {attempt})"
        rc = run_client(req, layout, staging, listing, deadline, progress, progress_path, log_path, result)
        result.downloaded = True
        progress.phase = "verifying sha256"
        write_progress(progress_path, progress)
        problems = verify_dir(staging, listing.files, rehash=True)
        if rc == 0 and not problems:
            break
        _discard(staging, problems)  # a file that failed is deleted so the next client run fetches it again
    else:
        detail = "; ".join(p.describe() for p in problems) or "every file verified but the client failed"
        raise IntegrityError(
            f"{req.model_id}@{req.revision} ({listing.commit}) was not published after "
            f"{result.attempts} client run(s): {detail}. The live path {layout.live} is unchanged; "
            f"{staging} is kept for resume. "
            f"modelscope exited {rc}; its log is {log_path}; its errors:\n{client_errors(log_path)}",
            problems,
        )
    _check_config(req, staging, listing)
    # What the client wrote besides the listed files is never published (its bookkeeping is expected;
    # anything else is reported: a hub's second listing named it).
    result.refused_files = [p for p in extra_files(staging, listing.files) if p.split("/")[0] not in CLIENT_BOOKKEEPING]
    progress.phase = "publishing"
    write_progress(progress_path, progress)
    assembled = assemble(layout, staging, listing, dl_uid, _inodes(live))
    manifest = write_manifest(assembled, listing, req.endpoint)
    set_tree_ownership(assembled, uid, gid)
    fsync_tree(assembled)
    version = publish(layout, assembled, listing.commit)
    shutil.rmtree(staging)  # only what was not published is left in it
    log_path.unlink(missing_ok=True)
    result.version_path, result.manifest_sha256 = str(version), manifest["manifest_sha256"]
    result.removed_versions = [str(p) for p in prune_versions(layout, req.keep_versions, also_keep=live)]
    prune_staging(layout)
    result.msg = f"published {req.model_id}@{listing.commit} at {layout.live} -> {version.name}"
    return result
