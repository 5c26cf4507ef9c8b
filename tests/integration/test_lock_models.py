"""make lock-models (playbooks/lock_models.yml) for real: the lock's answer comes from the hub over verified TLS,
never from the LAN cache, and boxes that disagree are refused, naming both answers.

What is real: ansible-playbook running the playbook over local hosts of an inventory with production's
group_vars, the gpubox.gpubox.model_resolve and model_lock modules, TLS with certificate checks, the test hub
(harness/hub/server.py) serving listings. Two hubs serve other content for one model id: ``hub`` is the hub the
inventory names (model_store_endpoint) and ``other`` plays the LAN cache (gpubox_fleet_cache_url) or, for the
disagreement, the hub another box is pointed at. Each hub's request log says who was asked.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import lock_file
from ansible_collections.gpubox.gpubox.plugins.module_utils.hub_listing import parse_listing
from harness import ansible_vars, live_proxies

ROOT = Path(__file__).resolve().parents[2]
MODEL = "Qwen/Qwen2.5-14B-Instruct"  # production's gpu_2x3090 model: its group_vars validate as they are
KEY = f"{MODEL}@master"


@dataclass
class Hub:
    endpoint: str
    cert: Path
    log: Path
    proc: subprocess.Popen
    commit: str = ""
    content: str = ""

    def asked(self) -> list[str]:
        if not self.log.exists():
            return []
        return [json.loads(line)["path"] for line in self.log.read_text().splitlines() if line.strip()]


def start_hub(work: Path, name: str, weights: bytes, also: dict[str, Path] | None = None) -> Hub:
    """The test hub over TLS (its own certificate for 127.0.0.1) serving MODEL at master: two small files; ``also``:
    more models at the same endpoint (OWNER/NAME -> directory)."""
    model, state = work / name / "model", work / name
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "hub": name}))
    (model / "model.safetensors").write_bytes(weights)
    cert, key = live_proxies.self_signed(state, "127.0.0.1")
    argv = [sys.executable, str(ROOT / "harness/hub/server.py"), str(model), "--model-id", MODEL, "--port", "0"]
    argv += ["--port-file", str(state / "port"), "--log", str(state / "requests.jsonl")]
    for model_id, directory in (also or {}).items():
        argv += ["--also", f"{model_id}={directory}"]
    argv += ["--tls-cert", str(cert), "--tls-key", str(key)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(state / "stderr").open("w"))
    deadline = time.monotonic() + 10
    while not (state / "port").is_file() or not (state / "port").read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, (state / "stderr").read_text()
        time.sleep(0.05)
    hub = Hub(f"https://127.0.0.1:{int((state / 'port').read_text())}", cert, state / "requests.jsonl", proc)
    url = f"{hub.endpoint}/api/v1/models/{MODEL}/repo/files?Revision=master&Recursive=True"
    with urllib.request.urlopen(url, timeout=10, context=ssl.create_default_context(cafile=str(cert))) as resp:
        listing = parse_listing(json.loads(resp.read()), MODEL, "master")
    hub.commit, hub.content = listing.commit, listing.content_sha256
    hub.log.write_text("")  # this read is the test's, not a box's
    return hub


@pytest.fixture(scope="module")
def hubs() -> Iterator[dict[str, Hub]]:
    work = Path(tempfile.mkdtemp(prefix="gpubox-lock-models."))
    started = {name: start_hub(work, name, weights) for name, weights in (("hub", b"A" * 64), ("other", b"B" * 64))}
    try:
        yield started
    finally:
        for hub in started.values():
            live_proxies.stop(hub.proc)
        subprocess.run(["rm", "-rf", str(work)], check=False)


def lock_models(tmp: Path, boxes: dict[str, dict[str, Any]], hubs: dict[str, Hub]) -> dict[str, Any]:
    """playbooks/lock_models.yml over local hosts in gpu_boxes and gpu_2x3090 (production's group_vars), each
    with ``boxes[name]`` over the shared settings; both hubs' certificates in the boxes' CA bundle."""
    bundle = tmp / "hubs-ca.pem"
    bundle.write_text("".join(hub.cert.read_text() for hub in hubs.values()))
    shared = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vault_gpubox_api_key": ansible_vars.TEST_KEY,
        "gpubox_model_lock_file": str(tmp / "models.lock.json"),
        "model_store_ca_bundle": str(bundle),
    }
    inventory = {
        "all": {
            "children": {
                "gpu_boxes": {"hosts": {name: {**shared, **own} for name, own in boxes.items()}},
                "gpu_2x3090": {"hosts": dict.fromkeys(boxes)},
            }
        }
    }
    if not (tmp / "group_vars").exists():
        (tmp / "group_vars").symlink_to(ROOT / "inventories/production/group_vars")
    return ansible_vars.run_playbook(
        inventory, f"- ansible.builtin.import_playbook: {ROOT}/playbooks/lock_models.yml\n", tmp
    )


def written(tmp: Path) -> dict[str, dict[str, Any]]:
    return dict(lock_file.read_lock(str(tmp / "models.lock.json")))


@pytest.mark.parametrize("cache", ["other", "closed"], ids=["https-cache-answering", "http-cache-closed"])
def test_the_lock_is_written_from_the_hub_never_from_the_lan_cache(
    tmp_path: Path, hubs: dict[str, Hub], cache: str
) -> None:
    """Before, the box asked the cache in front of the hub (gpubox_fleet_cache_url) and the entry named
    model_store_endpoint: an https cache's answer was locked as if the hub had given it, and with a plain-http
    cache make lock-models refused. Now the hub is asked itself and the entry names it; the cache is never
    asked. The control: the cache answers, and its answer is not the hub's (another commit and content)."""
    hub, other = hubs["hub"], hubs["other"]
    assert (other.commit, other.content) != (hub.commit, hub.content)
    cache_url = other.endpoint if cache == "other" else f"http://127.0.0.1:{live_proxies.free_port()}"
    box = {"model_store_endpoint": hub.endpoint, "gpubox_fleet_cache_url": cache_url}
    run = lock_models(tmp_path, {"box1": box, "box2": box}, hubs)
    assert ansible_vars.first_failure(run["box1"]) is None, ansible_vars.first_failure(run["box1"])
    entry = written(tmp_path)[KEY]
    assert (entry["commit"], entry["content_sha256"], entry["endpoint"]) == (hub.commit, hub.content, hub.endpoint)
    assert other.asked() == [], "the LAN cache was asked"
    assert len(hub.asked()) == 2, hub.asked()  # each box asked the hub once
    other.log.write_text("")
    hub.log.write_text("")


def test_a_hub_whose_certificate_is_not_trusted_gives_no_lock(tmp_path: Path, hubs: dict[str, Hub]) -> None:
    """Verified TLS: without the hub's CA in model_store_ca_bundle (the system's CAs, which do not know the test
    hub's certificate) the listing is refused, and nothing is written."""
    box = {"model_store_endpoint": hubs["hub"].endpoint, "model_store_ca_bundle": ""}
    run = lock_models(tmp_path, {"box1": box}, hubs)
    failed = ansible_vars.first_failure(run["box1"])
    assert failed and "CERTIFICATE_VERIFY_FAILED" in failed["msg"], failed
    assert not (tmp_path / "models.lock.json").exists()
    hubs["hub"].log.write_text("")


def test_boxes_that_disagree_are_refused_naming_both_answers(tmp_path: Path, hubs: dict[str, Hub]) -> None:
    """box2 is pointed at another hub, which names another commit and content for master. Before, the last box's
    answer was written; now nothing is, and the refusal names each box's commit, content and endpoint. The lock
    as it was stays. The control: the same boxes on one hub write their one answer."""
    hub, other = hubs["hub"], hubs["other"]
    before = {KEY: {"commit": "f" * 40, "endpoint": "https://earlier.example", "content_sha256": "e" * 64}}
    (tmp_path / "models.lock.json").write_text(lock_file.render_lock(before))
    boxes = {
        "box1": {"model_store_endpoint": hub.endpoint},
        "box2": {"model_store_endpoint": other.endpoint},
        "box3": {"model_store_endpoint": hub.endpoint},
    }
    run = lock_models(tmp_path, boxes, hubs)
    failed = ansible_vars.first_failure(run["box1"])  # the lock is written once, by the first box, for all
    assert failed and failed["task"].endswith("Record the resolved commits in the model lock on the controller.")
    said = " ".join(item.get("msg", "") for item in failed["results"])  # one item per lock file
    assert f"the boxes disagree on {KEY}, so nothing was written" in said, said
    assert f"box1, box3 got commit {hub.commit} (content_sha256 {hub.content}, from {hub.endpoint})" in said, said
    assert f"box2 got commit {other.commit} (content_sha256 {other.content}, from {other.endpoint})" in said, said
    assert written(tmp_path) == before
    agreed = lock_models(tmp_path, {name: boxes["box1"] for name in boxes}, hubs)
    assert all(ansible_vars.first_failure(agreed[host]) is None for host in boxes)
    assert written(tmp_path)[KEY] == {
        "commit": hub.commit,
        "endpoint": hub.endpoint,
        "content_sha256": hub.content,
        "files": 2,
        "total_bytes": written(tmp_path)[KEY]["total_bytes"],
    }
    hub.log.write_text("")
    other.log.write_text("")


DRAFT = "Qwen/Qwen2.5-7B-Instruct"  # in the catalog: gpubox_speculative_config needs no config facts for it


def test_make_lock_models_locks_a_speculative_draft_beside_the_model(tmp_path: Path, hubs: dict[str, Hub]) -> None:
    """A box whose gpubox_speculative_config names a draft model: make lock-models asks the hub for both revisions
    (roles/model_store/tasks/resolve_one.yml, once per checkpoint) and writes both entries, each with the hub's
    commit and content for it. The control: the same box without the draft writes the model's entry only."""
    draft_dir = tmp_path / "draft-files"
    draft_dir.mkdir()
    (draft_dir / "config.json").write_text(json.dumps({"model_type": "qwen2", "hub": "draft"}))
    (draft_dir / "model.safetensors").write_bytes(b"D" * 64)
    hub = start_hub(tmp_path / "hubs", "with-draft", b"A" * 64, also={DRAFT: draft_dir})
    try:
        url = f"{hub.endpoint}/api/v1/models/{DRAFT}/repo/files?Revision=master&Recursive=True"
        context = ssl.create_default_context(cafile=str(hub.cert))
        with urllib.request.urlopen(url, timeout=10, context=context) as resp:
            draft = parse_listing(json.loads(resp.read()), DRAFT, "master")
        both = {"with-draft": hub}
        box = {"model_store_endpoint": hub.endpoint, "gpubox_stack": "lts-580"}
        (tmp_path / "control").mkdir()
        control = lock_models(tmp_path / "control", {"box1": box}, both)
        assert ansible_vars.first_failure(control["box1"]) is None, ansible_vars.first_failure(control["box1"])
        assert sorted(written(tmp_path / "control")) == [KEY]
        speculative = {"method": "draft_model", "model": DRAFT, "revision": "master", "num_speculative_tokens": 3}
        run = lock_models(tmp_path, {"box1": {**box, "gpubox_speculative_config": speculative}}, both)
        assert ansible_vars.first_failure(run["box1"]) is None, ansible_vars.first_failure(run["box1"])
        entries = written(tmp_path)
        assert sorted(entries) == sorted([KEY, f"{DRAFT}@master"])
        assert (entries[KEY]["commit"], entries[KEY]["content_sha256"]) == (hub.commit, hub.content)
        got = entries[f"{DRAFT}@master"]
        assert (got["commit"], got["content_sha256"], got["endpoint"]) == (draft.commit, draft.content_sha256,
                                                                           hub.endpoint)  # fmt: skip
        assert draft.commit != hub.commit
    finally:
        live_proxies.stop(hub.proc)
