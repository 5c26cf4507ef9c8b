#!/usr/bin/env python3
"""The README's "Deploy to a real box" quick start, run as a stranger would, against the serving box.

The commands are the README's own (tools/readme_commands.py reads them from README.md and
docs/day-two.md), run in order from the checkout. Only the README's placeholders are replaced: the
inventory name `mybox`, the address 203.0.113.7, the user `ubuntu`, the key file and the served model
name `qwen14b` (the test box serves `tiny`).

The box is molecule/serving's, converged, serving and through day two. The harness (podman exec, its
only access to the box here) first makes it the box the README starts from:
- a user `operator`, reached by SSH key and allowed to sudo with a password (Debian's `%sudo` rule),
  not root;
- sshd listening on port 2222 as well (a non-default port); Ansible reaches the box there, on its
  network address, not through the harness's published port 22;
- no gpubox firewall table (as before a first run), so that the converge has to open 2222 itself.
Beyond the README's files the copied inventory gets what the harness simulates and nothing else:
the test groups' vars (molecule/shared/group_vars/gpubox_sim*.yml: the fake GPU, the test hub and
apt repo, the CPU engine) and the box's host_vars (molecule/serving/host_vars, plus the model root day
two moved it to and the test's own known_hosts file). The API key and the sudo password are only in
the vault file.

Checked after the commands: every one exited 0; the converge came in as `operator` on 2222 and used
sudo (the box's journal), the firewall now opens 2222 (only SSH_CONNECTION on the box could say so);
preflight refuses firewall_ssh_networks that would not admit the controller, over that same
connection, before any change; the first request got a chat answer through the front door, verified
against the box's own certificate. Each step's output is in --out.

    operator_suite.py --box gpubox-m-serving --address 10.231.89.10 --project . --out DIR
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pty
import re
import secrets
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SSH_PORT = 2222
USER = "deployer"  # not "operator": Debian has a system group of that name
INVENTORY_NAME = "gpubox-m-operator"  # README: inventories/mybox (a user's own copy stays untouched)
SERVED = "tiny"
# The README's placeholders, in the order they are replaced.
README_ADDRESS = "203.0.113.7"
README_USER = "ubuntu"
README_SERVED = "qwen14b"


def _readme_code(project: Path) -> tuple[list[str], list[str]]:
    """The commands and the host snippet of README.md's "Deploy to a real box", in order."""
    spec = importlib.util.spec_from_file_location("gpubox_readme_commands", project / "tools" / "readme_commands.py")
    readme_commands = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(readme_commands)
    return readme_commands.readme_code(readme_commands.SECTIONS[:1])


class Suite:
    def __init__(self, args: argparse.Namespace) -> None:
        self.box = args.box
        self.address = args.address
        self.project = Path(args.project).resolve()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.moved_root = args.model_root
        self.tmp = Path(tempfile.mkdtemp(prefix="gpubox-operator."))
        self.inventory = self.project / "inventories" / INVENTORY_NAME
        self.notes: list[str] = []
        self.failures = 0
        # A stranger's shell in the checkout: none of molecule's ANSIBLE_* settings (ansible.cfg in the checkout
        # is what applies), but the harness's cache (the simulated repo and hub) and its ephemeral directory
        # (the scenario's model lock, named by the box's host_vars).
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "MAKE", "MFLAGS"))}
        self.env["CACHE"] = os.environ.get("GPUBOX_CACHE", "")
        # The harness's own fact cache: the copied inventory's host is called gpu-box, as the README's is.
        self.env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(self.tmp / "facts")
        self.step_no = 0

    # --- helpers -------------------------------------------------------------------------------
    def podman(self, script: str, what: str = "") -> str:
        """Run ``script`` on the box (stdin: it may hold the sudo password, which no argv or message shows)."""
        proc = subprocess.run(
            ["podman", "exec", "-i", self.box, "bash", "-euo", "pipefail", "-s"],
            input=script, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            said = proc.stderr.strip()[-2000:].replace(getattr(self, "sudo_password", "") or "\0", "<password>")
            raise SystemExit(f"operator suite: on the box ({what or script.splitlines()[0][:80]}): {said}")
        return proc.stdout

    def note(self, line: str) -> None:
        print(line, flush=True)
        self.notes.append(line)

    def check(self, ok: bool, what: str) -> None:
        self.note(("ok   " if ok else "FAIL ") + what)
        self.failures += 0 if ok else 1

    def run(
        self, label: str, command: str, expect_rc: int | None = 0, tty: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run one README command (a shell line) from the checkout; its output goes to --out/NN-label.log.
        ``tty``: on a pseudo-terminal, as a person's shell is (`ansible-vault create` opens an editor only there)."""
        self.step_no += 1
        started = time.monotonic()
        if tty:
            main_fd, term_fd = pty.openpty()
            try:
                done = subprocess.run(
                    ["bash", "-o", "pipefail", "-c", command], cwd=self.project, env=self.env, stdin=term_fd,
                    stdout=term_fd, stderr=term_fd, timeout=600, check=False,
                )  # fmt: skip
            finally:
                os.close(term_fd)
            said = b""
            while select.select([main_fd], [], [], 0.2)[0]:
                try:
                    chunk = os.read(main_fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                said += chunk
            os.close(main_fd)
            proc = subprocess.CompletedProcess(done.args, done.returncode, said.decode(errors="replace"), "")
        else:
            proc = subprocess.run(
                ["bash", "-o", "pipefail", "-c", command], cwd=self.project, env=self.env, capture_output=True,
                text=True, timeout=1800, check=False,
            )  # fmt: skip
        log = self.out / f"{self.step_no:02d}-{label}.log"
        log.write_text(f"$ {command}\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        took = time.monotonic() - started
        if expect_rc is not None:
            self.check(proc.returncode == expect_rc, f"{label} ({took:.0f} s, rc {proc.returncode}): {command[:150]}")
        return proc

    def placeholders(self, command: str) -> str:
        command = command.replace("inventories/mybox", f"inventories/{INVENTORY_NAME}")
        command = command.replace(f"{README_USER}@{README_ADDRESS}", f"{USER}@{self.address}")
        command = command.replace(README_ADDRESS, self.address)
        return command.replace(f'"model": "{README_SERVED}"', f'"model": "{SERVED}"')

    # --- the box as the README finds it -----------------------------------------------------------
    def prepare_box(self, public_key: str) -> None:
        self.podman(
            f"""
id -u {USER} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash --groups sudo {USER}
printf '%s:%s\\n' {USER} {shlex.quote(self.sudo_password)} | chpasswd
install -d -m 700 -o {USER} -g {USER} /home/{USER}/.ssh
printf '%s\\n' {shlex.quote(public_key)} > /home/{USER}/.ssh/authorized_keys
chown {USER}:{USER} /home/{USER}/.ssh/authorized_keys && chmod 600 /home/{USER}/.ssh/authorized_keys
printf 'Port 22\\nPort {SSH_PORT}\\n' > /etc/ssh/sshd_config.d/gpubox-operator.conf
systemctl restart ssh
nft delete table inet gpubox 2>/dev/null || true
""",
            "make the README's box: its user, sshd on a second port, no gpubox firewall",
        )
        self.journal_since = self.podman("date +%s", "the box's clock").strip()  # journalctl --since @SECONDS

    # --- the inventory of the README ---------------------------------------------------------------
    def write_inventory_files(self, snippets: list[str], key_file: Path) -> None:
        """hosts.yml from the README's snippet; the harness's simulation vars beside the README's files."""
        text = "\n".join(re.sub(r"\s+#.*$", "", s) for s in snippets)
        text = text.replace(README_ADDRESS, self.address).replace(
            f"ansible_user: {README_USER}", f"ansible_user: {USER}"
        )
        text = text.replace("~/.ssh/gpubox_ed25519", str(key_file))
        ((name, hostvars),) = yaml.safe_load(text).items()
        hostvars["ansible_port"] = SSH_PORT
        hosts_file = self.inventory / "hosts.yml"
        hosts = yaml.safe_load(hosts_file.read_text())
        # SIMULATED: the test groups (molecule/shared/group_vars) that give the box its fake GPU and CPU engine,
        # nested in the topology group so that their vars win over it, as they do in molecule's flat inventory
        # (same depth, later name). The box is still in gpu_2x3090, as the README says.
        engine = {"hosts": {name: hostvars}}
        hosts["gpu_boxes"]["children"]["gpu_2x3090"] = {
            "children": {"gpubox_sim": {"children": {"gpubox_sim_cpu_engine": engine}}}
        }
        hosts_file.write_text(yaml.safe_dump(hosts, sort_keys=False))
        shared = self.project / "molecule" / "shared" / "group_vars"
        for group in ("gpubox_sim", "gpubox_sim_cpu_engine"):
            lines = (shared / f"{group}.yml").read_text().splitlines()
            # The key is the vault's: drop the harness's own copy of it.
            kept = [line for line in lines if not line.startswith("vault_gpubox_api_key:")]
            (self.inventory / "group_vars" / f"{group}.yml").write_text("\n".join(kept) + "\n")
        host_vars = self.inventory / "host_vars"
        host_vars.mkdir(exist_ok=True)
        box_vars = (self.project / "molecule" / "serving" / "host_vars" / f"{self.box}.yml").read_text()
        box_vars += (
            "\n# The operator suite: where day two left the model, and the test's own known_hosts file.\n"
            f"gpubox_model_root: {self.moved_root}\n"
            f"ansible_ssh_common_args: -o UserKnownHostsFile={self.tmp / 'known_hosts'}\n"
        )
        (host_vars / f"{name}.yml").write_text(box_vars)
        self.host = name

    def vault_content(self) -> str:
        shared = yaml.safe_load((self.project / "molecule" / "shared" / "group_vars" / "gpubox_sim.yml").read_text())
        self.key = shared["vault_gpubox_api_key"]
        return yaml.safe_dump({"vault_gpubox_api_key": self.key, "ansible_become_password": self.sudo_password})

    # --- the steps -----------------------------------------------------------------------------------
    def main(self) -> int:
        commands, snippets = _readme_code(self.project)
        self.sudo_password = secrets.token_urlsafe(18)
        key_file = self.tmp / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key_file)], check=True)
        self.prepare_box(Path(f"{key_file}.pub").read_text().strip())
        self.note(f"the box: user {USER} (sudo with a password), sshd on {SSH_PORT} too, no gpubox firewall table")
        keys = ""
        for _ in range(30):  # sshd was just restarted with its second port
            scan = ["ssh-keyscan", "-p", str(SSH_PORT), self.address]
            keys = subprocess.run(scan, capture_output=True, text=True, timeout=60, check=False).stdout
            if keys.strip():
                break
            time.sleep(1)
        if not keys.strip():
            raise SystemExit(f"operator suite: sshd on {self.address}:{SSH_PORT} does not answer ssh-keyscan")
        (self.tmp / "known_hosts").write_text(keys)
        (self.tmp / "ssh_config").write_text(
            f"Host {self.address}\n  Port {SSH_PORT}\n  IdentityFile {key_file}\n"
            f"  UserKnownHostsFile {self.tmp / 'known_hosts'}\n  BatchMode yes\n"
        )
        # The vault file's content, written by the EDITOR that `ansible-vault create` opens.
        content = self.tmp / "vault-content.yml"
        content.write_text(self.vault_content())
        content.chmod(0o600)
        editor = self.tmp / "editor"
        editor.write_text(f'#!/bin/sh\ncat {shlex.quote(str(content))} > "$1"\n')
        editor.chmod(0o700)
        self.env["EDITOR"] = str(editor)
        self.env["GPUBOX_KEY"] = self.key
        if self.inventory.exists():
            shutil.rmtree(self.inventory)
        try:
            return self.steps(commands, snippets, key_file)
        finally:
            shutil.rmtree(self.inventory, ignore_errors=True)
            shutil.rmtree(self.tmp, ignore_errors=True)
            (self.project / "gpu-box.crt").unlink(missing_ok=True)  # the README's scp writes it beside the checkout
            (self.out / "summary.txt").write_text("\n".join(self.notes) + "\n")

    def steps(self, commands: list[str], snippets: list[str], key_file: Path) -> int:
        wanted = [c for c in commands if self.wanted(c)]
        for command in wanted:
            line = self.placeholders(command)
            argv = shlex.split(line)
            tool = Path(argv[0]).name
            if tool == "cp":
                self.run("copy-inventory", line)
                self.write_inventory_files(snippets, key_file)
            elif tool == "export":
                name, _, value = argv[1].partition("=")
                path = Path(os.path.expanduser(value.replace("~/", f"{self.tmp}/")))
                path.write_text(secrets.token_urlsafe(24) + "\n")
                path.chmod(0o600)
                self.env[name] = str(path)
                self.note(f"ok   {name} is a 0600 file of the vault password ({line})")
            elif tool == "ansible-vault":
                self.run("vault-create", line, tty=True)
                text = (self.inventory / "group_vars" / "all.yml").read_text()
                self.check(text.startswith("$ANSIBLE_VAULT;"), "group_vars/all.yml is encrypted")
            elif tool == "scp":
                self.run("fetch-certificate", line.replace("scp ", f"scp -F {self.tmp / 'ssh_config'} ", 1))
            elif tool == "curl":
                proc = self.run("first-request", line)
                try:
                    answer = json.loads(proc.stdout)["choices"][0]["message"]
                except (ValueError, KeyError, IndexError, TypeError):
                    answer = None
                self.check(bool(answer and answer.get("content")), f"the first request got a chat answer: {answer}")
            else:
                label = f"make-{argv[1]}" if tool == "make" else Path(argv[argv.index("-i") + 2]).stem
                label += "-check" if "--check" in argv else ""
                self.run(label, line)
                if label == "site":
                    self.after_converge()
                if label == "preflight":
                    self.lockout_refused(line)
        failed = [n for n in self.notes if n.startswith("FAIL ")]
        for line in failed:  # last, where a failed run's digest (tools/run_scenarios.py why_failed) looks
            print(line, file=sys.stderr)
        self.note(f"{len(failed)} check(s) failed (logs: {self.out})" if failed else "every step passed")
        return 1 if self.failures else 0

    @staticmethod
    def wanted(command: str) -> bool:
        """The quick start's commands but the controller's set-up (apt, venv, collections): the harness's venv
        is made from the same lock, and the collections come with it (Galaxy is out of reach here)."""
        return re.match(r"^(sudo apt-get|python3\.\d+ -m venv|\.venv/bin/ansible-galaxy)", command) is None

    def after_converge(self) -> None:
        since = f"--since=@{self.journal_since}"
        log = self.podman(f"journalctl {since} -o cat -t sshd -t sudo")
        accepted = re.search(rf"Accepted publickey for {USER} from \S+ port \d+ ssh2", log)
        self.check(accepted is not None, f"the converge came in as {USER} by key: {accepted and accepted.group(0)}")
        self.check(re.search(rf"{USER} : .*USER=root ; COMMAND=", log) is not None, f"{USER} became root with sudo")
        rules = self.podman("nft list table inet gpubox")
        self.check(
            f"tcp dport {SSH_PORT} accept" in rules, f"the firewall opens {SSH_PORT}, the port the run came in on"
        )
        self.check("tcp dport 22 accept" in rules, "and firewall_ssh_port 22 as before")

    def lockout_refused(self, preflight: str) -> None:
        before = self.podman("nft list ruleset | sha256sum")
        bad = preflight + ' -e \'{"firewall_ssh_networks": ["192.0.2.0/24"]}\''
        proc = self.run("preflight-lockout", bad, expect_rc=None)
        text = proc.stdout + proc.stderr
        self.check(
            proc.returncode != 0 and "does not admit" in text and "firewall_ssh_networks" in text,
            "preflight refuses firewall_ssh_networks that would not admit the controller, naming it",
        )
        self.check(self.podman("nft list ruleset | sha256sum") == before, "and the box's firewall is as it was")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--box", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--model-root", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--out", required=True)
    return Suite(parser.parse_args()).main()


if __name__ == "__main__":
    sys.exit(main())
