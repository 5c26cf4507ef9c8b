"""The store's layout on disk and its atomic publish: the only code that writes under the store root.

On-disk layout under the store root (default /data/models):

    <root>/<name>                      symlink -> .versions/<name>@<commit>   (the live path)
    <root>/.versions/<name>@<commit>/  a complete, verified model + .gpubox-manifest.json (root's)
    <root>/.staging/                   root's, 0711: the download user may pass, not list or create
    <root>/.staging/<name>@<commit>/   the download user's, 0700: download in progress (kept for resume)
    <root>/.staging/.publish-<name>@<commit>/  root's, 0700: the next version while it is assembled

Trust boundary: <commit> is a checked value (hub_listing.is_commit) before it names a directory, and
every listed path is a checked path. Least privilege: the download user owns only the staging
directory and the files it wrote there; it never owns, nor can write, an inode that is or was live
(a repair's seed is a hard link that stays root's and read-only to it, and is never given away).
Publishing copies each listed file's bytes as root into a new root-owned inode while hashing them,
so what is published is exactly what was hashed, whatever a process of the download user still does
to the staged file; the live path only ever changes by rename(2) of a new symlink over the old one.

Runs on the managed host (Python >= 3.10).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks
from ansible_collections.gpubox.gpubox.plugins.module_utils.hub_listing import (
    CLIENT_DIR,
    PARTIAL_SUFFIX,
    Listing,
    is_commit,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_errors import (
    DiskSpaceError,
    ModelStoreError,
    os_error,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_manifest import (
    MANIFEST_NAME,
    MANIFEST_SCHEMA,
    FileProblem,
    NotInside,
    RemoteFile,
    manifest_digest,
    open_member,
    open_parent,
)

VERSIONS_DIR = ".versions"
STAGING_DIR = ".staging"
PUBLISH_PREFIX = ".publish-"
DIR_MODE = 0o755
FILE_MODE = 0o644
STAGING_ROOT_MODE = 0o711
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_COPY_BLOCK = 4 << 20


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


def check_disk_space(root: Path, total: int, staged: int, free: int, reserve: int = 0, copy: int = 0) -> int:
    """Raise DiskSpaceError unless free >= total - staged + copy + reserve; return the bytes still to
    fetch. copy: the largest file, which exists twice for a moment while publish copies it as root."""
    needed = max(0, total - staged)
    shortfall = needed + copy + reserve - free
    if shortfall > 0:
        raise DiskSpaceError(
            f"gpubox_model_root {root} has {human_bytes(free)} free but the download needs "
            f"{human_bytes(needed)} more (listing {human_bytes(total)}, {human_bytes(staged)} already staged)"
            + (f" plus {human_bytes(copy)} while the largest file is copied into place" if copy else "")
            + (f" plus a reserve of {human_bytes(reserve)}" if reserve else "")
            + f": short by {human_bytes(shortfall)} ({shortfall} bytes). Free space there or point "
            "gpubox_model_root at a larger filesystem."
        )
    return needed


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
        return self.staging_root / f"{self.name}@{_store_id(commit)}"

    @property
    def lock_path(self) -> Path:
        return self.staging_root / f"{self.name}.lock"

    def version_dirs(self) -> list[Path]:
        if not self.versions.is_dir():
            return []
        prefix = f"{self.name}@"
        return sorted(p for p in self.versions.iterdir() if p.name.startswith(prefix) and p.is_dir())

    def versions_for(self, commit: str) -> list[Path]:
        base = f"{self.name}@{_store_id(commit)}"
        return [p for p in self.version_dirs() if p.name == base or p.name.startswith(base + ".")]

    def new_version_path(self, commit: str) -> Path:
        """The first free <name>@<commit>[.N] directory name (N > 1 when re-publishing a commit)."""
        base = self.versions / f"{self.name}@{_store_id(commit)}"
        candidate, n = base, 1
        while candidate.exists() or candidate.is_symlink():
            n += 1
            candidate = base.with_name(f"{base.name}.{n}")
        return candidate


def _store_id(commit: str) -> str:
    """A commit as a directory name: only a checked commit id (never a path)."""
    if not is_commit(commit):
        raise ModelStoreError(f"{commit!r} is not a commit id: it never names a directory of the store")
    return commit


# Linux follows at most 40 symlinks in one path lookup (path_resolution(7)); a longer chain is a loop.
MAX_LINKS = 40
_GROUP_OTHER_WRITE = 0o022


def _link_problem(name: str, root: Path, link: Path, st: os.stat_result, parent: os.stat_result) -> str | None:
    """A symlink above (or at) the store root may be followed only when no user but root can change it:
    the link is root's and lies in a directory that is root's and not writable by group or others (sticky
    or not: whoever may write there could have made the link)."""
    if st.st_uid == 0 and parent.st_uid == 0 and not parent.st_mode & _GROUP_OTHER_WRITE:
        return None
    who = (
        f"the link is owned by uid {st.st_uid}"
        if st.st_uid != 0
        else f"its directory {link.parent} is owned by uid {parent.st_uid} with mode {stat.S_IMODE(parent.st_mode):04o}"
    )
    return (
        f"{name} {root} is reached through the symlink {link} and {who}: a user other than root could point it "
        "elsewhere and choose where the next run writes the store. Fix: set "
        f"{name} to the real path ({os.path.realpath(root)}) once its every parent is root's and not writable by "
        f"group or others, or make {link} and its directory root's (`chown -h root:root {link}; chown root:root "
        f"{link.parent}; chmod go-w {link.parent}`)"
    )


def root_path_problems(root: Path, name: str = "gpubox_model_root") -> list[str]:
    """What lets a user other than root swap the store at root, checked by the real path, one component at a
    time (lstat, never following a link unchecked): every existing directory above the root is root's and
    not writable by others (state_checks' rule, sticky allowed); a symlink on the way (the root itself
    included) is followed only when root's in a root-owned directory nobody else may write, and the walk
    goes on from its target. What does not exist yet is created by the store under the last checked
    directory. [] when the path is safe; the first problem otherwise (what lies beyond it is unknown)."""
    real = Path("/")
    try:
        here = os.lstat(real)
    except OSError as exc:
        return [f"{name} {root}: / cannot be read ({exc.strerror})"]
    problem = state_checks.store_ancestor_problem(name, str(root), "/", here.st_uid, stat.S_IMODE(here.st_mode))
    if problem:
        return [problem]
    pending, links = list(root.parts[1:]), 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":  # real holds no link: its parent is the real parent, checked on the way down
            real = real.parent
            here = os.lstat(real)
            continue
        candidate = real / part
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            return []
        except OSError as exc:
            return [f"{name} {root}: {candidate} cannot be read ({exc.strerror}); check its parent's permissions"]
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if problem := _link_problem(name, root, candidate, st, here):
                return [problem]
            if links > MAX_LINKS:
                return [f"{name} {root} goes through more than {MAX_LINKS} symlinks (a loop): set it to a real path"]
            target = os.readlink(candidate)
            if target.startswith("/"):
                real, here = Path("/"), os.lstat("/")
            pending = [p for p in target.split("/") if p] + pending
            continue
        if pending:  # a directory above the root (the root itself is check_store_dir's)
            if not stat.S_ISDIR(st.st_mode):
                return [f"{name} {root} lies under {candidate}, which is not a directory: choose another path"]
            if problem := state_checks.store_ancestor_problem(
                name, str(root), str(candidate), st.st_uid, stat.S_IMODE(st.st_mode)
            ):
                return [problem]
        real, here = candidate, st
    return []


def check_ancestors(root: Path) -> None:
    """Refuse a store root that another user could swap (root_path_problems), before anything is created."""
    problems = root_path_problems(root)
    if problems:
        raise ModelStoreError(problems[0])


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
    check_ancestors(layout.root)
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
    """The only root step on what the client wrote: exactly the listed files, out of staging, into a
    fresh root-owned directory. Each must be reached through plain directories (no symlink) and be a
    regular file with one link written by the download user, or one of our own published inodes (a
    repair's seed, root's). A seed is moved by renameat(2) (it is already root's); a file of the
    download user's is copied as root into a new inode while it is hashed, and refused unless size and
    sha256 are the listing's: a process that still writes the staged file changes nothing published.
    Anything else is refused; files not listed stay behind."""
    target = layout.staging_root / f"{PUBLISH_PREFIX}{staging.name}"
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)
    target.mkdir(mode=0o700)
    for f in listing.files:
        src = open_member(staging, f.path)  # verified moments ago; re-checked here without following links
        try:
            st = os.fstat(src)
            ours = (st.st_dev, st.st_ino) in own_inodes
            if not ours and (st.st_uid != download_uid or st.st_nlink != 1):
                raise ModelStoreError(
                    f"refused to publish {staging / f.path}: owned by uid {st.st_uid} with {st.st_nlink} links, not "
                    f"a file the download user (uid {download_uid}) wrote. Nothing was published; remove {staging} "
                    "and re-run"
                )
            for parent in reversed(Path(f.path).parents[:-1]):
                make_dir(target / parent, 0o700)
            leaf = f.path.rsplit("/", 1)[-1]
            src_dir, dst_dir = open_parent(staging, f.path), open_parent(target, f.path)
            try:
                if ours:  # renameat(2) between directory fds: no symlink on either side is followed
                    os.rename(leaf, leaf, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
                else:  # the staged file goes once it is copied: the peak is the model plus one file
                    _copy_checked(src, dst_dir, leaf, f, staging)
                    os.unlink(leaf, dir_fd=src_dir)
            finally:
                os.close(src_dir)
                os.close(dst_dir)
        finally:
            os.close(src)
    return target  # ownership and modes: set once by the caller, after the manifest is written


def _copy_checked(src: int, dst_dir: int, leaf: str, f: RemoteFile, staging: Path) -> None:
    """Copy src into a new file leaf (root's, 0600) under dst_dir, hashing what is written; unlink it
    and refuse unless it is exactly f's size and sha256."""
    out = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dst_dir)
    digest, size = hashlib.sha256(), 0
    try:
        os.lseek(src, 0, os.SEEK_SET)
        while size <= f.size and (block := os.read(src, _COPY_BLOCK)):
            digest.update(block)
            size += len(block)
            view = memoryview(block)
            while view:
                view = view[os.write(out, view) :]
        os.fsync(out)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(leaf, dir_fd=dst_dir)
        raise
    os.close(out)
    if size != f.size or digest.hexdigest() != f.sha256:
        os.unlink(leaf, dir_fd=dst_dir)
        raise ModelStoreError(
            f"refused to publish {staging / f.path}: it changed after it was verified (now {size} bytes, sha256 "
            f"{digest.hexdigest()}; listed {f.size} bytes, sha256 {f.sha256}). Something still writes the staging "
            f"directory: nothing was published. Remove {staging} and re-run"
        )


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
            if os.lstat(dst).st_nlink == 1:  # a repair's seed shares a live inode: it stays root's
                os.chown(dst, uid, gid, follow_symlinks=False)
            moved.append(rel)
    shutil.rmtree(pending)
    return moved


def discard(staging: Path, problems: list[FileProblem]) -> None:
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


def give_to(path: Path, uid: int, gid: int) -> None:
    """Give a staging directory to the download user: its directories, and its files that have one link,
    without following symlinks (lchown). A file with other links is left as it is: it may share an inode
    with a published version (a repair's seed), which the download user must never own."""
    for dirpath, dirnames, filenames in os.walk(path):
        os.chown(dirpath, uid, gid, follow_symlinks=False)
        for name in dirnames + filenames:
            entry = os.path.join(dirpath, name)
            st = os.lstat(entry)
            if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode) or st.st_nlink != 1:
                continue  # a directory is chowned when walked; a symlink or shared inode never
            os.chown(entry, uid, gid, follow_symlinks=False)


def seed_from(live: Path, staging: Path, listing: Listing, bad: set[str]) -> None:
    """Into a staging dir this run just created (nothing of the client's in it yet): hard-link the live
    files that passed a re-hash, so a repair fetches only the bad ones. The links stay root's inodes of
    the live version, 0644: the client may read or replace them (its directory), never write them, and
    give_to leaves them root's; assemble accepts exactly those inodes."""
    for f in listing.files:
        if f.path in bad:
            continue
        src, dst = live / f.path, staging / f.path
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            return  # not possible here (e.g. another filesystem): the client fetches everything
