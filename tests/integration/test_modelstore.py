"""End-to-end tests of the verified model store, on loopback, with the real modelscope client.

What is real: the modelscope CLI (installed from PyPI into a cached venv), HTTP, the files, the
hashes, rename(2). What is simulated: the ModelScope hub (harness/hub/server.py serves a
tiny generated model the way the real hub's API does) and, through its fault switches, a dropped
connection and a corrupted object. The module is a thin wrapper (options -> model_publish.Request ->
run_model_store): most tests build the Request from the module's own argument_spec and call
run_model_store directly; a few run the module itself through `ansible`.

The client runs as an unprivileged user (here `gpubox-test-fetch`, a system user the tests create: the
store kills every process of the download user's uid after a run without systemd, so it must be a
user of its own, as model_store_download_user is on a box), so
everything it must reach lives under TEST_BASE (/srv/gpubox-tests, world-traversable): its venv, the
store roots, a TLS hub's CA file. Not /tmp: the module checks its root with the desired-state
validator, which refuses a model store under /tmp or /root (as preflight does). Without systemd as
PID 1 (a CI machine) the store refuses to run the client unless the test-only switch
GPUBOX_TEST_UNSANDBOXED_CLIENT=1 is set (this module sets it); the client then runs as a plain child
process under that user. The systemd sandbox is exercised by the molecule scenarios (real systemd).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    lock_file,
    model_client,
    state_checks,
    store_layout,
    store_progress,
    vllm_cmdline,
)
from ansible_collections.gpubox.gpubox.plugins.module_utils import model_publish as lib
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]
HUB = ROOT / "harness/hub"
CACHE = Path(os.environ.get("GPUBOX_CACHE", Path.home() / ".cache/gpubox"))
# Root's, 0755: the download user can reach what lies here (unlike ~/.cache under /root).
TEST_BASE = Path(os.environ.get("GPUBOX_TEST_SRV", "/srv/gpubox-tests"))
DOWNLOAD_USER = "gpubox-test-fetch"
if subprocess.run(["id", "-u", DOWNLOAD_USER], capture_output=True).returncode != 0:
    subprocess.run(["useradd", "--system", "-M", "-s", "/usr/sbin/nologin", DOWNLOAD_USER], check=True)
# The test-only switch: no systemd here, so the client runs as a plain child of the download user.
os.environ["GPUBOX_TEST_UNSANDBOXED_CLIENT"] = "1"
SYSTEM_PYTHON = "/usr/bin/python3"

# The client the store is tested with (see roles/model_store/README.md for why this one), plus what
# make_tiny_model.py needs. The venv is created once and reused while this list is unchanged.
CLIENT_PINS = ["modelscope==1.40.2", "modelscope-hub==0.5.1", "numpy==2.4.6", "tokenizers==0.23.3"]
# The legacy generation, as python_env pinned it when this was written; it only speaks https.
LEGACY_PINS = ["modelscope==1.23.0"]
MODEL_ID = "Qwen/Tiny-Instruct"


def load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


store = load(ROOT / "plugins/modules/model_store.py", "gpubox_model_store_module")
# What the module passes when a task sets nothing: the defaults of its argument_spec.
DEFAULTS = {option: spec.get("default") for option, spec in store.ARGUMENT_SPEC.items()}
# Options without a module default: the role passes its facts and knobs (one default, in the role).
REQUIRED = {"revision": "master", "root": "/srv/models", "reserve_bytes": 0, "download_user": DOWNLOAD_USER}


def base_dir(*parts: str) -> Path:
    """A directory under TEST_BASE, root's and 0755 all the way (created when absent)."""
    path = TEST_BASE.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    for p in [path, *path.parents]:
        if p == Path("/"):
            break
        if p.stat().st_mode & 0o005 != 0o005:
            os.chmod(p, p.stat().st_mode | 0o005)
    return path


# --------------------------------------------------------------------------------------------------
# Fixtures: cached client venvs, generated models, hub processes
# --------------------------------------------------------------------------------------------------
def cached_venv(name: str, pins: list[str]) -> Path:
    """A venv under TEST_BASE holding exactly pins; rebuilt only when the pin list changes."""
    venv = base_dir("venvs") / name
    stamp = venv / ".gpubox-pins"
    wanted = "\n".join(pins) + "\n"
    if stamp.is_file() and stamp.read_text() == wanted and (venv / "bin/python").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    # The system's Python (Debian's python3 + python3-venv, installed by molecule/shared/host-setup.sh),
    # not this interpreter: a pyenv build under /root is out of the download user's reach.
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check", *pins],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, f"pip install {' '.join(pins)} failed:\n{pip.stdout}\n{pip.stderr}"
    stamp.write_text(wanted)
    print(f"\n[modelstore] installed {' '.join(pins)} in {time.monotonic() - started:.1f}s")
    return venv


@pytest.fixture(scope="session")
def client_venv() -> Path:
    return cached_venv("modelstore-venv", CLIENT_PINS)


@pytest.fixture(scope="session")
def models(client_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two versions of the tiny model: same tokenizer and config, different weights."""
    out = tmp_path_factory.mktemp("models")
    made = {}
    for label, seed in (("a", 1), ("b", 2)):
        subprocess.run(
            [
                str(client_venv / "bin/python"),
                str(HUB / "make_tiny_model.py"),
                str(out / label),
                "--seed",
                str(seed),
            ],
            check=True,
            capture_output=True,
        )
        made[label] = out / label
    return made


@dataclass
class Hub:
    endpoint: str
    log: Path
    proc: subprocess.Popen
    ca_bundle: str | None = None
    marks: list[int] = field(default_factory=list)

    def faults(self, spec: dict[str, Any]) -> None:
        req = urllib.request.Request(f"{self.endpoint}/_faults", data=json.dumps(spec).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10, context=self._ctx()) as resp:
            assert resp.status == 200

    def _ctx(self) -> Any:
        import ssl

        return ssl.create_default_context(cafile=self.ca_bundle) if self.ca_bundle else None

    def entries(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def mark(self) -> int:
        return len(self.entries())

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.entries()[mark:]

    def file_gets(self, mark: int, name: str | None = None) -> list[dict[str, Any]]:
        hits = [e for e in self.since(mark) if e["method"] == "GET" and "FilePath=" in e["path"]]
        return [e for e in hits if name is None or e["path"].endswith("FilePath=" + name)]


@pytest.fixture(scope="session")
def start_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Hub]]:
    hubs: list[Hub] = []

    def start(model_dir: Path, tls: bool = False, extra: tuple[str, ...] = ()) -> Hub:
        work = Path(tempfile.mkdtemp(dir=base_dir("hubs")))  # a TLS hub's CA must be readable by the client
        os.chmod(work, 0o755)
        cmd = [sys.executable, str(HUB / "server.py"), str(model_dir), "--model-id", MODEL_ID, *extra]
        cmd += ["--port", "0", "--port-file", str(work / "port"), "--log", str(work / "requests.jsonl")]
        ca = None
        if tls:
            openssl = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1"
            files = ["-keyout", str(work / "key.pem"), "-out", str(work / "cert.pem")]
            subprocess.run(
                [*openssl.split(), "-addext", "subjectAltName=IP:127.0.0.1", *files],
                check=True,
                capture_output=True,
            )
            cmd += ["--tls-cert", str(work / "cert.pem"), "--tls-key", str(work / "key.pem")]
            ca = str(work / "cert.pem")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=(work / "stderr").open("w"))
        for _ in range(100):
            if (work / "port").exists():
                break
            assert proc.poll() is None, (work / "stderr").read_text()
            time.sleep(0.05)
        port = int((work / "port").read_text())
        hub = Hub(f"{'https' if tls else 'http'}://127.0.0.1:{port}", work / "requests.jsonl", proc, ca)
        hubs.append(hub)
        return hub

    yield start
    for hub in hubs:
        hub.proc.terminate()
        hub.proc.wait(timeout=10)
        shutil.rmtree(hub.log.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def hub_a(start_hub: Callable[..., Hub], models: dict[str, Path]) -> Hub:
    return start_hub(models["a"])


@pytest.fixture(scope="session")
def hub_b(start_hub: Callable[..., Hub], models: dict[str, Path]) -> Hub:
    return start_hub(models["b"])


@pytest.fixture(autouse=True)
def no_faults(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    for name in ("hub_a", "hub_b"):
        if name in request.fixturenames:
            request.getfixturevalue(name).faults({})


@pytest.fixture
def store_root() -> Iterator[Path]:
    """<work>/models, where <work> is a fresh directory under the cache (the validator refuses /tmp)."""
    work = Path(tempfile.mkdtemp(dir=base_dir("roots")))
    os.chmod(work, 0o755)
    _, error = state_checks.check("gpubox_model_root", str(work / "models"))
    assert error is None, f"the test store root must be valid; set GPUBOX_CACHE elsewhere: {error}"
    yield work / "models"
    shutil.rmtree(work, ignore_errors=True)


def params_for(hub: Hub, root: Path, venv: Path, **kw: Any) -> dict[str, Any]:
    """module.params as AnsibleModule would hand them over: the argument_spec defaults, then the task's."""
    return {
        **DEFAULTS,
        **REQUIRED,
        "model_id": MODEL_ID,
        "modelscope_bin": str(venv / "bin/modelscope"),
        "endpoint": hub.endpoint,
        "root": str(root),
        "owner": None,
        "group": None,
        "timeout": 300,
        "retries": 0,
        "ca_bundle": hub.ca_bundle,
        "allow_http": hub.endpoint.startswith("http://"),
        "progress_file": str(root.parent / "progress.json"),
        **kw,
    }


def request_for(hub: Hub, root: Path, venv: Path, check_mode: bool = False, **kw: Any) -> lib.Request:
    return lib.Request(**params_for(hub, root, venv, **kw), check_mode=check_mode)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def same_content(published: Path, source: Path) -> None:
    files = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    got = sorted(
        p.relative_to(published).as_posix() for p in published.rglob("*") if p.is_file() and p.name != lib.MANIFEST_NAME
    )
    assert got == files
    for rel in files:
        assert sha(published / rel) == sha(source / rel), rel


# --------------------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------------------
def test_fresh_download_publishes_a_verified_model(hub_a: Hub, client_venv: Path, models, store_root: Path) -> None:
    root = store_root
    started = time.monotonic()
    result = lib.run_model_store(request_for(hub_a, root, client_venv))
    elapsed = time.monotonic() - started
    print(f"\n[modelstore] tiny model download+verify+publish: {elapsed:.2f}s ({result.total_bytes} bytes)")

    live = root / "Tiny-Instruct"
    assert result.changed and result.downloaded and result.attempts == 1
    assert result.client_version == "1.40.2"
    assert live.is_symlink() and not os.path.isabs(os.readlink(live))
    assert live.resolve() == root / ".versions" / f"Tiny-Instruct@{result.commit}"
    same_content(live, models["a"])
    manifest = lib.read_manifest(live)
    assert manifest and manifest["manifest_sha256"] == result.manifest_sha256
    assert manifest["commit"] == result.commit and manifest["revision"] == "master"
    assert {f["path"]: f["sha256"] for f in manifest["files"]} == {p.name: sha(p) for p in models["a"].iterdir()}
    for path in [live.resolve(), *live.resolve().rglob("*")]:
        assert path.stat().st_mode & 0o777 == (0o755 if path.is_dir() else 0o644), path
    assert not list((root / ".staging").glob("Tiny-Instruct@*")), "staging must be gone after publish"
    progress = json.loads((root.parent / "progress.json").read_text())
    assert progress["state"] == "done" and progress["bytes_done"] == progress["bytes_total"] == result.total_bytes


def test_second_run_downloads_nothing(hub_a: Hub, client_venv: Path, store_root: Path) -> None:
    root = store_root
    first = lib.run_model_store(request_for(hub_a, root, client_venv))
    mark = hub_a.mark()
    second = lib.run_model_store(request_for(hub_a, root, client_venv))
    assert first.changed and not second.changed and not second.downloaded
    assert second.manifest_sha256 == first.manifest_sha256
    assert hub_a.file_gets(mark) == [], "an up-to-date model must not fetch any file"
    assert any("repo/files" in e["path"] for e in hub_a.since(mark)), "the listing is still checked"


def test_interrupted_download_resumes_with_a_range_request(
    hub_a: Hub, client_venv: Path, models, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = store_root
    # The client's own retries would hide the interruption inside one run; switch them off.
    monkeypatch.setenv("MODELSCOPE_DOWNLOAD_MAX_RETRIES", "0")
    # Each of the two client runs gets 1 MB of the 2.6 MB file before the connection drops.
    hub_a.faults({"drop_after_bytes": {"model.safetensors": {"bytes": 1_000_000, "times": 2}}})
    with pytest.raises(lib.ModelStoreError) as failed:
        lib.run_model_store(request_for(hub_a, root, client_venv, retries=1))
    assert "model.safetensors" in str(failed.value)
    assert not (root / "Tiny-Instruct").exists(), "nothing may be published after a failed download"
    staging = next((root / ".staging").glob("Tiny-Instruct@*"))
    partial = staging / "model.safetensors.incomplete"
    kept = partial.stat().st_size
    assert kept == 2_000_000, "the second client run must have resumed the first one's partial file"

    mark = hub_a.mark()
    result = lib.run_model_store(request_for(hub_a, root, client_venv))
    gets = hub_a.file_gets(mark, "model.safetensors")
    starts = [int(m.group(1)) for e in gets if e["range"] and (m := re.match(r"bytes=(\d+)-", e["range"]))]
    assert starts and starts[0] == kept > 0, gets
    assert all(e["range"] for e in gets), "the resumed run must not fetch the file from byte 0"
    assert hub_a.file_gets(mark, "config.json") == [], "files completed before the drop are kept"
    assert result.changed
    same_content(root / "Tiny-Instruct", models["a"])


def test_corrupted_download_is_never_published(
    hub_a: Hub, hub_b: Hub, client_venv: Path, models, store_root: Path
) -> None:
    root = store_root
    good = lib.run_model_store(request_for(hub_a, root, client_venv))
    live = root / "Tiny-Instruct"
    before = live.resolve()

    hub_b.faults({"corrupt": {"model.safetensors": True}})
    with pytest.raises(lib.IntegrityError) as failed:
        lib.run_model_store(request_for(hub_b, root, client_venv, retries=1))
    message = str(failed.value)
    expected = sha(models["b"] / "model.safetensors")
    assert "model.safetensors" in message and expected in message
    assert re.search(r"Hash mismatch for model\.safetensors: expected \w+\.*, got \w+", message), message
    assert [p.path for p in failed.value.problems] == ["model.safetensors"]
    assert live.resolve() == before, "the live path must still point at the good version"
    same_content(live, models["a"])
    assert lib.read_manifest(live)["commit"] == good.commit
    assert list((root / ".versions").iterdir()) == [before], "no version dir for the corrupted commit"
    assert next((root / ".staging").glob("Tiny-Instruct@*")).is_dir(), "staging is kept for the next run"


def rot(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01  # simulated bit rot: same size, other content
    path.write_bytes(bytes(data))


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl to make the hub's test certificate")
def test_rehash_detects_a_file_corrupted_on_disk(
    start_hub: Callable[..., Hub], client_venv: Path, models, store_root: Path
) -> None:
    hub = start_hub(models["a"], tls=True)
    root = store_root
    lib.run_model_store(request_for(hub, root, client_venv))
    rot(root / "Tiny-Instruct" / "model.safetensors")

    quick = lib.run_model_store(request_for(hub, root, client_venv))
    assert not quick.changed, "over https without rehash only sizes are checked (cheap idempotence)"

    mark = hub.mark()
    fixed = lib.run_model_store(request_for(hub, root, client_venv, rehash=True))
    assert fixed.changed and len(fixed.repaired) == 1 and "model.safetensors" in fixed.repaired[0]
    assert [e["path"].split("FilePath=")[1] for e in hub.file_gets(mark)] == ["model.safetensors"]
    same_content(root / "Tiny-Instruct", models["a"])
    assert not lib.run_model_store(request_for(hub, root, client_venv, rehash=True)).changed


def test_http_endpoint_needs_the_switch_and_then_always_rehashes(
    hub_a: Hub, client_venv: Path, models, store_root: Path
) -> None:
    root = store_root
    with pytest.raises(lib.ModelStoreError, match=r"plain http.*model_store_allow_http: true"):
        request_for(hub_a, root, client_venv, allow_http=False)
    assert not root.exists(), "refused before anything was created"
    lib.run_model_store(request_for(hub_a, root, client_venv))
    rot(root / "Tiny-Instruct" / "config.json")
    # rehash not asked for: over http the live model is re-hashed anyway, so the rot is found and repaired.
    fixed = lib.run_model_store(request_for(hub_a, root, client_venv, rehash=False))
    assert fixed.changed and [r.split(":")[0] for r in fixed.repaired] == ["config.json"]
    same_content(root / "Tiny-Instruct", models["a"])


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory the download user can reach (wrapper clients) with a world-writable marker dir."""
    work = Path(tempfile.mkdtemp(dir=base_dir("scratch")))
    os.chmod(work, 0o755)
    (work / "marks").mkdir(mode=0o1777)
    os.chmod(work / "marks", 0o1777)
    yield work
    shutil.rmtree(work, ignore_errors=True)


def wrapper_client(scratch: Path, client_venv: Path, then: str, real: bool = True) -> Path:
    """A modelscope_bin for the download user: the real CLI (unless not real), then the shell lines then,
    with $staged set to its --local_dir (a simulated client defect or a hostile client)."""
    wrapper = scratch / "bin/modelscope"
    wrapper.parent.mkdir()
    (wrapper.parent / "python").symlink_to(client_venv / "bin/python")
    run = f'"{client_venv}/bin/modelscope" "$@" || exit $?\n' if real else ""
    wrapper.write_text(f'#!/bin/sh\n{run}staged="$(echo "$@" | sed "s/.*--local_dir //")"\n{then}')
    wrapper.chmod(0o755)
    return wrapper


def test_verifier_refetches_a_file_the_client_accepted(
    hub_a: Hub, client_venv: Path, models, scratch: Path, store_root: Path
) -> None:
    # Simulated client defect (like modelscope#1114: a bad file left in place): a wrapper runs the
    # real CLI, then damages tokenizer.json once. The store's own sha256 check must catch it.
    marker = scratch / "marks/damaged-once"
    wrapper = wrapper_client(
        scratch,
        client_venv,
        f'if [ ! -e "{marker}" ]; then touch "{marker}"; printf X | '
        'dd of="$staged/tokenizer.json" bs=1 seek=10 conv=notrunc 2>/dev/null; fi\n',
    )
    root = store_root
    mark = hub_a.mark()
    req = request_for(hub_a, root, client_venv, modelscope_bin=str(wrapper), retries=1)
    result = lib.run_model_store(req)
    assert marker.exists() and result.attempts == 2
    assert len(hub_a.file_gets(mark, "tokenizer.json")) == 2
    same_content(root / "Tiny-Instruct", models["a"])


def test_model_that_is_not_the_planned_one_is_never_published(
    hub_a: Hub, client_venv: Path, models, store_root: Path
) -> None:
    planned = sys.modules["ansible_collections.gpubox.gpubox.plugins.module_utils.model_catalog"]
    config = json.loads((models["a"] / "config.json").read_text())
    expected = planned.model_from_config_json(config, 1)
    root = store_root
    # the config.json agrees with the facts preflight planned from: published
    ok = lib.run_model_store(request_for(hub_a, root, client_venv, expected_config=expected))
    assert ok.changed and (root / "Tiny-Instruct").is_symlink()
    # another model's facts (one more layer): refused before publishing, the live link untouched
    other = {**expected, "num_hidden_layers": expected["num_hidden_layers"] + 1}
    root2 = root.parent / "models2"
    with pytest.raises(lib.ModelStoreError, match="num_hidden_layers") as err:
        lib.run_model_store(request_for(hub_a, root2, client_venv, expected_config=other))
    assert "gpubox_model_config" in str(err.value)
    assert not (root2 / "Tiny-Instruct").exists()
    versions = root2 / ".versions"
    assert not versions.exists() or not any(versions.iterdir())


def test_disk_space_shortfall_is_refused_before_downloading(hub_a: Hub, client_venv: Path, store_root: Path) -> None:
    root = store_root
    free = lib.free_bytes(root.parent)
    mark = hub_a.mark()
    with pytest.raises(lib.DiskSpaceError) as failed:
        lib.run_model_store(request_for(hub_a, root, client_venv, reserve_bytes=free + 2**40))
    assert "gpubox_model_root" in str(failed.value) and "short by" in str(failed.value)
    assert hub_a.file_gets(mark) == []
    assert not (root / "Tiny-Instruct").exists()


def test_check_mode_reports_without_changing(hub_a: Hub, client_venv: Path, store_root: Path) -> None:
    root = store_root
    mark = hub_a.mark()
    result = lib.run_model_store(request_for(hub_a, root, client_venv, check_mode=True))
    assert result.changed and not result.downloaded
    assert hub_a.file_gets(mark) == [] and not root.exists()


def test_new_revision_replaces_the_live_link_and_keeps_one_previous(
    hub_a: Hub, hub_b: Hub, client_venv: Path, models, store_root: Path
) -> None:
    root = store_root
    a = lib.run_model_store(request_for(hub_a, root, client_venv))
    b = lib.run_model_store(request_for(hub_b, root, client_venv))
    assert a.commit != b.commit and b.changed
    same_content(root / "Tiny-Instruct", models["b"])
    mark = hub_a.mark()
    back = lib.run_model_store(request_for(hub_a, root, client_venv))  # rollback: the kept copy
    assert back.changed and not back.downloaded and hub_a.file_gets(mark) == []
    same_content(root / "Tiny-Instruct", models["a"])
    assert len(list((root / ".versions").iterdir())) == 2


def test_a_locked_commit_is_served_while_the_branch_moves_and_rolls_back_without_a_download(
    start_hub: Callable[..., Hub], client_venv: Path, models, store_root: Path, tmp_path: Path
) -> None:
    """Issue 12 item 4 at the store's level: the hub serves two commits of the model and its branch
    moves from A to B (an upstream push); the store is asked for commits (what the lock resolves to)."""
    branch = tmp_path / "branch"
    hub = start_hub(models["a"], extra=("--commit-dir", str(models["b"]), "--branch-file", str(branch)))
    a = lib.fetch_listing(hub.endpoint, MODEL_ID, "master").commit
    assert re.fullmatch(r"[0-9a-f]{40}", a), "the test hub names a commit id in its listing"
    first = lib.run_model_store(request_for(hub, store_root, client_venv, revision=a))
    assert first.commit == a and lib.read_manifest(store_root / "Tiny-Instruct")["revision"] == a

    health = json.loads(urllib.request.urlopen(f"{hub.endpoint}/_health", timeout=10).read())["Data"]
    (b,) = [c for c in health["commits"] if c != a]
    branch.write_text(b + "\n")  # upstream pushes B to master
    assert lib.fetch_listing(hub.endpoint, MODEL_ID, "master").commit == b
    mark = hub.mark()
    pinned = lib.run_model_store(request_for(hub, store_root, client_venv, revision=a))
    assert not pinned.changed and hub.file_gets(mark) == [], "the locked commit holds while the branch moves"

    mark = hub.mark()
    moved = lib.run_model_store(request_for(hub, store_root, client_venv, revision=b))
    gets = hub.file_gets(mark)
    assert moved.changed and moved.commit == b and gets and all(f"Revision={b}" in e["path"] for e in gets)
    same_content(store_root / "Tiny-Instruct", models["b"])
    assert (store_root / ".versions" / f"Tiny-Instruct@{a}").is_dir(), "A is kept beside B"

    mark = hub.mark()
    back = lib.run_model_store(request_for(hub, store_root, client_venv, revision=a))
    assert back.changed and not back.downloaded and hub.file_gets(mark) == []
    same_content(store_root / "Tiny-Instruct", models["a"])


def test_verify_module_reports_every_file_and_finds_damage(
    hub_a: Hub, client_venv: Path, models, store_root: Path, tmp_path: Path
) -> None:
    """gpubox.gpubox.model_verify (make verify) through Ansible: per file, read-only, damage named."""
    lib.run_model_store(request_for(hub_a, store_root, client_venv))
    args = json.dumps({"root": str(store_root), "name": "Tiny-Instruct"})
    good = ansible_vars.run_module("gpubox.gpubox.model_verify", args, tmp_path)
    assert good["ok"] and not good["changed"] and good["problems"] == []
    assert sorted(f["path"] for f in good["files"]) == sorted(p.name for p in models["a"].iterdir())
    assert good["bytes_hashed"] == sum(p.stat().st_size for p in models["a"].iterdir())
    rot(store_root / "Tiny-Instruct" / "model.safetensors")
    with open(store_root / "Tiny-Instruct" / "config.json", "r+b") as fh:
        fh.truncate(10)
    bad = ansible_vars.run_module("gpubox.gpubox.model_verify", args, tmp_path)
    assert not bad["ok"] and not bad.get("failed")
    by_path = {f["path"]: f["status"] for f in bad["files"]}
    assert by_path["model.safetensors"].startswith("sha256 mismatch") and by_path["config.json"].startswith(
        "size mismatch"
    )
    assert [p for p, status in by_path.items() if status != "ok"] == sorted(["config.json", "model.safetensors"])
    assert any(line.startswith("model.safetensors: sha256 mismatch") for line in bad["problems"])
    absent = ansible_vars.run_module(
        "gpubox.gpubox.model_verify", json.dumps({"root": str(store_root), "name": "X"}), tmp_path
    )
    assert not absent["ok"] and "not a link to a published version" in absent["problems"][0]


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs openssl to make the hub's test certificate")
def test_legacy_client_generation_over_https(
    start_hub: Callable[..., Hub], hub_a: Hub, models, store_root: Path
) -> None:
    venv = cached_venv("modelstore-legacy-venv", LEGACY_PINS)
    hub = start_hub(models["a"], tls=True)
    root = store_root
    result = lib.run_model_store(request_for(hub, root, venv))
    assert result.client_version == "1.23.0"
    same_content(root / "Tiny-Instruct", models["a"])  # its .msc/.mv/._____temp are not published
    mark = hub.mark()
    assert not lib.run_model_store(request_for(hub, root, venv)).changed
    assert hub.file_gets(mark) == []
    # Same model over plain http (hub_a): the listing works, the legacy client could not; refused up front.
    os.remove(root / "Tiny-Instruct" / "config.json")
    with pytest.raises(lib.ModelStoreError, match="only speaks https"):
        lib.run_model_store(request_for(hub_a, root, venv))


def run_module(cwd: Path, args: dict[str, Any], check: bool = False) -> dict[str, Any]:
    """The real module through `ansible localhost -m gpubox.gpubox.model_store` (this checkout's collection)."""
    return ansible_vars.run_module("gpubox.gpubox.model_store", json.dumps(args), cwd, check)


def test_module_through_ansible_checks_and_refuses_like_preflight(
    hub_a: Hub, client_venv: Path, store_root: Path, tmp_path: Path
) -> None:
    task = {"model_id": MODEL_ID, "revision": "master", "reserve_bytes": 0, "endpoint": hub_a.endpoint}
    task |= {"download_user": DOWNLOAD_USER, "allow_http": True}
    task["root"] = str(store_root)
    task["modelscope_bin"] = str(client_venv / "bin/modelscope")
    mark = hub_a.mark()
    result = run_module(tmp_path, task, check=True)
    assert not result.get("failed"), result
    assert result["changed"] and not result["downloaded"] and result["revision"] == "master"
    assert result["msg"].startswith(f"would download {MODEL_ID}@") and result["files"] > 0
    assert hub_a.file_gets(mark) == [] and not store_root.exists()

    refused = run_module(tmp_path, {**task, "model_id": "Qwen/../etc", "root": "/tmp/models"}, check=True)
    _, id_error = state_checks.check("gpubox_model_id", "Qwen/../etc")
    _, root_error = state_checks.check("gpubox_model_root", "/tmp/models")
    assert refused["failed"] and f"model_id: {id_error}" in refused["msg"] and f"root: {root_error}" in refused["msg"]


# --------------------------------------------------------------------------------------------------
# Pure logic
# --------------------------------------------------------------------------------------------------
def listing_payload(**overrides: Any) -> dict[str, Any]:
    entry = {
        "Name": "a.bin",
        "Path": "a.bin",
        "Type": "blob",
        "Size": 3,
        "Sha256": "ab" * 32,
        "Revision": "c1" * 20,
    }
    entry.update(overrides)
    return {"Code": 200, "Success": True, "Data": {"Files": [entry, {"Path": "d", "Type": "tree"}]}}


def test_parse_listing_takes_blobs_and_the_commit() -> None:
    listing = lib.parse_listing(listing_payload(), MODEL_ID, "master")
    assert listing.commit == "c1" * 20 and listing.files == (lib.RemoteFile("a.bin", 3, "ab" * 32),)


@pytest.mark.parametrize(
    ("override", "words"),
    [({"Sha256": ""}, "no sha256"), ({"Path": "../x"}, "unusable path"), ({"Size": -1}, "no valid Size")],
)
def test_parse_listing_rejects_what_cannot_be_verified(override: dict[str, Any], words: str) -> None:
    with pytest.raises(lib.ListingError, match=words):
        lib.parse_listing(listing_payload(**override), MODEL_ID, "master")


def test_disk_check_counts_only_the_bytes_still_to_fetch(tmp_path: Path) -> None:
    files = [lib.RemoteFile("a", 100, "0" * 64), lib.RemoteFile("b", 50, "0" * 64)]
    (tmp_path / "a.incomplete").write_bytes(b"x" * 40)
    (tmp_path / "b").write_bytes(b"x" * 50)
    assert lib.staged_bytes(tmp_path, files) == 90
    assert lib.check_disk_space(tmp_path, 150, 90, free=60) == 60
    with pytest.raises(lib.DiskSpaceError, match=r"gpubox_model_root .* short by 1\.0 B|short by 1 B"):
        lib.check_disk_space(tmp_path, 150, 90, free=59)


def test_manifest_digest_detects_edits(tmp_path: Path) -> None:
    listing = lib.parse_listing(listing_payload(), MODEL_ID, "master")
    lib.write_manifest(tmp_path, listing)
    assert lib.manifest_matches(lib.read_manifest(tmp_path), listing)
    body = json.loads((tmp_path / lib.MANIFEST_NAME).read_text())
    body["files"][0]["size"] = 4
    (tmp_path / lib.MANIFEST_NAME).write_text(json.dumps(body))
    assert lib.read_manifest(tmp_path) is None


def test_module_options_are_declared_once_and_passed_whole() -> None:
    # DOCUMENTATION (what ansible-doc shows), ARGUMENT_SPEC (what AnsibleModule checks) and Request
    # (what the work receives, as **module.params) name the same options; defaults only in the first two.
    documented = yaml.safe_load(store.DOCUMENTATION)["options"]
    assert set(documented) == set(store.ARGUMENT_SPEC)
    for option, spec in store.ARGUMENT_SPEC.items():
        doc = documented[option]
        assert (doc["type"], doc.get("default"), doc.get("required", False)) == (
            spec["type"],
            spec.get("default"),
            spec.get("required", False),
        ), option
    request_fields = {f.name: f for f in fields(lib.Request)}
    assert set(request_fields) == set(store.ARGUMENT_SPEC) | {"check_mode"}
    assert [name for name, f in request_fields.items() if f.default is not MISSING] == ["check_mode"]


@pytest.mark.parametrize(
    ("option", "fact", "value"),
    [
        ("model_id", "gpubox_model_id", "Qwen2.5-7B-Instruct"),
        ("model_id", "gpubox_model_id", "Qwen/../x"),
        ("revision", "gpubox_model_revision", "--upload"),
        ("revision", "gpubox_model_revision", ""),
        ("root", "gpubox_model_root", "/tmp/models"),
        ("root", "gpubox_model_root", "models"),
        ("root", "gpubox_model_root", "/etc"),
    ],
)
def test_request_refuses_what_the_desired_state_refuses(option: str, fact: str, value: str) -> None:
    good = {**DEFAULTS, **REQUIRED, "model_id": MODEL_ID, "modelscope_bin": "/opt/gpubox/venv/bin/modelscope"}
    lib.Request(**good)  # the defaults and a valid id pass
    _, error = state_checks.check(fact, value)
    assert error
    with pytest.raises(lib.ModelStoreError) as refused:
        lib.Request(**{**good, option: value})
    assert str(refused.value) == f"{option}: {error}"


def test_request_normalizes_the_root_and_refuses_out_of_range_numbers() -> None:
    good = {**DEFAULTS, **REQUIRED, "model_id": MODEL_ID, "modelscope_bin": "/opt/gpubox/venv/bin/modelscope"}
    assert lib.Request(**{**good, "root": "/srv/models/"}).root == "/srv/models"
    with pytest.raises(lib.ModelStoreError) as refused:
        lib.Request(**{**good, "retries": -1, "keep_versions": 0, "timeout": 0, "reserve_bytes": -1})
    for words in (
        "retries must be an integer >= 0",
        "keep_versions must be an integer >= 1",
        "timeout must be an integer >= 1",
        "reserve_bytes",
    ):
        assert words in str(refused.value)


def test_options_fed_by_facts_or_role_knobs_have_no_second_default() -> None:
    """The role passes each fact and knob; a module default for one of them would be a second default."""
    import re

    import yaml

    tasks = (ROOT / "roles/model_store/tasks/publish.yml").read_text()
    task = tasks.split("gpubox.gpubox.model_store: &model_store_args", 1)[1].split("register:", 1)[0]
    passed = dict(re.findall(r"^    (\w+): \"\{\{ (?:__model_store_state\.)?(gpubox_\w+|model_store_\w+)", task, re.M))
    # each checkpoint's fields (the desired_state lookup's gpubox_model_checkpoints) are the desired state's too
    item = re.findall(r"^    (\w+): \"\{\{ __model_store_item\.(\w+)", task, re.M)
    passed |= {option: f"gpubox_model_checkpoints.{field}" for option, field in item}
    defaults = yaml.safe_load((ROOT / "roles/model_store/defaults/main.yml").read_text())
    assert {"revision", "root", "reserve_bytes"} <= set(passed)
    for option, source in passed.items():
        spec = store.ARGUMENT_SPEC[option]
        if source.startswith("gpubox_") or option == "reserve_bytes":
            assert "default" not in spec, option
        elif "default" in spec:
            assert spec["default"] == defaults[source], f"{option}: module {spec['default']!r} != {source}"


# --------------------------------------------------------------------------------------------------
# Under faults: a hostile hub, a client that plants links, full disks, a client that hangs
# --------------------------------------------------------------------------------------------------
def test_hostile_second_listing_writes_nothing_outside_staging_and_nothing_unlisted_is_published(
    hub_a: Hub, client_venv: Path, models, store_root: Path
) -> None:
    # The probe of the issue: the store checks the listing it fetched, the client fetches its own and
    # writes what that one names. Every listing after the store's names escapes: relative ones out of
    # staging and out of the root, and an absolute one into a directory of root's.
    root = store_root
    outside = root.parent / "outside"
    outside.mkdir()
    targets = {
        "../../escape-1.txt": root / "escape-1.txt",
        "../../../escape-2.txt": root.parent / "escape-2.txt",
        "../../../../escape-3.txt": root.parent.parent / "escape-3.txt",
        str(outside / "escape-abs.txt"): outside / "escape-abs.txt",
    }
    hub_a.faults({"extra_files": {"after": 1, "files": dict.fromkeys(targets, "written by a hostile hub\n")}})
    with pytest.raises(lib.ModelStoreError) as failed:
        lib.run_model_store(request_for(hub_a, root, client_venv, retries=0))
    for path in targets.values():
        assert not path.exists(), f"{path} was written outside the staging directory"
    assert [e for e in hub_a.entries() if e.get("fault") == "extra_files"], "the client did fetch the extra files"
    # The download user could not write there, so the client failed: nothing was published.
    assert "was not published" in str(failed.value) and not (root / "Tiny-Instruct").exists()
    assert not list((root / ".versions").iterdir())


def test_files_a_hostile_listing_adds_inside_staging_are_refused_not_published(
    hub_a: Hub, client_venv: Path, models, store_root: Path
) -> None:
    root = store_root
    hub_a.faults({"extra_files": {"after": 1, "files": {"extra/run-me.sh": "#!/bin/sh\n", "notes.txt": "x"}}})
    result = lib.run_model_store(request_for(hub_a, root, client_venv))
    assert result.refused_files == ["extra/run-me.sh", "notes.txt"]
    assert result.sandbox == "user"
    same_content(root / "Tiny-Instruct", models["a"])  # exactly the verified listing
    assert {p.stat().st_uid for p in (root / "Tiny-Instruct").resolve().rglob("*")} == {0}, "root's, not the client's"


def test_a_planted_symlink_is_never_followed_nor_published(
    hub_a: Hub, client_venv: Path, models, scratch: Path, store_root: Path
) -> None:
    # Simulated compromised client: after the real download it replaces config.json by a symlink to a
    # root-owned file of the same content (so size and sha256 would pass if the link were followed),
    # and tokenizer.json's directory entry by a link to a root directory. Once.
    decoy = scratch / "decoy-config.json"
    shutil.copy(models["a"] / "config.json", decoy)
    marker = scratch / "marks/planted"
    wrapper = scratch / "bin/modelscope"
    wrapper.parent.mkdir()
    wrapper.write_text(
        "#!/bin/sh\n"
        f'"{client_venv}/bin/modelscope" "$@" || exit $?\n'
        'staged="$(echo "$@" | sed "s/.*--local_dir //")"\n'
        f'if [ ! -e "{marker}" ]; then touch "{marker}"; rm -f "$staged/config.json"; '
        f'ln -s "{decoy}" "$staged/config.json"; fi\n'
    )
    wrapper.chmod(0o755)
    root = store_root
    result = lib.run_model_store(request_for(hub_a, root, client_venv, modelscope_bin=str(wrapper), retries=1))
    assert marker.exists() and result.attempts == 2, "the link was refused and the file fetched again"
    published = root / "Tiny-Instruct" / "config.json"
    assert not published.is_symlink() and published.lstat().st_uid == 0
    assert decoy.is_file() and decoy.read_bytes() == (models["a"] / "config.json").read_bytes(), "decoy untouched"
    same_content(root / "Tiny-Instruct", models["a"])


@pytest.mark.parametrize("where", ["manifest", "progress"])
def test_a_full_disk_is_a_clear_failure_or_harmless(
    hub_a: Hub, client_venv: Path, store_root: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # Simulated ENOSPC (an injected OSError, as a full disk raises it) while writing the manifest (the
    # run must fail naming the path and the fix, the progress file must say failed) or the progress
    # file (not fatal: the download goes on and publishes).
    root = store_root
    progress_file = root.parent / "progress.json"
    real = lib.write_file_atomic

    def full(path: Path, text: str, mode: int = lib.FILE_MODE) -> None:
        if (where == "manifest" and path.name == lib.MANIFEST_NAME) or (
            where == "progress" and path == progress_file and '"state": "running"' in text
        ):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, text, mode)

    # write_file_atomic is store_layout's; the manifest (store_layout) and the progress file
    # (store_progress) each reach it by their own module's name.
    monkeypatch.setattr(store_layout, "write_file_atomic", full)
    monkeypatch.setattr(store_progress, "write_file_atomic", full)
    req = request_for(hub_a, root, client_venv)
    if where == "progress":
        assert lib.run_model_store(req).changed
        assert json.loads(progress_file.read_text())["state"] == "done"
        return
    with pytest.raises(lib.ModelStoreError) as failed:
        lib.run_model_store(req)
    message = str(failed.value)
    assert "ENOSPC" in message and lib.MANIFEST_NAME in message and "free space" in message, message
    state = json.loads(progress_file.read_text())
    assert state["state"] == "failed" and "ENOSPC" in state["message"]
    assert not (root / "Tiny-Instruct").exists(), "nothing published"
    assert not list((root / ".versions").iterdir())
    assert not list(root.rglob(".*.tmp-*")), "no half-written file left"


def client_pids(marker_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in marker_dir.glob("pid-*")]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"


@pytest.mark.parametrize("how", ["deadline", "error"])
def test_no_client_process_outlives_the_run(
    hub_a: Hub, scratch: Path, store_root: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    # A client that hangs (and starts a child that hangs too): the run ends at its deadline, or on an
    # error raised while the client runs (ENOSPC updating progress), and takes both processes with it.
    marks = scratch / "marks"
    wrapper = scratch / "bin/modelscope"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nsleep 600 & echo $! > {marks}/pid-child\necho $$ > {marks}/pid-client\nwait\n")
    wrapper.chmod(0o755)
    (scratch / "bin/python").symlink_to(SYSTEM_PYTHON)
    if how == "error":
        real = lib.staging_progress

        def failing(staging: Path, files: Any) -> tuple[int, int]:
            if len(client_pids(marks)) == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(staging))
            return real(staging, files)

        monkeypatch.setattr(model_client, "staging_progress", failing)
    req = request_for(hub_a, store_root, Path("/nonexistent"), modelscope_bin=str(wrapper), timeout=4)
    started = time.monotonic()
    with pytest.raises(lib.ModelStoreError, match="did not finish within timeout" if how == "deadline" else "ENOSPC"):
        lib.run_model_store(req)
    assert time.monotonic() - started < 30
    pids = client_pids(marks)
    assert len(pids) == 2
    for pid in pids:
        for _ in range(50):
            if not alive(pid):
                break
            time.sleep(0.1)
        assert not alive(pid), f"client process {pid} outlived the run"


@pytest.mark.parametrize(("owner", "mode"), [(65534, 0o755), (0, 0o777), (0, 0o1777), (0, 0o775)])
def test_an_existing_root_not_roots_alone_is_refused_and_left_as_it_was(
    hub_a: Hub, client_venv: Path, store_root: Path, owner: int, mode: int
) -> None:
    store_root.mkdir()
    os.chown(store_root, owner, -1)
    os.chmod(store_root, mode)
    with pytest.raises(lib.ModelStoreError) as refused:
        lib.run_model_store(request_for(hub_a, store_root, client_venv))
    expected = state_checks.store_root_problem("gpubox_model_root", str(store_root), owner, mode, True)
    assert expected and str(refused.value) == expected
    st = store_root.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (owner, mode), "never chmod/chown a directory it did not create"
    assert list(store_root.iterdir()) == []


def test_a_new_root_is_created_roots_and_0755(hub_a: Hub, client_venv: Path, store_root: Path) -> None:
    lib.run_model_store(request_for(hub_a, store_root, client_venv))
    st = store_root.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    staging = (store_root / ".staging").stat()
    assert (staging.st_uid, stat.S_IMODE(staging.st_mode)) == (0, 0o711)
    left = [p.name for p in (store_root / ".staging").iterdir()]
    assert left == ["Tiny-Instruct.lock"], "staging emptied after the publish (the run lock stays)"


@pytest.mark.parametrize("root", ["/tmp", "/root", "/dev/shm", "/root/models", "/dev/shm/models", "/var/tmp/m", "/"])
def test_system_directories_are_refused_as_roots(root: str) -> None:
    _, error = state_checks.check("gpubox_model_root", root)
    assert error and error.startswith("gpubox_model_root is ")
    good = {**DEFAULTS, **REQUIRED, "model_id": MODEL_ID, "modelscope_bin": "/opt/gpubox/venv/bin/modelscope"}
    with pytest.raises(lib.ModelStoreError, match="root: gpubox_model_root is "):
        lib.Request(**{**good, "root": root})


@pytest.mark.parametrize("user", ["root", "", "Bad User", None])
def test_the_client_never_runs_as_root(user: Any) -> None:
    good = {**DEFAULTS, **REQUIRED, "model_id": MODEL_ID, "modelscope_bin": "/opt/gpubox/venv/bin/modelscope"}
    with pytest.raises(lib.ModelStoreError, match="download_user"):
        lib.Request(**{**good, "download_user": user})


def test_os_errors_name_the_path_and_the_fix() -> None:
    for code, words in ((errno.ENOSPC, "free space"), (errno.EROFS, "read-only"), (errno.EACCES, "ownership")):
        err = lib.os_error(OSError(code, os.strerror(code), "/data/models/x"), "publishing")
        assert "/data/models/x" in str(err) and words in str(err) and errno.errorcode[code] in str(err)


def test_a_run_stopped_while_publishing_resumes_without_fetching_again(
    hub_a: Hub, client_venv: Path, models, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Crash between assemble (files moved out of staging) and the rename into .versions.
    root = store_root

    def crash(*_args: Any, **_kwargs: Any) -> None:
        raise lib.Stopped("simulated crash during the publish")

    monkeypatch.setattr(lib, "publish", crash)
    with pytest.raises(lib.Stopped):
        lib.run_model_store(request_for(hub_a, root, client_venv))
    assert list((root / ".staging").glob(".publish-Tiny-Instruct@*"))
    monkeypatch.undo()
    mark = hub_a.mark()
    result = lib.run_model_store(request_for(hub_a, root, client_venv))
    assert result.changed and hub_a.file_gets(mark) == [], "the verified files were reused"
    same_content(root / "Tiny-Instruct", models["a"])
    assert [p.name for p in (root / ".staging").iterdir()] == ["Tiny-Instruct.lock"]


def test_progress_poll_ends_however_the_job_ends() -> None:
    progress_module = load(ROOT / "plugins/modules/model_store_progress.py", "gpubox_model_store_progress")
    me = {"state": "running", "message": "downloading", "pid": os.getpid(), "pid_start": lib.process_start(os.getpid())}
    job_running = {"started": 1, "finished": 0, "ansible_job_id": "j1"}
    assert progress_module.job_state(me, job_running) == ("running", "downloading")
    assert progress_module.job_state(None, job_running)[0] == "running"
    assert progress_module.job_state({**me, "state": "failed", "message": "failed: ENOSPC"}, job_running) == (
        "failed",
        "failed: ENOSPC",
    )
    assert progress_module.job_state(me, {"changed": True, "msg": "published"})[0] == "ended"
    assert progress_module.job_state(me, {"finished": 1})[0] == "ended"
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = {**me, "pid": dead.pid, "pid_start": "1"}
    assert progress_module.job_state(gone, job_running)[0] == "gone"
    reused = {**me, "pid_start": str(int(me["pid_start"]) + 1)}  # same pid, another process
    assert progress_module.job_state(reused, job_running)[0] == "gone"
    # A reboot (power cut) took /run's progress file and the job with it: no file, job file unfinished.
    assert progress_module.job_state(None, job_running, "boot-a", "boot-b")[0] == "gone"
    assert progress_module.job_state(None, job_running, "boot-a", "boot-a")[0] == "running"
    assert progress_module.current_boot_id()


def test_discard_removes_a_directory_where_a_file_was_listed_without_following_links(tmp_path: Path) -> None:
    """discard on Python 3.10 too (no rmtree(dir_fd=)): a directory at a listed path goes, with what is
    in it; a symlink inside it is removed, not followed."""
    staging, outside = tmp_path / "staging", tmp_path / "outside"
    (staging / "sub" / "model.bin" / "deeper").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep").write_text("not the store's")
    (staging / "sub" / "model.bin" / "link").symlink_to(outside)
    (staging / "sub" / "other").write_text("stays")
    problem = lib.FileProblem("sub/model.bin", "missing", "a regular file", "refused: not a regular file")
    lib.discard(staging, [problem])
    assert not (staging / "sub" / "model.bin").exists() and (staging / "sub" / "other").read_text() == "stays"
    assert (outside / "keep").read_text() == "not the store's"


def test_a_hub_that_redirects_files_to_storage_is_followed(
    hub_a: Hub, client_venv: Path, models, store_root: Path
) -> None:
    """ModelScope answers large files with a 302 to a storage host (presigned URL): the test hub's
    redirect mode does the same (a new query each time), and the real client follows it."""
    hub_a.faults({"redirect": True})
    mark = hub_a.mark()
    result = lib.run_model_store(request_for(hub_a, store_root, client_venv))
    assert result.changed and result.downloaded
    same_content(store_root / "Tiny-Instruct", models["a"])
    entries = hub_a.since(mark)
    redirected = [e for e in entries if e["status"] == 302 and e["fault"] == "redirect"]
    stored = [e for e in entries if e["path"].startswith("/_storage/") and e["status"] in (200, 206)]
    assert redirected and stored
    assert {e["path"].split("?")[0] for e in stored} >= {
        f"/_storage/{result.commit}/{p.name}" for p in models["a"].iterdir()
    }
    assert len({e["path"] for e in stored}) == len(stored), "every redirect must carry its own signed query"


def test_the_box_side_rehash_is_the_collections_code_and_names_the_damaged_file(
    hub_a: Hub, client_venv: Path, models, store_root: Path, tmp_path: Path
) -> None:
    """The re-hash timer's service (roles/model_store, model_store_verify_timer) runs gpubox-model-verify,
    which imports model_manifest.py from where gpu_check_library(library=model_manifest) installs it, with
    no site-packages (-S): stdlib only. Its local fact says ok, then names the one damaged file; exit 1."""
    lib.run_model_store(request_for(hub_a, store_root, client_venv))
    lib_dir = tmp_path / "usr-local-lib-gpubox"
    lib_dir.mkdir()
    script = lib_dir / "model_manifest.py"
    args = json.dumps({"dest": str(script), "library": "model_manifest"})
    installed = ansible_vars.run_module("gpubox.gpubox.gpu_check_library", args, tmp_path)
    assert (
        installed["changed"] and script.read_bytes() == (ROOT / "plugins/module_utils/model_manifest.py").read_bytes()
    )
    facts = tmp_path / "facts.d"
    facts.mkdir()
    fact = facts / "gpubox_model_verify.fact"
    program = ROOT / "roles/model_store/files/gpubox-model-verify"
    argv = [sys.executable, "-S", str(program), "--lib", str(lib_dir), "--root", str(store_root)]
    argv += ["--name", "Tiny-Instruct", "--fact", str(fact)]
    good = subprocess.run(argv, capture_output=True, text=True)
    recorded = json.loads(fact.read_text())
    assert good.returncode == 0, good.stderr
    assert (
        recorded["ok"] is True
        and recorded["failed_files"] == []
        and recorded["source"] == "gpubox-model-verify.service"
    )
    assert recorded["bytes_hashed"] == sum(p.stat().st_size for p in models["a"].iterdir())
    rot(store_root / "Tiny-Instruct" / "model.safetensors")
    bad = subprocess.run(argv, capture_output=True, text=True)
    recorded = json.loads(fact.read_text())
    assert bad.returncode == 1 and "model.safetensors: sha256 mismatch" in bad.stdout
    assert recorded["ok"] is False and recorded["failed_files"] == ["model.safetensors"]
    assert recorded["commit"] == lib.read_manifest(store_root / "Tiny-Instruct")["commit"]
    assert [p.name for p in facts.iterdir()] == ["gpubox_model_verify.fact"], "no temporary file is left behind"


# --------------------------------------------------------------------------------------------------
# Hostile hub, hostile client: nothing outside staging, nothing live the download user's, no wrong bytes
# --------------------------------------------------------------------------------------------------
def tree_state(path: Path) -> dict[str, tuple[int, int, int]]:
    """(uid, gid, mode) of every entry under path (path included), without following links."""
    out = {}
    for p in [path, *path.rglob("*")]:
        st = os.lstat(p)
        out[str(p)] = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
    return out


@pytest.mark.parametrize(
    "fields",
    [
        {"*": {"Revision": "p/../../../victim"}},
        {"*": {"Revision": "p/../../victim"}},
        {"*": {"Revision": "0" * 40 + "\nReadWritePaths=/"}},
        {"*": {"Revision": "a" * 39 + " /"}},
        {"config.json": {"Size": True}},
        {"config.json": {"Sha256": "AB" * 32}},
        {"config.json": {"Path": "../../victim/config.json"}},
        {"config.json": {"Path": "Tokenizer.json"}},
        {"config.json": {"Path": ".gpubox-client/home/.profile"}},
    ],
    ids=[
        "revision-up3",
        "revision-up2",
        "revision-newline",
        "revision-space",
        "size-bool",
        "sha-upper",
        "path-escape",
        "path-casefold",
        "path-bookkeeping",
    ],
)
def test_hostile_listing_fields_change_nothing_outside_staging(
    hub_a: Hub, client_venv: Path, models, store_root: Path, fields: dict[str, Any]
) -> None:
    root = store_root
    lib.run_model_store(request_for(hub_a, root, client_venv))  # a live model, and then a leftover staging dir
    leftover = root / ".staging" / f"Tiny-Instruct@{'e' * 40}"
    leftover.mkdir(mode=0o700)
    victim = root.parent / "victim"
    (victim / "deep").mkdir(parents=True)
    (victim / "deep" / "file").write_text("root's\n")
    before = {**tree_state(victim), **tree_state(root)}
    hub_a.faults({"listing_fields": fields})
    with pytest.raises(lib.ListingError) as refused:
        lib.run_model_store(request_for(hub_a, root, client_venv, rehash=True))
    assert str(refused.value).startswith("the hub listing of"), refused.value
    assert {**tree_state(victim), **tree_state(root)} == before, "a refused listing changed an owner, mode or entry"
    assert not (root.parent / "p").exists() and not (root / "p").exists()
    same_content(root / "Tiny-Instruct", models["a"])


def test_a_repair_never_gives_a_live_inode_to_the_download_user(
    hub_a: Hub, client_venv: Path, models, scratch: Path, store_root: Path
) -> None:
    # A client that records, while it runs, who owns each seeded file and tries to write it; then fails.
    root = store_root
    lib.run_model_store(request_for(hub_a, root, client_venv))
    live = (root / "Tiny-Instruct").resolve()
    rot(live / "config.json")  # one file to repair; the others are seeded into staging
    report = scratch / "marks/report"
    wrapper = wrapper_client(
        scratch,
        client_venv,
        f'stat -c "%u %n" "$staged/model.safetensors" "$staged/tokenizer.json" > "{report}"\n'
        f'if printf X >> "$staged/tokenizer.json" 2>/dev/null; then echo WROTE >> "{report}"; fi\n'
        "exit 3\n",
        real=False,
    )
    with pytest.raises(lib.IntegrityError):
        lib.run_model_store(request_for(hub_a, root, client_venv, modelscope_bin=str(wrapper), rehash=True))
    seen = report.read_text()
    assert "WROTE" not in seen, "the download user could write a seeded (live) inode"
    assert all(line.split()[0] == "0" for line in seen.splitlines()), f"a seeded file was the client's: {seen}"
    dl_uid = int(subprocess.run(["id", "-u", DOWNLOAD_USER], capture_output=True, text=True).stdout)
    owners = {p.stat().st_uid for p in live.rglob("*") if p.is_file()}
    assert dl_uid not in owners and owners == {0}, "after a failed repair a live file is the download user's"
    assert sha(live / "tokenizer.json") == sha(models["a"] / "tokenizer.json")


def test_a_late_writer_that_escaped_the_process_group_changes_nothing_published(
    hub_a: Hub, client_venv: Path, models, scratch: Path, store_root: Path
) -> None:
    # The real client, then a grandchild that calls setsid (leaves the client's process group) and
    # keeps rewriting a verified file of the same size while the store verifies and publishes.
    marks = scratch / "marks"
    wrapper = wrapper_client(
        scratch,
        client_venv,
        f"setsid sh -c 'echo $$ > {marks}/pid-late; while :; do "
        'printf X | dd of="$0/tokenizer.json" bs=1 seek=10 conv=notrunc 2>/dev/null; sleep 0.01; done\' "$staged" &\n'
        f'while [ ! -s "{marks}/pid-late" ]; do sleep 0.05; done\n',
    )
    root = store_root
    try:
        result = lib.run_model_store(request_for(hub_a, root, client_venv, modelscope_bin=str(wrapper), retries=1))
        same_content(root / "Tiny-Instruct", models["a"])  # what is published is what was hashed
        assert result.changed
    except lib.ModelStoreError as exc:  # or refused: never wrong bytes
        assert not (root / "Tiny-Instruct").exists(), exc
    pid = int((marks / "pid-late").read_text())
    for _ in range(50):
        if not alive(pid):
            break
        time.sleep(0.1)
    assert not alive(pid), "the setsid grandchild outlived the run"


def test_without_systemd_the_client_runs_only_with_the_test_switch(
    hub_a: Hub, client_venv: Path, store_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(model_client.UNSANDBOXED_SWITCH)
    with pytest.raises(lib.ModelStoreError, match="cannot be sandboxed") as refused:
        lib.run_model_store(request_for(hub_a, store_root, client_venv))
    assert model_client.UNSANDBOXED_SWITCH in str(refused.value)
    assert not (store_root / ".staging").exists() or not list((store_root / ".staging").glob("Tiny-Instruct@*"))


def test_content_the_lock_does_not_pin_is_refused_over_any_channel(
    hub_a: Hub, hub_b: Hub, client_venv: Path, models, store_root: Path
) -> None:
    root = store_root
    first = lib.run_model_store(request_for(hub_a, root, client_venv))
    pinned = first.content_sha256
    assert re.fullmatch(r"[0-9a-f]{64}", pinned)
    # the same commit, other bytes: the test hub b serves model b; a hostile mirror names a's commit for it
    hub_b.faults({"listing_fields": {"*": {"Revision": first.commit}}})
    mark = hub_b.mark()
    with pytest.raises(lib.ModelStoreError, match="not the content the model lock pins") as refused:
        lib.run_model_store(
            request_for(hub_b, root, client_venv, content_sha256=pinned, lock_file="/inv/models.lock.json")
        )
    message = str(refused.value)
    assert "/inv/models.lock.json" in message and "make lock-models" in message and "make cache-purge" in message
    assert hub_b.file_gets(mark) == [], "refused before a byte was fetched"
    same_content(root / "Tiny-Instruct", models["a"])
    # the pinned content itself passes
    assert not lib.run_model_store(request_for(hub_a, root, client_venv, content_sha256=pinned)).changed
    with pytest.raises(lib.ModelStoreError, match="content_sha256 must be 64"):
        request_for(hub_a, root, client_venv, content_sha256="x" * 64)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_root_under_a_parent_writable_by_others_is_refused(
    hub_a: Hub, client_venv: Path, store_root: Path, mode: int
) -> None:
    parent = store_root.parent / "shared"
    parent.mkdir()
    os.chmod(parent, mode)
    root = parent / "models"
    with pytest.raises(lib.ModelStoreError, match=r"lies under .*writable by group or others"):
        lib.run_model_store(request_for(hub_a, root, client_venv))
    assert not root.exists(), "refused before anything was created"
    os.chmod(parent, 0o1777)  # sticky, like /tmp: no other user may rename root's entries
    assert lib.run_model_store(request_for(hub_a, root, client_venv)).changed


# --------------------------------------------------------------------------------------------------
# Issue 31: content pinned by default, hostile hub and a swapped ancestor of the root
# --------------------------------------------------------------------------------------------------
def snapshot(*paths: Path) -> dict[str, Any]:
    """Every entry under paths, links not followed: owner, mode, and a file's sha256 or a link's target."""
    out: dict[str, Any] = {}
    for top in paths:
        for p in [top, *top.rglob("*")] if top.exists() or top.is_symlink() else []:
            st = os.lstat(p)
            what = os.readlink(p) if p.is_symlink() else (sha(p) if p.is_file() else "dir")
            out[str(p)] = (st.st_uid, stat.S_IMODE(st.st_mode), what)
    return out


def test_the_same_commit_with_other_content_is_refused_by_the_boxs_own_pin(
    hub_a: Hub, hub_b: Hub, client_venv: Path, models, store_root: Path
) -> None:
    """No lock entry at all (a commit pin's first converge wrote none before issue 31): the box pinned the
    content of the commit it published; a hub or cache naming that commit for other files is refused
    before a byte is fetched, the live model and the pins unchanged."""
    root = store_root
    pins = root.parent / "state" / "model-pins.json"
    first = lib.run_model_store(request_for(hub_a, root, client_venv, pin_file=str(pins)))
    recorded = json.loads(pins.read_text())["pins"]
    assert recorded == {
        f"{MODEL_ID}@{first.commit}": {
            "content_sha256": first.content_sha256,
            "files": first.files,
            "total_bytes": first.total_bytes,
            "endpoint": hub_a.endpoint,
        }
    }
    assert stat.S_IMODE(pins.stat().st_mode) == 0o644 and pins.stat().st_uid == 0
    # the hostile hub b names that commit for model b's files
    hub_b.faults({"listing_fields": {"*": {"Revision": first.commit}}})
    before, mark = snapshot(root, pins.parent), hub_b.mark()
    for check_mode in (True, False):
        with pytest.raises(lib.ModelStoreError, match="not the content this box published") as refused:
            lib.run_model_store(request_for(hub_b, root, client_venv, check_mode=check_mode, pin_file=str(pins)))
        assert str(pins) in str(refused.value) and "make cache-purge" in str(refused.value)
    assert hub_b.file_gets(mark) == [], "refused before a byte was fetched"
    assert snapshot(root, pins.parent) == before, "a refused listing changed the store or the pins"
    same_content(root / "Tiny-Instruct", models["a"])
    # the pinned content itself passes, and pins nothing new
    again = lib.run_model_store(request_for(hub_a, root, client_venv, revision=first.commit, pin_file=str(pins)))
    assert again.commit == first.commit
    assert not again.changed and json.loads(pins.read_text())["pins"] == recorded
    # control: without the box's pin (the store before issue 31) the same listing is published
    swapped = lib.run_model_store(request_for(hub_b, root, client_venv))
    assert swapped.changed and swapped.commit == first.commit
    same_content(root / "Tiny-Instruct", models["b"])


def test_a_box_pins_a_model_it_published_before_it_had_pins(hub_a: Hub, client_venv: Path, store_root: Path) -> None:
    root = store_root
    pins = root.parent / "state" / "model-pins.json"
    lib.run_model_store(request_for(hub_a, root, client_venv))  # a box converged before issue 31
    mark = hub_a.mark()
    dry = lib.run_model_store(request_for(hub_a, root, client_venv, check_mode=True, pin_file=str(pins)))
    assert dry.changed and not pins.exists(), "check mode says it would pin, and writes nothing"
    pinned = lib.run_model_store(request_for(hub_a, root, client_venv, pin_file=str(pins)))
    assert pinned.changed and not pinned.downloaded and hub_a.file_gets(mark) == []
    assert list(json.loads(pins.read_text())["pins"]) == [f"{MODEL_ID}@{pinned.commit}"]
    assert not lib.run_model_store(request_for(hub_a, root, client_venv, pin_file=str(pins))).changed


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"schema": 1, "pins": {}, "pins": {}}', "line 1: the key 'pins' is given twice"),
        ('{"schema": 1, "pins": {"x@y": {"content_sha256": null}}}', "line 1: the entry 'x@y' is not"),
        ("[]", "not a schema 1 pins file"),
        ("{", "are not JSON"),
    ],
)
def test_a_damaged_pins_file_is_refused_naming_it(
    hub_a: Hub, client_venv: Path, store_root: Path, text: str, words: str
) -> None:
    pins = store_root.parent / "model-pins.json"
    pins.write_text(text)
    with pytest.raises(lib.ModelStoreError, match=re.escape(words)) as refused:
        lib.run_model_store(request_for(hub_a, store_root, client_venv, pin_file=str(pins)))
    assert str(pins) in str(refused.value) and not store_root.exists()


def test_a_pins_file_another_user_could_write_is_refused(hub_a: Hub, client_venv: Path, store_root: Path) -> None:
    pins = store_root.parent / "model-pins.json"
    pins.write_text('{"schema": 1, "pins": {}}')
    os.chmod(pins, 0o666)
    with pytest.raises(lib.ModelStoreError, match="chmod go-w"):
        lib.run_model_store(request_for(hub_a, store_root, client_venv, pin_file=str(pins)))
    assert not store_root.exists()


@pytest.mark.parametrize(
    ("faults", "words"),
    [
        ({"listing_depth": 100_000}, "nests arrays or objects more than 32 deep"),
        ({"listing_fields": {"config.json": {"Size": True}}}, "config.json has no valid Size"),
        ({"listing_fields": {"*": {"Revision": None}}}, "names no commit"),
    ],
    ids=["nested-100000", "size-bool", "no-commit"],
)
def test_a_refused_listing_ends_the_progress_file_failed_with_the_reason(
    hub_a: Hub, client_venv: Path, store_root: Path, faults: dict[str, Any], words: str
) -> None:
    """A listing nested 100,000 deep raised RecursionError out of the module (a traceback) and left the
    progress file "running", so the role's poll loop waited for the process to be gone. Every refusal of the
    parser is now a ListingError naming the listing, and the progress file ends "failed" with the reason,
    which the poll loop (model_store_progress) reports at once."""
    hub_a.faults(faults)
    req, mark = request_for(hub_a, store_root, client_venv), hub_a.mark()
    with pytest.raises(lib.ListingError, match=words):
        lib.run_model_store(req)
    listing = f"/api/v1/models/{MODEL_ID}/repo/files?Revision=master&Recursive=True"
    asked = [e["path"] for e in hub_a.since(mark) if e["path"] != "/_faults"]  # the POST's line may land late
    assert asked == [listing], "refused before any file was asked for"
    progress = json.loads(Path(req.progress_file).read_text())
    assert progress["state"] == "failed" and words in progress["message"], progress
    poll = load(ROOT / "plugins/modules/model_store_progress.py", "gpubox_model_store_progress")
    assert poll.job_state(progress, {"started": 1, "finished": 0, "ansible_job_id": "j1"})[0] == "failed"
    assert not (store_root / "Tiny-Instruct").exists(), "nothing published"


@pytest.mark.parametrize("revision", ["commit", "master"])
@pytest.mark.parametrize("value", [None, ""])
def test_a_listing_without_a_revision_is_refused_and_changes_nothing(
    hub_a: Hub, client_venv: Path, models, store_root: Path, revision: str, value: str | None
) -> None:
    """A hub or cache that drops the commit from its listing: before issue 31 a commit pin took the listing
    for the commit asked, and a branch named it by its content."""
    root = store_root
    pins = root.parent / "state" / "model-pins.json"
    first = lib.run_model_store(request_for(hub_a, root, client_venv, pin_file=str(pins)))
    asked = first.commit if revision == "commit" else "master"
    hub_a.faults({"listing_fields": {"*": {"Revision": value}}})
    before, mark = snapshot(root, pins.parent), hub_a.mark()
    with pytest.raises(lib.ListingError, match="names no commit") as refused:
        lib.run_model_store(request_for(hub_a, root, client_venv, revision=asked, rehash=True, pin_file=str(pins)))
    assert "nothing was changed" in str(refused.value)
    assert hub_a.file_gets(mark) == [] and snapshot(root, pins.parent) == before
    same_content(root / "Tiny-Instruct", models["a"])


def legacy_ancestor_problems(root: Path) -> list[str]:
    """The check before issue 31, kept here as the control: each lexical parent, stat() following links."""
    found = []
    for ancestor in root.parents:
        with contextlib.suppress(FileNotFoundError):
            st = ancestor.stat()
            problem = state_checks.store_ancestor_problem(
                "gpubox_model_root", str(root), str(ancestor), st.st_uid, stat.S_IMODE(st.st_mode)
            )
            if problem:
                found.append(problem)
    return found


def fetch_uid() -> int:
    return int(subprocess.run(["id", "-u", DOWNLOAD_USER], capture_output=True, text=True, check=True).stdout)


def test_a_symlinked_ancestor_swapped_between_two_runs_is_refused(
    hub_a: Hub, client_venv: Path, models, store_root: Path
) -> None:
    """Issue 31: the root is reached through a symlink. Run 1: the link is root's, in a root-owned 0755
    directory, and points at root's directories: followed, the model published. Between the runs the store
    is moved under a directory the download user owns and the link re-pointed there (what an operator's
    `mv` does; from then on that user can rename the store away and plant its own): run 2 is refused
    naming the path and the fix, writes nothing under either target and leaves the live model as it was."""
    work = store_root.parent
    good = work / "disk1"
    good.mkdir(mode=0o755)
    (work / "via").symlink_to("disk1")  # relative, root's, in a root-owned 0755 directory
    root = work / "via" / "models"
    progress = str(work / "progress.json")  # not beside the root (params_for's default): not under a link
    first = lib.run_model_store(request_for(hub_a, root, client_venv, progress_file=progress))
    assert first.changed and (good / "models" / "Tiny-Instruct").is_symlink()
    same_content(root / "Tiny-Instruct", models["a"])

    user_dir = work / "fetch-owned"
    user_dir.mkdir(mode=0o755)
    os.chown(user_dir, fetch_uid(), -1)
    (user_dir / "disk2").mkdir(mode=0o755)  # root's, but in the download user's directory
    os.rename(good / "models", user_dir / "disk2" / "models")
    tmp = work / ".via.new"
    tmp.symlink_to("fetch-owned/disk2")
    os.replace(tmp, work / "via")
    assert legacy_ancestor_problems(root) == [], "control: the old check (stat through the link) passes this"

    before = snapshot(good, user_dir)
    with pytest.raises(lib.ModelStoreError) as refused:
        lib.run_model_store(request_for(hub_a, root, client_venv, rehash=True, progress_file=progress))
    message = str(refused.value)
    assert f"lies under {user_dir}, owned by uid {fetch_uid()}" in message and "chown root:root" in message
    assert snapshot(good, user_dir) == before, "a refused run wrote under a target of the link"
    same_content(user_dir / "disk2" / "models" / "Tiny-Instruct", models["a"])
    # the check mode of preflight's module says the same
    result = ansible_vars.run_module("gpubox.gpubox.model_root", json.dumps({"root": str(root)}), work)
    assert result["problems"] == [message] and not result.get("changed"), result


@pytest.mark.parametrize(
    ("arrangement", "words"),
    [
        ("link-owned-by-user", "reached through the symlink"),
        ("link-in-sticky-dir", "reached through the symlink"),  # sticky lets a directory pass, never a link
        ("link-in-group-writable-dir", "writable by group or others"),  # the directory itself is refused first
    ],
)
def test_a_symlink_above_the_root_that_a_user_could_change_is_refused(
    store_root: Path, arrangement: str, words: str
) -> None:
    work = store_root.parent
    target = work / "disk"
    target.mkdir(mode=0o755)
    holder = work / "holder"
    holder.mkdir()
    os.chmod(holder, {"link-in-sticky-dir": 0o1777, "link-in-group-writable-dir": 0o775}.get(arrangement, 0o755))
    link = holder / "store"
    link.symlink_to(target)
    if arrangement == "link-owned-by-user":
        os.chown(link, fetch_uid(), -1, follow_symlinks=False)
    root = link / "models"
    problems = store_layout.root_path_problems(root)
    assert len(problems) == 1 and words in problems[0], problems
    if words.startswith("reached"):
        assert f"through the symlink {link} and" in problems[0]
        assert f"set gpubox_model_root to the real path ({target / 'models'})" in problems[0]
    with pytest.raises(lib.ModelStoreError):
        store_layout.ensure_layout(store_layout.StoreLayout(root, "Tiny-Instruct"))
    assert not (target / "models").exists(), "refused before anything was created"
    if arrangement == "link-owned-by-user":
        assert legacy_ancestor_problems(root) == [], "control: the old check passes a user's link"
    # control: the same link made root's in a root-owned 0755 directory is followed
    os.chmod(holder, 0o755)
    os.chown(link, 0, 0, follow_symlinks=False)
    assert store_layout.root_path_problems(root) == []


def test_the_root_path_walk_follows_root_links_and_stops_at_loops(store_root: Path) -> None:
    work = store_root.parent
    (work / "a" / "b").mkdir(parents=True)
    (work / "up").symlink_to("a/b/../b")  # relative, with '..', root's
    (work / "abs").symlink_to(work / "up")  # absolute, to a link
    assert store_layout.root_path_problems(work / "abs" / "models") == []
    (work / "loop1").symlink_to("loop2")
    (work / "loop2").symlink_to("loop1")
    assert "more than 40 symlinks" in store_layout.root_path_problems(work / "loop1" / "models")[0]
    os.chmod(work / "a", 0o777)  # now a directory on the link's real path is writable by others
    (problem,) = store_layout.root_path_problems(work / "abs" / "models")
    assert f"lies under {work / 'a'}, mode 0777" in problem
    (work / "file").write_text("x")
    assert "not a directory" in store_layout.root_path_problems(work / "file" / "models")[0]


# --------------------------------------------------------------------------------------------------
# The second checkpoint of speculative decoding (gpubox_speculative_config): the role, for real
# --------------------------------------------------------------------------------------------------
DRAFT_ID = "Qwen/Tiny-Draft"
# One play per run: the role's main entry, as playbooks/serving.yml runs it; the facts directory and the box's pins
# (role-internal paths) go to each case's own directory instead of this machine's /etc and /var/lib. One case at a
# time: without systemd the store ends a run by killing every process of the download user's uid, which both cases
# share here (a box runs one store, its client in a transient unit of its own).
STORE_PLAY = """
- hosts: store_cases
  serial: 1
  gather_facts: true
  gather_subset: [min]
  tasks:
    - ansible.builtin.include_role:
        name: model_store
      vars:
        __model_store_fact_dir: "{{ case_dir }}/facts.d"
        __model_store_pin_file: "{{ case_dir }}/model-pins.json"
"""


@pytest.fixture(scope="session")
def draft_dir(client_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A third tiny model (another seed, the same tokenizer and shape): the draft model."""
    out = tmp_path_factory.mktemp("draft") / "draft"
    maker = [str(client_venv / "bin/python"), str(HUB / "make_tiny_model.py"), str(out), "--seed", "3"]
    subprocess.run(maker, check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def hub_draft(start_hub: Callable[..., Hub], models: dict[str, Path], draft_dir: Path) -> Hub:
    """The hub serving the model and, at the same endpoint, the draft (as ModelScope serves both)."""
    return start_hub(models["a"], extra=("--also", f"{DRAFT_ID}={draft_dir}"))


def listed_commit(hub: Hub, model_id: str) -> str:
    """The commit the hub's listing names for model_id at master (every blob names it)."""
    url = f"{hub.endpoint}/api/v1/models/{model_id}/repo/files?Revision=master&Recursive=True"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return next(f["Revision"] for f in json.loads(resp.read())["Data"]["Files"] if f["Type"] == "blob")


def state_of(host_vars: dict[str, Any]) -> dict[str, Any]:
    """The desired state the lookup gives a box of gpu_2x3090 with these gpubox_* variables."""
    extra = {k: v for k, v in host_vars.items() if k.startswith("gpubox_")}
    query = "query('gpubox.gpubox.desired_state') | first"
    return ansible_vars.render("unit-draft", query, groups=("gpu_2x3090",), extra_vars=extra)


def planner_config(model_dir: Path) -> dict[str, Any]:
    """gpubox_model_config's config.json form for a generated model: its config.json and its weight files' size."""
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    return {"config_json": json.loads((model_dir / "config.json").read_text()), "weights_bytes": weights}


def test_the_model_store_publishes_the_speculative_draft_beside_the_model_with_its_lock_entry(
    hub_draft: Hub, client_venv: Path, models: dict[str, Path], draft_dir: Path, tmp_path: Path
) -> None:
    """roles/model_store over two boxes on this machine (connection local), each its own store root: the desired
    state names a draft model (gpubox_speculative_config, lts-580); the role runs its one publish step per checkpoint
    (tasks/publish.yml), so the draft is fetched by the same client, verified, published at <root>/Tiny-Draft,
    recorded in its own local fact and locked (models.lock.json) like the model; the vLLM command line names that
    path. The control, box "tampered": the same, with a lock entry that pins other content for the draft: the model
    is published, the draft is refused before anything of it is published, naming the lock."""
    speculative = {"method": "draft_model", "model": DRAFT_ID, "revision": "master", "num_speculative_tokens": 3,
                   "config": planner_config(draft_dir)}  # fmt: skip
    cases = {}
    for name in ("draft", "tampered"):
        case_dir = base_dir("roles") / f"{tmp_path.name}-{name}"
        shutil.rmtree(case_dir, ignore_errors=True)
        case_dir.mkdir()
        cases[name] = case_dir
    # the draft's commit as the hub names it, pinned with other content: what a hub serving other weights looks like
    pinned = {"commit": listed_commit(hub_draft, DRAFT_ID), "endpoint": hub_draft.endpoint, "content_sha256": "0" * 64}
    (cases["tampered"] / "models.lock.json").write_text(lock_file.render_lock({f"{DRAFT_ID}@master": pinned}))
    box = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vault_gpubox_api_key": ansible_vars.TEST_KEY,
        "gpubox_stack": "lts-580",
        "gpubox_model_id": MODEL_ID,
        "gpubox_model_config": planner_config(models["a"]),
        "gpubox_speculative_config": speculative,
        "gpubox_env_prefix": str(client_venv),
        "model_store_endpoint": hub_draft.endpoint,
        "model_store_allow_http": True,
        "model_store_lock_allow_http": True,
        "model_store_download_user": DOWNLOAD_USER,
        "model_store_poll_interval": 1,
        "model_store_timeout": 300,
        "model_store_retries": 0,
        "model_store_reserve_bytes": 0,
    }
    hosts = {
        name: {
            **box,
            "case_dir": str(case_dir),
            "gpubox_model_root": str(case_dir / "models"),
            "gpubox_model_lock_file": str(case_dir / "models.lock.json"),
            "model_store_progress_file": str(case_dir / "progress.json"),
        }
        for name, case_dir in cases.items()
    }
    inventory = {
        "all": {
            "children": {
                "gpu_boxes": {"hosts": hosts},
                "gpu_2x3090": {"hosts": dict.fromkeys(hosts)},
                "store_cases": {"hosts": dict.fromkeys(hosts)},
            }
        }
    }
    (tmp_path / "group_vars").symlink_to(ROOT / "inventories/production/group_vars")
    mark = hub_draft.mark()
    run = ansible_vars.run_playbook(inventory, STORE_PLAY, tmp_path)
    try:
        failed = ansible_vars.first_failure(run["draft"])
        logs = {p.name: p.read_text()[-2000:] for p in (cases["draft"] / "models").glob(".staging/*.log")}
        assert failed is None, f"{failed['task']}: {failed.get('msg')}\n{logs}"
        root = cases["draft"] / "models"
        same_content(root / "Tiny-Instruct", models["a"])
        same_content(root / "Tiny-Draft", draft_dir)
        assert hub_draft.file_gets(mark, "config.json") and any(
            f"/{DRAFT_ID}/repo" in e["path"] for e in hub_draft.file_gets(mark)
        )
        facts = {n: json.loads((cases["draft"] / "facts.d" / f"{n}.fact").read_text())
                 for n in ("gpubox_model", "gpubox_model_draft")}  # fmt: skip
        assert facts["gpubox_model_draft"]["model_id"] == DRAFT_ID
        assert facts["gpubox_model_draft"]["path"] == str(root / "Tiny-Draft")
        assert facts["gpubox_model_draft"]["commit"] != facts["gpubox_model"]["commit"]
        lock = json.loads((cases["draft"] / "models.lock.json").read_text())["models"]
        assert lock[f"{DRAFT_ID}@master"]["commit"] == facts["gpubox_model_draft"]["commit"]
        assert lock[f"{DRAFT_ID}@master"]["content_sha256"] == facts["gpubox_model_draft"]["content_sha256"]
        assert lock[f"{MODEL_ID}@master"]["commit"] == facts["gpubox_model"]["commit"]
        # the command line of the vLLM unit names the published draft
        state = state_of(hosts["draft"])
        assert state["errors"] == [], state["errors"]
        argv = vllm_cmdline.vllm_args(state)
        rendered = json.loads(argv[argv.index("--speculative-config") + 1])
        assert rendered == {"method": "draft_model", "model": str(root / "Tiny-Draft"), "num_speculative_tokens": 3}
        assert (Path(rendered["model"]) / "config.json").is_file()

        refused = ansible_vars.first_failure(run["tampered"])
        assert refused and "content" in refused["msg"] and DRAFT_ID in refused["msg"], refused
        same_content(cases["tampered"] / "models" / "Tiny-Instruct", models["a"])
        assert not (cases["tampered"] / "models" / "Tiny-Draft").exists()
        assert not (cases["tampered"] / "facts.d" / "gpubox_model_draft.fact").exists()
    finally:
        for case_dir in cases.values():
            shutil.rmtree(case_dir, ignore_errors=True)
