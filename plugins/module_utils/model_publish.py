"""Verified model store: the work of the gpubox.gpubox.model_store module, without Ansible.

The module is a thin wrapper: it declares its options once (``argument_spec``) and passes
``module.params`` whole to :class:`Request`, then calls :func:`run_model_store`. This file is the
orchestration; each trust boundary has a file of its own:

- hub_listing.py: the hub's listing, the only place where what a hub, mirror or cache sends becomes a
  value (checked commit, paths, sizes, sha256), and the content digest the model lock pins;
- store_layout.py: the layout under the store root and the atomic publish (root's only writes);
- model_client.py: the modelscope client, sandboxed as the download user, and stopped whole;
- store_progress.py: the progress file the role's poll loop reads;
- model_manifest.py: the manifest and the re-hash (stdlib only: the box's weekly re-hash runs it).

What a run does: read the listing (checked), refuse it unless its content is the locked one (the
model lock's content_sha256, whatever channel it came over: https hub, http mirror, LAN cache) and,
for a commit this box published before, the content it pinned then (model_pins.py),
keep the live version when it is that content and intact, else switch to a kept intact copy, else
download into staging as the download user, verify every sha256, and publish a root-made copy by
rename(2). Every failure is a ModelStoreError whose message names the path and the fix (OSErrors
included: disk full, read-only file system, permission denied); the progress file then says "failed".

Runs on the managed host (Python >= 3.10).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ansible_collections.gpubox.gpubox.plugins.module_utils import state_checks
from ansible_collections.gpubox.gpubox.plugins.module_utils.hub_listing import (
    CLIENT_BOOKKEEPING,
    SHA256_RE,
    Listing,
    fetch_listing,
    parse_listing,
    split_model_id,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_catalog import config_mismatches
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_client import (
    check_client,
    client_errors,
    download_ids,
    run_client,
    sandbox_properties,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_errors import (
    DiskSpaceError,
    IntegrityError,
    ListingError,
    ModelStoreError,
    os_error,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_manifest import (
    MANIFEST_NAME,
    FileProblem,
    NotInside,
    RemoteFile,
    open_member,
    read_manifest,
    verify_dir,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_pins import check_pinned, read_pins, record_pin
from ansible_collections.gpubox.gpubox.plugins.module_utils.store_layout import (
    FILE_MODE,
    PUBLISH_PREFIX,
    StoreLayout,
    _inodes,
    assemble,
    check_disk_space,
    discard,
    ensure_layout,
    extra_files,
    free_bytes,
    fsync_tree,
    give_to,
    live_target,
    make_dir,
    manifest_matches,
    prune_staging,
    prune_versions,
    publish,
    resume_assembly,
    seed_from,
    set_tree_ownership,
    staged_bytes,
    swap_symlink,
    write_file_atomic,
    write_manifest,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils.store_progress import (
    Progress,
    process_start,
    staging_progress,
    write_progress,
)

# The names callers and tests use from here (the module, model_resolve, model_verify, tools/unit_security).
__all__ = [
    "FILE_MODE",
    "MANIFEST_NAME",
    "DiskSpaceError",
    "FileProblem",
    "IntegrityError",
    "ListingError",
    "ModelStoreError",
    "RemoteFile",
    "Request",
    "Stopped",
    "StoreLayout",
    "StoreResult",
    "check_disk_space",
    "discard",
    "fetch_listing",
    "free_bytes",
    "manifest_matches",
    "os_error",
    "parse_listing",
    "process_start",
    "read_manifest",
    "run_model_store",
    "sandbox_properties",
    "staged_bytes",
    "staging_progress",
    "write_file_atomic",
    "write_manifest",
]


@contextlib.contextmanager
def store_lock(path: Path) -> Iterator[None]:
    """One run per model at a time on this host (a second run waits for the first)."""
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


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
    # The model lock's pin of this content (lock_file's content_sha256 for model_id@revision): a listing
    # whose content differs is refused, whatever channel it came over. None: nothing locked yet.
    content_sha256: str | None
    lock_file: str | None
    # The box's own content pins (model_pins.py): every commit it published, with its content; a listing
    # naming a pinned commit with other content is refused. None: no box-side pins (tests of other parts).
    pin_file: str | None
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
        if self.content_sha256 not in (None, "") and not (
            isinstance(self.content_sha256, str) and SHA256_RE.match(self.content_sha256)
        ):
            problems.append(
                f"content_sha256 must be 64 lower-case hex digits from the model lock, got {self.content_sha256!r}: "
                "fix the entry in gpubox_model_lock_file or run make lock-models"
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
    content_sha256: str = ""
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
    except Exception as exc:
        # Not ours (a bug, or a library's own error): the progress file still ends "failed", with the
        # reason, never "running" until the poll finds the process gone; the traceback goes to Ansible.
        progress.state = "failed"
        progress.phase = f"failed: {type(exc).__name__} in {progress.phase}: {str(exc)[:250]}"
        write_progress(progress_path, progress)
        raise
    progress.state, progress.phase = "done", result.msg
    progress.bytes_done = progress.bytes_total
    progress.files_done = progress.files_total
    write_progress(progress_path, progress)
    return result


def check_locked_content(req: Request, listing: Listing) -> None:
    """Refuse content the model lock does not pin: same commit or not, over https, an http mirror or the
    LAN cache. The lock was written on purpose from an https hub (make lock-models)."""
    if not req.content_sha256 or listing.content_sha256 == req.content_sha256:
        return
    raise ModelStoreError(
        f"{req.model_id}@{req.revision} from {req.endpoint} is not the content the model lock pins: the listing "
        f"(commit {listing.commit}, {len(listing.files)} files, {listing.total_size} bytes) has content_sha256 "
        f"{listing.content_sha256}, the lock {req.lock_file or 'gpubox_model_lock_file'} has {req.content_sha256}. "
        "Nothing was changed. If the hub really published new content under this revision, re-lock it on purpose "
        "from the https hub (make lock-models); if it came through the LAN cache, purge the cached object "
        "(make cache-purge) and re-run"
    )


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
    check_locked_content(req, listing)
    pin_path = Path(req.pin_file) if req.pin_file else None
    pinned = pin_path is not None and check_pinned(read_pins(pin_path), listing, req.endpoint, pin_path)
    progress.bytes_total, progress.files_total = listing.total_size, len(listing.files)
    result = StoreResult(
        changed=False,
        path=str(layout.live),
        commit=listing.commit,
        revision=req.revision,
        total_bytes=listing.total_size,
        files=len(listing.files),
        content_sha256=listing.content_sha256,
    )
    if not req.check_mode:
        ensure_layout(layout)
        with store_lock(layout.lock_path):
            result = _converge(req, layout, listing, result, deadline, free, progress, progress_path)
            # The content now live is this commit's pin on this box (a first publish, or a box pinned before).
            if pin_path is not None and record_pin(pin_path, listing, req.endpoint):
                result.changed = True
            return result
    if layout.live.exists() and not layout.live.is_symlink():
        raise ModelStoreError(f"{layout.live} is a real directory, not the symlink this store manages")
    result = _converge(req, layout, listing, result, deadline, free, progress, progress_path)
    result.changed = result.changed or (pin_path is not None and not pinned)
    return result


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
    pending = layout.staging_root / f"{PUBLISH_PREFIX}{staging.name}"  # a stopped publish's copies count too
    staged = sum(staged_bytes(d, listing.files) for d in (staging, pending) if d.is_dir() and not d.is_symlink())
    largest = max(f.size for f in listing.files)
    check_disk_space(layout.root, listing.total_size, staged, free(layout.root), req.reserve_bytes, largest)
    result.changed = True
    if req.check_mode:
        result.msg = f"would download {req.model_id}@{listing.commit} into {staging} and publish it"
        return result
    result.client_version = check_client(req)
    uid, gid = _ids(req)
    dl_uid, dl_gid = download_ids(req)
    fresh = make_dir(staging, 0o700)
    if fresh and live and bad_live and req.rehash:
        seed_from(live, staging, listing, {p.path for p in bad_live})
    if fresh or staging.lstat().st_uid != dl_uid:  # new, or left by a store that ran the client as root
        give_to(staging, dl_uid, dl_gid)
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
        discard(staging, problems)  # a file that failed is deleted so the next client run fetches it again
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
