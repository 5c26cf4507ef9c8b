"""The model lock: which commit a moving revision (a branch or tag) of a model was resolved to.

A lock file is kept with the inventory (default ``<inventory dir>/models.lock.json``, the fact
``gpubox_model_lock_file``), like a pip lock: ``make lock-models`` (playbooks/lock_models.yml) writes
what the hub's listing names as the commit of each box's ``gpubox_model_id`` at ``gpubox_model_revision``;
the first converge of a box whose branch has no entry writes its entry the same way. From then on
every converge of every box asks the model store for the locked commit, until the lock is changed on
purpose (re-run ``make lock-models``, or edit/revert the file). A revision that is already a commit id
needs no entry. Nothing here invents a commit: an entry only ever holds what a hub listing said.

The file is JSON (readable and diffable; YAML readers take it too)::

    {"_comment": "...", "schema": 1,
     "models": {"OWNER/NAME@master": {"commit": "<40 hex>", "endpoint": "https://www.modelscope.cn",
                                      "content_sha256": "<64 hex>", "files": 12, "total_bytes": 29540000000}}}

``content_sha256`` pins the content, not only its name: the sha256 of the listing's model id, commit and
every file's path, size and sha256 (hub_listing.content_sha256). Every converge refuses content whose
digest differs, whatever the channel (https hub, http mirror, LAN cache): a hub or cache that publishes
other weights under the locked commit is refused. An entry without it (written before it existed) pins
the commit alone until ``make lock-models`` re-resolves it.

Read on the controller (the desired_state lookup, the model_lock module delegated to localhost).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils.hub_listing import SHA256_RE, is_commit

LOCK_SCHEMA = 1
COMMENT = (
    "gpubox model lock: the commit each moving revision (branch or tag) of a model was resolved to, "
    "read from the hub's listing. Written by `make lock-models` (playbooks/lock_models.yml) or by the "
    "first converge of a revision with no entry; every later converge serves the locked commit. "
    "Change it on purpose: re-run make lock-models, or revert this file to roll back."
)
# A commit id and a sha256 have one definition each, hub_listing's (it says where the formats come from).


class LockError(Exception):
    """A lock file that cannot be used: the message names the file and the fix."""


def is_sha256(value: Any) -> bool:
    return isinstance(value, str) and bool(SHA256_RE.match(value))


def lock_key(model_id: str, revision: str) -> str:
    return f"{model_id}@{revision}"


def parse_lock(text: str, where: str) -> dict[str, dict[str, Any]]:
    """The entries of a lock file's text ({} for an empty file); LockError when it is not a lock."""
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise LockError(
            f"the model lock {where} is not JSON ({exc}): fix it, or delete it and run make lock-models"
        ) from exc
    if not isinstance(data, dict) or data.get("schema") != LOCK_SCHEMA or not isinstance(data.get("models"), dict):
        raise LockError(
            f"the model lock {where} must be a JSON object with schema {LOCK_SCHEMA} and a models mapping: "
            "fix it, or delete it and run make lock-models"
        )
    entries: dict[str, dict[str, Any]] = {}
    for key, entry in data["models"].items():
        commit = entry.get("commit") if isinstance(entry, dict) else None
        content = entry.get("content_sha256") if isinstance(entry, dict) else None
        if content is not None and not is_sha256(content):
            raise LockError(
                f"the model lock {where} entry {key!r} has content_sha256 {content!r}, not 64 lower-case hex "
                "digits: revert the file, or remove the entry and run make lock-models"
            )
        if "@" not in str(key) or not is_commit(commit):
            raise LockError(
                f"the model lock {where} has an unusable entry {key!r}: each key is OWNER/NAME@REVISION and each "
                "entry a commit of 40 hex digits read from the hub; remove it and run make lock-models"
            )
        entries[str(key)] = dict(entry)
    return entries


def read_lock(path: str) -> dict[str, dict[str, Any]]:
    """The entries of the lock file at path; {} when it does not exist."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise LockError(f"the model lock {path} cannot be read ({exc.strerror}): check its permissions") from exc
    return parse_lock(text, path)


def locked_commit(entries: dict[str, dict[str, Any]], model_id: str, revision: str) -> str | None:
    """The commit to serve: the revision itself when it is a commit, else its lock entry's (or None)."""
    if is_commit(revision):
        return revision
    entry = entries.get(lock_key(model_id, revision))
    return entry["commit"] if entry else None


def locked_content(entries: dict[str, dict[str, Any]], model_id: str, revision: str) -> str | None:
    """The content_sha256 the lock pins for model_id@revision (None when it pins none)."""
    entry = entries.get(lock_key(model_id, revision))
    return entry.get("content_sha256") if entry else None


def render_lock(entries: dict[str, dict[str, Any]]) -> str:
    body = {"_comment": COMMENT, "schema": LOCK_SCHEMA, "models": dict(sorted(entries.items()))}
    return json.dumps(body, indent=2, sort_keys=False) + "\n"


def merge_lock(
    entries: dict[str, dict[str, Any]], resolved: list[dict[str, Any]], replace: bool
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """entries with each resolved {model_id, revision, commit, endpoint, content_sha256, files,
    total_bytes} added (or, with replace, updated); returns the new entries and the keys that changed.
    A commit revision is locked for its content only; a resolved commit that is not a commit id (a
    listing that named none) is refused, and so is a content digest that is not 64 hex digits."""
    out = {k: dict(v) for k, v in entries.items()}
    changed = []
    for item in resolved:
        model_id, revision, commit = item.get("model_id"), item.get("revision"), item.get("commit")
        if not isinstance(model_id, str) or not isinstance(revision, str):
            continue
        if is_commit(revision) and not item.get("content_sha256"):
            continue  # a commit revision needs an entry only to pin its content
        if not is_commit(commit):
            raise LockError(
                f"the hub's listing of {model_id}@{revision} names no commit id (got {commit!r}), so nothing can be "
                "locked: pin gpubox_model_revision to a commit instead"
            )
        key = lock_key(model_id, revision)
        if key in out and not replace:
            continue
        if is_commit(revision) and commit != revision:
            raise LockError(f"the hub's listing of {model_id}@{revision} names another commit {commit!r}: not locked")
        entry = {"commit": commit, "endpoint": str(item.get("endpoint") or "")}
        content = item.get("content_sha256")
        if content not in (None, ""):
            if not is_sha256(content):
                raise LockError(f"the content_sha256 {content!r} of {model_id}@{revision} is not 64 hex digits")
            entry |= {"content_sha256": content, "files": item.get("files"), "total_bytes": item.get("total_bytes")}
        if out.get(key) != entry:
            out[key] = entry
            changed.append(key)
    return out, changed


def write_lock(path: str, entries: dict[str, dict[str, Any]]) -> None:
    """Write the lock whole or not at all (a temp file beside it, fsync, rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(render_lock(entries))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
