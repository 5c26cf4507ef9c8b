"""The checkout is the collection gpubox.gpubox: it builds, the artifact works on its own, and every
plugin resolves by FQCN from a plain checkout (ansible.cfg's collections_path and its link).

The artifact ships what a user needs (plugins, roles, playbooks, meta, README, LICENSE, CHANGELOG) and
none of the test harness; it declares the collections its roles call and installs offline against the
ones vendored here (PyPI's ansible==12.3.0); a play of its roles and modules by FQCN runs from a temp
directory with only the installed copy on the collections path. One ansible-core lower bound is stated
everywhere (meta/runtime.yml, every role's meta); test_ansible_core_floor.py runs the same play under it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLUGINS = ROOT / "plugins"
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
FQCN = f"{GALAXY['namespace']}.{GALAXY['name']}"
RUNTIME = yaml.safe_load((ROOT / "meta" / "runtime.yml").read_text())
# The collections PyPI's `ansible` package vendors into the venv (site-packages/ansible_collections):
# the only copies of ansible.posix, community.* and containers.podman this machine has (no Galaxy).
VENDORED = next(
    Path(p) for p in sys.path if (Path(p) / "ansible_collections" / "community" / "general" / "MANIFEST.json").is_file()
)
# Used by the test harness only (molecule's create/destroy playbooks), never by the roles or playbooks.
TEST_ONLY_COLLECTIONS = {"containers.podman"}


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
    """Files of one name in two plugin directories, but an action plugin and its module: Ansible pairs them by
    name, and ansible-test's action-plugin-docs wants the module (its documentation) beside the action."""
    seen: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PLUGINS.glob("*/*.py")):
        if path.name != "__init__.py":
            seen[path.name].append(path.parent.name)
    return {name: kinds for name, kinds in seen.items() if len(kinds) > 1 and kinds != ["action", "modules"]}


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
    wanted = {"meta/runtime.yml", "README.md", "LICENSE", "CHANGELOG.md", "FILES.json", "site.yml"}
    wanted |= {p.relative_to(ROOT).as_posix() for p in ROOT.glob("playbooks/*.yml")}
    wanted |= {p.relative_to(ROOT).as_posix() for p in PLUGINS.glob("*/*.py")}
    wanted |= {p.relative_to(ROOT).as_posix() for p in ROOT.glob("roles/*/tasks/main.yml")}
    wanted |= {p.relative_to(ROOT).as_posix() for p in ROOT.glob("roles/*/meta/argument_specs.yml")}
    assert not wanted - names, f"missing from the artifact: {sorted(wanted - names)}"
    assert {p.relative_to(ROOT).as_posix() for p in ROOT.glob("roles/*")} <= names
    workspace = (".venv/", ".git/", "collections/", ".cache/", ".ansible/", ".pytest_cache/", ".ruff_cache/")
    harness = (
        "tests/",
        "harness/",
        "molecule/",
        ".github/",
        ".ci/",
        ".config/",
        "bench/",
        "tools/",
        "inventories/demo/",
    )
    harness_files = {"Makefile", "pyproject.toml", "requirements-dev.lock", ".secrets.baseline", ".yamllint"}
    leaked = sorted(
        n
        for n in names
        if n.startswith(workspace + harness) or n in harness_files or "__pycache__" in n or n.endswith(".pyc")
    )
    assert leaked == [], leaked
    assert not {n for n in names if n.split("/")[0] in {"tests", "molecule"}}


def test_the_artifact_ships_the_license_galaxy_yml_names(built: Path) -> None:
    assert GALAXY["license"] == ["Apache-2.0"] and "license_file" not in GALAXY
    with tarfile.open(built) as tar:
        shipped = tar.extractfile("LICENSE").read().decode()
    assert shipped == (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in shipped
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in shipped
    assert "END OF TERMS AND CONDITIONS" in shipped and len(shipped.splitlines()) > 150


# --------------------------------------------------------------------------- what it declares


def collections_used() -> set[str]:
    """namespace.name of every FQCN the roles, playbooks and site.yml call outside ansible.* builtins and
    this collection (modules, filters and lookups alike)."""
    fqcn = re.compile(r"\b([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*\b")
    used: set[str] = set()
    for path in [ROOT / "site.yml", *ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/**/*.yml")]:
        for ns, name in fqcn.findall(path.read_text()):
            if ns in {"community", "containers"} or (ns == "ansible" and name not in {"builtin", "legacy"}):
                used.add(f"{ns}.{name}")
    return used


def vendored_version(name: str) -> Version:
    manifest = VENDORED / "ansible_collections" / Path(*name.split(".")) / "MANIFEST.json"
    return Version(json.loads(manifest.read_text())["collection_info"]["version"])


def test_galaxy_yml_declares_exactly_the_collections_the_roles_call() -> None:
    used = collections_used()
    assert {"ansible.posix", "community.crypto", "community.general"} <= used
    assert not used & TEST_ONLY_COLLECTIONS, "a role or playbook calls a test-only collection"
    assert set(GALAXY["dependencies"]) == used
    for name, spec in GALAXY["dependencies"].items():
        assert vendored_version(name) in SpecifierSet(spec), f"{name} {vendored_version(name)} not in {spec}"
    assert "repository" not in GALAXY or "example" not in GALAXY["repository"], "a placeholder repository URL"


def test_requirements_yml_is_runtime_only_and_test_collections_are_apart() -> None:
    runtime = {c["name"]: c["version"] for c in yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]}
    assert set(runtime) == set(GALAXY["dependencies"])
    for name, version in runtime.items():
        assert Version(version) in SpecifierSet(GALAXY["dependencies"][name]), name
        assert Version(version) == vendored_version(name), f"{name}: requirements.yml and the venv disagree"
    test_file = ROOT / "molecule" / "requirements.yml"
    test = {c["name"]: c["version"] for c in yaml.safe_load(test_file.read_text())["collections"]}
    assert set(test) == TEST_ONLY_COLLECTIONS
    for name, version in test.items():
        assert Version(version) == vendored_version(name), name


def ansible_core_floor() -> Version:
    """The lower bound of meta/runtime.yml's requires_ansible (its one >= clause)."""
    lower = [s.version for s in SpecifierSet(RUNTIME["requires_ansible"]) if s.operator == ">="]
    assert len(lower) == 1, RUNTIME["requires_ansible"]
    return Version(lower[0])


def test_one_ansible_core_lower_bound_everywhere() -> None:
    floor = ansible_core_floor()
    mins = {
        p.parent.parent.name: str(yaml.safe_load(p.read_text())["galaxy_info"]["min_ansible_version"])
        for p in ROOT.glob("roles/*/meta/main.yml")
    }
    assert set(mins) == {p.name for p in ROOT.glob("roles/*") if p.is_dir()}
    assert {Version(v) for v in mins.values()} == {floor}, mins
    pinned = re.search(r"^ansible-core==(\S+)$", (ROOT / "requirements-dev.lock").read_text(), re.M).group(1)
    assert Version(pinned) in SpecifierSet(RUNTIME["requires_ansible"]), pinned


def install_offline(bindir: Path, tarball: Path, dest: Path) -> tuple[Path, dict[str, str]]:
    """`ansible-galaxy collection install --offline` of the artifact into dest (no Galaxy here): its
    dependencies resolve against the vendored copies. Returns the installed collection and the env a
    user of it has: ANSIBLE_COLLECTIONS_PATH = dest and the vendored collections, never the checkout."""
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=f"{dest}{os.pathsep}{VENDORED}", ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")
    argv = [str(bindir / "ansible-galaxy"), "collection", "install", "--offline", str(tarball), "-p", str(dest)]
    out = run(argv, dest.parent, env).stdout
    for name in GALAXY["dependencies"]:  # found, in range, and not fetched
        assert f"'{name}:{vendored_version(name)}' is already installed" in out, out
    installed = dest / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"]
    assert (installed / "MANIFEST.json").is_file() and not (installed / "molecule").exists()
    return installed, env


# A play in a directory of its own (not the checkout): the collection's modules, lookup and roles by FQCN.
PLAY = """\
- name: The installed gpubox.gpubox, by FQCN only
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    gpubox_gpu_count: "{{ 1 + 1 }}"
  tasks:
    - name: GPU facts from a fake sysfs, no nvidia-smi
      gpubox.gpubox.gpu_facts:
        nvidia_smi: /nonexistent/nvidia-smi
        sysfs_root: "{{ work }}/sysfs"
    - name: Lock a branch to the commit a hub named
      gpubox.gpubox.model_lock:
        path: "{{ work }}/models.lock.json"
        resolved:
          - model_id: Qwen/Qwen2.5-0.5B-Instruct
            revision: master
            commit: "{{ '0123456789abcdef' * 2 ~ '01234567' }}"
            endpoint: https://www.modelscope.cn
      register: lock
    - name: The facts, the lock and the lookup
      ansible.builtin.assert:
        that:
          - ansible_facts.gpubox_gpu.source == 'sysfs'
          - ansible_facts.gpubox_gpu.count == 2
          - lock is changed
          - lock.changed_keys == ['Qwen/Qwen2.5-0.5B-Instruct@master']
          - (query('gpubox.gpubox.desired_state') | first).gpubox_gpu_count == 2
"""
ROLES_PLAY = """\
- name: A role of the installed collection
  hosts: localhost
  gather_facts: false
  roles:
    - gpubox.gpubox.preflight
# site.yml's stages, in its order, each by its FQCN (site.yml itself imports them by path)
- name: Preflight stage of the installed collection
  ansible.builtin.import_playbook: gpubox.gpubox.preflight
- name: LAN cache stage of the installed collection
  ansible.builtin.import_playbook: gpubox.gpubox.fleet_cache
- name: Host stage of the installed collection
  ansible.builtin.import_playbook: gpubox.gpubox.host
- name: Serving stage of the installed collection
  ansible.builtin.import_playbook: gpubox.gpubox.serving
- name: LAN cache pins stage of the installed collection
  ansible.builtin.import_playbook: gpubox.gpubox.fleet_cache_pins
- name: Report stage of the installed collection
  ansible.builtin.import_playbook: gpubox.gpubox.report
"""
COMMIT = "0123456789abcdef" * 2 + "01234567"


def run_installed_play(bindir: Path, installed: Path, env: dict[str, str], work: Path) -> None:
    """PLAY and a --syntax-check of ROLES_PLAY from work, with bindir's ansible-playbook and Python."""
    env = dict(env, ANSIBLE_PYTHON_INTERPRETER=str(bindir / "python"), ANSIBLE_LOCALHOST_WARNING="0")
    env.update(ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    sysfs = ROOT / "harness" / "fakegpu" / "make_sysfs.py"  # the harness makes the fake sysfs
    fixture = ROOT / "tests" / "fixtures" / "nvidia-smi" / "rtx3090x2-pcie" / "sysfs.json"
    subprocess.run([sys.executable, str(sysfs), str(fixture), str(work / "sysfs")], check=True)
    (work / "play.yml").write_text(PLAY)
    (work / "roles.yml").write_text(ROLES_PLAY)
    playbook = str(bindir / "ansible-playbook")
    out = run([playbook, "-i", "localhost,", "play.yml", "-e", f"work={work}", "-v"], work, env).stdout
    assert "failed=0" in out and "ok=3" in out and "changed=1" in out, out
    # the modules ran from the installed copy (its plugins/modules), not the checkout's
    assert str(ROOT) not in out, out
    lock = json.loads((work / "models.lock.json").read_text())
    assert lock["models"]["Qwen/Qwen2.5-0.5B-Instruct@master"]["commit"] == COMMIT
    run([playbook, "-i", "localhost,", "--syntax-check", "roles.yml"], work, env)
    # the shipped entry point, from the installed copy: its stages by path
    run([playbook, "-i", "localhost,", "--syntax-check", str(installed / "site.yml")], work, env)
    assert (installed / "roles" / "preflight" / "tasks" / "main.yml").is_file()


def test_installed_artifact_works_without_the_checkout(built: Path, tmp_path: Path) -> None:
    # Installed elsewhere, with the checkout hidden: the modules resolve there and run from there.
    installed, env = install_offline(BIN, built, tmp_path / "installed")
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


def test_a_play_of_the_installed_collection_runs_from_elsewhere(built: Path, tmp_path: Path) -> None:
    work = tmp_path / "play"
    work.mkdir()
    installed, env = install_offline(BIN, built, tmp_path / "installed")
    run_installed_play(BIN, installed, env, work)
