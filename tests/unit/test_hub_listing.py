"""The hub listing as hostile input: every field is checked by one typed parser before it is used.

Each class of bad value a hub, http mirror or LAN cache could send (commit ids, paths, sizes, sha256,
entry shapes, case-folding collisions, the store's own names) is refused with a message naming what
was wrong, and never as a traceback. The end-to-end cases (the real modelscope client against the
test hub with hostile listing fields, a leftover staging directory, a late writer) are in
test_modelstore.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import hub_listing as hl
from ansible_collections.gpubox.gpubox.plugins.module_utils.model_errors import ListingError, ModelStoreError
from ansible_collections.gpubox.gpubox.plugins.module_utils.store_layout import StoreLayout

MODEL = "Qwen/Tiny-Instruct"
COMMIT = "0123456789abcdef" * 2 + "01234567"  # a commit id: 40 lower-case hex digits
SHA = "ab" * 32


def payload(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"Code": 200, "Success": True, "Data": {"Files": list(entries)}}


def blob(path: str = "a.bin", **fields: Any) -> dict[str, Any]:
    entry = {"Name": path.rsplit("/", 1)[-1], "Path": path, "Type": "blob", "Size": 3, "Sha256": SHA}
    return entry | {"Revision": COMMIT} | fields


def test_a_clean_listing_gives_checked_values_and_a_stable_content_digest() -> None:
    listing = hl.parse_listing(payload(blob("b/c.bin"), blob("a.bin"), {"Path": "b", "Type": "tree"}), MODEL, "master")
    assert listing.commit == COMMIT and [f.path for f in listing.files] == ["a.bin", "b/c.bin"]
    again = hl.parse_listing(payload(blob("a.bin"), blob("b/c.bin")), MODEL, "master")
    assert listing.content_sha256 == again.content_sha256 and hl.SHA256_RE.match(listing.content_sha256)
    other = hl.parse_listing(payload(blob("a.bin", Sha256="cd" * 32), blob("b/c.bin")), MODEL, "master")
    assert other.content_sha256 != listing.content_sha256, "other bytes under the same commit: another digest"


@pytest.mark.parametrize(
    "revision",
    [
        "p/../../../somewhere",
        "../x",
        COMMIT.upper(),
        COMMIT[:39],
        COMMIT + "0",
        COMMIT[:20] + " " + COMMIT[21:],
        COMMIT[:39] + "\n",
        "master",
        12345,
        True,
        ["x"],
    ],
)
def test_a_hostile_revision_field_refuses_the_listing(revision: Any) -> None:
    with pytest.raises(ListingError, match="not a commit id"):
        hl.parse_listing(payload(blob(Revision=revision)), MODEL, "master")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../x", "normalized"),
        ("a/../../x", "normalized"),
        ("/etc/passwd", "normalized"),
        ("a//b", "normalized"),
        ("./a", "normalized"),
        ("a/", "normalized"),
        ("a\\..\\x", "backslash"),
        ("a\x00b", "control"),
        ("a\nb", "control"),
        ("a\rb", "control"),
        ("a\tb", "control"),
        ("a\x7fb", "control"),
        ("a\u2028b", "control"),
        ("a\u202eb", "control"),
        ("a\ud800b", "UTF-8"),
        ("x" * 256, "255 bytes"),
        ("d/" * 600 + "x", "1024 characters"),
        (".gpubox-manifest.json", "keeps for itself"),
        ("sub/.gpubox-manifest.json", "keeps for itself"),
        (".gpubox-client/home/.bashrc", "keeps for itself"),
        (".msc", "keeps for itself"),
        ("._____temp/x", "keeps for itself"),
        ("model.safetensors.incomplete", "keeps for itself"),
        ("", "non-empty"),
        (None, "non-empty"),
        (7, "non-empty"),
    ],
)
def test_a_hostile_path_refuses_the_listing(path: Any, why: str) -> None:
    with pytest.raises(ListingError, match=why):
        hl.parse_listing(payload(blob(path) if isinstance(path, str) else blob() | {"Path": path}), MODEL, "master")


@pytest.mark.parametrize(
    "paths",
    [["Model.bin", "model.bin"], ["Sub/a", "sub/b"], ["a", "a/b"], ["straße", "STRASSE"]],
)
def test_paths_that_collide_on_a_case_insensitive_copy_or_nest_in_a_file_are_refused(paths: list[str]) -> None:
    with pytest.raises(ListingError, match=r"case is folded|both as a file"):
        hl.parse_listing(payload(*(blob(p) for p in paths)), MODEL, "master")


@pytest.mark.parametrize("size", [-1, True, False, 1.0, "3", None, hl.MAX_FILE_BYTES + 1])
def test_a_size_that_is_not_a_non_negative_int_is_refused(size: Any) -> None:
    with pytest.raises(ListingError, match="no valid Size"):
        hl.parse_listing(payload(blob(Size=size)), MODEL, "master")


@pytest.mark.parametrize("sha", ["", "AB" * 32, "ab" * 31, "ab" * 33, "zz" * 32, None, 5])
def test_a_sha256_that_is_not_64_lower_case_hex_is_refused(sha: Any) -> None:
    with pytest.raises(ListingError, match="64 lower-case hex"):
        hl.parse_listing(payload(blob(Sha256=sha)), MODEL, "master")


@pytest.mark.parametrize(
    "body",
    [
        [],
        "x",
        {"Data": {"Files": "x"}},
        {"Data": {"Files": ["x"]}},
        {"Data": {"Files": [blob(Type="symlink")]}},
        {"Data": {"Files": []}},
        {"Data": {"Files": [blob(), blob()]}},
        {"Success": False, "Message": "x\r\nSet-Cookie: y"},
    ],
)
def test_malformed_listings_are_refused_with_a_message_not_a_traceback(body: Any) -> None:
    with pytest.raises(ListingError):
        hl.parse_listing(body, MODEL, "master")


def test_the_commit_asked_for_is_the_commit_answered() -> None:
    other = "f" * 40
    assert hl.parse_listing(payload(blob()), MODEL, COMMIT).commit == COMMIT
    with pytest.raises(ListingError, match="not the commit asked for"):
        hl.parse_listing(payload(blob(Revision=other)), MODEL, COMMIT)


@pytest.mark.parametrize("revision", [COMMIT, "master"])
@pytest.mark.parametrize("missing", [{"Revision": None}, {"Revision": ""}, "absent"])
def test_a_listing_that_names_no_commit_is_refused_never_taken_for_the_one_asked(
    revision: str, missing: dict | str
) -> None:
    """Issue 31: a file entry without a Revision was taken for the commit asked (a commit pin) or named by
    its content (a branch): content no commit names cannot be pinned, so the listing is refused."""
    entry = blob()
    if missing == "absent":
        del entry["Revision"]
    else:
        entry |= missing
    with pytest.raises(ListingError, match=r"entry 0 \('a\.bin'\) names no commit") as refused:
        hl.parse_listing(payload(entry), MODEL, revision)
    assert "nothing was changed" in str(refused.value) and "model_store_endpoint" in str(refused.value)
    # one entry of two without it is enough
    with pytest.raises(ListingError, match="names no commit"):
        hl.parse_listing(payload(blob("b.bin"), entry), MODEL, revision)
    assert hl.parse_listing(payload(blob()), MODEL, revision).commit == COMMIT  # control: named, taken


def test_a_listing_that_names_two_commits_is_refused() -> None:
    with pytest.raises(ListingError, match="names 2 commits"):
        hl.parse_listing(payload(blob(), blob("b.bin", Revision="f" * 40)), MODEL, "master")


@pytest.mark.parametrize("commit", ["p/../../x", "../x", "a b", "x\ny", "", "master"])
def test_only_a_checked_id_ever_names_a_store_directory(commit: str) -> None:
    layout = StoreLayout(Path("/srv/models"), "Tiny")
    for name_it in (layout.staging, layout.new_version_path, layout.versions_for):
        with pytest.raises(ModelStoreError, match="not a commit id"):
            name_it(commit)
    assert layout.staging(COMMIT) == Path(f"/srv/models/.staging/Tiny@{COMMIT}")


def listing_text(nested: str) -> bytes:
    """A clean listing's text with one more field in Data holding ``nested`` (JSON text, spliced in as a hub
    would send it: json.dumps of 100,000 nested lists would itself recurse)."""
    text = json.dumps({"Code": 200, "Success": True, "Data": {"Files": [blob()], "Nested": None}})
    return text.replace('"Nested": null', f'"Nested": {nested}', 1).encode()


BOUND = hl.MAX_LISTING_DEPTH - 2  # Data.Nested sits 2 levels down: this many lists there make the bound exactly


@pytest.mark.parametrize("nested", ["[]", "[" * BOUND + "]" * BOUND, "[" + ", ".join(['{"a": [{}]}'] * 3) + "]"])
def test_a_listing_nested_up_to_the_bound_is_decoded(nested: str) -> None:
    """Data.Nested sits 2 levels down (the top object, Data)."""
    body = listing_text(nested)
    assert not hl.nesting_over(body, hl.MAX_LISTING_DEPTH)
    assert hl.parse_listing(hl.loads_listing(body, "GET x"), MODEL, "master").commit == COMMIT


def test_the_depth_is_counted_exactly_whatever_the_brackets() -> None:
    for depth in range(1, 12):
        lists, mixed = "[" * depth + "]" * depth, ("[{" * depth)[:depth] + ("}]" * depth)[-depth:]
        for text in (lists, mixed, "[1, " + lists + ", {}]"):
            extra = text.startswith("[1")
            assert hl.nesting_over(text.encode(), depth - 1 + extra), text
            assert not hl.nesting_over(text.encode(), depth + extra), text


@pytest.mark.parametrize(
    "nested",
    [
        "[" * 100_000 + "]" * 100_000,  # the listing: json raised RecursionError, uncaught
        "[" * (MAX := hl.MAX_LISTING_DEPTH - 1) + "]" * MAX,  # one past the bound (with the top object and Data)
        '{"a": ' * 100_000 + "1" + "}" * 100_000,
        '[{"a": ' * 50_000 + "1" + "}]" * 50_000,
    ],
    ids=["lists-100000", "lists-bound+1", "objects-100000", "mixed-100000"],
)
def test_a_listing_nested_past_the_bound_is_refused_by_name_before_decoding(nested: str) -> None:
    body = listing_text(nested)
    if len(nested) > 100_000:  # the control: json's own decoder does not survive these
        with pytest.raises(RecursionError):
            json.loads(body)
    with pytest.raises(ListingError, match=f"more than {hl.MAX_LISTING_DEPTH} deep") as refused:
        hl.loads_listing(body, "GET https://hub.example/api/v1/models/o/n/repo/files")
    said = str(refused.value)
    assert said.startswith("GET https://hub.example/") and "nothing was changed" in said
    assert "model_store_endpoint" in said and "gpubox_fleet_cache_url" in said


@pytest.mark.parametrize(
    "text",
    [
        '{"Data": {"Files": [], "Note": "' + "[" * 100_000 + '"}}',  # brackets in a string are text
        '{"a": "\\"' + "{" * 1000 + '\\\\", "b": []}',  # escaped quotes do not end the string
    ],
)
def test_brackets_inside_strings_are_not_nesting(text: str) -> None:
    assert not hl.nesting_over(text.encode(), 4)
    assert isinstance(hl.loads_listing(text.encode(), "GET x"), dict)


def test_malformed_text_is_left_to_json_to_name() -> None:
    """Unbalanced brackets are not called deep: json's own error says what is wrong (a ValueError, which
    fetch_listing turns into 'did not return JSON')."""
    for text in (b"]]]]", b"[[[[", b'{"a": [}'):
        assert not hl.nesting_over(text, 2)
        with pytest.raises(ValueError):
            hl.loads_listing(text, "GET x")
