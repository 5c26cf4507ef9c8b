#!/usr/bin/env python3
"""A ModelScope-compatible test hub that serves one model directory over HTTP (stdlib only).

    python3 server.py MODEL_DIR --model-id OWNER/NAME [--bind 127.0.0.1] [--port 0]
                      [--port-file F] [--log F] [--faults-file F] [--revision master]
                      [--commit-dir DIR ...] [--branch-file F] [--also OWNER/NAME=DIR ...]
                      [--tls-cert CERT.pem --tls-key KEY.pem]

It answers the requests the real `modelscope` client makes (docs/facts.md, "ModelScope"):
    GET  /api/v1/models/{owner}/{name}                        model info
    GET  /api/v1/models/{owner}/{name}/revisions              branches and tags (legacy client)
    GET  /api/v1/models/{owner}/{name}/repo/files?Revision=R  listing: Name Path Type Size Sha256 Revision
    GET  /api/v1/models/{owner}/{name}/repo?Revision=R&FilePath=P   file bytes, Range -> 206 + Content-Range
    HEAD (the same four)
    GET  /api/v1/repos/internalAccelerationInfo               404: no intra-cloud acceleration here

The model is served at the branch name given by --revision and at a commit id derived from the
files' hashes (so it changes exactly when the content changes). Each --commit-dir is another commit
of the same model (another directory of files), served at its own commit id. The branch points at
MODEL_DIR's commit, or at the commit id written in --branch-file (re-read whenever its mtime
changes): writing another commit id there is an upstream push that moves the branch. Each --also is
another model at the same endpoint (a hub serves many: a speculative draft beside the model), one commit
of DIR's files at the same branch name. Files are hashed once at start; do not change the directories
while the hub runs.

Fault injection, for tests (simulated network and storage faults):
    POST /_faults  {"drop_after_bytes": {"model.safetensors": 100000}}
        the next GET of that file sends 100000 body bytes, then closes the connection;
        {"model.safetensors": {"bytes": 100000, "times": 3}} does it for the next 3 GETs.
    POST /_faults  {"corrupt": {"model.safetensors": true}}
        serves that file with one byte flipped (at the middle of the file) until cleared, while the
        listing keeps the true sha256.
    POST /_faults  {"extra_files": {"after": 1, "files": {"../../x": "text", "/abs/y": "text"}}}
        a hostile hub: every listing after the first `after` ones also names these files (with their
        true size and sha256) and serves their text; the first listing(s) stay honest.
    POST /_faults  {"throttle": {"model.safetensors": 500000}}
        serves that file at about 500000 bytes per second (a slow link: downloads last long enough
        to be interrupted on purpose).
    POST /_faults  {"listing_fields": {"*": {"Revision": "p/../../x"}, "config.json": {"Size": true}}}
        sets fields of listed entries ("*": every blob) to hostile values: a hostile hub's listing.
    POST /_faults  {"listing_depth": 100000}
        the listing's Data also holds a field nesting that many lists (written as text: json would
        itself recurse), as a hostile hub or cache could send.
    POST /_faults  {"redirect": true}
        serves every file as ModelScope does for large ones: the /repo request answers 302 with a
        Location on a "storage" path of this server, /_storage/<commit>/<path>?Expires=..&Signature=..,
        whose query differs on every request (as presigned URLs do); the storage path serves the bytes
        (Range, and the faults above, apply there). A cache must follow it and key by the request.
    POST /_faults  {}            clears every fault.      GET /_faults   shows the current ones.
The same JSON may be written to the --faults-file; it is re-read whenever its mtime changes, and
removing the file clears every fault.

Every request is appended to --log as one JSON object per line:
    {"method", "path", "range", "status", "sent", "fault"}
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import ssl
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

BLOCK = 64 * 1024
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".msgpack", ".h5")


@dataclass(frozen=True)
class HubFile:
    path: str  # posix, relative to the model directory
    disk: Path
    size: int
    sha256: str


@dataclass(frozen=True)
class HubModel:
    """One commit of the model: its id and its files."""

    owner: str
    name: str
    branch: str
    commit: str
    files: dict[str, HubFile]

    def knows_revision(self, revision: str | None) -> bool:
        return revision in (None, "", self.branch, self.commit)


class HubRepo:
    """Every commit the hub serves of one model, and the commit its branch points at (movable)."""

    def __init__(self, commits: list[HubModel], branch_file: Path | None) -> None:
        self.commits = {m.commit: m for m in commits}
        self.default = commits[0].commit
        self.branch_file, self.mtime, self.head = branch_file, None, self.default
        self.lock = threading.Lock()

    @property
    def first(self) -> HubModel:
        return self.commits[self.default]

    def branch_head(self) -> str:
        """The commit the branch points at now (the branch file's, when it names a known commit)."""
        with self.lock:
            if self.branch_file is not None:
                try:
                    mtime = self.branch_file.stat().st_mtime_ns
                except FileNotFoundError:
                    mtime = None
                if mtime != self.mtime:
                    self.mtime = mtime
                    wanted = self.branch_file.read_text().strip() if mtime is not None else ""
                    self.head = wanted if wanted in self.commits else self.default
            return self.head

    def resolve(self, revision: str | None) -> HubModel | None:
        """The commit a revision names: the branch (or no revision) -> its head; a known commit id."""
        if revision in (None, "", self.first.branch):
            return self.commits[self.branch_head()]
        return self.commits.get(revision or "")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def commit_id(files: dict[str, HubFile]) -> str:
    """A 40-hex id derived from every path and hash, like a git commit id in length."""
    digest = hashlib.sha1(usedforsecurity=False)
    for path in sorted(files):
        digest.update(f"{path}\0{files[path].sha256}\n".encode())
    return digest.hexdigest()


def load_model(model_dir: Path, model_id: str, branch: str) -> HubModel:
    if not model_dir.is_dir():
        raise SystemExit(f"MODEL_DIR {model_dir} is not a directory: pass a directory made by make_tiny_model.py")
    owner, sep, name = model_id.partition("/")
    if not sep or not owner or not name or "/" in name:
        raise SystemExit(f"--model-id {model_id!r} must look like OWNER/NAME")
    files: dict[str, HubFile] = {}
    for disk in sorted(model_dir.rglob("*")):
        rel = disk.relative_to(model_dir).as_posix()
        if disk.is_file() and not any(part.startswith(".") for part in rel.split("/")):
            files[rel] = HubFile(rel, disk, disk.stat().st_size, sha256_of(disk))
    if not files:
        raise SystemExit(f"MODEL_DIR {model_dir} holds no files to serve")
    return HubModel(owner, name, branch, commit_id(files), files)


def listing(model: HubModel) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    trees: set[str] = set()
    for f in model.files.values():
        parts = f.path.split("/")
        trees.update("/".join(parts[:i]) for i in range(1, len(parts)))
        entries.append(
            {
                "Name": parts[-1],
                "Path": f.path,
                "Type": "blob",
                "Size": f.size,
                "Sha256": f.sha256,
                "Revision": model.commit,
                "IsLFS": f.path.endswith(LFS_SUFFIXES),
                "Mode": "100644",
            }
        )
    for tree in sorted(trees):
        entries.append(
            {
                "Name": tree.split("/")[-1],
                "Path": tree,
                "Type": "tree",
                "Size": 0,
                "Sha256": "",
                "Revision": model.commit,
            }
        )
    return entries


def parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """(start, end inclusive) for one satisfiable byte range; None: no/ignored range; "416": unsatisfiable."""
    if not header:
        return None
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if not m or (not m.group(1) and not m.group(2)):
        return None  # multi-range or malformed: RFC 9110 lets a server ignore it and send 200
    if not m.group(1):  # suffix range: the last N bytes
        n = int(m.group(2))
        if n == 0:
            return "416"
        return (max(0, size - n), size - 1)
    start = int(m.group(1))
    end = int(m.group(2)) if m.group(2) else size - 1
    if start >= size or end < start:
        return "416"
    return (start, min(end, size - 1))


@dataclass
class Faults:
    """Runtime fault switches; every access goes through the lock."""

    drops: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> {"bytes", "times"}
    corrupt: set[str] = field(default_factory=set)
    extra: dict[str, bytes] = field(default_factory=dict)  # path -> content, listed after `extra_after`
    extra_after: int = 0
    throttle: dict[str, int] = field(default_factory=dict)  # path -> bytes per second
    redirect: bool = False  # files answered with a 302 to the storage path
    listing_fields: dict[str, dict[str, Any]] = field(default_factory=dict)  # path or "*" -> fields to set
    listing_depth: int = 0  # lists nested in the listing's Data (0: none)
    listings: int = 0  # listings served since the faults were last set
    lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def parse_extra(spec: Any) -> tuple[dict[str, bytes], int]:
        rule = spec.get("extra_files") or {}
        after, files = rule.get("after", 1), rule.get("files", {})
        if not isinstance(after, int) or after < 0 or not isinstance(files, dict):
            raise ValueError(f"extra_files needs after >= 0 and a files mapping, got {rule!r}")
        return {str(k): str(v).encode() for k, v in files.items()}, after

    @staticmethod
    def parse(spec: Any) -> tuple[dict[str, dict[str, int]], set[str]]:
        if not isinstance(spec, dict):
            raise ValueError("the fault spec must be a JSON object")
        known = {"drop_after_bytes", "corrupt", "extra_files", "throttle", "redirect", "listing_fields"}
        known.add("listing_depth")
        if unknown := set(spec) - known:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(sorted(known))}")
        depth = spec.get("listing_depth", 0)
        if not isinstance(depth, int) or isinstance(depth, bool) or not 0 <= depth <= 10_000_000:
            raise ValueError(f"listing_depth must be a number of nested lists from 0 to 10000000, got {depth!r}")
        if not isinstance(spec.get("redirect", False), bool):
            raise ValueError(f"redirect must be true or false, got {spec.get('redirect')!r}")
        drops: dict[str, dict[str, int]] = {}
        for path, value in (spec.get("drop_after_bytes") or {}).items():
            rule = value if isinstance(value, dict) else {"bytes": value}
            nbytes, times = rule.get("bytes"), rule.get("times", 1)
            if not isinstance(nbytes, int) or nbytes < 0 or not isinstance(times, int) or times < 1:
                raise ValueError(f"drop_after_bytes[{path!r}] needs bytes >= 0 and times >= 1, got {value!r}")
            drops[path] = {"bytes": nbytes, "times": times}
        corrupt = {path for path, on in (spec.get("corrupt") or {}).items() if on}
        return drops, corrupt

    def replace(self, spec: Any) -> None:
        drops, corrupt = self.parse(spec)
        extra, after = self.parse_extra(spec)
        throttle = spec.get("throttle") or {}
        if not all(isinstance(v, int) and v > 0 for v in throttle.values()):
            raise ValueError(f"throttle needs positive bytes per second, got {throttle!r}")
        with self.lock:
            self.drops, self.corrupt, self.throttle = drops, corrupt, dict(throttle)
            self.extra, self.extra_after, self.listings = extra, after, 0
            self.redirect = bool(spec.get("redirect", False))
            self.listing_fields = {str(k): dict(v) for k, v in (spec.get("listing_fields") or {}).items()}
            self.listing_depth = spec.get("listing_depth", 0)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "drop_after_bytes": {p: dict(r) for p, r in self.drops.items()},
                "corrupt": {p: True for p in sorted(self.corrupt)},
                "throttle": dict(self.throttle),
                "redirect": self.redirect,
                "listing_fields": {p: dict(v) for p, v in self.listing_fields.items()},
                "listing_depth": self.listing_depth,
                "extra_files": {"after": self.extra_after, "files": {p: v.decode() for p, v in self.extra.items()}},
            }

    def take_listing_extras(self) -> dict[str, bytes]:
        """The hostile entries for this listing (none for the first `extra_after` listings)."""
        with self.lock:
            self.listings += 1
            return dict(self.extra) if self.listings > self.extra_after else {}

    def extra_content(self, path: str) -> bytes | None:
        with self.lock:
            return self.extra.get(path)

    def take_drop(self, path: str) -> int | None:
        """Byte count after which this response is cut, consuming one use of the rule."""
        with self.lock:
            rule = self.drops.get(path)
            if rule is None:
                return None
            rule["times"] -= 1
            if rule["times"] <= 0:
                del self.drops[path]
            return rule["bytes"]

    def rate(self, path: str) -> int | None:
        with self.lock:
            return self.throttle.get(path)

    def redirects(self) -> bool:
        with self.lock:
            return self.redirect

    def is_corrupt(self, path: str) -> bool:
        with self.lock:
            return path in self.corrupt


class FaultsFile:
    """Reloads Faults from a JSON file whenever its mtime changes."""

    def __init__(self, path: Path | None, faults: Faults) -> None:
        self.path, self.faults, self.mtime = path, faults, None
        self.lock = threading.Lock()

    def refresh(self) -> None:
        if self.path is None:
            return
        with self.lock:
            try:
                mtime = self.path.stat().st_mtime_ns
            except FileNotFoundError:
                # Removed: no faults any more (a test makes the hub honest again by deleting the file).
                if self.mtime is not None:
                    self.faults.replace({})
                    self.mtime = None
                return
            if mtime != self.mtime:
                self.faults.replace(json.loads(self.path.read_text() or "{}"))
                self.mtime = mtime


class RequestLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.lock = threading.Lock()

    def write(self, entry: dict[str, Any]) -> None:
        line = json.dumps(entry, sort_keys=True)
        with self.lock:
            if self.path is None:
                print(line, file=sys.stderr, flush=True)
            else:
                with self.path.open("a", encoding="utf-8") as fh:
                    fh.write(line + "\n")


def ok(data: Any) -> dict[str, Any]:
    return {"Code": 200, "Success": True, "Message": "success", "RequestId": "gpubox-test-hub", "Data": data}


def error(code: int, message: str) -> dict[str, Any]:
    return {"Code": code, "Success": False, "Message": message, "RequestId": "gpubox-test-hub"}


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "gpubox-test-hub/1"
    # set on the class by make_server()
    repo: HubRepo
    others: dict[tuple[str, str], HubRepo]  # --also: more models at the same endpoint, by (owner, name)
    faults: Faults
    faults_file: FaultsFile
    request_log: RequestLog

    def log_message(self, format: str, *args: Any) -> None:
        pass  # replaced by the JSON request log

    # -- plumbing ---------------------------------------------------------------------------------
    def _log(self, status: int, sent: int = 0, fault: str | None = None) -> None:
        self.request_log.write(
            {
                "time": round(time.time(), 3),
                "method": self.command,
                "path": self.path,
                "range": self.headers.get("Range"),
                "status": status,
                "sent": sent,
                "fault": fault,
            }
        )

    def _json(self, status: int, body: Any, head: bool = False) -> None:
        self._raw_json(status, json.dumps(body).encode(), head)

    def _raw_json(self, status: int, raw: bytes, head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if not head:
            self.wfile.write(raw)
        self._log(status, 0 if head else len(raw))

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # -- verbs ------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_POST(self) -> None:
        body = self._read_body()
        if urlsplit(self.path).path != "/_faults":
            return self._json(404, error(404, f"no POST route for {self.path}"))
        try:
            self.faults.replace(json.loads(body or b"{}"))
        except (ValueError, json.JSONDecodeError) as exc:
            return self._json(400, error(400, str(exc)))
        return self._json(200, self.faults.snapshot())

    def _dispatch(self, head: bool) -> None:
        self.faults_file.refresh()
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path == "/_faults":
            return self._json(200, self.faults.snapshot(), head)
        if url.path == "/_health":
            commits = sorted(self.repo.commits)
            return self._json(200, ok({"commit": self.repo.branch_head(), "commits": commits}), head)
        storage = re.fullmatch(r"/_storage/([0-9a-f]{40})/(.+)", url.path)
        if storage:  # the simulated storage host a redirected file points at
            model = next((r.commits[storage.group(1)] for r in self._repos() if storage.group(1) in r.commits), None)
            if model is None:
                return self._json(404, error(404, f"no commit {storage.group(1)} in storage"), head)
            return self._send_file(model, unquote(storage.group(2)), head, redirected=True)
        if url.path == "/api/v1/repos/internalAccelerationInfo":
            return self._json(404, error(404, "no acceleration in the test hub"), head)
        m = re.fullmatch(r"/api/v1/models/([^/]+)/([^/]+)(/revisions|/repo/files|/repo)?", url.path)
        if not m:
            return self._json(404, error(404, f"unknown path {url.path}"), head)
        repo = next((r for r in self._repos() if (r.first.owner, r.first.name) == (m.group(1), m.group(2))), None)
        if repo is None:
            return self._json(404, error(10010205001, f"model {m.group(1)}/{m.group(2)} not found"), head)
        revision = query.get("Revision")
        model = repo.resolve(revision)
        if model is None or not model.knows_revision(revision):
            return self._json(404, error(10010205001, f"revision {revision} not found"), head)
        kind = m.group(3)
        if kind is None:
            info = {"Id": 1, "Path": model.owner, "Name": model.name, "Revision": model.branch}
            return self._json(200, ok(info), head)
        if kind == "/revisions":
            branch = {"Revision": model.branch, "CommitId": model.commit, "CreatedAt": int(time.time())}
            return self._json(200, ok({"RevisionMap": {"Branches": [branch], "Tags": []}}), head)
        if kind == "/repo/files":
            files = listing(model)
            fields = self.faults.snapshot().get("listing_fields") or {}
            for entry in files:  # simulated hostile hub: fields set to what the test asks
                if entry["Type"] == "blob":
                    entry.update(fields.get("*", {}))
                    entry.update(fields.get(entry["Path"], {}))
            for path, content in self.faults.take_listing_extras().items():  # simulated hostile hub
                files.append(
                    {
                        "Name": path.rsplit("/", 1)[-1],
                        "Path": path,
                        "Type": "blob",
                        "Size": len(content),
                        "Sha256": hashlib.sha256(content).hexdigest(),
                        "Revision": model.commit,
                    }
                )
            depth = self.faults.snapshot()["listing_depth"]
            if depth:  # simulated hostile hub: the nesting is text, spliced in (json.dumps would recurse)
                raw = json.dumps(ok({"Files": files, "LatestCommitter": {}, "Nested": None}))
                nested = "[" * depth + "]" * depth
                return self._raw_json(200, raw.replace('"Nested": null', f'"Nested": {nested}', 1).encode(), head)
            return self._json(200, ok({"Files": files, "LatestCommitter": {}}), head)
        return self._send_file(model, query.get("FilePath", ""), head)

    def _repos(self) -> list[HubRepo]:
        return [self.repo, *self.others.values()]

    def _send_extra(self, content: bytes, head: bool) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if not head:
            self.wfile.write(content)
        self._log(200, 0 if head else len(content), "extra_files")

    def _send_file(self, model: HubModel, file_path: str, head: bool, redirected: bool = False) -> None:
        extra = self.faults.extra_content(file_path)
        if extra is not None:
            return self._send_extra(extra, head)
        f = model.files.get(file_path)
        if f is None:
            return self._json(404, error(10010205001, f"file {file_path!r} not found"), head)
        if not redirected and self.faults.redirects():
            # Like a presigned storage URL: another query on every request for the same file.
            query = urlencode({"Expires": int(time.time()) + 3600, "Signature": secrets.token_hex(16)})
            host = self.headers.get("Host") or "localhost"
            location = f"http://{host}/_storage/{model.commit}/{quote(f.path)}?{query}"
            self.send_response(HTTPStatus.FOUND)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return self._log(302, 0, "redirect")
        rng = parse_range(self.headers.get("Range"), f.size)
        if rng == "416":
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{f.size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return self._log(416)
        start, end = rng if isinstance(rng, tuple) else (0, f.size - 1)
        status = HTTPStatus.PARTIAL_CONTENT if isinstance(rng, tuple) else HTTPStatus.OK
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{f.sha256}"')
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if head:
            return self._log(status)
        cut = self.faults.take_drop(file_path)
        flip = f.size // 2 if self.faults.is_corrupt(file_path) else None
        fault = f"drop_after_bytes={cut}" if cut is not None else None
        if flip is not None:
            fault = (fault + "," if fault else "") + f"corrupt@{flip}"
        sent = 0
        budget = length if cut is None else min(cut, length)
        rate = self.faults.rate(file_path)
        began = time.monotonic()
        with f.disk.open("rb") as fh:
            fh.seek(start)
            while sent < budget:
                if rate:  # simulated slow link
                    time.sleep(max(0.0, sent / rate - (time.monotonic() - began)))
                block = bytearray(fh.read(min(BLOCK if not rate else max(1, rate // 20), budget - sent)))
                if not block:
                    break
                pos = start + sent
                if flip is not None and pos <= flip < pos + len(block):
                    block[flip - pos] ^= 0xFF  # simulated corruption: the listing keeps the true hash
                self.wfile.write(block)
                sent += len(block)
        self.wfile.flush()
        if sent < length:
            self.close_connection = True  # simulated interruption: fewer bytes than Content-Length
        self._log(status, sent, fault)


def make_server(args: argparse.Namespace) -> ThreadingHTTPServer:
    commits = [load_model(d, args.model_id, args.revision) for d in [args.model_dir, *args.commit_dir]]
    if len({m.commit for m in commits}) != len(commits):
        raise SystemExit("two of the model directories hold the same files (the same commit): pass distinct ones")
    repo = HubRepo(commits, args.branch_file)
    others = {}
    for also in args.also:  # OWNER/NAME=DIR: another model at this endpoint (e.g. a speculative draft), one commit
        model_id, sep, model_dir = also.partition("=")
        other = HubRepo([load_model(Path(model_dir), model_id, args.revision)], None)
        if not sep or (other.first.owner, other.first.name) in {(repo.first.owner, repo.first.name), *others}:
            raise SystemExit(f"--also {also!r} must be OWNER/NAME=DIR of another model id")
        others[(other.first.owner, other.first.name)] = other
    faults = Faults()
    handler = type(
        "BoundHubHandler",
        (HubHandler,),
        {
            "repo": repo,
            "others": others,
            "faults": faults,
            "faults_file": FaultsFile(args.faults_file, faults),
            "request_log": RequestLog(args.log),
        },
    )
    server = ThreadingHTTPServer((args.bind, args.port), handler)
    server.daemon_threads = True
    if args.tls_cert:
        # The legacy modelscope client (<= 1.37) always speaks https; tests give it a throwaway cert.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls_cert, args.tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ModelScope-compatible test hub (see the module docstring).")
    parser.add_argument("model_dir", type=Path, help="directory whose files are served")
    parser.add_argument("--model-id", required=True, help="OWNER/NAME the model is served as")
    parser.add_argument("--revision", default="master", help="branch name the model is served at")
    parser.add_argument(
        "--commit-dir", type=Path, action="append", default=[], help="another commit of the model (repeatable)"
    )
    parser.add_argument("--branch-file", type=Path, help="file naming the commit id the branch points at")
    parser.add_argument(
        "--also", action="append", default=[], help="OWNER/NAME=DIR: another model served at this endpoint (repeatable)"
    )
    parser.add_argument("--bind", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to listen on; 0 picks a free one")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--log", type=Path, help="request log (JSON lines); default: stderr")
    parser.add_argument("--faults-file", type=Path, help="JSON fault spec, re-read when it changes")
    parser.add_argument("--tls-cert", type=Path, help="serve https with this PEM certificate (chain)")
    parser.add_argument("--tls-key", type=Path, help="private key for --tls-cert")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = make_server(args)
    host, port = server.server_address[:2]
    repo = server.RequestHandlerClass.repo  # type: ignore[attr-defined]
    model = repo.first
    if args.port_file:
        tmp = args.port_file.with_name(args.port_file.name + ".tmp")
        tmp.write_text(f"{port}\n")
        os.replace(tmp, args.port_file)
    print(
        f"serving {model.owner}/{model.name}@{model.branch} "
        f"(commit {model.commit}, {len(model.files)} files; {len(repo.commits)} commit(s)) "
        f"on {'https' if args.tls_cert else 'http'}://{host}:{port}",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
