"""The checkout is the collection gpubox.gpubox: it builds, the artifact works on its own, and every
plugin resolves by FQCN from a plain checkout (ansible.cfg's collections_path and its link).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLUGINS = ROOT / "plugins"
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"


def plugin_files(kind: str) -> list[Path]:
    return sorted(p for p in (PLUGINS / kind).glob("*.py") if p.name != "__init__.py")


def filter_names() -> set[str]:
    """The names FilterModule.filters() returns, read from the file's source (its dict literal)."""
    names: set[str] = set()
    for path in plugin_files("filter"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "filters":
                returned = next(n.value for n in ast.walk(node) if isinstance(n, ast.Return))
                assert isinstance(returned, ast.Dict), f"{path}: filters() should return a dict literal"
                names |= {key.value for key in returned.keys if isinstance(key, ast.Constant)}
    return names


def clean_env(**extra: str) -> dict[str, str]:
    """No ANSIBLE_* from the caller (tests/conftest.py sets ANSIBLE_CONFIG); the venv's .pth makes the
    checkout importable from sys.path, which Ansible would also scan unless told not to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", **extra)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def ansible_doc(kind: str, names: list[str], cwd: Path, env: dict[str, str]) -> dict:
    return json.loads(run([str(BIN / "ansible-doc"), "-t", kind, "--json", *names], cwd, env).stdout)


def ansible_doc_list(kind: str, cwd: Path, env: dict[str, str]) -> set[str]:
    return set(json.loads(run([str(BIN / "ansible-doc"), "-t", kind, "-l", "--json", FQCN], cwd, env).stdout))


MODULES = [p.stem for p in plugin_files("modules")]
LOOKUPS = [p.stem for p in plugin_files("lookup")]
FILTERS = sorted(filter_names())


def test_the_collection_has_the_plugins_this_test_knows() -> None:
    assert {"gpu_facts", "model_store", "gpu_check_library"} <= set(MODULES)
    assert LOOKUPS == ["desired_state"] and len(FILTERS) >= 5


# --------------------------------------------------------------------------- a plain checkout


def test_every_plugin_resolves_by_fqcn_from_a_plain_checkout() -> None:
    # What a user of the checkout gets: ansible.cfg (collections_path = collections) from the repo root.
    env = clean_env(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")
    for kind, names in (("module", MODULES), ("lookup", LOOKUPS)):
        docs = ansible_doc(kind, [f"{FQCN}.{name}" for name in names], ROOT, env)
        assert set(docs) == {f"{FQCN}.{name}" for name in names}, kind
        for name in names:
            doc = docs[f"{FQCN}.{name}"]["doc"]
            assert doc[kind if kind == "module" else "name"] == name
            assert Path(doc["filename"]).resolve() == (
                PLUGINS / ("modules" if kind == "module" else kind) / f"{name}.py"
            )
    assert ansible_doc_list("filter", ROOT, env) == {f"{FQCN}.{name}" for name in FILTERS}


def basename_clashes() -> dict[str, list[str]]:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PLUGINS.glob("*/*.py")):
        if path.name != "__init__.py":
            seen[path.name].append(path.parent.name)
    return {name: kinds for name, kinds in seen.items() if len(kinds) > 1}


def test_no_two_plugin_files_share_a_basename() -> None:
    assert basename_clashes() == {}


# --------------------------------------------------------------------------- the built artifact


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("build")
    run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(out), str(ROOT)], ROOT, clean_env())
    tarballs = list(out.glob("*.tar.gz"))
    assert [p.name for p in tarballs] == [f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz"]
    return tarballs[0]


def test_build_ships_the_plugins_and_roles_and_nothing_of_the_workspace(built: Path) -> None:
    with tarfile.open(built) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("MANIFEST.json"))["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == (
        GALAXY["namespace"],
        GALAXY["name"],
        GALAXY["version"],
    )
    wanted = {"meta/runtime.yml", "README.md", "FILES.json"}
    wanted |= {p.relative_to(ROOT).as_posix() for p in PLUGINS.glob("*/*.py")}
    wanted |= {p.relative_to(ROOT).as_posix() for p in ROOT.glob("roles/*/tasks/main.yml")}
    wanted |= {p.relative_to(ROOT).as_posix() for p in ROOT.glob("roles/*/meta/argument_specs.yml")}
    assert not wanted - names, f"missing from the artifact: {sorted(wanted - names)}"
    assert {p.relative_to(ROOT).as_posix() for p in ROOT.glob("roles/*")} <= names
    workspace = (".venv/", ".git/", "collections/", ".cache/", ".ansible/", ".pytest_cache/", ".ruff_cache/")
    leaked = sorted(n for n in names if n.startswith(workspace) or "__pycache__" in n or n.endswith(".pyc"))
    assert leaked == [], leaked


def test_installed_artifact_works_without_the_checkout(built: Path, tmp_path: Path) -> None:
    # Installed elsewhere, with the checkout hidden: the modules resolve there and run from there.
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "installed"), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")
    run(
        [str(BIN / "ansible-galaxy"), "collection", "install", str(built), "-p", str(tmp_path / "installed")],
        tmp_path,
        env,
    )
    installed = tmp_path / "installed" / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"]
    docs = ansible_doc("module", [f"{FQCN}.{name}" for name in MODULES], tmp_path, env)
    for name in MODULES:
        assert Path(docs[f"{FQCN}.{name}"]["doc"]["filename"]) == installed / "plugins" / "modules" / f"{name}.py"
    assert ansible_doc_list("filter", tmp_path, env) == {f"{FQCN}.{name}" for name in FILTERS}

    dest = tmp_path / "lib" / "gpu_parsers.py"
    dest.parent.mkdir()
    env.update(ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_LOCALHOST_WARNING="0")
    env.update(ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    argv = [str(BIN / "ansible"), "localhost", "-c", "local", "-m", f"{FQCN}.gpu_check_library", "-a", f"dest={dest}"]
    run(argv, tmp_path, env)
    assert dest.read_bytes() == (installed / "plugins" / "module_utils" / "gpu_parsers.py").read_bytes()
    assert dest.read_bytes() == (PLUGINS / "module_utils" / "gpu_parsers.py").read_bytes()
