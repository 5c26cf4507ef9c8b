"""The hub's file listing: the one place where what a hub, mirror or LAN cache sends becomes a value.

Trust boundary (design.md, Trust boundaries): every field of a listing is hostile input. Nothing from
the wire reaches a path, an argv, a unit property or a header except through the checked types made
here: :func:`check_commit`, :func:`check_path`, :func:`check_size`, :func:`check_sha256`, gathered in
a :class:`Listing`. A value that fails its check refuses the whole listing (ListingError, naming the
field and the fix) before the store changes anything.

The formats, with their sources:
- commit: a git commit id of the model repository, 40 lower-case hex digits. ModelScope's listing
  (``GET /api/v1/models/{owner}/{name}/repo/files``) gives it per file as ``Revision``
  (docs/facts.md, "ModelScope"); model repositories there are git repositories, whose
  SHA-1 object ids are 40 hex digits (git's ``git rev-parse`` prints them lower-case). Every file
  entry must name one and the same commit, and for a commit revision the commit asked for: a listing
  that names none (``Revision`` missing, null or empty), several, or another is refused whole, since
  the commit is what the model lock and the box's content pins are keyed by.
- path: relative, normalized (no empty, ``.`` or ``..`` component, no leading or trailing ``/``), no
  backslash, NUL, newline or any other control character, valid UTF-8, at most 255 bytes a component
  and 1024 characters in all, unique also when case is folded (a case-insensitive copy or mirror
  must not merge two files), no file that is also a directory of another, and nothing the store or
  the client keeps for itself (the manifest, the client's home and bookkeeping, partial files).
- size: a non-negative int (a JSON ``true`` is not a size).
- sha256: 64 lower-case hex digits.
- nesting: a listing is an object whose Data.Files list holds flat objects, 4 levels deep at most (the
  test hub's and ModelScope's answers); any text nesting arrays or objects more than MAX_LISTING_DEPTH
  deep is refused before it is decoded (json's recursive decoder would otherwise raise RecursionError
  on, say, 100,000 nested lists).

Runs on the managed host (Python >= 3.10).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import unicodedata
import urllib.error
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.urls import ConnectionError as UrlConnectionError
from ansible.module_utils.urls import open_url

from ansible_collections.gpubox.gpubox.plugins.module_utils.model_errors import ListingError, ModelStoreError
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_manifest import MANIFEST_NAME, RemoteFile

COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PARTIAL_SUFFIX = ".incomplete"  # the modelscope client's name for a partly received file
CLIENT_DIR = ".gpubox-client"  # inside a staging dir: the client's HOME and cache, never published
# What the modelscope client writes beside the files in its local_dir (metadata, partial downloads).
CLIENT_BOOKKEEPING = (".msc", ".mv", "._____temp", ".mdl")
MAX_PATH_CHARS = 1024
MAX_COMPONENT_BYTES = 255
MAX_FILE_BYTES = 1 << 50  # 1 PiB: no model file is larger; a bigger "size" is a hostile or broken hub
MAX_FILES = 100_000
_RESERVED_TOP = {CLIENT_DIR, *CLIENT_BOOKKEEPING}


def is_commit(value: Any) -> bool:
    return isinstance(value, str) and bool(COMMIT_RE.match(value))


def check_commit(value: Any, where: str) -> str:
    if not is_commit(value):
        raise ListingError(
            f"{where} names the commit {value!r}, not a commit id (40 lower-case hex digits): "
            "the hub, mirror or cache is broken or hostile; nothing was changed. Check model_store_endpoint "
            "(or the LAN cache gpubox_fleet_cache_url) and re-run"
        )
    return value


def _controls(text: str) -> list[str]:
    return sorted({f"U+{ord(c):04X}" for c in text if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")})


def check_path(value: Any, where: str) -> str:
    """A listed path the store may create under staging and publish, or ListingError saying why not."""

    def bad(why: str) -> ListingError:
        return ListingError(
            f"{where} names an unusable path {value!r}: {why}. Nothing was changed; the hub, mirror or cache "
            "(model_store_endpoint / gpubox_fleet_cache_url) is broken or hostile"
        )

    if not isinstance(value, str) or not value:
        raise bad("not a non-empty string")
    if len(value) > MAX_PATH_CHARS:
        raise bad(f"longer than {MAX_PATH_CHARS} characters")
    if controls := _controls(value):
        raise bad(f"control or format characters {', '.join(controls)}")
    if "\\" in value:
        raise bad("a backslash")
    try:
        parts = [p.encode("utf-8") for p in value.split("/")]
    except UnicodeEncodeError:
        raise bad("not valid UTF-8") from None
    if value.startswith("/") or any(p in (b"", b".", b"..") for p in parts):
        raise bad("not a normalized relative path (an empty, '.' or '..' component, or a leading '/')")
    if any(len(p) > MAX_COMPONENT_BYTES for p in parts):
        raise bad(f"a component longer than {MAX_COMPONENT_BYTES} bytes")
    leaf = value.rsplit("/", 1)[-1]
    if value.split("/")[0] in _RESERVED_TOP or leaf == MANIFEST_NAME or leaf.endswith(PARTIAL_SUFFIX):
        raise bad("a name the store or its client keeps for itself")
    return value


def check_size(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_FILE_BYTES:
        raise ListingError(f"{where} has no valid Size ({value!r}): it must be an integer from 0 to {MAX_FILE_BYTES}")
    return value


def check_sha256(value: Any, where: str) -> str:
    if not isinstance(value, str) or not SHA256_RE.match(value):
        raise ListingError(
            f"{where} has no sha256 of 64 lower-case hex digits ({value!r}); it cannot be verified. "
            "Use a hub or mirror that lists each file's Sha256"
        )
    return value


def check_tree(paths: Iterable[str], where: str) -> None:
    """No two paths equal when case is folded, and no file that is also another file's directory."""
    seen: dict[str, str] = {}
    files = set(paths)
    for path in sorted(files):
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if depth < len(parts) and prefix in files:
                raise ListingError(f"{where} lists {prefix!r} both as a file and as the directory of {path!r}")
            folded = unicodedata.normalize("NFC", prefix).casefold()
            if seen.setdefault(folded, prefix) != prefix:
                raise ListingError(
                    f"{where} lists {seen[folded]!r} and {prefix!r}, one name when case is folded: a copy on a "
                    "case-insensitive file system or mirror would merge them. Nothing was changed"
                )


@dataclass(frozen=True)
class Listing:
    model_id: str
    revision: str  # what was asked for: a branch, tag or commit
    commit: str  # what the hub resolved it to (checked), or the store's content id
    files: tuple[RemoteFile, ...]

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def content_sha256(self) -> str:
        return content_sha256(self.model_id, self.commit, self.files)


def content_sha256(model_id: str, commit: str, files: Iterable[RemoteFile]) -> str:
    """What the model lock pins: sha256 over the canonical JSON of the model id, the commit and every
    file's path, size and sha256 (the manifest's content, without the channel it came over)."""
    body = {
        "model_id": model_id,
        "commit": commit,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in sorted(files, key=lambda f: f.path)],
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


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
    """Turn the hub's repo/files answer into a Listing of checked values, or refuse it whole."""
    where = f"the hub listing of {model_id}@{revision}"
    if not isinstance(payload, dict):
        raise ListingError(f"{where} is not a JSON object")
    if payload.get("Success") is False or payload.get("Code") not in (None, 200, "200"):
        message = payload.get("Message") or payload.get("Code")
        raise ListingError(f"{where} was refused: {str(message)[:200]!r}")
    data = payload.get("Data")
    entries = data.get("Files") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ListingError(f"{where} has no Data.Files list")
    if len(entries) > MAX_FILES:
        raise ListingError(f"{where} lists {len(entries)} entries, more than {MAX_FILES}")
    files: list[RemoteFile] = []
    commits: set[str] = set()
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ListingError(f"{where}: entry {n} is not a JSON object")
        kind = entry.get("Type", "blob")
        if kind not in ("blob", "tree"):
            raise ListingError(f"{where}: entry {n} has an unknown Type {kind!r} (blob or tree)")
        if kind == "tree":
            if entry.get("Revision") not in (None, ""):
                commits.add(check_commit(entry["Revision"], f"{where} (entry {n})"))
            continue
        if entry.get("Revision") in (None, ""):
            raise ListingError(
                f"{where}: entry {n} ({str(entry.get('Path'))[:120]!r}) names no commit (its Revision is "
                f"{entry.get('Revision')!r}): content that no commit names cannot be pinned, so the listing is "
                "refused and nothing was changed. The hub, mirror or cache (model_store_endpoint / "
                "gpubox_fleet_cache_url) is broken or hostile: point it at the hub itself"
            )
        commits.add(check_commit(entry["Revision"], f"{where} (entry {n})"))
        path = check_path(entry.get("Path"), where)
        size = check_size(entry.get("Size"), f"{where}: {path}")
        sha = check_sha256(entry.get("Sha256"), f"{where}: {path}")
        files.append(RemoteFile(path, size, sha))
    if not files:
        raise ListingError(f"{where} lists no files: check model_id and revision")
    if len({f.path for f in files}) != len(files):
        raise ListingError(f"{where} lists a path twice")
    check_tree((f.path for f in files), where)
    if is_commit(revision) and commits - {revision}:
        raise ListingError(
            f"{where} answers with commit(s) {', '.join(sorted(commits - {revision}))}, not the commit asked for: "
            "the hub, mirror or cache is broken or hostile; nothing was changed"
        )
    if len(commits) != 1:
        raise ListingError(
            f"{where} names {len(commits)} commits ({', '.join(sorted(commits))}) for one revision: a listing is "
            "one commit's files, so the hub, mirror or cache is broken or hostile; nothing was changed"
        )
    return Listing(model_id, revision, commits.pop(), tuple(sorted(files, key=lambda f: f.path)))


MAX_LISTING_BYTES = 64 << 20
MAX_LISTING_DEPTH = 32  # a listing nests 4 deep; 32 leaves room for any field a hub adds
# A JSON string (escapes included), whose brackets are text, not nesting; and every byte that is not a bracket.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_INNERMOST = re.compile(rb"\[\]|\{\}")  # one scan removes every innermost pair, never a pair it uncovers


def nesting_over(body: bytes, limit: int) -> bool:
    """True when the JSON text ``body`` nests arrays or objects more than ``limit`` deep. Without decoding
    anything: the strings are dropped, then everything but the brackets; each pass removes the innermost
    pairs, one level (a linear scan in C, at most ``limit`` of them). Unbalanced text is not called deep
    (json says what is wrong with it)."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    for _level in range(limit):
        if not brackets:
            return False
        inner = _INNERMOST.sub(b"", brackets)
        if inner == brackets:
            return False
        brackets = inner
    return bool(brackets)


def loads_listing(body: bytes, where: str) -> Any:
    """The decoded JSON of a listing's body, or ListingError naming ``where`` (never a RecursionError)."""
    if nesting_over(body, MAX_LISTING_DEPTH):
        raise ListingError(
            f"{where} nests arrays or objects more than {MAX_LISTING_DEPTH} deep: not a listing (a listing nests 4 "
            "deep), so it is refused before it is decoded and nothing was changed. The hub, mirror or cache "
            "(model_store_endpoint / gpubox_fleet_cache_url) is broken or hostile"
        )
    return json.loads(body.decode("utf-8"))


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
            validate_certs=True,  # https: the hub's certificate is checked (the model lock trusts no other)
            use_netrc=False,
            follow_redirects="none",  # a listing comes from the endpoint itself, never from elsewhere
        )
        with contextlib.closing(response):
            body = response.read(MAX_LISTING_BYTES + 1)
        if len(body) > MAX_LISTING_BYTES:
            raise ListingError(f"GET {url} answered more than {MAX_LISTING_BYTES} bytes: not a listing")
        payload = loads_listing(body, f"GET {url}")
    except urllib.error.HTTPError as exc:
        raise ListingError(
            f"GET {url} answered HTTP {exc.code}: check model_id {model_id!r} and revision {revision!r}"
            + (
                " (a redirect: a listing is never followed elsewhere; point the endpoint at the hub itself)"
                if 300 <= exc.code < 400
                else ""
            )
        ) from exc
    except (urllib.error.URLError, UrlConnectionError, OSError) as exc:
        raise ListingError(f"GET {url} failed ({exc}): check the endpoint and the network") from exc
    except ValueError as exc:
        raise ListingError(f"GET {url} did not return JSON ({exc})") from exc
    return parse_listing(payload, model_id, revision)
