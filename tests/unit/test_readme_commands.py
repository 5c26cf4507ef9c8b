"""Every command the README's "Deploy to a real box" and "Day two" sections show is exercised here.

The commands are read from README.md itself (indented code lines of those two sections) and each one
is checked by what it names: files and inventories exist, make targets exist and run, playbooks pass
`ansible-playbook --syntax-check` with the flags shown against a copy of the production inventory
(the one the README tells users to copy, with the host snippet the README shows merged in). A command
this test does not know fails it, so a new README command needs a check here.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("## Deploy to a real box", "## Day two")


def _section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def _blocks(section: str) -> list[list[str]]:
    """Indented code blocks (4+ spaces more than the surrounding text), as lists of lines."""
    blocks: list[list[str]] = []
    current: list[str] = []
    base = 0
    for line in section.splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if not stripped:
            if current:
                blocks.append(current)
                current = []
            continue
        if current and indent >= base + 4:
            current.append(line)
        elif not current and re.match(r"^(- |\w|\*\*)", stripped) and indent < base + 4:
            base = indent + 2 if stripped.startswith("- ") else (base if indent > 0 else 0)
        elif indent >= base + 4:
            current.append(line)
    if current:
        blocks.append(current)
    return [textwrap.dedent("\n".join(b)).splitlines() for b in blocks]


def readme_code() -> tuple[list[str], list[str]]:
    """(shell commands, YAML snippet lines) shown in the two sections."""
    text = (ROOT / "README.md").read_text()
    commands, snippets = [], []
    for heading in SECTIONS:
        for block in _blocks(_section(text, heading)):
            if ":" in block[0].split()[0]:  # a YAML snippet: `gpu-box:`
                snippets.extend(block)
            else:
                commands.extend(re.sub(r"\s+#.*$", "", line).strip() for line in block)
    return commands, snippets


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
        if argv[:3] == ["python3", "-m", "venv"]:
            # python3 -m venv .venv && .venv/bin/pip install -r requirements-dev.lock
            req = argv[argv.index("-r") + 1]
            assert (ROOT / req).is_file(), req
            assert "ansible-core==2.19" in (ROOT / req).read_text()
        elif tool == "ansible-galaxy":
            req = yaml.safe_load((ROOT / argv[argv.index("-r") + 1]).read_text())
            assert req["collections"], command
        elif tool == "cp":
            assert (ROOT / argv[2]).is_dir(), command
        elif tool == "ansible-vault":
            assert argv[1] == "create"
            target = Path(argv[2].replace("inventories/mybox", str(inventory)))
            assert target.parent.is_dir(), f"{command}: {target.parent} does not exist in the copy"
        elif tool == "make":
            target = argv[1]
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
