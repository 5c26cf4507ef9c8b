"""Role contracts: defaults and argument specs agree, every role has its files, and the OS-specific
package sets resolve to exactly the right packages for Ubuntu 22.04 (GA/HWE kernel, Secure Boot on/off)
and Debian 12."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.module_utils.parsing.convert_bool import boolean

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())
TASK_ROLES = [p for p in ROLES if (p / "tasks" / "main.yml").exists()]


def load(path: Path):
    return yaml.safe_load(path.read_text()) or {}


@pytest.mark.parametrize("role", ROLES, ids=[p.name for p in ROLES])
def test_defaults_and_argument_specs_have_the_same_keys_and_values(role):
    defaults = set(load(role / "defaults" / "main.yml"))
    specs = load(role / "meta" / "argument_specs.yml")["argument_specs"]
    options = set(specs["main"].get("options") or {})
    assert defaults == options, (
        f"{role.name}: only in defaults: {sorted(defaults - options)}; only in specs: {sorted(options - defaults)}"
    )
    values = load(role / "defaults" / "main.yml")
    for name, value in values.items():
        declared = specs["main"]["options"][name].get("default")
        assert declared == value, f"{role.name}: {name} defaults to {value!r}, its spec says {declared!r}"


@pytest.mark.parametrize("role", ROLES, ids=[p.name for p in ROLES])
def test_role_inputs_are_prefixed(role):
    prefix = role.name + "_"
    for key in load(role / "defaults" / "main.yml"):
        assert key.startswith(prefix), f"{role.name}: {key} should start with {prefix}"


@pytest.mark.parametrize("role", TASK_ROLES, ids=[p.name for p in TASK_ROLES])
def test_role_has_its_files(role):
    for rel in (
        "README.md",
        "vars/Ubuntu-22.yml",
        "vars/Debian-12.yml",
        "meta/main.yml",
    ):
        assert (role / rel).is_file(), f"{role.name} lacks {rel}"
    notifies = any("notify:" in f.read_text() for f in (role / "tasks").glob("*.yml"))
    assert (role / "handlers" / "main.yml").is_file() == notifies, f"{role.name}: handlers exist iff it notifies"


def render(value, variables: dict):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["bool"] = lambda v: boolean(v, strict=False)
    if isinstance(value, list):
        return [render(v, variables) for v in value]
    if not isinstance(value, str):
        return value
    out = env.from_string(value).render(**variables)
    try:
        return yaml.safe_load(out) if out.strip().startswith("[") else out.strip()
    except yaml.YAMLError:
        return out.strip()


def driver_vars(distro: str, flavour: str, secure_boot: bool, branch: str = "535") -> dict:
    variables = {
        "__nvidia_driver_branch": branch,
        "_nvidia_driver_kernel_flavour": flavour,
        "_nvidia_driver_secure_boot_on": secure_boot,
    }
    raw = load(ROOT / "roles/nvidia_driver/vars" / f"{distro}.yml")
    # resolve in file order: later entries reference earlier ones
    for key, value in raw.items():
        variables[key] = render(value, variables)
    return variables


BASE = [
    "nvidia-headless-no-dkms-535-server",
    "nvidia-utils-535-server",
    "libnvidia-compute-535-server",
    "nvidia-compute-utils-535-server",
]


@pytest.mark.parametrize(
    ("flavour", "secure_boot", "modules"),
    [
        ("generic", True, ["linux-modules-nvidia-535-server-generic"]),
        ("generic-hwe-22.04", True, ["linux-modules-nvidia-535-server-generic-hwe-22.04"]),
        ("generic", False, ["nvidia-dkms-535-server", "linux-headers-generic"]),
        ("generic-hwe-22.04", False, ["nvidia-dkms-535-server", "linux-headers-generic-hwe-22.04"]),
    ],
)
def test_ubuntu_2204_driver_package_sets(flavour, secure_boot, modules):
    v = driver_vars("Ubuntu-22", flavour, secure_boot)
    assert v["__nvidia_driver_packages"] == BASE + modules
    # signed precompiled modules and DKMS are mutually exclusive
    pkgs = v["__nvidia_driver_packages"]
    assert not (
        any(p.startswith("linux-modules-nvidia") for p in pkgs) and any(p.startswith("nvidia-dkms") for p in pkgs)
    )
    versioned = v["__nvidia_driver_versioned_packages"]
    assert set(versioned) <= set(pkgs)
    assert ("nvidia-dkms-535-server" in versioned) is (not secure_boot)


def test_debian_12_driver_package_set():
    v = driver_vars("Debian-12", "", False)
    assert v["__nvidia_driver_packages"] == [
        "nvidia-kernel-dkms",
        "nvidia-smi",
        "libcuda1",
        "libnvidia-ml1",
        "firmware-nvidia-gsp",
        "nvidia-persistenced",
    ]
    assert v["__nvidia_driver_userspace_package"] == "nvidia-smi"
    # the version is the stack's (gpubox_stack): tests/unit/test_stacks.py renders it per distribution


def test_debian_12_tesla_470_package_set():
    # bookworm's nvidia-graphics-drivers-tesla-470: every name carries the branch, no GSP firmware
    v = driver_vars("Debian-12", "", False, branch="470")
    assert v["__nvidia_driver_versioned_packages"] == [
        "nvidia-tesla-470-kernel-dkms",
        "nvidia-tesla-470-smi",
        "libnvidia-tesla-470-cuda1",
        "libnvidia-tesla-470-ml1",
    ]
    assert v["__nvidia_driver_packages"] == [*v["__nvidia_driver_versioned_packages"], "nvidia-persistenced"]
    assert v["__nvidia_driver_userspace_package"] == "nvidia-tesla-470-smi"


def test_debian_names_agree_with_the_branch_move_plan():
    from ansible_collections.gpubox.gpubox.plugins.module_utils import driver_branch

    for branch in ("470", "535"):
        names, userspace = driver_branch._debian_names(branch)
        v = driver_vars("Debian-12", "", False, branch=branch)
        assert (v["__nvidia_driver_versioned_packages"], v["__nvidia_driver_userspace_package"]) == (
            list(names),
            userspace,
        )


@pytest.mark.parametrize("branch", ["535", "580"])
def test_ubuntu_2204_names_follow_the_branch(branch):
    v = driver_vars("Ubuntu-22", "generic", False, branch=branch)
    assert v["__nvidia_driver_packages"] == [
        f"nvidia-headless-no-dkms-{branch}-server",
        f"nvidia-utils-{branch}-server",
        f"libnvidia-compute-{branch}-server",
        f"nvidia-compute-utils-{branch}-server",
        f"nvidia-dkms-{branch}-server",
        "linux-headers-generic",
    ]
    assert v["__nvidia_driver_userspace_package"] == f"nvidia-utils-{branch}-server"


def _task(path: str, name: str) -> dict:
    def walk(tasks):
        for task in tasks:
            yield task
            for key in ("block", "rescue", "always"):
                yield from walk(task.get(key) or [])

    return next(t for t in walk(load(ROOT / path)) if t.get("name") == name)


def test_the_branch_move_is_one_apt_transaction_that_purges_the_old_branch():
    task = _task(
        "roles/nvidia_driver/tasks/main.yml",
        "Move the driver to the pinned branch in one apt transaction (purge the old branch, install the new)",
    )
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["regex_replace"] = lambda value, pattern, repl: re.sub(pattern, repl, value)
    plan = {"purge": ["libcuda1", "nvidia-smi"]}
    install = ["nvidia-tesla-470-smi=470.256.02-1~deb12u1", "nvidia-persistenced"]
    argv = yaml.safe_load(
        env.from_string(task["ansible.builtin.command"]["argv"]).render(
            _nvidia_driver_plan=plan, _nvidia_driver_install=install
        )
    )
    assert argv[:3] == ["apt-get", "install", "-y"] and "--purge" in argv and "--allow-downgrades" in argv
    assert argv[-4:] == [*install, "libcuda1-", "nvidia-smi-"]  # apt-get's "name-": removed in the same run
    assert task["when"] == "_nvidia_driver_plan.purge | length > 0"
    apt = _task(
        "roles/nvidia_driver/tasks/main.yml",
        "Ensure the driver packages are installed at exactly the pinned version (moves an installed build up or down)",
    )
    assert apt["when"] == "_nvidia_driver_plan.purge | length == 0"  # a version move: the apt task as before


@pytest.mark.parametrize(
    ("packages", "expected"),
    [
        ({"linux-image-generic-hwe-22.04": "6.8.0-60.63~22.04.1"}, "generic-hwe-22.04"),
        ({"linux-image-generic": "5.15.0.143.138"}, "generic"),
    ],
)
def test_kernel_flavour_detection(packages, expected):
    tasks = load(ROOT / "roles/nvidia_driver/tasks/validate.yml")
    decide = next(t for t in tasks if "_nvidia_driver_kernel_flavour" in t.get("ansible.builtin.set_fact", {}))
    expr = decide["ansible.builtin.set_fact"]["_nvidia_driver_kernel_flavour"]
    facts = {"distribution_version": "22.04"}
    given = {"nvidia_driver_kernel_flavour": "", "ansible_facts": facts, "_nvidia_driver_versions": packages}
    assert render(expr, given) == expected


@pytest.mark.parametrize("distro", ["Ubuntu-22", "Debian-12"])
def test_cuda_repo_blocks_driver_packages(distro):
    v = load(ROOT / "roles/cuda_toolkit/vars" / f"{distro}.yml")
    globs = v["__cuda_toolkit_blocked_globs"].split()
    for needed in ("nvidia-*", "libnvidia-*", "cuda-drivers*"):
        assert needed in globs
    assert v["__cuda_toolkit_repo_url"].endswith(("ubuntu2204/x86_64/", "debian12/x86_64/"))


def test_role_readmes_match_argument_specs():
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools/role_readme.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)
_CONDITION = re.compile(r"^\s*(?:when|that|until|changed_when|failed_when):\s*(.+)$", re.M)


def _gpubox_facts_used(role: Path, facts: set[str]) -> set[str]:
    """The gpubox role's defaults a role's tasks, templates, handlers and vars evaluate (comments and prose aside)."""
    used: set[str] = set()
    for sub in ("tasks", "templates", "handlers", "vars", "defaults"):
        for path in sorted((role / sub).rglob("*")) if (role / sub).is_dir() else []:
            if not path.is_file():
                continue
            lines = path.read_text(errors="replace").splitlines()
            text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
            for span in _JINJA.findall(text) + _CONDITION.findall(text):
                used |= set(re.findall(r"\b(gpubox_[a-z0-9_]+)\b", span)) & facts
    return used


@pytest.mark.parametrize("role", [r for r in ROLES if r.name != "gpubox"], ids=lambda r: r.name)
def test_a_role_that_evaluates_the_desired_state_declares_the_gpubox_role(role: Path) -> None:
    facts = set(yaml.safe_load((ROOT / "roles" / "gpubox" / "defaults" / "main.yml").read_text()))
    used = _gpubox_facts_used(role, facts)
    deps = yaml.safe_load((role / "meta" / "main.yml").read_text()).get("dependencies") or []
    names = {d.get("role") if isinstance(d, dict) else d for d in deps}
    assert not used or names & {"gpubox", "gpubox.gpubox.gpubox"}, (
        f"{role.name} evaluates {sorted(used)} (roles/gpubox/defaults) but meta/main.yml does not depend on gpubox"
    )


def test_the_dependency_check_sees_a_fact_in_jinja_and_not_in_prose(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "main.yml").write_text(
        "# gpubox_port in a comment\n- debug:\n    msg: set gpubox_port\n  when: gpubox_model_root | length > 0\n"
        '- debug: {msg: "{{ gpubox_env_prefix }}"}\n'
    )
    used = _gpubox_facts_used(tmp_path, {"gpubox_port", "gpubox_model_root", "gpubox_env_prefix"})
    assert used == {"gpubox_model_root", "gpubox_env_prefix"}


# Every file of the checkout but what git, the venvs and the caches keep (the collection's link loops back here).
_SKIP = {".git", ".venv", ".lockvenv", ".ansible", ".cache", "collections", ".pytest_cache", ".ruff_cache"}


def test_one_nginx_checker_owned_by_the_gpubox_role_used_by_both_nginx_roles() -> None:
    # front_door and fleet_cache each kept a copy of files/nginx-check (a role reads nothing outside its own
    # directory) and the copies drifted: the LAN cache's missed the private temp directories, so its `nginx -t`
    # made /var/lib/nginx/* nobody's. One copy now, which the gpubox role owns and installs (tasks/nginx_check.yml).
    marker = "Usage: nginx-check FILE"
    copies = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*")
        if path.is_file()
        and not _SKIP & set(path.relative_to(ROOT).parts)
        and ("nginx-check" in path.name or marker in path.read_text(errors="replace")[:2000])
    )
    assert copies == ["roles/gpubox/files/nginx-check"]
    installer = (ROOT / "roles" / "gpubox" / "tasks" / "nginx_check.yml").read_text()
    assert "src: nginx-check" in installer and 'dest: "{{ gpubox_nginx_check }}"' in installer
    for role in ("front_door", "fleet_cache"):
        tasks = "\n".join(path.read_text() for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml")))
        assert "name: gpubox\n" in tasks and "tasks_from: nginx_check\n" in tasks, role
        validates = re.findall(r"^\s*validate: (.*)$", tasks, re.M)
        assert validates and set(validates) == {'"{{ gpubox_nginx_check }} %s"'}, (role, validates)
        assert not (ROOT / "roles" / role / "files" / "nginx-check").exists(), role
