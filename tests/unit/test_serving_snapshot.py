"""A box's serving layer kept before a canary and put back (plugins/module_utils/layer_snapshot.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ansible_collections.gpubox.gpubox.plugins.module_utils import layer_snapshot as snap


def layer(root: Path) -> dict[str, Path]:
    (root / "etc").mkdir()
    (root / "models" / ".versions" / "m@A").mkdir(parents=True)
    (root / "models" / ".versions" / "m@B").mkdir(parents=True)
    unit = root / "etc" / "vllm.service"
    unit.write_text("ExecStart=/opt/gpubox/venv/bin/python -m vllm\n")
    unit.chmod(0o644)
    env = root / "etc" / "vllm.env"
    env.write_text("A=1\n")
    env.chmod(0o600)
    link = root / "models" / "m"
    link.symlink_to(".versions/m@A")
    return {"unit": unit, "env": env, "new": root / "etc" / "added.conf", "link": link}


def test_a_changed_layer_is_put_back_whole(tmp_path: Path) -> None:
    paths = layer(tmp_path)
    dest = str(tmp_path / "snap")
    snap.save(dest, [str(paths["unit"]), str(paths["env"]), str(paths["new"])], [str(paths["link"])])
    # the canary's change: another environment, other flags, a file added, the model moved to commit B
    paths["unit"].write_text("ExecStart=/opt/gpubox/venv-lts-580/bin/python -m vllm\n")
    paths["env"].write_text("A=2\n")
    paths["env"].chmod(0o644)
    paths["new"].write_text("x")
    paths["link"].unlink()
    paths["link"].symlink_to(".versions/m@B")
    _manifest, planned = snap.plan(dest)
    changed = snap.restore(dest)
    assert sorted(changed) == sorted(planned) == sorted(str(p) for p in paths.values())
    assert paths["unit"].read_text() == "ExecStart=/opt/gpubox/venv/bin/python -m vllm\n"
    assert paths["env"].read_text() == "A=1\n" and (paths["env"].stat().st_mode & 0o777) == 0o600
    assert not paths["new"].exists()
    assert os.readlink(paths["link"]) == ".versions/m@A"
    assert snap.restore(dest) == []  # put back: nothing left to change


def test_control_an_unchanged_layer_changes_nothing(tmp_path: Path) -> None:
    paths = layer(tmp_path)
    dest = str(tmp_path / "snap")
    snap.save(dest, [str(paths["unit"]), str(paths["env"])], [str(paths["link"])])
    assert snap.restore(dest) == []


def test_a_gone_old_version_is_refused_before_any_change(tmp_path: Path) -> None:
    paths = layer(tmp_path)
    dest = str(tmp_path / "snap")
    snap.save(dest, [str(paths["unit"])], [str(paths["link"])])
    paths["unit"].write_text("changed\n")
    paths["link"].unlink()
    paths["link"].symlink_to(".versions/m@B")
    (tmp_path / "models" / ".versions" / "m@A").rmdir()
    with pytest.raises(snap.SnapshotError, match="which is gone"):
        snap.restore(dest)
    assert paths["unit"].read_text() == "changed\n"  # nothing was put back halfway


def test_bad_input_is_named(tmp_path: Path) -> None:
    paths = layer(tmp_path)
    with pytest.raises(snap.SnapshotError, match="is a symlink; name it among the links"):
        snap.save(str(tmp_path / "snap"), [str(paths["link"])], [])
    with pytest.raises(snap.SnapshotError, match="not an absolute path"):
        snap.save(str(tmp_path / "snap"), ["etc/vllm.service"], [])
    with pytest.raises(snap.SnapshotError, match="no snapshot to restore"):
        snap.restore(str(tmp_path / "none"))


def test_a_second_save_replaces_the_first(tmp_path: Path) -> None:
    paths = layer(tmp_path)
    dest = str(tmp_path / "snap")
    snap.save(dest, [str(paths["unit"])], [])
    paths["unit"].write_text("second\n")
    snap.save(dest, [str(paths["unit"])], [])
    paths["unit"].write_text("third\n")
    snap.restore(dest)
    assert paths["unit"].read_text() == "second\n"
    assert sorted(p.name for p in (tmp_path).iterdir() if p.name.startswith(".")) == []  # no work dirs left
