"""Verified model store: the work of the gpubox.gpubox.model_store module, without Ansible.

The module is a thin wrapper: it declares its options once (``argument_spec``) and passes
``module.params`` whole to :class:`Request`, then calls :func:`run_model_store`. Everything else
lives here: the hub listing, verification, manifest, disk check, the modelscope client run and
the atomic publish. Shared by the module and tests/unit/test_modelstore.py.

On-disk layout under the store root (default /data/models):

    <root>/<name>                      symlink -> .versions/<name>@<commit>   (the live path)
    <root>/.versions/<name>@<commit>/  a complete, verified model + .gpubox-manifest.json
    <root>/.staging/<name>@<commit>/   download in progress (kept between runs for resume)

A version directory is only ever created by rename(2) of a fully verified staging directory, and
the live path only ever changes by rename(2) of a new symlink over the old one, so a reader of
<root>/<name> sees either the old complete model or the new complete model, never a mix.

Runs on the managed host (Python >= 3.10).
"""

from __future__ import annotations

import contextlib
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
from typing import Any, Callable, Optional

from ansible.module_utils.urls import ConnectionError as UrlConnectionError
from ansible.module_utils.urls import open_url

from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_catalog import config_mismatches

MANIFEST_NAME = ".gpubox-manifest.json"
MANIFEST_SCHEMA = 1
VERSIONS_DIR = ".versions"
STAGING_DIR = ".staging"
PARTIAL_SUFFIX = ".incomplete"  # the modelscope client's name for a partly received file
DIR_MODE = 0o755
FILE_MODE = 0o644
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

ByteCallback = Optional[Callable[[int], None]]


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
class RemoteFile:
    path: str
    size: int
    sha256: str


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


def _safe_relpath(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


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


class IntegrityError(ModelStoreError):
    def __init__(self, message: str, problems: list[FileProblem]) -> None:
        super().__init__(message)
        self.problems = problems


def sha256_file(path: Path, on_bytes: ByteCallback = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(4 << 20):
            digest.update(block)
            if on_bytes:
                on_bytes(len(block))
    return digest.hexdigest()


def verify_file(directory: Path, f: RemoteFile, *, rehash: bool, on_bytes: ByteCallback = None) -> FileProblem | None:
    path = directory / f.path
    try:
        st = path.lstat()
    except FileNotFoundError:
        return FileProblem(f.path, "missing", f"{f.size} bytes, sha256 {f.sha256}", "")
    if not stat.S_ISREG(st.st_mode):
        return FileProblem(f.path, "missing", "a regular file", "not a regular file")
    if st.st_size != f.size:
        return FileProblem(f.path, "size", f"{f.size} bytes", f"{st.st_size} bytes")
    if rehash:
        actual = sha256_file(path, on_bytes)
        if actual != f.sha256:
            return FileProblem(f.path, "sha256", f"sha256 {f.sha256}", f"sha256 {actual}")
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


def extra_files(directory: Path, files: Iterable[RemoteFile]) -> list[str]:
    """Relative paths of files present in directory but not in the listing (manifest excluded)."""
    wanted = {f.path for f in files} | {MANIFEST_NAME}
    found = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if not path.is_dir() and rel not in wanted:
            found.append(rel)
    return found


def remove_extras(directory: Path, files: Iterable[RemoteFile]) -> list[str]:
    """Delete files not in the listing (client bookkeeping such as .msc, .mv) and the empty dirs left."""
    removed = extra_files(directory, files)
    for rel in removed:
        (directory / rel).unlink()
    for dirpath, _dirnames, _filenames in sorted(os.walk(directory), key=lambda w: -len(w[0])):
        if Path(dirpath) != directory and not os.listdir(dirpath):
            os.rmdir(dirpath)
    return removed


# --------------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------------
def _canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8")


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


def manifest_digest(body: dict[str, Any]) -> str:
    """sha256 over the canonical JSON of every field but manifest_sha256 itself."""
    return hashlib.sha256(_canonical({k: v for k, v in body.items() if k != "manifest_sha256"})).hexdigest()


def write_manifest(directory: Path, listing: Listing, endpoint: str = "") -> dict[str, Any]:
    body = manifest_body(listing, endpoint)
    body["manifest_sha256"] = manifest_digest(body)
    write_file_atomic(directory / MANIFEST_NAME, json.dumps(body, indent=2, sort_keys=True) + "\n", FILE_MODE)
    return body


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


def ensure_layout(layout: StoreLayout) -> None:
    for path, mode in ((layout.root, DIR_MODE), (layout.versions, DIR_MODE), (layout.staging_root, 0o700)):
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
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
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


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


def publish(layout: StoreLayout, staged: Path, commit: str) -> Path:
    """Move a verified staging dir into .versions with rename(2), then swap the live symlink to it."""
    target = layout.new_version_path(commit)
    os.rename(staged, target)
    fsync_path(layout.versions)
    fsync_path(layout.staging_root)
    swap_symlink(layout.live, target)
    return target


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
    """Remove this model's staging dirs for other commits (left by an abandoned revision)."""
    removed = []
    if not layout.staging_root.is_dir():
        return removed
    for path in layout.staging_root.iterdir():
        if path.is_dir() and path.name.startswith(f"{layout.name}@") and path.name != f"{layout.name}@{keep_commit}":
            shutil.rmtree(path)
            removed.append(path)
    return removed


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
        }


def write_progress(path: Path | None, progress: Progress) -> None:
    if path is None:
        return
    try:
        write_file_atomic(path, json.dumps(progress.as_dict()) + "\n", FILE_MODE)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.EACCES, errno.EROFS):
            raise  # a missing/readonly progress location must not fail the download itself


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
        if urllib.parse.urlsplit(self.endpoint).scheme not in ("http", "https"):
            problems.append(f"endpoint must be an http(s) URL, got {self.endpoint!r}")
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


def client_env(req: Request, cache_dir: Path) -> dict[str, str]:
    """Environment for the CLI. Both client generations are served: >= 1.38 reads MODELSCOPE_ENDPOINT
    (and then ignores MODELSCOPE_DOMAIN); <= 1.37 reads only MODELSCOPE_DOMAIN and always uses https."""
    env = dict(os.environ)
    env["MODELSCOPE_ENDPOINT"] = req.endpoint.rstrip("/")
    url = urllib.parse.urlsplit(req.endpoint)
    if url.scheme == "https":
        env["MODELSCOPE_DOMAIN"] = url.netloc
    else:
        env.pop("MODELSCOPE_DOMAIN", None)
    if req.ca_bundle:
        env["REQUESTS_CA_BUNDLE"] = req.ca_bundle
        env["SSL_CERT_FILE"] = req.ca_bundle
    env["MODELSCOPE_CACHE"] = str(cache_dir)  # keep the client's locks and state beside the staging dir
    env["TQDM_DISABLE"] = "1"  # no progress bars in the captured log; we report progress ourselves
    env["PYTHONUNBUFFERED"] = "1"
    return env


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
    staging: Path,
    listing: Listing,
    deadline: float,
    progress: Progress,
    progress_path: Path | None,
    log_path: Path,
) -> int:
    """Run the modelscope CLI once, updating progress every second; stop it at the deadline.

    A Popen of its own, not AnsibleModule.run_command: the run takes hours, is watched every second
    (progress file) and its whole process group is stopped at the deadline.
    """
    with log_path.open("ab") as log:
        log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(client_argv(req, staging))}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                client_argv(req, staging),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=client_env(req, staging.parent / ".cache"),
                cwd=str(staging.parent),
                start_new_session=True,
            )
        except OSError as exc:
            raise ModelStoreError(
                f"cannot run modelscope_bin {req.modelscope_bin!r} ({exc}); point it at the serving "
                "environment's modelscope CLI"
            ) from exc
        while True:
            try:
                return proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            progress.bytes_done, progress.files_done = staging_progress(staging, listing.files)
            write_progress(progress_path, progress)
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                raise ModelStoreError(
                    f"the download of {req.model_id}@{req.revision} did not finish within timeout "
                    f"{req.timeout}s; {staging} is kept and a re-run resumes from it (or raise the timeout)"
                )


# --------------------------------------------------------------------------------------------------
# The store: converge the live path to the listing
# --------------------------------------------------------------------------------------------------
def _ids(req: Request) -> tuple[int | None, int | None]:
    import grp
    import pwd

    try:
        uid = pwd.getpwnam(req.owner).pw_uid if req.owner else None
        gid = grp.getgrnam(req.group).gr_gid if req.group else None
    except KeyError as exc:
        raise ModelStoreError(f"owner {req.owner!r} or group {req.group!r} does not exist on this host") from exc
    return uid, gid


def _discard(staging: Path, problems: list[FileProblem]) -> None:
    for p in problems:
        if p.kind != "missing":
            (staging / p.path).unlink(missing_ok=True)


def _seed_from(live: Path, staging: Path, listing: Listing, bad: set[str]) -> None:
    """Hard-link the live files that passed a re-hash into staging, so a repair fetches only the bad ones."""
    for f in listing.files:
        src, dst = live / f.path, staging / f.path
        if f.path in bad or dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            return  # not possible here (e.g. another filesystem): the client fetches everything


def _check_config(req: Request, staging: Path, listing: Listing) -> None:
    """Refuse to publish a model whose config.json is not the model preflight planned the memory for."""
    if req.expected_config is None:
        return
    try:
        config = json.loads((staging / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelStoreError(f"{req.model_id}@{listing.commit} has no readable config.json ({exc})") from exc
    problems = config_mismatches(req.expected_config, config)
    if problems:
        raise ModelStoreError(
            f"{req.model_id}@{listing.commit} is not the model preflight planned from (gpubox_model_id / "
            f"gpubox_model_config): {'; '.join(problems)}. Nothing was published; the live path is unchanged. "
            "Fix: correct the catalog entry or gpubox_model_config, or pin gpubox_model_revision."
        )


def run_model_store(req: Request, free: Callable[[Path], int] = free_bytes) -> StoreResult:
    """The module's work, without Ansible: raises ModelStoreError on any failure."""
    started = time.monotonic()
    deadline = started + req.timeout
    layout = StoreLayout(Path(req.root), req.model_name)
    progress_path = Path(req.progress_file) if req.progress_file else None
    progress = Progress(phase="reading the hub listing")
    write_progress(progress_path, progress)
    try:
        result = _run(req, layout, deadline, free, progress, progress_path)
    except ModelStoreError as exc:
        progress.state, progress.phase = "failed", f"failed: {str(exc)[:200]}"
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
    staging.mkdir(mode=0o700, exist_ok=True)
    if live and bad_live and req.rehash:
        _seed_from(live, staging, listing, {p.path for p in bad_live})
    uid, gid = _ids(req)
    log_path = layout.staging_root / f"client-{layout.name}@{listing.commit}.log"
    problems: list[FileProblem] = []
    rc = 0
    for attempt in range(1, req.retries + 2):
        result.attempts = attempt
        progress.phase = f"downloading (attempt {attempt})"
        rc = run_client(req, staging, listing, deadline, progress, progress_path, log_path)
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
    remove_extras(staging, listing.files)  # client leftovers: the published dir holds exactly the listing
    progress.phase = "publishing"
    write_progress(progress_path, progress)
    manifest = write_manifest(staging, listing, req.endpoint)
    set_tree_ownership(staging, uid, gid)
    fsync_tree(staging)
    version = publish(layout, staging, listing.commit)
    log_path.unlink(missing_ok=True)
    result.version_path, result.manifest_sha256 = str(version), manifest["manifest_sha256"]
    result.removed_versions = [str(p) for p in prune_versions(layout, req.keep_versions, also_keep=live)]
    prune_staging(layout)
    result.msg = f"published {req.model_id}@{listing.commit} at {layout.live} -> {version.name}"
    return result
