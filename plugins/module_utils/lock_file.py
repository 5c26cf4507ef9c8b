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

Where an answer may come from (design.md, Trust boundaries): the hub over verified TLS, never the LAN cache.
``make lock-models`` asks ``model_store_endpoint`` itself, never the cache in front of it; a converge writes an
entry only when the box fetched from the hub directly. Each answer carries the endpoint it came from (recorded
as the entry's ``endpoint``) and the cache the box would use: :func:`merge_lock` refuses an answer that came
through the cache or from plain http (unless that box's ``model_store_lock_allow_http``, a test hub), and
refuses to write anything when the boxes answered one key differently, naming each box's answer. A box whose
fetch goes through the cache needs an entry before it fetches (:func:`cache_fetch_problem`), unless the
inventory says ``gpubox_fleet_cache_trust_first_fetch: true``.

``content_sha256`` pins the content, not only its name: the sha256 of the listing's model id, commit and
every file's path, size and sha256 (hub_listing.content_sha256). Every converge refuses content whose
digest differs, whatever the channel (https hub, http mirror, LAN cache): a hub or cache that publishes
other weights under the locked commit is refused. A revision that is a commit id gets an entry too (its
content pin), written by the first converge that publishes it, as a branch's is. An entry whose
``content_sha256`` is missing or null pins the commit alone: it is refused, naming its line, unless the
inventory says ``gpubox_model_accept_unpinned: true``. The file is parsed strictly (:func:`loads_strict`): a
key given twice in one object is refused naming both lines, never silently shadowed.

Read on the controller (the desired_state lookup, the model_lock module delegated to localhost).
"""

from __future__ import annotations

import contextlib
import json
import json.scanner
import os
import re
from typing import Any
from urllib.parse import urlsplit

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


class Entries(dict):
    """A lock's entries (key -> entry), with the line of each entry's key and of each entry's fields."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lines: dict[str, int] = {}
        self.field_lines: dict[str, dict[str, int]] = {}


class _Object(dict):
    """A JSON object as loads_strict returns it: its keys' lines (1-based) in ``lines``."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, int] = {}


class DuplicateKeyError(ValueError):
    def __init__(self, key: str, line: int, first: int) -> None:
        super().__init__(f"the key {key!r} is given twice in one object, on line {first} and on line {line}")
        self.key, self.line, self.first = key, line, first


_WS = re.compile(r"[ \t\n\r]*")


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _parse_object(
    s_and_end: tuple[str, int], strict: bool, scan_once: Any, _hook: Any, _pairs_hook: Any, _memo: Any = None
) -> tuple[_Object, int]:
    """One JSON object for json.scanner (its parse_object): each key's line kept, a second use of a key
    in the same object refused (DuplicateKeyError), where json.loads would keep the last silently."""
    text, end = s_and_end
    found = _Object()
    end = _WS.match(text, end).end()
    if text[end : end + 1] == "}":
        return found, end + 1
    while True:
        if text[end : end + 1] != '"':
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, end)
        at = end
        key, end = json.decoder.scanstring(text, end + 1, strict)
        if key in found.lines:
            raise DuplicateKeyError(key, _line(text, at), found.lines[key])
        end = _WS.match(text, end).end()
        if text[end : end + 1] != ":":
            raise json.JSONDecodeError("Expecting ':' delimiter", text, end)
        end = _WS.match(text, end + 1).end()
        try:
            value, end = scan_once(text, end)
        except StopIteration as stop:
            raise json.JSONDecodeError("Expecting value", text, stop.value) from None
        found[key], found.lines[key] = value, _line(text, at)
        end = _WS.match(text, end).end()
        if text[end : end + 1] == "}":
            return found, end + 1
        if text[end : end + 1] != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, end)
        end = _WS.match(text, end + 1).end()


def loads_strict(text: str) -> Any:
    """json.loads, but every object keeps its keys' lines and a duplicate key raises DuplicateKeyError
    (a hand edit that shadows a field, e.g. a second content_sha256, is never read as the last one)."""
    decoder = json.JSONDecoder()
    decoder.parse_object = _parse_object  # type: ignore[assignment]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # the pure-Python scanner calls parse_object
    value, end = decoder.raw_decode(text, _WS.match(text, 0).end())
    if _WS.match(text, end).end() != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def parse_lock(text: str, where: str) -> Entries:
    """The entries of a lock file's text ({} for an empty file); LockError when it is not a lock."""
    if not text.strip():
        return Entries()
    try:
        data = loads_strict(text)
    except DuplicateKeyError as exc:
        raise LockError(
            f"the model lock {where} line {exc.line}: {exc}; a second key shadows the first (a hand edit): "
            "revert the file, or remove the entry and run make lock-models"
        ) from exc
    except ValueError as exc:
        raise LockError(
            f"the model lock {where} is not JSON ({exc}): fix it, or delete it and run make lock-models"
        ) from exc
    if not isinstance(data, dict) or data.get("schema") != LOCK_SCHEMA or not isinstance(data.get("models"), dict):
        raise LockError(
            f"the model lock {where} must be a JSON object with schema {LOCK_SCHEMA} and a models mapping: "
            "fix it, or delete it and run make lock-models"
        )
    models = data["models"]
    entries = Entries()
    for key, entry in models.items():
        line = getattr(models, "lines", {}).get(key, 0)
        commit = entry.get("commit") if isinstance(entry, dict) else None
        content = entry.get("content_sha256") if isinstance(entry, dict) else None
        if content is not None and not is_sha256(content):
            raise LockError(
                f"the model lock {where} line {line}: entry {key!r} has content_sha256 {content!r}, not 64 lower-case "
                "hex digits: revert the file, or remove the entry and run make lock-models"
            )
        if "@" not in str(key) or not is_commit(commit):
            raise LockError(
                f"the model lock {where} line {line} has an unusable entry {key!r}: each key is OWNER/NAME@REVISION "
                "and each entry a commit of 40 hex digits read from the hub; remove it and run make lock-models"
            )
        revision = str(key).rpartition("@")[2]
        if is_commit(revision) and commit != revision:
            raise LockError(
                f"the model lock {where} line {line}: the entry {key!r} is for the commit {revision} but holds the "
                f"commit {commit}: revert the file, or remove the entry and run make lock-models"
            )
        entries[str(key)] = dict(entry)
        entries.lines[str(key)] = line
        entries.field_lines[str(key)] = dict(getattr(entry, "lines", {}))
    return entries


def unpinned_problem(
    entries: dict[str, dict[str, Any]], model_id: str, revision: str, accept_unpinned: bool, where: str
) -> str | None:
    """The refusal of model_id@revision's entry when it pins no content (content_sha256 missing or null),
    naming its line; None when it pins content, has no entry (the first converge records one) or the
    inventory accepts an unpinned model (gpubox_model_accept_unpinned)."""
    key = lock_key(model_id, revision)
    entry = entries.get(key)
    if entry is None or entry.get("content_sha256") is not None or accept_unpinned:
        return None
    fields = getattr(entries, "field_lines", {}).get(key, {})
    if "content_sha256" in entry:
        line, lost = fields.get("content_sha256", 0), "content_sha256 is null"
    else:
        line, lost = getattr(entries, "lines", {}).get(key, 0), "it has no content_sha256"
    return (
        f"the model lock {where} line {line}: the entry {key!r} pins the commit {entry.get('commit')} but not its "
        f"content ({lost}), so a hub or LAN cache could serve other files under that commit. Re-resolve it on "
        "purpose from the https hub (make lock-models writes its content_sha256), revert the file to a version "
        "that has it, or set gpubox_model_accept_unpinned: true to serve the commit without a content pin"
    )


def read_lock(path: str) -> Entries:
    """The entries of the lock file at path; {} when it does not exist."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return Entries()
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


def cache_fetch_problem(
    entries: dict[str, dict[str, Any]], model_id: str, revision: str, cache_url: str | None, trust: bool, where: str
) -> str | None:
    """The refusal of a fetch of model_id@revision through the LAN cache (cache_url) with no lock entry for it:
    the box would take whatever listing the cache serves, commit and content alike, as its first pin. None
    without a cache, with an entry, or when the inventory trusts the cache's first answer (``trust``)."""
    if not cache_url or trust or lock_key(model_id, revision) in entries:
        return None
    lock = f"the model lock {where}" if where else "no model lock (gpubox_model_lock_file is empty)"
    return (
        f"gpubox_fleet_cache_url is {cache_url} and {lock} has no entry for {lock_key(model_id, revision)}: the "
        "box's fetch through the LAN cache would trust the first listing the cache serves (the commit and every "
        "file's sha256), and the cache is never trusted. Nothing was changed. Run `make lock-models` first (it "
        "asks the hub, model_store_endpoint, over verified TLS, never the cache), or set "
        "gpubox_fleet_cache_trust_first_fetch: true to accept the cache's first answer on purpose"
    )


def _where(item: dict[str, Any]) -> str:
    return f"box {item.get('host') or '?'}"


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port made explicit, for comparing two spellings of one server."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    except ValueError:
        return (url, "", None)
    return (parts.scheme.lower(), (parts.hostname or "").lower(), port)


def _is_true(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "1")


def check_source(item: dict[str, Any], key: str) -> None:
    """An answer may be locked only when it came from the hub itself over https (verified TLS: the listing's
    fetch checks the certificate), never through the LAN cache (``cache_endpoint``, the cache the box
    uses); plain http only where the box allows it (``allow_http``: model_store_lock_allow_http, a test hub)."""
    endpoint = str(item.get("endpoint") or "").strip().rstrip("/")
    cache = str(item.get("cache_endpoint") or "").strip().rstrip("/")
    if cache and _origin(endpoint) == _origin(cache):
        raise LockError(
            f"the answer for {key} ({_where(item)}) came through the LAN cache {cache}: a model lock is written only "
            "from the hub over verified TLS, never from the cache, and nothing was written. Run make lock-models, "
            "which asks the hub (model_store_endpoint) directly"
        )
    scheme = urlsplit(endpoint).scheme.lower()
    if scheme != "https" and not (scheme == "http" and _is_true(item.get("allow_http"))):
        raise LockError(
            f"the answer for {key} ({_where(item)}) came from {endpoint or 'an endpoint it does not name'}, not an "
            "https hub: a model lock is written only from the hub over verified TLS, and nothing was written. Set "
            "model_store_endpoint to the https hub (model_store_lock_allow_http: true is for a test hub only)"
        )


def check_agreement(resolved: list[dict[str, Any]]) -> None:
    """Refuse, writing nothing, when the boxes answered one key with more than one commit or content: which
    answer would be locked is then an accident of order. Names each answer, its boxes and its endpoint."""
    answers: dict[str, dict[tuple[Any, Any], list[dict[str, Any]]]] = {}
    for item in resolved:
        key = lock_key(str(item.get("model_id")), str(item.get("revision")))
        answer = (item.get("commit"), item.get("content_sha256") or None)
        answers.setdefault(key, {}).setdefault(answer, []).append(item)
    for key, found in sorted(answers.items()):
        if len(found) < 2:
            continue
        said = "; ".join(
            _answer_text(commit, content, items)
            for (commit, content), items in sorted(found.items(), key=lambda kv: str(kv[0]))
        )
        raise LockError(
            f"the boxes disagree on {key}, so nothing was written: {said}. The hub moved while they asked, or they "
            "ask different hubs (model_store_endpoint): re-run make lock-models, or lock from one box (LIMIT=box), "
            "and check the endpoints"
        )


def _answer_text(commit: Any, content: Any, items: list[dict[str, Any]]) -> str:
    boxes = ", ".join(sorted(str(i.get("host") or "?") for i in items))
    endpoints = ", ".join(sorted({str(i.get("endpoint") or "?") for i in items}))
    return f"{boxes} got commit {commit} (content_sha256 {content or 'none'}, from {endpoints})"


def merge_lock(
    entries: dict[str, dict[str, Any]], resolved: list[dict[str, Any]], replace: bool
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """entries with each resolved {model_id, revision, commit, endpoint, content_sha256, files, total_bytes,
    host, cache_endpoint, allow_http} added (or, with replace, updated); returns the new entries and the keys
    that changed. A commit revision is locked for its content only; a resolved commit that is not a commit id
    (a listing that named none) is refused, and so is a content digest that is not 64 hex digits, an answer
    that did not come from the hub over https (check_source) and boxes that disagree (check_agreement)."""
    out = {k: dict(v) for k, v in entries.items()}
    changed = []
    lockable = []
    for item in resolved:
        model_id, revision = item.get("model_id"), item.get("revision")
        if not isinstance(model_id, str) or not isinstance(revision, str):
            continue
        if is_commit(revision) and not item.get("content_sha256"):
            continue  # a commit revision needs an entry only to pin its content
        check_source(item, lock_key(model_id, revision))
        lockable.append(item)
    check_agreement(lockable)
    for item in lockable:
        model_id, revision, commit = item["model_id"], item["revision"], item.get("commit")
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
        entry = {"commit": commit, "endpoint": str(item.get("endpoint") or "").strip().rstrip("/")}
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
