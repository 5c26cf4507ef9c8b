"""The stacks a box can run (the desired-state fact gpubox_stack): one typed row per stack, in one table.

A stack is everything that moves together when a box changes its software generation: the NVIDIA driver
branch and its exact package version per distribution, the CUDA toolkit, the Python the pins resolve for,
the vLLM and torch pins (requirements, constraints and the hash lock beside them) with their advisory
table, the vLLM engine the planner models (V0 or V1) and the dates its parts stop being supported.
Roles read a stack through the desired state (the gpubox.gpubox.desired_state lookup's
``gpubox_stack_info``, from ``info()``): nvidia_driver its branch and version, cuda_toolkit its toolkit,
python_env its Python and pin files, and every role its environment's prefix (the desired state's
``gpubox_env_prefix`` when it is not set: ``env_prefix()``). tools/plan.py and preflight print ``summary_lines()``.

``pinned-0.7.3`` is the design card's stack and the default: every value is what the roles carried before
stacks existed (tests/unit/test_stacks.py renders both and compares). ``lts-580`` is the supported one.
A stack's vLLM words (flags it removed, quantization methods, dtypes, KV dtypes, the engine and the model families
the planner models on it) are its release's record, ``Stack.words`` (vllm_words.RELEASES): a third stack is one row
here, one Release there and its pin files. Imports only vllm_words (a leaf), so state_checks and the schema can
import it.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import vllm_words

DEFAULT = "pinned-0.7.3"
ENGINES = ("v0", "v1")
# The python_env role's files/ (the pin files and advisory tables are named relative to it).
PIN_DIR = Path(__file__).resolve().parents[2] / "roles" / "python_env" / "files"


class StackError(ValueError):
    """A stack name that is not in the table; the message names gpubox_stack and the allowed values."""


@dataclass(frozen=True)
class SupportEnd:
    """When one part of a stack stops being supported upstream.

    ``until``: "YYYY-MM" (a month, as NVIDIA states branch ends), "YYYY-MM-DD", or "" when there is no
    upstream support at all (``note`` says why). ``source``: where the date is stated.
    """

    part: str
    until: str
    source: str
    note: str = ""

    def last_day(self) -> datetime.date | None:
        """The last supported day (a month's last day for "YYYY-MM"); None when there is no date."""
        if not self.until:
            return None
        if re.fullmatch(r"\d{4}-\d{2}", self.until):
            year, month = (int(part) for part in self.until.split("-"))
            following = datetime.date(year + month // 12, month % 12 + 1, 1)
            return following - datetime.timedelta(days=1)
        return datetime.date.fromisoformat(self.until)

    def state(self, today: datetime.date) -> str:
        """'supported until …', 'ENDED …' or 'no upstream support (…)', for the plan and preflight."""
        last = self.last_day()
        if last is None:
            return f"{self.part}: no upstream support ({self.note})"
        if today > last:
            return f"{self.part}: support ENDED {self.until}"
        return f"{self.part}: supported until {self.until}"


@dataclass(frozen=True)
class Stack:
    """One stack. ``driver_versions``: "<Distribution>-<major version>" (Ansible's facts) -> the exact apt
    version of the driver packages (Ubuntu: the ``-server`` packages; Debian: the archive's packages); a
    distribution without an entry needs ``nvidia_driver_version`` set. ``pythons``: the interpreter
    versions the pin set resolves for, Ubuntu 22.04's first. Pin files are names in roles/python_env/files;
    the hash lock is the constraints file's X.hashes.txt. ``env_prefix``: where the stack's Python environment
    lives when gpubox_env_prefix is not set (each stack its own, so a move builds the new environment beside the
    old one and a move back finds the old one whole: no download; docs/day-two.md)."""

    name: str
    summary: str
    driver_branch: str
    driver_versions: dict[str, str]
    cuda_toolkit: str
    pythons: tuple[str, ...]
    vllm: str
    torch: str
    requirements: str
    constraints: str
    advisories: str
    env_prefix: str
    support: tuple[SupportEnd, ...] = field(default_factory=tuple)

    @property
    def hash_lock(self) -> str:
        return re.sub(r"\.txt$", "", self.constraints) + ".hashes.txt"

    @property
    def python(self) -> str:
        return self.pythons[0]

    @property
    def words(self) -> vllm_words.Release:
        """The stack's vLLM release record: its vocabulary, engine and the families the planner models on it."""
        return vllm_words.RELEASES[self.vllm]

    @property
    def engine(self) -> str:
        return self.words.engine


_NVIDIA_SUPPORT = "NVIDIA's 'Supported Drivers and CUDA Toolkit Versions' table (docs.nvidia.com/datacenter/tesla)"
_UBUNTU_2204 = SupportEnd(
    "Ubuntu 22.04 standard support", "2027-04-01", "Ubuntu's release cycle page (ubuntu.com/about/release-cycle)"
)

STACKS: dict[str, Stack] = {
    stack.name: stack
    for stack in (
        Stack(
            name="pinned-0.7.3",
            summary="driver R535, CUDA 12.2, vLLM 0.7.3 (the design card's stack; V0 engine)",
            driver_branch="535",
            # Ubuntu: the pin roles/nvidia_driver carried before stacks (jammy-updates now carries 535.309.01
            # as a transitional package that pulls 580-server: preflight refuses a pin the archive no longer
            # offers, and lts-580 is where such a box goes). Debian 12: bookworm's non-free 535.
            driver_versions={"Ubuntu-22": "535.274.02-0ubuntu0.22.04.1", "Debian-12": "535.261.03-1"},
            cuda_toolkit="12.2",
            pythons=("3.10", "3.11"),
            vllm="0.7.3",
            torch="2.5.1",
            requirements="requirements-vllm-0.7.3.txt",
            constraints="constraints-vllm-0.7.3.txt",
            advisories="advisories.yml",
            # The one prefix every box had before stacks existed (the pinned stack renders as before).
            env_prefix="/opt/gpubox/venv",
            support=(
                SupportEnd("NVIDIA driver R535", "2026-06", _NVIDIA_SUPPORT),
                _UBUNTU_2204,
                SupportEnd(
                    "vLLM 0.7.3",
                    "",
                    "vLLM's security policy (fixes land in new releases only)",
                    note="vLLM fixes only its newest releases; 0.7.3 gets no fixes",
                ),
            ),
        ),
        Stack(
            name="lts-580",
            summary="driver R580 (long-term branch), CUDA 13.0, vLLM 0.32.0 (V1 engine)",
            driver_branch="580",
            # archive.ubuntu.com/ubuntu/dists/jammy-updates/restricted/binary-amd64/Packages.gz (and
            # jammy-security), read 2026-12-04: nvidia-utils-580-server, nvidia-headless-no-dkms-580-server,
            # libnvidia-compute-580-server, nvidia-compute-utils-580-server and nvidia-dkms-580-server at
            # 580.178.04-0ubuntu0.22.04.1 (source nvidia-graphics-drivers-580-server), and the signed
            # linux-modules-nvidia-580-server-generic. Debian 12 carries no 580 (issue 33, item 6).
            driver_versions={"Ubuntu-22": "580.178.04-0ubuntu0.22.04.1"},
            # torch 2.13.0 (PyPI) requires cuda-toolkit==13.0.3 wheels; R580 is CUDA 13.0's driver branch.
            cuda_toolkit="13.0",
            # vLLM 0.32.0 requires Python >= 3.11: Ubuntu 22.04's python3.11 (universe), Debian 12's python3.
            pythons=("3.11",),
            vllm="0.32.0",
            torch="2.13.0",
            requirements="requirements-vllm-0.32.0.txt",
            constraints="constraints-vllm-0.32.0.txt",
            advisories="advisories-vllm-0.32.0.yml",
            env_prefix="/opt/gpubox/venv-lts-580",
            support=(
                SupportEnd("NVIDIA driver R580 (LTSB)", "2028-06", _NVIDIA_SUPPORT),
                _UBUNTU_2204,
                SupportEnd(
                    "vLLM 0.32.0",
                    "",
                    "vLLM's security policy (fixes land in new releases only)",
                    note="vLLM fixes only its newest releases: move the pins when an advisory needs it",
                ),
            ),
        ),
    )
}
NAMES: tuple[str, ...] = tuple(STACKS)


def allowed() -> str:
    """The allowed values with what each is, for error messages."""
    return "; ".join(f"{name} ({stack.summary})" for name, stack in STACKS.items())


def get(name: Any) -> Stack:
    """The stack called ``name``; a StackError naming gpubox_stack and the allowed values otherwise."""
    if isinstance(name, str) and name.strip() in STACKS:
        return STACKS[name.strip()]
    raise StackError(f"gpubox_stack is {name!r}, which is not a stack: use one of {allowed()}")


def support_table() -> str:
    """The support dates of every stack's parts as a Markdown table (docs/day-two.md, tools/gen_schema.py)."""
    lines = ["| stack | part | supported until | source |", "|---|---|---|---|"]
    for name, stack in STACKS.items():
        for end in stack.support:
            until = end.until or f"no upstream support ({end.note})"
            lines.append(f"| `{name}` | {end.part} | {until} | {end.source} |")
    return "\n".join(lines) + "\n"


def engine_of(values: Any) -> str:
    """The vLLM engine the planner models for a box's facts ("v0" or "v1"): its stack's, the default stack's when
    gpubox_stack is not set. A name that is not a stack is refused elsewhere (state_checks, preflight) by name;
    the plan meanwhile models the default's engine rather than none."""
    name = values.get("gpubox_stack", DEFAULT) if isinstance(values, dict) else DEFAULT
    return STACKS[name.strip()].engine if isinstance(name, str) and name.strip() in STACKS else STACKS[DEFAULT].engine


def env_prefix(explicit: Any, stack: Any) -> Any:
    """The prefix of the Python environment a box runs: ``explicit`` (gpubox_env_prefix, checked) when set, else
    the stack's own (``Stack.env_prefix``); None when neither is known (a bad stack name is refused by name
    elsewhere). An explicit prefix is one environment for every stack: a move reinstalls it in place."""
    if explicit is not None:
        return explicit
    return STACKS[stack].env_prefix if isinstance(stack, str) and stack in STACKS else None


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def serving(minimum_vllm: str) -> list[str]:
    """The stacks whose vLLM is ``minimum_vllm`` or newer (a model that needs it runs on these)."""
    return [name for name, stack in STACKS.items() if _release(stack.vllm) >= _release(minimum_vllm)]


def serving_family(family: str) -> list[str]:
    """The stacks whose vLLM release the planner models ``family`` on (vllm_words.Release.families)."""
    return [name for name, stack in STACKS.items() if family in stack.words.families]


def driver_version(stack: Stack, distribution: str) -> str:
    """The exact driver version of ``stack`` for "<Distribution>-<major>", or "" when the table has none."""
    return stack.driver_versions.get(distribution, "")


def open_advisories(stack: Stack, pin_dir: Path = PIN_DIR) -> int:
    """Advisories of the stack's pins that stay open: accepted risks (the advisory check, advisories.py
    --check, keeps an accepted risk only while the pin is inside the affected range)."""
    import yaml  # on the controller only (the plan, the lookup): Ansible's own dependency

    data = yaml.safe_load((pin_dir / stack.advisories).read_text(encoding="utf-8")) or {}
    return sum(1 for entry in data.get("advisories") or [] if entry.get("status") == "accepted-risk")


def info(name: str) -> dict[str, Any]:
    """What roles read of a stack (the desired state's gpubox_stack_info): plain values only."""
    stack = get(name)
    return {
        "name": stack.name,
        "summary": stack.summary,
        "driver_branch": stack.driver_branch,
        "driver_versions": dict(stack.driver_versions),
        "cuda_toolkit": stack.cuda_toolkit,
        "python": stack.python,
        "pythons": list(stack.pythons),
        "vllm": stack.vllm,
        "torch": stack.torch,
        "requirements": stack.requirements,
        "constraints": stack.constraints,
        "hash_lock": stack.hash_lock,
        "advisories": stack.advisories,
        "engine": stack.engine,
        "env_prefix": stack.env_prefix,
    }


def summary_lines(name: str, today: datetime.date | None = None, pin_dir: Path = PIN_DIR) -> list[str]:
    """What the plan and preflight say about a box's stack: which, its support ends, its open advisories."""
    stack = get(name)
    today = today or datetime.date.today()
    count = open_advisories(stack, pin_dir)
    return [
        f"stack {stack.name}: {stack.summary}",
        *(f"  {end.state(today)}" for end in stack.support),
        f"  open advisories (accepted, unfixed): {count} (roles/python_env/files/{stack.advisories}; docs/security.md)",
    ]
