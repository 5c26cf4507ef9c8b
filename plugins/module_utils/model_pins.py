"""The box's own content pins: which content each model commit had when this box first published it.

A git commit names one tree: the same model id and commit can never legitimately list other files,
sizes or sha256. So the box keeps, in a file only root writes (the role's ``/var/lib/gpubox/model-pins.json``),
the content digest (hub_listing.content_sha256) of every model commit it published, keyed
``OWNER/NAME@<commit>``, and refuses, before anything changes, a listing that names a pinned commit with
other content: from the https hub, a mirror or the LAN cache alike, whether or not the controller's model
lock (lock_file.py) has an entry. The controller's lock stays the trusted pin of what a box should serve;
this file is what the box itself has seen, so that a box never swaps the weights of a commit it serves.

The file is JSON, parsed strictly (lock_file.loads_strict: a key given twice is refused, naming its line)::

    {"schema": 1, "pins": {"OWNER/NAME@<40 hex>": {"content_sha256": "<64 hex>", "files": 12,
                                                     "total_bytes": 29540000000, "endpoint": "https://..."}}}

Runs on the managed host (Python >= 3.10).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils.hub_listing import SHA256_RE, Listing, is_commit
from ansible_collections.gpubox.gpubox.plugins.module_utils.lock_file import DuplicateKeyError, loads_strict
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_errors import ModelStoreError

PINS_SCHEMA = 1


def _fix(path: Path) -> str:
    return (
        f"it is written only by the model store (as root): restore it from a backup, or remove {path} to let the "
        "next converge pin again what it publishes (the controller's model lock still pins what it names)"
    )


def _check_owner(path: Path) -> None:
    """The pins file and its directory are root's and not writable by group or others (else whoever may
    write them could pin hostile content)."""
    for entry, kind in ((path.parent, stat.S_ISDIR), (path, stat.S_ISREG)):
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            continue
        if not kind(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise ModelStoreError(
                f"the box's content pins {path}: {entry} is not a {'directory' if kind is stat.S_ISDIR else 'file'} "
                f"root owns alone (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}, a symlink is refused): "
                f"another user could pin other content. Fix: `chown root:root {entry}; chmod go-w {entry}`"
            )


def read_pins(path: Path) -> dict[str, dict[str, Any]]:
    """The pins in path ({} when it does not exist); ModelStoreError naming the file, the line and the fix."""
    _check_owner(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelStoreError(f"the box's content pins {path} cannot be read ({exc}): {_fix(path)}") from exc
    try:
        data = loads_strict(text)
    except DuplicateKeyError as exc:
        raise ModelStoreError(f"the box's content pins {path} line {exc.line}: {exc}: {_fix(path)}") from exc
    except ValueError as exc:
        raise ModelStoreError(f"the box's content pins {path} are not JSON ({exc}): {_fix(path)}") from exc
    pins = data.get("pins") if isinstance(data, dict) and data.get("schema") == PINS_SCHEMA else None
    if not isinstance(pins, dict):
        raise ModelStoreError(f"the box's content pins {path} are not a schema {PINS_SCHEMA} pins file: {_fix(path)}")
    for key, entry in pins.items():
        model_id, _at, commit = key.rpartition("@")
        content = entry.get("content_sha256") if isinstance(entry, dict) else None
        if not model_id or not is_commit(commit) or not isinstance(content, str) or not SHA256_RE.match(content):
            line = getattr(pins, "lines", {}).get(key, 0)
            raise ModelStoreError(
                f"the box's content pins {path} line {line}: the entry {key!r} is not OWNER/NAME@<commit> with a "
                f"content_sha256 of 64 hex digits: {_fix(path)}"
            )
    return {key: dict(entry) for key, entry in pins.items()}


def pin_key(model_id: str, commit: str) -> str:
    return f"{model_id}@{commit}"


def check_pinned(pins: dict[str, dict[str, Any]], listing: Listing, endpoint: str, path: Path) -> bool:
    """True when the box pinned this commit's content and the listing is it; False when it pinned nothing
    for this commit; ModelStoreError, changing nothing, when the listing names the commit with other content."""
    entry = pins.get(pin_key(listing.model_id, listing.commit))
    if entry is None:
        return False
    if entry["content_sha256"] == listing.content_sha256:
        return True
    raise ModelStoreError(
        f"{listing.model_id}@{listing.commit} from {endpoint} is not the content this box published for that commit: "
        f"the listing ({len(listing.files)} files, {listing.total_size} bytes) has content_sha256 "
        f"{listing.content_sha256}, the box's pin in {path} has {entry['content_sha256']} ({entry.get('files')} files, "
        f"{entry.get('total_bytes')} bytes, from {entry.get('endpoint') or '?'}). A commit names one set of files, so "
        "the hub, mirror or LAN cache is broken or hostile. Nothing was changed; the live model is unchanged. If it "
        "came through the LAN cache, purge the cached object (make cache-purge) and re-run"
    )


def record_pin(path: Path, listing: Listing, endpoint: str) -> bool:
    """Add the listing's content as its commit's pin (whole file written or none: temp, fsync, rename);
    False when it was pinned already. Never replaces a pin (check_pinned refuses other content first)."""
    pins = read_pins(path)
    key = pin_key(listing.model_id, listing.commit)
    if key in pins:
        return False
    pins[key] = {
        "content_sha256": listing.content_sha256,
        "files": len(listing.files),
        "total_bytes": listing.total_size,
        "endpoint": endpoint,
    }
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    body = json.dumps({"schema": PINS_SCHEMA, "pins": dict(sorted(pins.items()))}, indent=2) + "\n"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True
