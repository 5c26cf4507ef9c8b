"""tools/lock_wheels.py: hashes from a PEP 503 page, and every checked-in lock in step with its pins."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("lock_wheels", ROOT / "tools/lock_wheels.py")
assert spec and spec.loader
lw = importlib.util.module_from_spec(spec)
sys.modules["lock_wheels"] = lw
spec.loader.exec_module(lw)


def _locked_pins() -> list[tuple[Path, Path]]:
    """The (constraints, lock) pairs python_env installs with --require-hashes: the Makefile's LOCKED_PINS,
    which `make lock-wheels` refreshes."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("LOCKED_PINS :="))
    return [tuple(ROOT / part for part in pair.split(":")) for pair in line.split(":=", 1)[1].split()]


LOCKS = _locked_pins()

H1, H2, H3 = "1" * 64, "2" * 64, "3" * 64
PAGE = f"""<!DOCTYPE html><html><body>
<a href="https://files.example/p/Foo_Bar-1.2-py3-none-any.whl#sha256={H1}">Foo_Bar-1.2-py3-none-any.whl</a>
<a href="https://files.example/p/foo-bar-1.2.tar.gz#sha256={H2}" data-requires-python="&gt;=3.9">foo-bar-1.2.tar.gz</a>
<a href="https://files.example/p/foo_bar-1.20-cp311-cp311-manylinux_2_17_x86_64.whl#sha256={H3}">x</a>
<a href="https://files.example/p/foo_bar_extra-1.2-py3-none-any.whl#sha256={H3}">other project</a>
</body></html>"""


def test_hashes_of_exactly_the_pinned_version_of_exactly_that_project() -> None:
    assert lw.hashes_from_page(PAGE, lw.Pin("foo.bar", "1.2")) == [H1, H2]
    assert lw.hashes_from_page(PAGE, lw.Pin("foo-bar", "1.20")) == [H3]
    assert lw.hashes_from_page(PAGE, lw.Pin("foo-bar", "9")) == []


def test_a_rendered_lock_is_in_step_and_a_changed_one_is_not() -> None:
    constraints = "# c\nfoo-bar==1.2\nbaz==3 ; python_version < '3.11'\n"
    pins = lw.read_pins(constraints)
    lock = lw.render("c.txt", pins, {pins[0]: [H1, H2], pins[1]: [H3]})
    assert lw.lock_problems(constraints, lock) == []
    assert lw.lock_problems(constraints.replace("1.2", "1.3"), lock)
    assert lw.lock_problems(constraints, lock.replace(f"    --hash=sha256:{H3}", "")), "a pin without a hash"


@pytest.mark.parametrize(("constraints", "lock"), LOCKS, ids=[str(c.relative_to(ROOT)) for c, _ in LOCKS])
def test_checked_in_locks_pin_what_their_constraints_pin(constraints: Path, lock: Path) -> None:
    assert lw.lock_problems(constraints.read_text(), lock.read_text()) == [], "run make lock-wheels"


def test_extras_the_constraints_name_are_written_on_the_pins_and_checked() -> None:
    """pip --require-hashes refuses a dependency asking for name[extra] unless the lock names name[extra]==version."""
    constraints = "# lock-extras: foo-bar[std,b] baz[x]\nfoo-bar==1.2\nbaz==3\nqux==1\n"
    pins = lw.read_pins(constraints)
    assert [(p.name, p.extras) for p in pins] == [("foo-bar", "b,std"), ("baz", "x"), ("qux", "")]
    lock = lw.render("c.txt", pins, {pins[0]: [H1], pins[1]: [H2], pins[2]: [H3]})
    assert "foo-bar[b,std]==1.2 \\\n" in lock and "baz[x]==3 \\\n" in lock and "qux==1 \\\n" in lock
    # each pin with extras is written plain too: pip resolves a plain dependency on it before expanding the extras
    assert "\nfoo-bar==1.2 \\\n" in lock and "\nbaz==3 \\\n" in lock
    assert lw.lock_problems(constraints, lock) == []
    assert lw.lock_problems(constraints, lock.replace("baz[x]==3", "baz==3")), "an extra missing from the lock"
    assert lw.lock_problems(constraints, lock.replace("\nbaz==3", "\nbaz[x]==3")), "the plain line missing"
    assert lw.lock_problems(constraints.replace(" baz[x]", ""), lock), "an extra the constraints no longer name"
    with pytest.raises(ValueError, match="not name"):
        lw.read_extras("# lock-extras: baz\n")


def test_the_vllm_lock_names_the_extras_its_dependencies_ask_for() -> None:
    constraints, lock = LOCKS[0]
    extras = lw.read_extras(constraints.read_text())
    assert extras == {
        "fastapi": "standard",
        "fastapi-cli": "standard",
        "mistral-common": "opencv",
        "pydantic": "email",
        "ray": "adag",
        "uvicorn": "standard",
    }
    assert "\nuvicorn[standard]==0.34.0 \\\n" in lock.read_text() and "\nuvicorn==0.34.0 \\\n" in lock.read_text()
