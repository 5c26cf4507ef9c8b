"""The test boxes' compile cache for zip imports (molecule/shared/image/zipimport_cache.py): a module
imported from a zip runs the code zipimport would compile from its source, cached or not, and an entry
whose source differs (a changed module, a colliding key, a torn file) is never used."""

from __future__ import annotations

import importlib.util
import marshal
import subprocess
import sys
import zipfile
import zipimport
from pathlib import Path

CACHE_PY = Path(__file__).resolve().parents[2] / "molecule/shared/image/zipimport_cache.py"
spec = importlib.util.spec_from_file_location("gpubox_zipimport_cache_under_test", CACHE_PY)
zcache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zcache)

SOURCE = b"def outer():\n    def inner():\n        return 41 + 1\n    return inner\n\nVALUE = outer()()\n"


def _code_files(code) -> set[str]:
    files = {code.co_filename}
    for const in code.co_consts:
        if isinstance(const, type(code)):
            files |= _code_files(const)
    return files


def test_a_cached_compile_is_the_same_code_under_the_new_name(tmp_path: Path) -> None:
    fresh = zcache._compile_source("/tmp/a.zip/m.py", SOURCE)
    first = zcache.cached_compile_source("/tmp/a.zip/m.py", SOURCE, cache=str(tmp_path))
    assert len(list(tmp_path.iterdir())) == 1
    second = zcache.cached_compile_source("/tmp/b.zip/m.py", SOURCE, cache=str(tmp_path))
    assert first.co_code == fresh.co_code == second.co_code
    assert _code_files(second) == {"/tmp/b.zip/m.py"}  # nested functions too: tracebacks name this zip
    namespace: dict = {}
    exec(second, namespace)
    assert namespace["VALUE"] == 42


def test_an_entry_for_other_source_is_not_used(tmp_path: Path) -> None:
    zcache.cached_compile_source("/z.zip/m.py", SOURCE, cache=str(tmp_path))
    (entry,) = tmp_path.iterdir()
    planted = compile(b"VALUE = 'planted'\n", "/z.zip/m.py", "exec")
    entry.write_bytes(marshal.dumps((b"VALUE = 'planted'\n", planted)))  # same key, other source
    namespace: dict = {}
    exec(zcache.cached_compile_source("/z.zip/m.py", SOURCE, cache=str(tmp_path)), namespace)
    assert namespace["VALUE"] == 42
    entry.write_bytes(b"\x00torn")  # a half-written entry
    namespace = {}
    exec(zcache.cached_compile_source("/z.zip/m.py", SOURCE, cache=str(tmp_path)), namespace)
    assert namespace["VALUE"] == 42


def test_a_changed_module_in_the_zip_is_compiled_afresh(tmp_path: Path) -> None:
    """Two interpreters importing from zips, as two tasks do: the second reads the cache; then the
    module's source changes and the new source runs."""
    cache = tmp_path / "cache"
    script = (
        "import functools, importlib.util, sys, zipimport\n"
        f"spec = importlib.util.spec_from_file_location('zc', {str(CACHE_PY)!r})\n"
        "zc = importlib.util.module_from_spec(spec); spec.loader.exec_module(zc)\n"
        f"zipimport._compile_source = functools.partial(zc.cached_compile_source, cache={str(cache)!r})\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import payload_mod\n"
        "print(payload_mod.VALUE, payload_mod.__file__)\n"
    )
    outputs = []
    for n, body in enumerate((SOURCE, SOURCE, b"VALUE = 'changed'\n")):
        archive = tmp_path / f"payload{n}.zip"
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("payload_mod.py", body)
        out = subprocess.run([sys.executable, "-c", script, str(archive)], capture_output=True, text=True, check=True)
        outputs.append(out.stdout.split())
    assert outputs[0][0] == outputs[1][0] == "42"
    assert outputs[1][1] == str(tmp_path / "payload1.zip" / "payload_mod.py")
    assert outputs[2][0] == "changed"
    assert len(list(cache.iterdir())) == 2


def test_the_hook_replaces_the_function_zipimport_calls() -> None:
    """The function patched exists in this Python's zipimport (3.10-3.12 call it for a source member)."""
    assert callable(zipimport._compile_source)
    assert zipimport._compile_source.__code__.co_varnames[:2] == ("pathname", "source")
