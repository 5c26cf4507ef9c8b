"""Cross-role facts are documented outputs of one role.

A fact one role sets (set_fact) and another role or a playbook reads, and every local fact a role keeps
in /etc/ansible/facts.d, has one owner: the role that writes it, whose README lists it under "## Outputs".
Found from the roles' files (comments aside), checked against OWNERS; docs/design.md ("Roles' outputs")
tables the same.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir())
OWNERS = {
    "gpubox_driver_check": "nvidia_driver",
    "gpubox_reboot_reasons": "nvidia_driver",
    "gpubox_driver": "nvidia_driver",
    "gpubox_preflight": "preflight",
    "gpubox_cuda": "cuda_toolkit",
    "gpubox_gpu_check": "gpu_tuning",
    "gpubox_env": "python_env",
    "gpubox_model": "model_store",
    "gpubox_model_verify": "model_store",
    "gpubox_front_door": "front_door",
    "gpubox_serving": "vllm_service",
    "gpubox_gateway": "llm_gateway",
    "llm_gateway_drain_result": "llm_gateway",
    "llm_gateway_canary_stats": "llm_gateway",
    "llm_gateway_canary_decisions": "llm_gateway",
    "vllm_service_canary_metrics": "vllm_service",
    "vllm_service_canary_answers": "vllm_service",
    "gpubox_canary": "vllm_service",
    "gpubox_kv_pin": "vllm_service",
    "gpubox_reboot": "gpubox",
}
_FACT_FILE = re.compile(r"facts\.d/([a-z0-9_]+)\.fact\b")


def _code(path: Path) -> str:
    """A file's text without its comment lines."""
    return "\n".join(ln for ln in path.read_text(errors="replace").splitlines() if not ln.lstrip().startswith("#"))


def _files(role: Path) -> list[Path]:
    return [
        p
        for sub in ("tasks", "handlers", "vars", "templates", "files")
        for p in sorted((role / sub).rglob("*"))
        if (role / sub).is_dir() and p.is_file()
    ]


def _set_facts(role: Path) -> set[str]:
    found: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key in ("ansible.builtin.set_fact", "set_fact") and isinstance(value, dict):
                    found.update(k for k in value if k != "cacheable")
                walk(value)

    for sub in ("tasks", "handlers"):
        for path in sorted((role / sub).glob("*.yml")) if (role / sub).is_dir() else []:
            walk(yaml.safe_load(path.read_text()))
    return found


def _outputs_listed(role: Path) -> set[str]:
    text = (role / "README.md").read_text()
    m = re.search(r"^## Outputs[^\n]*\n(.*?)(?=^## |^<!-- BEGIN|\Z)", text, re.S | re.M)
    return set(re.findall(r"`(?:ansible_local\.)?([a-z0-9_]+)`", m.group(1))) if m else set()


def _readers(name: str, owner: str) -> set[str]:
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    readers = {r.name for r in ROLES if r.name != owner and any(pattern.search(_code(p)) for p in _files(r))}
    readers |= {p.name for p in (ROOT / "playbooks").rglob("*.yml") if pattern.search(_code(p))}
    return readers


def test_every_shared_set_fact_has_one_owner_that_lists_it():
    setters: dict[str, set[str]] = {}
    for role in ROLES:
        for fact in _set_facts(role):
            setters.setdefault(fact, set()).add(role.name)
    shared = {fact for fact, roles in setters.items() if not fact.startswith("_") and _readers(fact, *roles)}
    assert shared  # gpubox_driver_check, gpubox_reboot_reasons, gpubox_preflight at least
    for fact in sorted(shared):
        assert setters[fact] == {OWNERS.get(fact)}, f"{fact} is set by {sorted(setters[fact])}; one owner, in OWNERS"


def test_every_local_fact_a_role_names_has_an_owner():
    named = {m for role in ROLES for p in _files(role) for m in _FACT_FILE.findall(_code(p))}
    assert named and named <= set(OWNERS), sorted(named - set(OWNERS))


@pytest.mark.parametrize("fact", sorted(OWNERS))
def test_the_owner_writes_it_and_its_readme_lists_it(fact):
    owner = ROOT / "roles" / OWNERS[fact]
    code = "\n".join(_code(p) for p in _files(owner))
    assert fact in _set_facts(owner) or f"facts.d/{fact}.fact" in code, f"{owner.name} does not write {fact}"
    assert fact in _outputs_listed(owner), f"roles/{owner.name}/README.md: add {fact} under '## Outputs'"
    # and no other role sets it
    assert not [r.name for r in ROLES if r != owner and fact in _set_facts(r)]


def test_the_outputs_check_reads_the_section_only(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(
        "# x\n\nSets `gpubox_a`.\n\n## Outputs (what other roles read)\n\n- `ansible_local.gpubox_b` (a file)\n"
        "- `gpubox_c`: a fact\n\n## Variables\n\n`gpubox_d`\n"
    )
    assert _outputs_listed(tmp_path) == {"gpubox_b", "gpubox_c"}
