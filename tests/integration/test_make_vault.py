"""An inventory with Ansible Vault data: every make target that reads an inventory takes the password the
one way, VAULT_PASSWORD_FILE=path (--vault-password-file to ansible-playbook and to tools/plan.py), and
ANSIBLE_VAULT_PASSWORD_FILE works as Ansible reads it.

The inventory is the one the README's step makes: `ansible-vault create inventories/<inv>/group_vars/all.yml`
(here `ansible-vault encrypt` of the same file, from the venv, with a password file in tmp).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SECRET = "vault-test-key-0123456789abcdef0123"  # pragma: allowlist secret (a test value)
PASSWORD = "unit-vault-password"  # pragma: allowlist secret (a test value)


@pytest.fixture
def vaulted(tmp_path: Path) -> tuple[Path, Path]:
    """(inventory, password file): the production inventory with an encrypted group_vars/all.yml."""
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventories" / "production", inv)
    (inv / "models.lock.json").unlink(missing_ok=True)
    secret = inv / "group_vars" / "all.yml"
    secret.write_text(f"---\nvault_gpubox_api_key: {SECRET}\n")
    password = tmp_path / "vault-pass"
    password.write_text(PASSWORD + "\n")
    subprocess.run(
        [str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(password), str(secret)],
        check=True,
        capture_output=True,
    )
    assert secret.read_text().startswith("$ANSIBLE_VAULT;1.1;AES256")
    return inv, password


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}
    return env | extra


def _plan(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "plan.py"), *argv],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        check=False,
    )


def test_plan_reads_a_vaulted_inventory_with_its_password_file(vaulted: tuple[Path, Path]) -> None:
    inv, password = vaulted
    proc = _plan("-i", str(inv), "--vault-password-file", str(password))
    assert proc.returncode == 0, proc.stderr
    assert "group gpu_2x3090" in proc.stdout
    assert SECRET not in proc.stdout + proc.stderr


def test_plan_without_the_password_says_how_to_give_it(vaulted: tuple[Path, Path]) -> None:
    inv, _ = vaulted
    proc = _plan("-i", str(inv))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"ERROR: inventory {inv} holds Ansible Vault data")
    assert "--vault-password-file FILE" in proc.stderr and "ANSIBLE_VAULT_PASSWORD_FILE" in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr


def test_plan_with_a_wrong_password_fails_clearly(vaulted: tuple[Path, Path], tmp_path: Path) -> None:
    inv, _ = vaulted
    wrong = tmp_path / "wrong"
    wrong.write_text("not-it\n")
    proc = _plan("-i", str(inv), "--vault-password-file", str(wrong))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "Ansible Vault data" in proc.stderr


def test_plan_honours_ansible_vault_password_file(vaulted: tuple[Path, Path]) -> None:
    inv, password = vaulted
    proc = _plan("-i", str(inv), ANSIBLE_VAULT_PASSWORD_FILE=str(password))
    assert proc.returncode == 0, proc.stderr


def test_make_plan_takes_vault_password_file(vaulted: tuple[Path, Path]) -> None:
    # The issue as a user hits it: `make plan INVENTORY=…` of a vaulted inventory.
    inv, password = vaulted
    make = [shutil.which("make") or "make", "--no-print-directory", "plan", f"INVENTORY={inv}"]
    proc = subprocess.run(make, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "make plan VAULT_PASSWORD_FILE=FILE" in proc.stderr
    make.append(f"VAULT_PASSWORD_FILE={password}")
    proc = subprocess.run(make, cwd=ROOT, env=_env(), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "group gpu_2x3090" in proc.stdout


def _dry(target: str, *args: str) -> str:
    proc = subprocess.run(
        ["make", "-n", "--no-print-directory", target, *args],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("target", "command"),
    [
        ("plan", "tools/plan.py -i x --vault-password-file 'y'"),
        ("verify", "ansible-playbook -i x --vault-password-file 'y' playbooks/verify.yml"),
        ("lock-models", "ansible-playbook -i x --vault-password-file 'y' playbooks/lock_models.yml"),
        ("cache-purge", "ansible-playbook -i x --vault-password-file 'y' playbooks/fleet_cache_purge.yml"),
        ("canary", "ansible-playbook -i x --vault-password-file 'y' playbooks/canary.yml"),
    ],
)
def test_every_inventory_target_passes_vault_password_file(target: str, command: str) -> None:
    assert command in _dry(target, "INVENTORY=x", "VAULT_PASSWORD_FILE=y")
    assert "vault" not in _dry(target, "INVENTORY=x")  # nothing added without it


def test_demo_passes_it_to_ansible_through_the_environment() -> None:
    line = _dry("demo-clean", "VAULT_PASSWORD_FILE=y")
    assert line.startswith(f"ANSIBLE_VAULT_PASSWORD_FILE='{ROOT}/y' ") and line.endswith("tools/demo.py down")
    assert "VAULT" not in _dry("demo-clean")


def test_every_make_target_reading_an_inventory_is_covered() -> None:
    # A new target that reads an inventory (-i $(INVENTORY)) must take $(VAULT_ARGS) too.
    lines = [line for line in (ROOT / "Makefile").read_text().splitlines() if "-i $(INVENTORY)" in line]
    assert len(lines) == 6 and all("$(VAULT_ARGS)" in line for line in lines), lines


def test_make_verify_without_the_password_names_the_fix(vaulted: tuple[Path, Path]) -> None:
    # ansible-playbook stops at the vault file before it connects to any box; make names VAULT_PASSWORD_FILE.
    inv, _ = vaulted
    proc = subprocess.run(
        ["make", "--no-print-directory", "verify", f"INVENTORY={inv}"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode != 0
    assert "no vault secrets found" in proc.stdout + proc.stderr
    assert f"make verify: inventory {inv} holds Ansible Vault data" in proc.stderr
    assert "make verify VAULT_PASSWORD_FILE=path (or export ANSIBLE_VAULT_PASSWORD_FILE)" in proc.stderr
