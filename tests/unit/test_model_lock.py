"""The model lock (plugins/module_utils/lock_file.py): a moving revision is served as the commit it
was resolved to, read from a lock file beside the inventory, until the lock is changed on purpose.

- the lock file's format: read, merged, rendered and written back; bad files name the file and fix;
- the desired_state lookup (on the controller, as Ansible templates it) turns the lock into
  gpubox_model_commit / gpubox_model_fetch_revision; a commit revision needs no entry;
- preflight warns about a branch with no entry and not about a locked or commit revision;
- the model_lock module (through `ansible localhost`, in tests/integration/test_modules.py) adds missing
  entries, replaces only when asked, writes only on a change and never locks a listing's content id;
- an answer is locked only from the hub over https, never through the LAN cache, and boxes that disagree
  are refused naming each answer; a box's fetch through the cache waits for an entry (the role's input
  checks, one ansible-playbook run); make lock-models itself, for real: tests/integration/test_lock_models.py.
The molecule scenario serving (its day-two side effect) proves the same end to end on a box with the test hub.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import lock_file, preflight_checks
from harness import ansible_vars

ROOT = Path(__file__).resolve().parents[2]
A = "a" * 40
B = "0123456789abcdef0123456789abcdef01234567"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
C = "c" * 64
D = "d" * 64
HUB = "https://hub.example"


def answer(commit: str = A, revision: str = "master", **more) -> dict:
    """One box's answer from the hub, as resolve.yml and the model store note it for model_lock."""
    return {"model_id": MODEL, "revision": revision, "commit": commit, "endpoint": HUB, "host": "box1", **more}


def state(extra: dict) -> dict:
    return ansible_vars.render(
        "unit-lock", "query('gpubox.gpubox.desired_state') | first", groups=("gpu_2x3090",), extra_vars=extra
    )


def write(path: Path, entries: dict) -> Path:
    path.write_text(lock_file.render_lock(entries))
    return path


def test_lock_round_trips_and_merges() -> None:
    entries, changed = lock_file.merge_lock({}, [answer(A)], False)
    assert changed == [f"{MODEL}@master"] and entries[f"{MODEL}@master"] == {"commit": A, "endpoint": HUB}
    assert lock_file.parse_lock(lock_file.render_lock(entries), "x") == entries
    # a converge adds only what is missing; make lock-models replaces
    same, changed = lock_file.merge_lock(entries, [answer(B)], False)
    assert same == entries and changed == []
    moved, changed = lock_file.merge_lock(entries, [answer(B)], True)
    assert moved[f"{MODEL}@master"]["commit"] == B and changed == [f"{MODEL}@master"]
    # a commit revision is not locked for its commit alone ...
    kept, changed = lock_file.merge_lock({}, [answer(A, revision=A)], True)
    assert kept == {} and changed == []
    # ... only to pin its content (content_sha256)
    pinned, changed = lock_file.merge_lock({}, [answer(A, revision=A, content_sha256=C, files=3)], True)
    assert pinned[f"{MODEL}@{A}"]["content_sha256"] == C and changed == [f"{MODEL}@{A}"]
    with pytest.raises(lock_file.LockError, match="another commit"):
        lock_file.merge_lock({}, [answer(B, revision=A, content_sha256=C)], True)
    with pytest.raises(lock_file.LockError, match="64 hex"):
        lock_file.merge_lock({}, [answer(A, content_sha256="x")], True)


def test_a_listing_without_a_commit_is_never_locked() -> None:
    with pytest.raises(lock_file.LockError, match="names no commit id"):
        lock_file.merge_lock({}, [answer("content-" + "0" * 32)], True)


# --------------------------------------------------------------------------- where an answer came from


@pytest.mark.parametrize(
    "cache", ["http://10.0.0.5", "https://cache.lan", "https://cache.lan:443/", "HTTPS://Cache.LAN"]
)
@pytest.mark.parametrize("replace", [True, False], ids=["lock-models", "converge"])
def test_an_answer_that_came_through_the_lan_cache_is_never_locked(cache: str, replace: bool) -> None:
    """Before, an https cache's listing was locked as if from the hub (the entry named model_store_endpoint);
    the answer now names where it came from, and one from the cache the box uses is refused, nothing written."""
    through = answer(A, content_sha256=C, endpoint=cache.lower().rstrip("/"), cache_endpoint=cache, allow_http=True)
    with pytest.raises(lock_file.LockError, match="came through the LAN cache") as refused:
        lock_file.merge_lock({}, [through], replace)
    said = str(refused.value)
    assert f"{MODEL}@master (box box1)" in said and "make lock-models" in said and "nothing was written" in said
    # the control: the same answer from the hub itself, the cache still set, is locked and says so
    direct, changed = lock_file.merge_lock({}, [{**through, "endpoint": HUB}], replace)
    assert changed == [f"{MODEL}@master"] and direct[f"{MODEL}@master"]["endpoint"] == HUB
    # another port of the cache host is another server (the fleet scenario's test hub runs there)
    other_port = {**through, "endpoint": "http://10.0.0.5:8090", "cache_endpoint": "http://10.0.0.5"}
    assert lock_file.merge_lock({}, [other_port], replace)[1] == [f"{MODEL}@master"]


@pytest.mark.parametrize("endpoint", ["http://hub.lan", "", None, "ftp://hub.lan", "hub.example"])
def test_an_answer_not_from_an_https_hub_is_locked_only_where_plain_http_is_allowed(endpoint: str | None) -> None:
    plain = answer(A, endpoint=endpoint)
    with pytest.raises(lock_file.LockError, match="not an https hub") as refused:
        lock_file.merge_lock({}, [plain], True)
    assert "model_store_endpoint" in str(refused.value) and "box box1" in str(refused.value)
    for allowed in (True, "True", "true"):  # model_store_lock_allow_http (a test hub), as Ansible passes it
        if endpoint == "http://hub.lan":
            assert lock_file.merge_lock({}, [{**plain, "allow_http": allowed}], True)[1] == [f"{MODEL}@master"]
        else:
            with pytest.raises(lock_file.LockError, match="not an https hub"):
                lock_file.merge_lock({}, [{**plain, "allow_http": allowed}], True)


@pytest.mark.parametrize("replace", [True, False], ids=["lock-models", "converge"])
def test_boxes_that_disagree_are_refused_naming_every_answer(replace: bool) -> None:
    """Before, make lock-models kept the last box's answer (and a converge the first). Now nothing is written
    and the message names each answer: which boxes, which commit and content, from which endpoint."""
    other = "https://other-hub.example"
    answers = [
        answer(A, content_sha256=C, host="box1"),
        answer(B, content_sha256=D, host="box2", endpoint=other),
        answer(A, content_sha256=C, host="box3"),
    ]
    with pytest.raises(lock_file.LockError, match=f"the boxes disagree on {MODEL}@master") as refused:
        lock_file.merge_lock({}, answers, replace)
    said = str(refused.value)
    assert f"box1, box3 got commit {A} (content_sha256 {C}, from {HUB})" in said, said
    assert f"box2 got commit {B} (content_sha256 {D}, from {other})" in said, said
    assert "nothing was written" in said and "make lock-models" in said
    # one commit with two contents is a disagreement too (a hub or mirror that lists other files under it)
    with pytest.raises(lock_file.LockError, match=f"box2 got commit {A} \\(content_sha256 {D}"):
        lock_file.merge_lock({}, [answers[0], {**answers[1], "commit": A}], replace)
    # the control: boxes that agree write one entry; another model's answers are judged apart
    agreed = [answers[0], answers[2], answer(B, content_sha256=D, host="box2", model_id="Qwen/Other")]
    entries, changed = lock_file.merge_lock({}, agreed, replace)
    assert changed == [f"{MODEL}@master", "Qwen/Other@master"] and entries[f"{MODEL}@master"]["commit"] == A


# --------------------------------------------------------------------------- a fetch through the LAN cache


def test_a_fetch_through_the_cache_needs_a_lock_entry_unless_the_inventory_trusts_the_cache(tmp_path: Path) -> None:
    """The lookup says why a box may not fetch yet (gpubox_model_cache_fetch_refusal); the model store's input
    checks refuse it (test below). Before, a box behind the plain-http cache wrote no entry and trusted its
    first download, and one behind an https cache locked what the cache served."""
    lock = write(
        tmp_path / "models.lock.json", {f"{MODEL}@master": {"commit": A, "endpoint": HUB, "content_sha256": C}}
    )
    base = {"gpubox_model_id": MODEL, "gpubox_model_lock_file": str(lock)}
    for url in ("http://10.0.0.5", "https://cache.lan"):
        cached = {**base, "gpubox_fleet_cache_url": url}
        refusal = state({**cached, "gpubox_model_revision": "dev"})["gpubox_model_cache_fetch_refusal"]
        assert refusal.startswith(f"gpubox_fleet_cache_url is {url} and the model lock {lock} has no entry for ")
        assert f"{MODEL}@dev" in refusal and "make lock-models" in refusal
        assert "gpubox_fleet_cache_trust_first_fetch: true" in refusal
        # a commit revision needs its entry too: without one, the cache's listing would pin its content
        assert state({**cached, "gpubox_model_revision": B})["gpubox_model_cache_fetch_refusal"]
        # the controls: an entry, the inventory's trust, no cache
        assert state({**cached, "gpubox_model_revision": "master"})["gpubox_model_cache_fetch_refusal"] is None
        trusted = {**cached, "gpubox_model_revision": "dev", "gpubox_fleet_cache_trust_first_fetch": True}
        assert state(trusted)["gpubox_model_cache_fetch_refusal"] is None and state(trusted)["errors"] == []
    assert state({**base, "gpubox_model_revision": "dev"})["gpubox_model_cache_fetch_refusal"] is None
    nolock = state({**base, "gpubox_model_lock_file": "", "gpubox_fleet_cache_url": "http://10.0.0.5"})
    assert "no model lock (gpubox_model_lock_file is empty)" in nolock["gpubox_model_cache_fetch_refusal"]
    bad = state({"gpubox_fleet_cache_trust_first_fetch": "maybe"})
    assert any(e.startswith("gpubox_fleet_cache_trust_first_fetch must be true or false") for e in bad["errors"])


# One play per entry point (include_role takes its tasks_from once for all hosts of a play).
STORE_CHECKS = """
- hosts: validate_cases
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: model_store
        tasks_from: validate
- hosts: resolve_cases
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: model_store
        tasks_from: resolve
"""


def test_the_model_stores_input_checks_refuse_an_unlocked_fetch_through_the_cache_before_any_change(
    tmp_path: Path,
) -> None:
    """preflight and the role run roles/model_store/tasks/validate.yml before any change: one host per case.
    make lock-models (resolve.yml), which writes the entry, runs the same checks without this one: its host
    fails later, asking the hub (none listens here), never on the missing entry."""
    lock = write(
        tmp_path / "models.lock.json", {f"{MODEL}@master": {"commit": A, "endpoint": HUB, "content_sha256": C}}
    )
    box = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vault_gpubox_api_key": ansible_vars.TEST_KEY,
        "gpubox_model_id": MODEL,
        "gpubox_model_lock_file": str(lock),
        "gpubox_fleet_cache_url": "http://10.0.0.5",
        "model_store_endpoint": "https://127.0.0.1:9",
    }
    cases = {
        "unlocked": {"gpubox_model_revision": "dev"},
        "locked": {"gpubox_model_revision": "master"},
        "trusted": {"gpubox_model_revision": "dev", "gpubox_fleet_cache_trust_first_fetch": True},
        "no-cache": {"gpubox_model_revision": "dev", "gpubox_fleet_cache_url": ""},
        "lock-models": {"gpubox_model_revision": "dev"},
    }
    inventory = {
        "all": {
            "children": {
                "gpu_boxes": {"hosts": {name: {**box, **case} for name, case in cases.items()}},
                "gpu_2x3090": {"hosts": {name: None for name in cases}},
                "validate_cases": {"hosts": {name: None for name in cases if name != "lock-models"}},
                "resolve_cases": {"hosts": {"lock-models": None}},
            }
        }
    }
    production = ROOT / "inventories/production/group_vars"
    (tmp_path / "group_vars").symlink_to(production)
    run = ansible_vars.run_playbook(inventory, STORE_CHECKS, tmp_path)
    refused = ansible_vars.first_failure(run["unlocked"])
    assert refused and refused["task"].endswith("Check the model store's own settings before changing anything.")
    said = refused["msg"]
    assert f"gpubox_fleet_cache_url is http://10.0.0.5 and the model lock {lock} has no entry for {MODEL}@dev" in said
    assert "make lock-models" in said and "gpubox_fleet_cache_trust_first_fetch" in said
    for passed in ("locked", "trusted", "no-cache"):
        assert ansible_vars.first_failure(run[passed]) is None, (passed, ansible_vars.first_failure(run[passed]))
    asked = ansible_vars.first_failure(run["lock-models"])
    assert asked and "Ask the hub which commit" in asked["task"], asked["msg"]
    assert "127.0.0.1:9" in asked["msg"], asked["msg"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "is not JSON"),
        ('{"schema": 2, "models": {}}', "schema 1"),
        ('{"schema": 1, "models": {"nomodel": {"commit": "' + A + '"}}}', "unusable entry"),
        ('{"schema": 1, "models": {"' + MODEL + '@master": {"commit": "abc"}}}', "unusable entry"),
        ('{"schema": 1, "models": {"' + MODEL + "@" + B + '": {"commit": "' + A + '"}}}', "holds the commit " + A),
    ],
)
def test_a_bad_lock_names_the_file_and_the_fix(text: str, words: str) -> None:
    with pytest.raises(lock_file.LockError, match=words) as failed:
        lock_file.parse_lock(text, "inv/models.lock.json")
    assert "inv/models.lock.json" in str(failed.value) and "make lock-models" in str(failed.value)


def test_the_lookup_serves_the_locked_commit(tmp_path: Path) -> None:
    lock = write(tmp_path / "models.lock.json", {f"{MODEL}@master": {"commit": A, "endpoint": "", "content_sha256": C}})
    locked = state({"gpubox_model_id": MODEL, "gpubox_model_revision": "master", "gpubox_model_lock_file": str(lock)})
    assert locked["errors"] == []
    assert locked["gpubox_model_commit"] == A and locked["gpubox_model_fetch_revision"] == A
    # another branch of the same model has no entry: served as the branch, unlocked
    other = state({"gpubox_model_id": MODEL, "gpubox_model_revision": "dev", "gpubox_model_lock_file": str(lock)})
    assert other["gpubox_model_commit"] is None and other["gpubox_model_fetch_revision"] == "dev"
    # a commit revision is its own pin, lock or not
    pinned = state({"gpubox_model_id": MODEL, "gpubox_model_revision": B, "gpubox_model_lock_file": ""})
    assert pinned["gpubox_model_commit"] == B and pinned["gpubox_model_fetch_revision"] == B


def test_the_lookup_passes_the_content_pin_of_a_commit_revision(tmp_path: Path) -> None:
    lock = write(tmp_path / "models.lock.json", {f"{MODEL}@{B}": {"commit": B, "endpoint": "", "content_sha256": C}})
    pinned = state({"gpubox_model_id": MODEL, "gpubox_model_revision": B, "gpubox_model_lock_file": str(lock)})
    assert pinned["errors"] == [] and pinned["gpubox_model_content_sha256"] == C


# A lock entry that lost its content pin, as a hand edit leaves it (issue 31): each refused naming the line.
HAND_EDITS = {
    "missing": ('{"schema": 1, "models": {\n  "KEY": {\n    "commit": "COMMIT"\n  }\n}}\n', 2, "no content_sha256"),
    "null": (
        '{"schema": 1, "models": {\n  "KEY": {\n    "commit": "COMMIT",\n    "content_sha256": null\n  }\n}}\n',
        4,
        "content_sha256 is null",
    ),
    "duplicate": (
        '{"schema": 1, "models": {\n  "KEY": {\n    "commit": "COMMIT",\n    "content_sha256": "' + C + '",\n'
        '    "content_sha256": null\n  }\n}}\n',
        5,
        "given twice in one object, on line 4 and on line 5",
    ),
}


@pytest.mark.parametrize("edit", sorted(HAND_EDITS))
@pytest.mark.parametrize("revision", ["master", B])
def test_a_lock_entry_that_lost_its_content_pin_is_refused_naming_the_line(
    tmp_path: Path, edit: str, revision: str
) -> None:
    text, line, words = HAND_EDITS[edit]
    lock = tmp_path / "models.lock.json"
    commit = A if revision == "master" else B
    lock.write_text(text.replace("KEY", f"{MODEL}@{revision}").replace("COMMIT", commit))
    base = {"gpubox_model_id": MODEL, "gpubox_model_revision": revision, "gpubox_model_lock_file": str(lock)}
    refused = state(base)["errors"]
    assert any(f"{lock} line {line}" in e and words in e for e in refused), refused
    assert any("gpubox_model_lock_file" in e for e in refused)
    # the explicit switch accepts a commit-only pin, never a shadowed key
    accepted = state({**base, "gpubox_model_accept_unpinned": True})
    if edit == "duplicate":
        assert any(f"line {line}" in e and words in e for e in accepted["errors"]), accepted["errors"]
    else:
        assert accepted["errors"] == [] and accepted["gpubox_model_content_sha256"] is None
        assert accepted["gpubox_model_commit"] == (A if revision == "master" else B)
    # control: the same entry with its content pin passes without the switch
    lock.write_text(
        lock_file.render_lock(
            {f"{MODEL}@{revision}": {"commit": A if revision == "master" else B, "content_sha256": C}}
        )
    )
    assert state(base)["errors"] == []


def test_a_duplicate_key_anywhere_in_the_lock_is_refused_naming_both_lines() -> None:
    text = '{"schema": 1,\n "models": {},\n "models": {"x@y": {"commit": "' + A + '"}}}'
    with pytest.raises(
        lock_file.LockError, match=r"x\.lock line 3: the key 'models' is given twice.*line 2 and on line 3"
    ):
        lock_file.parse_lock(text, "x.lock")
    # json.loads keeps the last silently: the control that this is what the strict parser changes
    assert json.loads(text)["models"] == {"x@y": {"commit": A}}


def test_the_accept_unpinned_switch_is_a_checked_fact() -> None:
    result = state({"gpubox_model_accept_unpinned": "maybe"})
    assert any(e.startswith("gpubox_model_accept_unpinned must be true or false") for e in result["errors"])
    assert state({})["gpubox_model_accept_unpinned"] is False


def test_the_lookup_reports_a_bad_lock_file(tmp_path: Path) -> None:
    bad = tmp_path / "models.lock.json"
    bad.write_text("not json")
    result = state({"gpubox_model_id": MODEL, "gpubox_model_lock_file": str(bad)})
    assert any(e.startswith("gpubox_model_lock_file:") and str(bad) in e for e in result["errors"])
    relative = state({"gpubox_model_id": MODEL, "gpubox_model_lock_file": "models.lock.json"})
    assert any(e.startswith("gpubox_model_lock_file is") for e in relative["errors"])


def test_the_default_lock_lives_beside_the_inventory() -> None:
    result = ansible_vars.render("gpu-box", "query('gpubox.gpubox.desired_state') | first")
    assert result["gpubox_model_lock_file"] == str(ROOT / "inventories/production/models.lock.json")
    # production's lock is committed empty: no commit in the repository that a run did not read from a hub
    assert lock_file.read_lock(result["gpubox_model_lock_file"]) == {}


def _preflight(config: dict) -> dict:
    host = {
        "distribution": "Debian",
        "distribution_version": "12",
        "memtotal_mb": 128 * 1024,
        "gpu": None,
        "disk_free_bytes": 500 * 1024**3,
        "disk_mount": "/data",
        "model_bytes_present": 0,
        "model_root_stat": "0 755 directory",
        "secure_boot": False,
    }
    return preflight_checks.preflight(host, config)


def test_preflight_warns_about_an_unlocked_branch_only(tmp_path: Path) -> None:
    lock = write(tmp_path / "models.lock.json", {f"{MODEL}@master": {"commit": A, "endpoint": "", "content_sha256": C}})
    base = {"gpubox_model_id": MODEL, "gpubox_model_lock_file": str(lock)}
    unlocked = _preflight(state({**base, "gpubox_model_revision": "dev"}))
    assert any("'dev'" in w and "rebuilds may differ" in w and "make lock-models" in w for w in unlocked["warnings"])
    for revision in ("master", B):
        assert not any(
            "model lock" in w for w in _preflight(state({**base, "gpubox_model_revision": revision}))["warnings"]
        )
