"""The stacks a box can run (the desired-state fact gpubox_stack): one typed row per stack, in one table.

A stack is everything that moves together when a box changes its software generation: the NVIDIA driver
branch and its exact package version per distribution, the CUDA toolkit, the Python the pins resolve for,
the vLLM and torch pins (requirements, constraints and the hash lock beside them) with their advisory
table, the vLLM engine the planner models (V0 or V1) and the dates its parts stop being supported.
Roles read a stack through the desired state (the gpubox.gpubox.desired_state lookup's
``gpubox_stack_info``, from ``info()``): nvidia_driver its branch, version and archive snapshot, cuda_toolkit its
toolkit, python_env its Python and pin files, and every role its environment's prefix (the desired state's
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
    distribution without an entry needs ``nvidia_driver_version`` set. ``apt_snapshot``: "<Distribution>-<major>" ->
    the UTC time (YYYYMMDDTHHMMSSZ) of an archive snapshot that carries that exact version, for a distribution whose
    archive no longer does; the driver role adds it as a pinned apt source for the driver packages only
    (driver_snapshot.py). ``pythons``: the interpreter
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
    apt_snapshot: dict[str, str] = field(default_factory=dict)

    @property
    def hash_lock(self) -> str:
        return hash_lock_of(self.constraints)

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
            # as a transitional package that pulls 580-server, so that build comes from an archive snapshot:
            # apt_snapshot below). Debian 12: bookworm's non-free 535.
            driver_versions={"Ubuntu-22": "535.274.02-0ubuntu0.22.04.1", "Debian-12": "535.261.03-1"},
            # Ubuntu's archive as it was on 2026-01-01 (snapshot.ubuntu.com; docs/facts.md, "Ubuntu snapshot
            # service"). Chosen, not read from a source that lists the day: NVIDIA released 535.274.02 on 2025-09-30
            # and its successor 535.288.01 on 2026-01-13 (redistrib_<version>.json), so on this day no later 535
            # build existed to replace 535.274.02-0ubuntu0.22.04.1 in jammy-updates. Preflight asks the snapshot
            # itself and refuses, listing what it offers, if it does not carry the pin.
            apt_snapshot={"Ubuntu-22": "20260101T000000Z"},
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
        "apt_snapshot": dict(stack.apt_snapshot),
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


_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
_VERSION = re.compile(r"^\d+(\.\d+)+([.+][0-9A-Za-z.]+)?$")
_DISTRIBUTION = re.compile(r"^[A-Z][A-Za-z]+-\d+$")


def problems(stack: Any, release: vllm_words.Release | None = None, pin_dir: Path = PIN_DIR) -> list[str]:
    """Why ``stack`` is not a row the roles could run, one line each naming the field (empty: it is one).

    The release record is ``release`` or, when None, the registered one (vllm_words.RELEASES). Checked: the name, the
    driver branch and versions, the CUDA toolkit and Pythons as X.Y, the pin files present in ``pin_dir`` with the
    stack's vLLM and torch pinned in them, an absolute environment prefix, support dates that read as dates, and a
    release record of the same version whose engine the planner models. Every row of STACKS passes; so must a
    stack proposed by `make stack-add` (tools/stack_add.py) before a person adds its row."""
    if not isinstance(stack, Stack):
        return [f"not a Stack: {type(stack).__name__}"]
    found = []
    if not isinstance(stack.name, str) or not _NAME.match(stack.name):
        found.append(f"name {stack.name!r}: lower-case letters, digits, dots and dashes")
    if not str(stack.summary or "").strip():
        found.append("summary is empty")
    if not re.fullmatch(r"\d{3}", str(stack.driver_branch)):
        found.append(f"driver_branch {stack.driver_branch!r} is not a branch number such as 580")
    for distribution, version in dict(stack.driver_versions).items():
        if not _DISTRIBUTION.match(str(distribution)) or not str(version or "").strip():
            found.append(f"driver_versions: {distribution!r}: {version!r} is not '<Distribution>-<major>': version")
    if not re.fullmatch(r"\d+\.\d+", str(stack.cuda_toolkit)):
        found.append(f"cuda_toolkit {stack.cuda_toolkit!r} is not X.Y")
    if not stack.pythons or not all(re.fullmatch(r"3\.\d+", str(p)) for p in stack.pythons):
        found.append(f"pythons {stack.pythons!r} is not a list of 3.X, Ubuntu 22.04's first")
    for key in ("vllm", "torch"):
        if not _VERSION.match(str(getattr(stack, key))):
            found.append(f"{key} {getattr(stack, key)!r} is not a version")
    texts = {}
    for key in ("requirements", "constraints", "hash_lock", "advisories"):
        path = pin_dir / str(getattr(stack, key))
        if not path.is_file():
            found.append(f"{key}: {path} does not exist")
        elif key != "advisories":
            texts[key] = path.read_text(encoding="utf-8").splitlines()
    if "requirements" in texts and f"vllm=={stack.vllm}" not in texts["requirements"]:
        found.append(f"requirements: {stack.requirements} has no line vllm=={stack.vllm}")
    for pin in (f"vllm=={stack.vllm}", f"torch=={stack.torch}"):
        if "constraints" in texts and pin not in texts["constraints"]:
            found.append(f"constraints: {stack.constraints} has no line {pin}")
        if "hash_lock" in texts and f"{pin} \\" not in texts["hash_lock"]:
            found.append(f"hash_lock: {stack.hash_lock} has no hashed entry {pin}")
    if not str(stack.env_prefix).startswith("/"):
        found.append(f"env_prefix {stack.env_prefix!r} is not an absolute path")
    for end in stack.support:
        try:
            end.last_day()
        except (ValueError, TypeError, AttributeError):
            found.append(f"support: {end!r}: until is not YYYY-MM or YYYY-MM-DD")
            continue
        if not end.until and not end.note:
            found.append(f"support: {end.part}: no date and no note saying why")
    words = release if release is not None else vllm_words.RELEASES.get(stack.vllm)
    if words is None:
        found.append(f"vllm {stack.vllm}: no vllm_words.Release record")
    elif words.version != stack.vllm or words.engine not in ENGINES:
        found.append(f"release record {words.version} (engine {words.engine!r}) is not vLLM {stack.vllm}'s on v0/v1")
    else:
        for key in ("dtypes", "kv_cache_dtypes", "quantizations", "families"):
            values = getattr(words, key)
            if not values or not all(isinstance(value, str) and value for value in values):
                found.append(f"release {key}: {values!r} is not a non-empty list of words")
        if not words.block_sizes or not all(isinstance(size, int) and size > 0 for size in words.block_sizes):
            found.append(f"release block_sizes: {words.block_sizes!r} is not a list of positive sizes")
        for flag, instead in dict(words.removed_flags).items():
            if not str(flag).startswith("--") or not str(instead or "").strip():
                found.append(f"release removed_flags: {flag!r} needs a --flag and what to do instead")
    return found


def hash_lock_of(constraints: str) -> str:
    """The hash lock beside a constraints file (roles/python_env/files): constraints-vllm-X.txt's
    constraints-vllm-X.hashes.txt, as lock_wheels writes it."""
    return re.sub(r"\.txt$", "", constraints) + ".hashes.txt"
