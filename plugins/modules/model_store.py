#!/usr/bin/python
"""Ansible module: download a ModelScope model with the real client, verify it, publish it atomically."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpubox_model_store
short_description: Download a ModelScope model with the real client, verify it, publish it atomically
description:
  - Reads the hub's file listing for I(model_id) at I(revision). When the live path C(<root>/<name>)
    already holds that commit (manifest equal to the listing, sizes equal, and sha256 equal when
    I(rehash)), nothing changes.
  - Otherwise checks free disk space, runs C(modelscope download) into the staging directory
    C(<root>/.staging/<name>@<commit>), verifies every file's size and sha256 against the listing,
    deletes and re-fetches files that fail (bounded by I(retries)), writes a manifest, sets ownership,
    renames the staging directory into C(<root>/.versions/) and swaps the C(<root>/<name>) symlink with
    one rename(2).
  - On failure the live path is untouched and the staging directory is kept, so a re-run resumes.
options:
  model_id:
    description: ModelScope id, OWNER/NAME.
    type: str
    required: true
  revision:
    description: Branch, tag or commit to fetch.
    type: str
    default: master
  endpoint:
    description: Hub base URL.
    type: str
    default: https://www.modelscope.cn
  root:
    description: Store root directory.
    type: path
    default: /data/models
  name:
    description: Directory name under I(root); default the last part of I(model_id).
    type: str
  modelscope_bin:
    description: Path of the C(modelscope) CLI of the serving environment.
    type: path
    required: true
  owner:
    description: Owner of published files and directories.
    type: str
    default: root
  group:
    description: Group of published files and directories (files 0644, directories 0755).
    type: str
    default: root
  rehash:
    description: Re-hash the live files (sha256) instead of trusting the manifest and the sizes.
    type: bool
    default: false
  timeout:
    description: Seconds the client may run in total before it is stopped (staging is kept).
    type: int
    default: 14400
  progress_file:
    description: JSON file rewritten every second with bytes done/total while the module runs.
    type: path
  retries:
    description: Extra client runs after a failed or unverifiable download.
    type: int
    default: 2
  keep_versions:
    description: Version directories kept for this model, the live one included.
    type: int
    default: 2
  reserve_bytes:
    description: Bytes that must stay free on I(root) after the download.
    type: int
    default: 0
  ca_bundle:
    description: PEM file of CAs to trust for the endpoint (a private mirror).
    type: path
  expected_config:
    description:
      - The config.json facts the model must have (the capacity catalog's entry or the inventory's
        gpubox_model_config). A download whose config.json disagrees fails before it is published.
    type: dict
attributes:
  check_mode:
    support: full
    details: Reads the listing, the live manifest and the free space; reports whether it would download.
author:
  - gpubox maintainers
"""

EXAMPLES = r"""
- name: Ensure Qwen2.5-7B-Instruct is published under /data/models.
  gpubox_model_store:
    model_id: Qwen/Qwen2.5-7B-Instruct
    revision: master
    modelscope_bin: /opt/gpubox/venv/bin/modelscope
"""

RETURN = r"""
path:
  description: The live path (a symlink).
  type: str
  returned: always
version_path:
  description: The version directory the live path points at.
  type: str
  returned: success
commit:
  description: Commit id the hub resolved the revision to.
  type: str
  returned: always
revision:
  description: The revision asked for.
  type: str
  returned: always
manifest_sha256:
  description: Digest of the published manifest.
  type: str
  returned: success
total_bytes:
  description: Size of the model by the listing.
  type: int
  returned: always
files:
  description: Number of files in the model.
  type: int
  returned: always
downloaded:
  description: Whether the client was run.
  type: bool
  returned: always
attempts:
  description: Client runs made.
  type: int
  returned: always
client_version:
  description: modelscope version beside modelscope_bin, when the client ran.
  type: str
  returned: always
repaired:
  description: Live files a re-hash found damaged; a new version replaced them.
  type: list
  returned: always
removed_versions:
  description: Old version directories pruned.
  type: list
  returned: always
"""

import contextlib  # noqa: E402
import fcntl  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

from ansible_collections.gpubox.gpubox.plugins.module_utils.model_catalog import config_mismatches  # noqa: E402
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_publish import (  # noqa: E402
    FileProblem,
    IntegrityError,
    Listing,
    ModelStoreError,
    Progress,
    StoreLayout,
    check_disk_space,
    ensure_layout,
    fetch_listing,
    free_bytes,
    fsync_tree,
    live_target,
    manifest_matches,
    prune_staging,
    prune_versions,
    publish,
    read_manifest,
    remove_extras,
    set_tree_ownership,
    split_model_id,
    staged_bytes,
    staging_progress,
    swap_symlink,
    verify_dir,
    write_manifest,
    write_progress,
)

CLIENT_LOG_TAIL = 3000  # characters of the client's output quoted in an error
LEGACY_BEFORE = (1, 38)  # modelscope < 1.38 is the legacy generation (docs/facts.md)


@dataclass(frozen=True)
class StoreRequest:
    model_id: str
    modelscope_bin: str
    revision: str = "master"
    endpoint: str = "https://www.modelscope.cn"
    root: str = "/data/models"
    name: str | None = None
    owner: str | None = "root"
    group: str | None = "root"
    rehash: bool = False
    timeout: int = 14400
    progress_file: str | None = None
    retries: int = 2
    keep_versions: int = 2
    reserve_bytes: int = 0
    ca_bundle: str | None = None
    # The config.json facts preflight planned from (catalog entry or gpubox_model_config); a download
    # whose config.json disagrees is never published.
    expected_config: dict[str, Any] | None = None
    check_mode: bool = False

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


def client_argv(req: StoreRequest, staging: Path) -> list[str]:
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


def client_env(req: StoreRequest, cache_dir: Path) -> dict[str, str]:
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


def check_client(req: StoreRequest) -> str:
    """Refuse a combination the client cannot do, before anything is downloaded."""
    if not os.access(req.modelscope_bin, os.X_OK):
        raise ModelStoreError(
            f"modelscope_bin {req.modelscope_bin!r} is not an executable; install the serving environment "
            "first (python_env) or point model_store_modelscope_bin at its bin/modelscope"
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
    req: StoreRequest,
    staging: Path,
    listing: Listing,
    deadline: float,
    progress: Progress,
    progress_path: Path | None,
    log_path: Path,
) -> int:
    """Run the modelscope CLI once, updating progress every second; stop it at the deadline."""
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


def _ids(req: StoreRequest) -> tuple[int | None, int | None]:
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


def _check_config(req: StoreRequest, staging: Path, listing: Listing) -> None:
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


def run_model_store(req: StoreRequest, free: Callable[[Path], int] = free_bytes) -> StoreResult:
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
    req: StoreRequest,
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
    req: StoreRequest,
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
    reserve = req.reserve_bytes
    check_disk_space(layout.root, listing.total_size, staged, free(layout.root), reserve)
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


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            model_id=dict(type="str", required=True),
            revision=dict(type="str", default="master"),
            endpoint=dict(type="str", default="https://www.modelscope.cn"),
            root=dict(type="path", default="/data/models"),
            name=dict(type="str"),
            modelscope_bin=dict(type="path", required=True),
            owner=dict(type="str", default="root"),
            group=dict(type="str", default="root"),
            rehash=dict(type="bool", default=False),
            timeout=dict(type="int", default=14400),
            progress_file=dict(type="path"),
            retries=dict(type="int", default=2),
            keep_versions=dict(type="int", default=2),
            reserve_bytes=dict(type="int", default=0),
            ca_bundle=dict(type="path"),
            expected_config=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["retries"] < 0 or p["keep_versions"] < 1 or p["timeout"] < 1 or p["reserve_bytes"] < 0:
        module.fail_json(msg="retries and reserve_bytes must be >= 0, keep_versions and timeout >= 1")
    req = StoreRequest(
        model_id=p["model_id"],
        revision=p["revision"],
        endpoint=p["endpoint"],
        root=p["root"],
        name=p["name"],
        modelscope_bin=p["modelscope_bin"],
        owner=p["owner"],
        group=p["group"],
        rehash=p["rehash"],
        timeout=p["timeout"],
        progress_file=p["progress_file"],
        retries=p["retries"],
        keep_versions=p["keep_versions"],
        reserve_bytes=p["reserve_bytes"],
        ca_bundle=p["ca_bundle"],
        expected_config=p["expected_config"],
        check_mode=module.check_mode,
    )
    try:
        result = run_model_store(req)
    except IntegrityError as exc:
        module.fail_json(msg=str(exc), problems=[pr.__dict__ for pr in exc.problems])
    except ModelStoreError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result.as_dict())


if __name__ == "__main__":
    main()
