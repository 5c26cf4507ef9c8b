"""Every command the README's "Deploy to a real box" section and docs/day-two.md's "Changes to the inventory"
section show is exercised here.

The commands are read from those files themselves (indented code lines of the two sections) and each one
is checked by what it names: files and inventories exist, make targets exist and run, playbooks pass
`ansible-playbook --syntax-check` with the flags shown against a copy of the production inventory
(the one the README tells users to copy, with the host snippet the README shows merged in). A command
this test does not know fails it, so a new README command needs a check here.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from readme_commands import readme_code

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    """The README's `cp -r inventories/production inventories/mybox`, with its hosts.yml snippet applied."""
    commands, snippets = readme_code()
    assert "cp -r inventories/production inventories/mybox" in commands
    inv = tmp_path_factory.mktemp("inv") / "mybox"
    shutil.copytree(ROOT / "inventories" / "production", inv)
    snippet = yaml.safe_load("\n".join(re.sub(r"\s+#.*$", "", s) for s in snippets))
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    ((name, hostvars),) = snippet.items()
    group = hosts["gpu_boxes"]["children"]["gpu_2x3090"]["hosts"]
    assert name in group, f"the README's host {name} is not in inventories/production/hosts.yml"
    group[name] = hostvars
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv


def test_readme_shows_the_commands_of_each_day_two_change():
    commands, snippets = readme_code()
    joined = "\n".join(commands)
    for needed in (
        "playbooks/preflight.yml",
        "--check --diff",
        "--tags driver",
        "--tags model,service",
        "ansible-galaxy collection install -r requirements.yml",
        "make plan",
    ):
        assert needed in joined, needed
    assert {"ansible_host", "ansible_user", "ansible_ssh_private_key_file"} <= {
        s.strip().split(":")[0] for s in snippets
    }


def test_every_readme_command_is_exercised(inventory):
    commands, _ = readme_code()
    assert commands
    bindir = Path(sys.executable).parent
    for command in commands:
        argv = shlex.split(command)
        tool = Path(argv[0]).name
        if argv[1:3] == ["-m", "venv"] and re.fullmatch(r"python3(\.\d+)?", argv[0]):
            # python3.11 -m venv .venv && .venv/bin/pip install -r requirements-dev.lock
            req = argv[argv.index("-r") + 1]
            assert (ROOT / req).is_file(), req
            assert "ansible-core==2.19" in (ROOT / req).read_text()
            # ansible-core 2.19 needs Python 3.11+ on the controller (Ubuntu 22.04's python3 is 3.10)
            assert argv[0] == "python3.11", f"{command}: the venv needs a Python ansible-core 2.19 runs on"
            assert 'requires-python = ">=3.11"' in (ROOT / "pyproject.toml").read_text()
            if "touch" in argv:  # the Makefile's stamp of an installed venv, so `make plan` keeps this one
                makefile = (ROOT / "Makefile").read_text()
                assert "VENV ?= .venv" in makefile and "$(VENV)/.stamp: requirements-dev.lock" in makefile
                assert argv[argv.index("touch") + 1] == ".venv/.stamp", command
        elif argv[:3] == ["sudo", "apt-get", "install"]:
            # the controller's Python 3.11 on Ubuntu 22.04, for the venv command
            assert {"python3.11", "python3.11-venv"} <= set(argv[3:]), command
        elif tool == "export":
            name = argv[1].split("=", 1)[0]
            assert name == "ANSIBLE_VAULT_PASSWORD_FILE", command
        elif tool == "scp":
            # the self-signed certificate of the front door, from the host of the README's snippet
            remote, local = argv[1], argv[2]
            host = yaml.safe_load((inventory / "hosts.yml").read_text())["gpu_boxes"]["children"]["gpu_2x3090"]
            hostvars = host["hosts"]["gpu-box"]
            assert remote.split(":", 1)[0] == f"{hostvars['ansible_user']}@{hostvars['ansible_host']}", command
            fd_vars = yaml.safe_load((ROOT / "roles" / "front_door" / "vars" / "main.yml").read_text())
            gpubox_defaults = yaml.safe_load((ROOT / "roles" / "gpubox" / "defaults" / "main.yml").read_text())
            etc_dir = gpubox_defaults["gpubox_etc_dir"]
            fd_dir = fd_vars["__front_door_dir"].replace("{{ gpubox_etc_dir }}", etc_dir)
            assert fd_vars["__front_door_cert"] == "{{ __front_door_dir }}/tls.crt", fd_vars
            assert "{{" not in fd_dir and remote.split(":", 1)[1] == f"{fd_dir}/tls.crt", (command, fd_dir)
            fetched = local
        elif tool == "curl":
            # the first request: the fetched certificate, the box's front door, the key, the served model name
            assert argv[argv.index("--cacert") + 1] == fetched, command
            url = next(a for a in argv if a.startswith("https://"))
            assert url.startswith(f"https://{hostvars['ansible_host']}/v1/"), command
            assert any(a.startswith("Authorization: Bearer ") for a in argv), command
            body = json.loads(argv[argv.index("-d") + 1])
            group_vars = yaml.safe_load((ROOT / "inventories/production/group_vars/gpu_2x3090.yml").read_text())
            assert body["model"] == group_vars["gpubox_served_model_name"], command
        elif tool == "ansible-galaxy":
            req = yaml.safe_load((ROOT / argv[argv.index("-r") + 1]).read_text())
            assert req["collections"], command
        elif tool == "cp":
            assert (ROOT / argv[2]).is_dir(), command
        elif tool == "ansible-vault":
            assert argv[1] == "create"
            target = Path(argv[2].replace("inventories/mybox", str(inventory)))
            assert target.parent.is_dir(), f"{command}: {target.parent} does not exist in the copy"
        elif tool == "make" and argv[1] in ("verify", "lock-models"):
            # day two: the target's playbook, on the copied inventory and the README's host, passes --syntax-check
            makefile = (ROOT / "Makefile").read_text()
            recipe = makefile.split(f"\n{argv[1]}: venv\n", 1)[1].split("\n", 1)[0]
            playbook = re.search(r"playbooks/\S+\.yml", recipe).group(0)
            args = dict(a.split("=", 1) for a in argv[2:])
            inv = args["INVENTORY"].replace("inventories/mybox", str(inventory))
            proc = subprocess.run(
                [str(bindir / "ansible-playbook"), "-i", inv, playbook, "-l", args["LIMIT"], "--syntax-check"],
                cwd=ROOT, capture_output=True, text=True, check=False,
                env={"PATH": f"{bindir}:/usr/bin:/bin", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                     "HOME": str(inventory.parent)},
            )  # fmt: skip
            assert proc.returncode == 0, f"{command}\n{proc.stdout}{proc.stderr}"
        elif tool == "make":
            target = argv[1]
            assert target == "plan", command
            assert re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), re.M), command
            args = dict(a.split("=", 1) for a in argv[2:])
            plan = subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "tools" / "plan.py"),
                    "-i",
                    args["INVENTORY"].replace("inventories/mybox", str(inventory)),
                    "-l",
                    args["LIMIT"],
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            assert plan.returncode == 0, plan.stdout + plan.stderr
        elif tool == "ansible-playbook":
            argv = [a.replace("inventories/mybox", str(inventory)) for a in argv if a != "--ask-vault-pass"]
            proc = subprocess.run(
                [str(bindir / "ansible-playbook"), *argv[1:], "--syntax-check"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
                env={
                    "PATH": f"{bindir}:/usr/bin:/bin",
                    "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
                    "HOME": str(inventory.parent),
                },
            )
            assert proc.returncode == 0, f"{command}\n{proc.stdout}{proc.stderr}"
        else:
            pytest.fail(f"README command not exercised by this test: {command}")
