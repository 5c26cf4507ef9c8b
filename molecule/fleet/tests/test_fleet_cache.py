"""Verify the fleet's LAN cache (molecule/fleet, run after its converge and before its side effect): what it
saved upstream, that a second run of site.yml on the cache and a box changes nothing, and that nothing it
serves is trusted by the boxes. Every request and check runs inside the containers (podman exec). Each
test leaves the cache as it found it (hub faults cleared, a changed stored wheel put back): the side
effect's rolls build environments through it next."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from harness.ansible_vars import play_recap, scenario_playbook

CACHE = "gpubox-m-fleet-gw"
BOX1, BOX2, BOX3 = "gpubox-m-fleet-box1", "gpubox-m-fleet-box2", "gpubox-m-fleet-box3"
CACHE_IP = "10.231.93.5"
CACHE_URL = f"http://{CACHE_IP}"
BOX_IPS = {BOX1: "10.231.93.11", BOX2: "10.231.93.12", BOX3: "10.231.93.13"}
MODEL = "gpubox-test/tiny-qwen2"
PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
EPHEMERAL = Path(os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "/nonexistent"))
RESULTS = PROJECT / ".cache/molecule-logs/fleet.converge.json"  # converge.yml: per wave of boxes
FAULTS = "/etc/gpubox-sim/hub-faults.json"
HUB_LOG = "/var/log/gpubox-sim-hub.jsonl"
TINY_WEIGHTS = 2628800  # model.safetensors of the tiny model (host_vars: weights_bytes)
# A box after the first may cost the cache some revalidation of apt's index files; "about nothing" is this
# bound per box.
LATER_BOX_BOUND = 2 * 1024 * 1024
LOCK = PROJECT / "harness/engine_standin/constraints.hashes.txt"  # the fleet boxes' hash lock


def sh(container: str, script: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["podman", "exec", "-i", container, "bash", "-c", script], input=stdin, capture_output=True, text=True
    )
    if check:
        assert proc.returncode == 0, f"{container}: {script}\n{proc.stdout}\n{proc.stderr}"
    return proc


def set_faults(spec: dict) -> None:
    sh(CACHE, f"cat > {FAULTS}.tmp && mv {FAULTS}.tmp {FAULTS}", stdin=json.dumps(spec))


FETCH = r"""
import hashlib, json, sys, urllib.request
url = sys.argv[1]
with urllib.request.urlopen(url, timeout=60) as r:
    body = r.read()
    print(json.dumps({"status": r.status, "cache": r.headers.get("X-Gpubox-Fleet-Cache"),
                      "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}))
"""


def fetch(container: str, url: str) -> dict:
    return json.loads(sh(container, f"python3 - '{url}'", stdin=FETCH).stdout)


def commit(name: str) -> str:
    return (EPHEMERAL / name).read_text().strip()


@pytest.fixture(autouse=True)
def no_hub_faults():
    """Every test starts and ends with the test hub serving faithfully."""
    set_faults({})
    yield
    set_faults({})


@pytest.fixture(scope="module")
def waves() -> list[dict]:
    assert RESULTS.is_file(), f"{RESULTS} missing: the converge writes it"
    return json.loads(RESULTS.read_text())["waves"]


def test_the_first_box_fetched_through_the_cache_from_every_source(waves) -> None:
    first = waves[0]
    assert first["boxes"] == [BOX1], first
    assert int(first["apt_upstream_bytes"]) > 10 * 1024 * 1024, first  # the driver and CUDA packages
    assert int(first["pypi_upstream_bytes"]) > 5 * 1024 * 1024, first  # cryptography and modelscope
    assert int(first["models_upstream_bytes"]) >= TINY_WEIGHTS, first


def test_later_boxes_added_about_nothing_upstream_yet_got_everything_from_the_cache(waves) -> None:
    first, later = waves[0], waves[1]
    n = len(later["boxes"])
    print(f"\n[fleet cache] upstream bytes: {first['upstream_bytes']} (box1), {later['upstream_bytes']} (box2, box3)")
    assert n == 2, later
    assert int(later["upstream_bytes"]) <= n * LATER_BOX_BOUND, later
    assert int(later["pypi_upstream_files"]) == 0, later
    # The later boxes really downloaded (through the cache): about as many bytes each as the first was sent.
    assert int(later["apt_sent_bytes"]) >= n * 0.9 * int(first["apt_sent_bytes"]) > 0, (first, later)
    assert int(later["models_sent_bytes"]) >= n * TINY_WEIGHTS, later


def test_a_second_run_of_site_yml_on_the_cache_and_a_box_changes_nothing() -> None:
    """Idempotence of the cache host (roles/fleet_cache) and of a box that converged through it (the
    cache's apt proxy, the packages, the environment by hash lock, the model from the cache)."""
    run = scenario_playbook(PROJECT / "site.yml", limit=f"{CACHE},{BOX2}")
    assert run.returncode == 0, run.stdout[-4000:]
    stats = play_recap(run.stdout)
    assert set(stats) >= {CACHE, BOX2}, run.stdout[-3000:]
    changed = {host: counts["changed"] for host, counts in stats.items() if counts.get("changed")}
    said = "\n".join(line for line in run.stdout.splitlines() if line.startswith("changed:"))
    assert changed == {}, f"{changed}\n{said}"


@pytest.mark.parametrize("box", [BOX1, BOX2, BOX3])
def test_boxes_point_at_the_cache_and_verified_what_they_got(box: str) -> None:
    conf = sh(box, "cat /etc/apt/apt.conf.d/01gpubox-fleet-cache").stdout
    assert f'Acquire::http::Proxy "http://{CACHE_IP}:3142/";' in conf
    assert "trusted=yes" not in sh(box, "cat /etc/apt/sources.list.d/* /etc/apt/sources.list 2>/dev/null; true").stdout
    fact = json.loads(sh(box, "cat /etc/ansible/facts.d/gpubox_model.fact").stdout)
    assert fact["endpoint"] == CACHE_URL and fact["commit"] == commit("hub-commit")
    # The live model's files match its manifest (what model_store checked: sha256 of every file).
    live = f"/data/models/{MODEL.split('/')[1]}"
    manifest = json.loads(sh(box, f"cat {live}/.gpubox-manifest.json").stdout)
    for f in manifest["files"]:
        got = sh(box, f"sha256sum {live}/{f['path']}").stdout.split()[0]
        assert got == f["sha256"], f["path"]


def test_a_redirected_file_is_cached_under_the_request_not_the_presigned_url() -> None:
    """ModelScope serves files by a redirect to a storage host: nginx follows it and caches the body
    under (model, Revision, FilePath); a second box's request is a HIT with no new upstream request."""
    set_faults({"redirect": True})
    url = f"{CACHE_URL}/api/v1/models/{MODEL}/repo?Revision={commit('hub-commit-b')}&FilePath=config.json"
    mark = int(sh(CACHE, f"wc -l < {HUB_LOG}").stdout)
    first, second = fetch(BOX1, url), fetch(BOX2, url)
    hub = [json.loads(line) for line in sh(CACHE, f"tail -n +{mark + 1} {HUB_LOG}").stdout.splitlines()]
    assert first["status"] == second["status"] == 200
    assert (first["cache"], second["cache"]) == ("MISS", "HIT")
    assert first["sha256"] == second["sha256"]
    assert [e["status"] for e in hub if "config.json" in e["path"]] == [302, 200], hub
    a_url = url.replace(commit("hub-commit-b"), commit("hub-commit"))
    assert fetch(BOX1, a_url)["sha256"] == first["sha256"]  # commit B kept A's config.json: same bytes


def test_a_tampered_wheel_from_the_cache_is_refused() -> None:
    """pip checks each file against the sha256 the index page names: a cache whose stored wheel was
    changed cannot slip it into a box. The stored wheel is put back afterwards."""
    get = (
        "rm -rf /tmp/fc-dl && /opt/gpubox/venv/bin/python -m pip download --no-deps --no-cache-dir "
        "--disable-pip-version-check "
        f"--index-url {CACHE_URL}/index/ --trusted-host {CACHE_IP} -d /tmp/fc-dl idna==3.20 2>&1"
    )
    assert sh(BOX2, get, check=False).returncode == 0  # control: the untouched cache serves it
    wheel = sh(CACHE, "find /var/cache/gpubox-pypi-cache -name 'idna-3.20-*.whl' | head -1").stdout.strip()
    assert wheel, "the box's environment fetched idna 3.20 through the cache"
    flip = "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read())"
    flip += "; b[len(b) // 2] ^= 255; open(p, 'wb').write(b)"
    sh(CACHE, f"cp -p {wheel} {wheel}.kept")
    try:
        sh(CACHE, f'python3 -c "{flip}" {wheel}')
        refused = sh(BOX2, get, check=False)
    finally:
        sh(CACHE, f"mv -f {wheel}.kept {wheel}")
    assert refused.returncode != 0 and "HASH" in refused.stdout.upper(), refused.stdout
    assert sh(BOX2, get, check=False).returncode == 0  # the wheel put back is served again


HOSTILE_INDEX = r"""
import hashlib, http.server, os, pathlib, shutil, sys
root = pathlib.Path("/tmp/fc-hostile")
shutil.rmtree(root, ignore_errors=True)
(root / "simple/idna").mkdir(parents=True)
wheel = pathlib.Path(sys.argv[1])
body = bytearray(wheel.read_bytes()); body[len(body) // 3] ^= 0x55  # other bytes, same name
(root / wheel.name).write_bytes(body)
digest = hashlib.sha256(body).hexdigest()  # the index page names the tampered file's own hash
(root / "simple/idna/index.html").write_text(f'<a href="/{wheel.name}#sha256={digest}">{wheel.name}</a>')
os.chdir(root)
http.server.ThreadingHTTPServer(("127.0.0.1", 8765), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def test_a_wheel_whose_hash_the_lock_does_not_name_is_refused_whatever_the_index_says() -> None:
    """A hostile index (or cache) that also rewrites the index page's sha256 passes pip's own check,
    not the box's hash lock: python_env installs with --require-hashes from the checked-in lock."""
    pins = "/opt/gpubox/venv/gpubox"
    assert sh(BOX2, f"test -s {pins}/hashes.txt && grep -c -- '--hash=sha256:' {pins}/hashes.txt").returncode == 0
    # idna's entry of the lock the box installed from (the checked-in file), as a one-pin requirements file
    lock = LOCK.read_text()
    entry = re.search(r"^idna==3\.20 \\\n(?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+", lock, re.M)
    assert entry, f"idna 3.20 is in the fleet boxes' hash lock {LOCK}"
    assert sh(BOX2, f"cat {pins}/hashes.txt").stdout == lock, "the box installed from the checked-in lock"
    sh(BOX2, "cat > /tmp/fc-idna.txt", stdin=entry.group(0))
    # The hostile index serves a changed copy of the wheel the cache stored (the copy changes other bytes than
    # the test above, so it is never PyPI's file).
    stored = sh(CACHE, "find /var/cache/gpubox-pypi-cache -name 'idna-3.20-*.whl' | head -1").stdout.strip()
    assert stored, "the cache stored idna 3.20 when the box's environment was built"
    wheel = f"/tmp/{Path(stored).name}"
    local = EPHEMERAL / Path(stored).name
    subprocess.run(["podman", "cp", f"{CACHE}:{stored}", str(local)], check=True)
    subprocess.run(["podman", "cp", str(local), f"{BOX2}:{wheel}"], check=True)
    server = subprocess.Popen(["podman", "exec", "-i", BOX2, "python3", "-", wheel], stdin=subprocess.PIPE, text=True)
    try:
        server.stdin.write(HOSTILE_INDEX)
        server.stdin.close()
        sh(
            BOX2,
            "for i in $(seq 50); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8765))' "
            "2>/dev/null && exit 0; sleep 0.1; done; exit 1",
        )
        get = (
            "rm -rf /tmp/fc-h && /opt/gpubox/venv/bin/python -m pip download --no-deps --no-cache-dir "
            "--disable-pip-version-check --index-url http://127.0.0.1:8765/simple/ -d /tmp/fc-h"
        )
        plain = sh(BOX2, f"{get} idna==3.20 2>&1", check=False)
        assert plain.returncode == 0, f"control: without the lock pip takes the hostile file\n{plain.stdout}"
        locked = sh(BOX2, f"{get} --require-hashes -r /tmp/fc-idna.txt 2>&1", check=False)
        assert locked.returncode != 0 and "HASH" in locked.stdout.upper(), locked.stdout
    finally:
        sh(BOX2, "pkill -f 'python3 - ' || true", check=False)
        server.wait(timeout=30)


def refetch(*extra: str) -> subprocess.CompletedProcess:
    """refetch.yml (the model store on box 1) as its own ansible-playbook run, with extra -e pairs."""
    playbook = Path(__file__).resolve().parents[1] / "refetch.yml"
    return scenario_playbook(playbook, "model_store_retries=0", "model_store_poll_interval=2", *extra)


def test_other_content_under_the_locked_commit_through_the_cache_is_refused_by_the_lock(tmp_path: Path) -> None:
    """The hub behind the cache lists other weights under the commit the box serves (the correct commit
    id, other sha256 and size): the model lock pins the content, so the box refuses the listing before
    it fetches a byte, names the lock and the fix, and keeps serving what it had."""
    from ansible_collections.gpubox.gpubox.plugins.module_utils.hub_listing import parse_listing

    a = commit("hub-commit")
    listing_url = f"{CACHE_URL}/api/v1/models/{MODEL}/repo/files?Revision={a}&Recursive=True"
    read = f"import urllib.request; print(urllib.request.urlopen('{listing_url}').read().decode())"
    body = sh(BOX1, f'python3 -c "{read}"')
    pinned = parse_listing(json.loads(body.stdout), MODEL, a)
    lock = tmp_path / "models.lock.json"
    entry = {"commit": a, "endpoint": "https://hub.example", "content_sha256": pinned.content_sha256}
    lock.write_text(json.dumps({"schema": 1, "models": {f"{MODEL}@{a}": entry}}))
    lock.chmod(0o644)
    other = "0" * 64
    set_faults({"listing_fields": {"model.safetensors": {"Sha256": other, "Size": TINY_WEIGHTS + 1}}})
    mark = int(sh(CACHE, f"wc -l < {HUB_LOG}").stdout)
    try:
        refused = refetch(f"gpubox_model_revision={a}", f"gpubox_model_lock_file={lock}")
    finally:
        set_faults({})
    assert refused.returncode != 0, refused.stdout[-3000:]
    said = refused.stdout
    assert "not the content the model lock pins" in said and str(lock) in said, said[-3000:]
    hub = [json.loads(line) for line in sh(CACHE, f"tail -n +{mark + 1} {HUB_LOG}").stdout.splitlines()]
    assert not [e for e in hub if "FilePath=" in e["path"]], f"a file was fetched for refused content: {hub}"
    live = sh(BOX1, f"readlink /data/models/{MODEL.split('/')[1]}").stdout
    assert a in live
    # control: the pinned content itself passes the same lock, with nothing to do
    passed = refetch(f"gpubox_model_revision={a}", f"gpubox_model_lock_file={lock}")
    assert passed.returncode == 0, passed.stdout[-3000:]


def test_a_corrupt_model_file_from_the_cache_is_refused_and_the_live_model_stays() -> None:
    """The hub (through a redirect) hands the cache a corrupt model.safetensors for commit B, which the
    cache keeps: the box's model store refuses it (sha256 against the listing) and keeps commit A live."""
    set_faults({"redirect": True, "corrupt": {"model.safetensors": True}})
    # Commit B has no lock entry: the box takes the cache's first answer only because the inventory says so.
    run = refetch(f"gpubox_model_revision={commit('hub-commit-b')}", "gpubox_fleet_cache_trust_first_fetch=true")
    set_faults({})
    assert run.returncode != 0, run.stdout[-3000:]
    assert "sha256" in run.stdout.lower() or "checksum" in run.stdout.lower(), run.stdout[-3000:]
    live = sh(BOX1, f"readlink /data/models/{MODEL.split('/')[1]}").stdout
    assert commit("hub-commit") in live and commit("hub-commit-b") not in live
    log = [json.loads(line) for line in sh(CACHE, "cat /var/log/nginx/gpubox-fleet-cache.log").stdout.splitlines()]
    stored = [e for e in log if "model.safetensors" in e["uri"] and commit("hub-commit-b") in e["uri"]]
    assert stored and stored[0]["upstream_status"].startswith("302"), stored


# One HTTP request from a chosen source address (a proxy request when the path is a URL, as apt sends it).
ASK_FROM = r"""
import http.client, json, sys
source, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]  # argv[4]: the cache's address
try:
    conn = http.client.HTTPConnection(sys.argv[4], port, timeout=30, source_address=(source, 0))
    conn.request("GET", path, headers={"Accept": "text/html"})  # the PyPI index negotiates (PEP 691)
    resp = conn.getresponse()
    body = resp.read()
    print(json.dumps({"status": resp.status, "size": len(body)}))
except (OSError, http.client.HTTPException) as exc:
    print(json.dumps({"status": None, "size": 0, "error": type(exc).__name__}))
"""
ASKED = [
    (80, "/_fleet_cache/health"),
    (80, f"/api/v1/models/{MODEL}/repo/files?Revision=master"),
    (80, "/index/idna/"),
    (3142, f"http://{CACHE_IP}:8089/InRelease"),  # apt-cacher-ng, as apt asks a proxy
]


def ask_from(container: str, source: str, port: int, path: str) -> dict:
    return json.loads(sh(container, f"python3 - {source} {port} '{path}' {CACHE_IP}", stdin=ASK_FROM).stdout)


@pytest.mark.parametrize(("port", "path"), ASKED)
def test_a_host_outside_the_allowed_networks_gets_nothing_on_any_port(port: int, path: str) -> None:
    """The default admits the boxes of gpu_boxes only: the cache host's own network address is not one."""
    seen = sh(CACHE, f"wc -l < {HUB_LOG} 2>/dev/null || echo 0").stdout.strip()
    outside = ask_from(CACHE, CACHE_IP, port, path)
    assert outside["status"] in (None, 403) and (outside["status"] == 403 or outside["size"] == 0), outside
    if port == 80:
        assert outside["status"] == 403, outside  # nginx says why (gpu_boxes, fleet_cache_allowed_networks)
        assert sh(CACHE, f"wc -l < {HUB_LOG} 2>/dev/null || echo 0").stdout.strip() == seen  # nothing went upstream
    inside = ask_from(BOX1, BOX_IPS[BOX1], port, path)  # control: a box on the list gets an answer
    assert inside["status"] == 200 and inside["size"] > 0, inside


def test_the_default_admits_exactly_the_boxes_by_the_addresses_their_facts_report() -> None:
    """The boxes' ansible_host is 127.0.0.1 (sshd published on loopback): the role read their default IPv4
    (molecule.yml: 10.231.93.11 to .13) and admits those and loopback, on nginx and on apt-cacher-ng, nothing else
    (not the cache+gateway host's own address, nor the podman host's)."""
    conf = sh(CACHE, "cat /etc/nginx/conf.d/gpubox-fleet-cache.conf").stdout
    allowed = sorted(w[1].rstrip(";") for w in (line.split() for line in conf.splitlines()) if w[:1] == ["allow"])
    boxes = [f"{ip}/32" for ip in BOX_IPS.values()]
    assert allowed == sorted(["127.0.0.1", "::1", *boxes]), allowed
    wrap = sh(CACHE, "grep '^apt-cacher-ng:' /etc/hosts.allow").stdout.strip()
    assert wrap == "apt-cacher-ng: 127.0.0.1 [::1] " + " ".join(boxes), wrap
