"""Preflight for a gpubox: refuse, before any change, what cannot work (pure Python, stdlib only).

``preflight(host, config)`` compares what a box IS (``host``: facts gathered read-only) with what its
inventory SAYS (``config``: the ``gpubox_*`` topology variables plus the preflight settings) and plans
the GPU memory with :func:`capacity_planner.plan` from the same variables the roles deploy. It never
raises on bad input: every problem comes back as one line in ``errors`` (the box cannot work) or
``warnings`` (it works, worse), and every line names the variable to change and how.

host keys (all optional; a missing one is reported, not raised):
  distribution, distribution_version   Ansible's facts ("Ubuntu", "22.04")
  memtotal_mb                          Ansible's ansible_memtotal_mb (MiB)
  gpu                                  the ``gpubox_gpu`` fact (plugins/module_utils/gpu_parsers.py)
  disk_free_bytes, disk_mount          free bytes of the filesystem holding gpubox_model_root, its mount
  model_bytes_present                  bytes already in the model's directory there (0 when absent)
  model_root_stat                      "UID MODE TYPE" of an existing gpubox_model_root (stat -L), or "absent"
  model_root_problems                  what the gpubox.gpubox.model_root module found above the root (a list
                                       of messages: store_layout.root_path_problems, the model store's walk)
  secure_boot                          bool, what nvidia_driver's validate.yml recorded

Every host field preflight reads has one type (:class:`HostFacts`, and gpu_parsers.GpuInfo for each GPU of
the ``gpubox_gpu`` fact) and is read through one typed parser, :func:`read_host`: a value of the wrong
type (``"12288 MiB"`` where an int of MiB is due) is an error naming the fact and the field, never skipped.

config keys: the desired state, either as the gpubox.gpubox.desired_state lookup returns it (checked,
with ``errors``) or as raw gpubox_* variables (checked here by state_checks, the one validator), plus
preflight_ram_factor, preflight_disk_headroom_bytes, preflight_supported_os (["Ubuntu 22.04",
"Debian 12"]) and secure_boot_warning (the distro's note when Secure Boot needs action, or empty).
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils import (
    capacity_planner,
    gpu_parsers,
    model_catalog,
    speculative_config,
    stacks,
    state_checks,
)

GIB = 1024**3
MIB = 1024**2

# nvidia-smi totals vary by a few MiB between boards and VBIOS versions of one model.
GPU_MEMORY_TOLERANCE_MIB = 8
# Resizable BAR off leaves BAR1 at 256 MiB (docs/facts.md, "Peer-to-peer on consumer GPUs").
BAR1_SMALL_MIB = 256
DEFAULT_RAM_FACTOR = 2.0
DEFAULT_DISK_HEADROOM_BYTES = 10 * GIB
DEFAULT_SUPPORTED_OS = ("Ubuntu 22.04", "Debian 12")
PRIVILEGED_PORTS_BELOW = 1024

# PCI device ids by nvidia-smi product name, so that a box without a working driver (GPU facts from
# sysfs, where only the PCI id is known) can still be checked for the right model. Ids as in the
# fixtures' sysfs.json / q.xml pci_device_id (tests/fixtures/nvidia-smi/) and the PCI ID database.
PCI_DEVICE_IDS = {
    "NVIDIA GeForce RTX 3090": "0x2204",
    "NVIDIA GeForce RTX 4090": "0x2684",
    "NVIDIA H200": "0x2335",
}


@dataclass
class _Report:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    def row(self, check: str, found: str, ok: bool | None) -> None:
        self.rows.append((check, found, "ok" if ok else ("FAIL" if ok is False else "-")))


# --------------------------------------------------------------------------- small helpers


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _coerce(value: Any, kind: type) -> Any:
    """ "2" -> 2 and "0.9" -> 0.9 for preflight's own settings (extra vars arrive as strings)."""
    if isinstance(value, str):
        text = value.strip()
        if kind is int and re.fullmatch(r"[+-]?\d{1,19}", text):
            return int(text)
        if kind is float and re.fullmatch(r"[+-]?(\d{1,12}\.?\d{0,12}|\.\d{1,12})", text):
            return float(text)
    return value


def desired(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The checked desired state: (normalized facts + gpubox_model_dir, errors), by state_checks.

    ``config`` is either the gpubox.gpubox.desired_state lookup's result (already checked: it carries
    ``errors`` and ``gpubox_api_key_set``) or raw inventory variables, which are checked here.
    """
    if not (isinstance(config.get("errors"), list) and "gpubox_api_key_set" in config):
        config = state_checks.validate(config).public()  # the lookup's result, made here
    values = {name: config.get(name) for name in state_checks.FACTS if name not in state_checks.SECRET_FACTS}
    values["gpubox_model_dir"] = config.get("gpubox_model_dir")
    return values, [str(e) for e in config["errors"]]


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def _gpu_label(gpu: gpu_parsers.GpuInfo) -> str:
    return f"GPU {gpu.index} ({gpu.name or 'unnamed'}, slot {gpu.pci_bus_id})"


def _os_matches(entry: str, distribution: str, version: str) -> bool:
    """ "Debian 12" matches Debian 12 and 12.8; "Ubuntu 22.04" matches 22.04 only (not 22.10 or 20.04)."""
    name, _space, want = entry.strip().rpartition(" ")
    if not name or name.lower() != distribution.lower():
        return False
    want_parts, have_parts = want.split("."), version.split(".")
    return have_parts[: len(want_parts)] == want_parts


# --------------------------------------------------------------------------- the box's facts, typed


@dataclass(frozen=True)
class GpuFact:
    """The part of the ``gpubox_gpu`` fact (gpu_parsers.gpu_facts) preflight reads; each GPU is a GpuInfo."""

    source: str | None = None
    nvidia_smi_error: str | None = None
    gpus: tuple[gpu_parsers.GpuInfo, ...] = ()


@dataclass(frozen=True)
class HostFacts:
    """What preflight reads about the box (see the module docstring), each field with its one type."""

    distribution: str | None = None
    distribution_version: str | None = None
    memtotal_mb: int | None = None
    gpu: GpuFact | None = None
    disk_free_bytes: int | None = None
    disk_mount: str | None = None
    model_bytes_present: int | None = None
    draft_bytes_present: int | None = None  # the speculative draft's published files (gpubox_speculative_config)
    model_root_stat: str | None = None
    model_root_problems: tuple[str, ...] = ()
    secure_boot: bool | None = None
    # The fields whose value had the wrong type (reported once by read_host, not again as unknown).
    refused: frozenset[str] = frozenset()


# Where each host field comes from, for the fix in a refusal.
_SOURCES = {
    "gpu": "re-gather it with the gpubox.gpubox.gpu_facts module (a cached or hand-set gpubox_gpu is stale or forged)",
    "memtotal_mb": "gather the hardware facts again (setup: gather_subset hardware), not a cached or hand-set value",
    "model_root_problems": "run the gpubox.gpubox.model_root module for gpubox_model_root",
    "secure_boot": "run nvidia_driver's validate.yml (it records gpubox_driver_check.secure_boot)",
}
_DEFAULT_SOURCE = "it is measured by roles/preflight/tasks/main.yml; do not set it by hand"


def _type_words(hint: Any) -> str:
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    words = {int: "an integer", str: "a string", bool: "true or false", float: "a number"}
    named = [words.get(o, getattr(o, "__name__", str(o))) for o in options if o is not type(None)]
    return " or ".join(named) + (" (or null)" if type(None) in options else "")


def _has_type(value: Any, hint: Any) -> bool:
    """value is of the type hint (int never accepts a bool; a tuple of str accepts a list of str)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return True
        if option is bool and isinstance(value, bool):
            return True
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if option is str and isinstance(value, str):
            return True
        if typing.get_origin(option) is tuple and isinstance(value, (list, tuple)):
            element = typing.get_args(option)[0]
            return all(_has_type(item, element) for item in value)
    return False


def _read_typed(
    cls: type, data: dict[str, Any], label: str, fix_of: typing.Callable[[str], str], errors: list[str]
) -> tuple[dict[str, Any], set[str]]:
    """The fields of dataclass cls present in data, each checked against its type hint (nested facts and
    ``refused`` are the caller's); a wrong one is an error naming label.field and the fix, and is left out
    (its default). Returns (values, the names refused)."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    refused: set[str] = set()
    for f in fields(cls):
        if f.name not in data or f.name in ("refused", "gpu", "gpus"):
            continue
        value = data[f.name]
        if _has_type(value, hints[f.name]):
            values[f.name] = tuple(value) if isinstance(value, list) else value
            continue
        refused.add(f.name)
        errors.append(
            f"the box's fact {label}{f.name} is {str(value)[:80]!r} ({type(value).__name__}), not "
            f"{_type_words(hints[f.name])}: preflight refuses it rather than skip the check it feeds. "
            f"Fix: {fix_of(f.name)}"
        )
    return values, refused


def _read_gpu_fact(fact: Any, errors: list[str]) -> GpuFact | None:
    """The gpubox_gpu fact, typed (None when it has no list of GPUs: reported as missing GPU facts)."""
    if not isinstance(fact, dict) or not isinstance(fact.get("gpus"), list):
        return None

    def fix_of(_name: str) -> str:
        return _SOURCES["gpu"]

    values, _refused = _read_typed(GpuFact, fact, "gpubox_gpu.", fix_of, errors)
    gpus = []
    for n, gpu in enumerate(fact["gpus"]):
        label = f"gpubox_gpu.gpus[{n}]"
        if not isinstance(gpu, dict):
            errors.append(
                f"the box's fact {label} is {str(gpu)[:80]!r}, not a mapping of GPU fields. Fix: {fix_of('')}"
            )
            continue
        read, _refused = _read_typed(gpu_parsers.GpuInfo, gpu, label + ".", fix_of, errors)
        for name in ("index", "pci_bus_id"):  # the fields every GpuInfo has
            if name not in gpu:
                errors.append(f"the box's fact {label} has no {name}. Fix: {fix_of(name)}")
        gpus.append(gpu_parsers.GpuInfo(**{"index": n, "pci_bus_id": "?", **read}))
    return GpuFact(**values, gpus=tuple(gpus))


def read_host(host: dict[str, Any]) -> tuple[HostFacts, list[str]]:
    """The one typed parser of what preflight reads about the box: (HostFacts, errors). A field of the
    wrong type is an error naming it (never skipped) and is left unknown in the result, marked refused so
    that no check reports it a second time; an absent field is unknown (each check says what that means)."""
    errors: list[str] = []
    values, refused = _read_typed(HostFacts, host, "", lambda name: _SOURCES.get(name, _DEFAULT_SOURCE), errors)
    if host.get("gpu") is not None:
        values["gpu"] = _read_gpu_fact(host["gpu"], errors)
    return HostFacts(**values, refused=frozenset(refused)), errors


# --------------------------------------------------------------------------- checks


def _check_settings(config: dict[str, Any], report: _Report) -> tuple[float, int, list[str]]:
    factor = config.get("preflight_ram_factor", DEFAULT_RAM_FACTOR)
    factor = _coerce(factor, float)
    if not _is_number(factor) or factor <= 0:
        report.errors.append(
            f"preflight_ram_factor must be a number > 0, got {factor!r}: use 2.0 (RAM >= 2 x the weights)"
        )
        factor = DEFAULT_RAM_FACTOR
    headroom = _coerce(config.get("preflight_disk_headroom_bytes", DEFAULT_DISK_HEADROOM_BYTES), int)
    if not _is_int(headroom) or headroom < 0:
        report.errors.append(
            f"preflight_disk_headroom_bytes must be an integer >= 0, got {headroom!r}: "
            f"use e.g. {DEFAULT_DISK_HEADROOM_BYTES} (10 GiB)"
        )
        headroom = DEFAULT_DISK_HEADROOM_BYTES
    supported = config.get("preflight_supported_os", list(DEFAULT_SUPPORTED_OS))
    if not isinstance(supported, (list, tuple)) or not all(isinstance(s, str) for s in supported):
        report.errors.append(
            f"preflight_supported_os must be a list of 'Distribution version' strings, got {supported!r}: "
            "use ['Ubuntu 22.04', 'Debian 12']"
        )
        supported = list(DEFAULT_SUPPORTED_OS)
    return float(factor), headroom, list(supported)


def _check_os(host: HostFacts, supported: list[str], report: _Report) -> None:
    distribution = host.distribution or ""
    version = host.distribution_version or ""
    found = f"{distribution or '?'} {version or '?'}"
    ok = bool(distribution and version) and any(_os_matches(s, distribution, version) for s in supported)
    report.row("OS", found, ok)
    if not ok:
        report.errors.append(
            f"the box runs {found}, which preflight_supported_os ({', '.join(supported)}) does not list: "
            "install Ubuntu 22.04 (the target) or Debian 12"
        )


def _check_port(config: dict[str, Any], report: _Report) -> None:
    port = config.get("gpubox_port")
    if _is_int(port) and port < PRIVILEGED_PORTS_BELOW:
        report.warnings.append(
            f"gpubox_port is {port} (< {PRIVILEGED_PORTS_BELOW}): vLLM runs as an unprivileged system "
            "user and cannot bind it without CAP_NET_BIND_SERVICE; use 8000 behind a proxy"
        )


def _check_gpus(host: HostFacts, config: dict[str, Any], report: _Report) -> int | None:
    """Compare the GPU facts with gpubox_gpu_name/count/memory_mib. Returns the GPUs present."""
    fact = host.gpu
    want_name = config.get("gpubox_gpu_name")
    want_count = config.get("gpubox_gpu_count")
    want_mib = config.get("gpubox_gpu_memory_mib")
    # Facts state_checks refused arrive as None (reported there); here they are not compared.
    if not _is_int(want_count) or want_count < 1:
        want_count = None
    if not _is_number(want_mib) or want_mib <= 0:
        want_mib = None
    if fact is None:
        report.row("GPUs", "no GPU facts", False)
        report.errors.append(
            "no GPU facts (gpubox_gpu) were gathered: run the gpubox.gpubox.gpu_facts module before preflight"
        )
        return None
    gpus = fact.gpus
    source = fact.source or "?"
    names = sorted({g.name for g in gpus if g.name})
    errors_before = len(report.errors)

    if want_count is not None and len(gpus) != want_count:
        report.errors.append(
            f"gpubox_gpu_count is {want_count} but {len(gpus)} NVIDIA GPU(s) are present (from {source}): "
            "reseat or power the missing card (check `lspci -d 10de:` and the BIOS), or put the host in "
            "the topology group that matches its GPUs"
        )
    if fact.nvidia_smi_error:
        report.warnings.append(
            f"nvidia-smi failed ({fact.nvidia_smi_error}); GPUs were read from sysfs. A driver/library "
            "mismatch is fixed by the reboot gate after nvidia_driver"
        )

    if isinstance(want_name, str) and want_name:
        if source == "nvidia-smi":
            wrong = [g for g in gpus if g.name != want_name]
            for gpu in wrong:
                report.errors.append(
                    f"gpubox_gpu_name is {want_name!r} but {_gpu_label(gpu)} is a different model: fix the "
                    "host's topology group (gpu_2x3090, gpu_4x4090) or the card"
                )
        else:
            want_id = PCI_DEVICE_IDS.get(want_name)
            if want_id is None:
                report.warnings.append(
                    f"gpubox_gpu_name {want_name!r} has no PCI device id in preflight's table "
                    "(plugins/module_utils/preflight_checks.py PCI_DEVICE_IDS): the GPU model is not checked "
                    "until nvidia-smi works"
                )
            else:
                for gpu in gpus:
                    got = (gpu.pci_device_id or "").lower()
                    if got != want_id:
                        report.errors.append(
                            f"gpubox_gpu_name is {want_name!r} (PCI device {want_id}) but GPU "
                            f"{gpu.index} in slot {gpu.pci_bus_id} is PCI device "
                            f"{got or 'unknown'}: fix the host's topology group or the card"
                        )

    if want_mib is not None:
        for gpu in gpus:
            have = gpu.memory_total_mib
            if have is not None and abs(have - want_mib) > GPU_MEMORY_TOLERANCE_MIB:
                report.errors.append(
                    f"gpubox_gpu_memory_mib is {want_mib} but {_gpu_label(gpu)} has {have} MiB: set it to "
                    "nvidia-smi's memory.total for this model, or fix the topology group"
                )

    report.row(
        "GPUs",
        f"{len(gpus)} x {', '.join(names) or 'unknown'} (from {source})",
        len(report.errors) == errors_before,
    )
    for gpu in gpus:
        cur, top = gpu.pcie_link_width_current, gpu.pcie_link_width_max
        if cur is not None and top is not None and cur < top:
            report.warnings.append(
                f"{_gpu_label(gpu)} runs at PCIe x{cur} of x{top}: move it to a x{top}-wired slot or check "
                "the riser (weight loading and tensor-parallel all-reduce slow down)"
            )
        bar1 = gpu.bar1_total_mib
        if bar1 is not None and 0 < bar1 <= BAR1_SMALL_MIB:
            report.warnings.append(
                f"{_gpu_label(gpu)} has a BAR1 of {bar1} MiB: Resizable BAR is off; turn on Above 4G "
                "Decoding and Resizable BAR in the BIOS"
            )
    return len(gpus)


def _check_parallel_vs_present(config: dict[str, Any], present: int | None, report: _Report) -> None:
    """tp x pp against the GPUs present (the plan checks it against gpubox_gpu_count)."""
    tp, pp = config.get("gpubox_tensor_parallel_size"), config.get("gpubox_pipeline_parallel_size", 1)
    pp = 1 if pp is None else pp
    count = config.get("gpubox_gpu_count")
    # With no GPU at all the count error says everything; tp x pp is compared when some GPUs are there.
    if not present or not (_is_int(tp) and _is_int(pp) and tp > 0 and pp > 0):
        return
    needed = tp * pp
    if needed > present and not (_is_int(count) and needed > count):
        report.errors.append(
            f"gpubox_tensor_parallel_size x gpubox_pipeline_parallel_size = {needed} GPUs but only "
            f"{present} are present: lower gpubox_tensor_parallel_size or bring the missing GPUs back"
        )


def _model_facts(facts: dict[str, Any], refused: set[str], report: _Report) -> dict[str, Any] | None:
    if facts.get("gpubox_model_id") is None or refused & {"gpubox_model_config", "gpubox_model_dtype"}:
        return None  # reported by the desired state
    try:
        # The catalog entry, or gpubox_model_config for a model the catalog does not carry.
        return model_catalog.planned_model(facts)
    except (model_catalog.UnknownModelError, ValueError) as exc:
        report.errors.append(str(exc))
        return None


def _is_about(error: str, names: set[str]) -> bool:
    head = re.split(r"[\s:(]", error, maxsplit=1)[0]
    return head in names


def _check_plan(facts: dict[str, Any], model: dict[str, Any] | None, refused: set[str], report: _Report) -> dict | None:
    gpu, serving = capacity_planner.inventory_inputs(facts)
    if model is not None and not refused:
        stack = facts.get("gpubox_stack")
        result = capacity_planner.plan(model, gpu, serving, engine=stacks.engine_of(facts), stack=stack)
        report.errors.extend(result["errors"])
        report.warnings.extend(result["warnings"])
        return result
    # With a refused fact or no model facts there is no plan to show; what the planner finds about
    # the facts that were not refused is still reported (the missing model facts are not: the
    # unknown model is already reported).
    result = capacity_planner.plan(
        model or {}, gpu, serving, engine=stacks.engine_of(facts), stack=facts.get("gpubox_stack")
    )
    model_prefix = f"{capacity_planner.var('model')}: model facts"
    report.errors.extend(
        e for e in result["errors"] if not e.startswith(model_prefix) and not _is_about(e, refused | {"None"})
    )
    return None


def _check_ram(host: HostFacts, model: dict[str, Any] | None, factor: float, report: _Report) -> None:
    memtotal = host.memtotal_mb
    if memtotal is None or memtotal <= 0:
        report.row("RAM", "unknown", False)
        if "memtotal_mb" in host.refused:
            return  # its type was refused (read_host said so)
        report.errors.append(
            f"the box's RAM is unknown (memtotal_mb {memtotal!r}): gather the hardware facts "
            "(gather_subset: hardware) before preflight"
        )
        return
    have = memtotal * MIB
    if model is None:
        report.row("RAM", _gib(have), None)
        return
    need = factor * model["weights_bytes"]
    ok = have >= need
    report.row("RAM", f"{_gib(have)} (need {_gib(need)})", ok)
    if not ok:
        report.errors.append(
            f"the box has {_gib(have)} of RAM but preflight_ram_factor ({factor:.1f}) x the model's weights "
            f"({_gib(model['weights_bytes'])}, gpubox_model_id) needs {_gib(need)}: add RAM, choose a "
            "smaller model, or lower preflight_ram_factor if you accept slow loading and swapping"
        )


def _check_disk(
    host: HostFacts, config: dict[str, Any], model: dict[str, Any] | None, headroom: int, report: _Report
) -> None:
    root = config.get("gpubox_model_root") or "?"
    free = host.disk_free_bytes
    mount = host.disk_mount or "?"
    if free is None or free < 0:
        report.row(f"disk at {root}", "unknown", False)
        if "disk_free_bytes" in host.refused:
            return  # its type was refused (read_host said so)
        report.errors.append(
            f"free space at gpubox_model_root ({root}) is unknown (disk_free_bytes {free!r}): make its parent "
            "directory readable and `df` available"
        )
        return
    if model is None:
        report.row(f"disk at {root}", f"{_gib(free)} free on {mount}", None)
        return
    present = host.model_bytes_present if host.model_bytes_present and host.model_bytes_present > 0 else 0
    draft, draft_present = _draft_bytes(config), max(0, host.draft_bytes_present or 0)
    need = max(0, model["weights_bytes"] - present) + max(0, draft - draft_present) + headroom
    ok = free >= need
    report.row(f"disk at {root}", f"{_gib(free)} free on {mount} (need {_gib(need)})", ok)
    if not ok:
        also = f" + the speculative draft's {_gib(draft)} - {_gib(draft_present)} already there" if draft else ""
        report.errors.append(
            f"gpubox_model_root ({root}, filesystem {mount}) has {_gib(free)} free but the model needs "
            f"{_gib(need)} (weights {_gib(model['weights_bytes'])} - {_gib(present)} already there{also} + "
            f"preflight_disk_headroom_bytes {_gib(headroom)}): free space, or point gpubox_model_root at a "
            "larger filesystem"
        )


def _draft_bytes(config: dict[str, Any]) -> int:
    """The weight files of gpubox_speculative_config's second checkpoint (0 without one; a draft whose facts cannot
    be read is the desired state's error)."""
    spec = config.get("gpubox_speculative_config")
    if not speculative_config.is_draft(spec):
        return 0
    try:
        facts = speculative_config.draft_facts("gpubox_speculative_config", spec["model"], spec.get("config"))
    except ValueError:
        return 0
    return int(facts["weights_bytes"])


def _check_model_root_owner(host: HostFacts, config: dict[str, Any], report: _Report) -> None:
    """An existing gpubox_model_root must be root's and writable by no one else (state_checks' rule,
    the one the model store applies too); an absent one is created by the store."""
    root, found = config.get("gpubox_model_root"), host.model_root_stat
    if not root or found in (None, "", "absent"):
        return
    parts = str(found).split(" ", 2)
    try:
        uid, mode = int(parts[0]), int(parts[1], 8)
    except (IndexError, ValueError):
        report.errors.append(f"gpubox_model_root ({root}): could not read its owner and mode ({found!r})")
        return
    problem = state_checks.store_root_problem("gpubox_model_root", root, uid, mode, parts[2:] == ["directory"])
    report.row(f"owner of {root}", f"uid {uid}, mode {mode:04o}", problem is None)
    if problem:
        report.errors.append(problem)


def _check_model_root_ancestors(host: HostFacts, config: dict[str, Any], report: _Report) -> None:
    """What the gpubox.gpubox.model_root module found on the real path above gpubox_model_root (the walk
    the model store runs, store_layout.root_path_problems): a directory or symlink another user could
    change lets that user swap the whole store."""
    if config.get("gpubox_model_root"):
        report.errors.extend(host.model_root_problems)


def _check_api_key(config: dict[str, Any], state_errors: list[str], report: _Report) -> None:
    ok = not any(e.startswith("gpubox_api_key") for e in state_errors)
    report.row("API key", "valid" if ok else "missing or invalid", ok)


def _check_secure_boot(host: HostFacts, config: dict[str, Any], report: _Report) -> None:
    secure_boot = host.secure_boot
    if secure_boot is None:
        return
    report.row("Secure Boot", "on" if secure_boot else "off", None)
    note = config.get("secure_boot_warning")
    if secure_boot is True and isinstance(note, str) and note.strip():
        report.warnings.append(note.strip())


def _check_model_lock(facts: dict[str, Any], config: dict[str, Any], report: _Report) -> None:
    """A moving revision (branch or tag) with no lock entry works, but what it serves may differ
    from box to box and rebuild to rebuild. gpubox_model_commit is the desired_state lookup's
    reading of the lock (absent when preflight is called without it)."""
    model_id, revision = facts.get("gpubox_model_id"), facts.get("gpubox_model_revision")
    if not isinstance(model_id, str) or not isinstance(revision, str) or "gpubox_model_commit" not in config:
        return
    commit = config.get("gpubox_model_commit")
    lock = config.get("gpubox_model_lock_file") or "(none: gpubox_model_lock_file is empty)"
    report.row("model commit", commit or f"{revision} (unlocked)", None)
    if not commit:
        report.warnings.append(
            f"gpubox_model_revision {revision!r} of {model_id} is a branch or tag with no entry in the model lock "
            f"{lock}: this run serves whatever commit the hub names now, so rebuilds may differ (boxes built at other "
            "times may serve other weights). Run `make lock-models` (or let this converge record it), or pin a commit."
        )


# --------------------------------------------------------------------------- table and entry point

# The planner's rows that preflight's table shows (labels and formats are the planner's).
_PLAN_KEYS = (
    "budget_gib_per_gpu",
    "weights_gib_per_gpu",
    "activation_peak_gib",
    "non_torch_gib",
    "kv_cache_gib_per_gpu",
    "kv_tokens",
    "max_concurrency",
)
_PLAN_ROWS = tuple(row for row in capacity_planner.PLAN_ROWS if row[1] in _PLAN_KEYS)


def _table(config: dict[str, Any], report: _Report, plan: dict | None) -> str:
    title = (
        f"gpubox preflight: {config.get('gpubox_model_id')} on {config.get('gpubox_gpu_count')} x "
        f"{config.get('gpubox_gpu_name')}, tp {config.get('gpubox_tensor_parallel_size')}, "
        f"max_model_len {config.get('gpubox_max_model_len')}, "
        f"max_num_seqs {config.get('gpubox_max_num_seqs')}"
    )
    lines = [title]
    if config.get("gpubox_stack") in stacks.STACKS:  # the stack, its support ends and open advisories
        lines.extend(stacks.summary_lines(config["gpubox_stack"]))
    lines.extend(f"{check:<24} {found:<58} {verdict}" for check, found, verdict in report.rows)
    if plan is not None:
        for label, key, fmt in _PLAN_ROWS:
            lines.append(f"{'plan: ' + label:<24} {fmt.format(plan[key]):<58} -")
        lines.append(f"{'plan: fits':<24} {'yes' if plan['fits'] else 'no':<58} {'ok' if plan['fits'] else 'FAIL'}")
        if plan.get("measured_start"):  # gpubox_capacity_measured_start: the box starts unplanned, said once
            lines.append(f"{'plan: measured start':<24} {plan['measured_start']} (gpubox_capacity_measured_start)")
    lines.append(f"{len(report.errors)} error(s), {len(report.warnings)} warning(s)")
    return "\n".join(lines)


def preflight(host: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """Check a box against its inventory. Returns {errors, warnings, plan, table}; never raises on input."""
    report = _Report()
    if not isinstance(host, dict) or not isinstance(config, dict):
        report.errors.append(
            f"preflight needs two mappings (host facts, inventory config), got {type(host).__name__} and "
            f"{type(config).__name__}"
        )
        return {"errors": report.errors, "warnings": [], "plan": None, "table": ""}
    factor, headroom, supported = _check_settings(config, report)
    typed, fact_errors = read_host(host)
    report.errors.extend(fact_errors)
    facts, state_errors = desired(config)
    report.errors.extend(state_errors)
    # A fact the desired state refused is not checked again under another wording.
    refused = {name for name in state_checks.FACTS if any(e.startswith(name) for e in state_errors)}
    facts = {k: (None if k in refused else v) for k, v in facts.items()}
    _check_os(typed, supported, report)
    present = _check_gpus(typed, facts, report)
    _check_parallel_vs_present(facts, present, report)
    _check_port(facts, report)
    model = _model_facts(facts, refused, report)
    plan = _check_plan(facts, model, refused, report)
    _check_ram(typed, model, factor, report)
    _check_disk(typed, facts, model, headroom, report)
    _check_model_root_owner(typed, facts, report)
    _check_model_root_ancestors(typed, facts, report)
    _check_api_key(facts, state_errors, report)
    _check_secure_boot(typed, config, report)
    _check_model_lock(facts, config, report)
    # One line per problem: the same message from two checks is reported once.
    errors = list(dict.fromkeys(report.errors))
    warnings = list(dict.fromkeys(report.warnings))
    report.errors, report.warnings = errors, warnings
    return {"errors": errors, "warnings": warnings, "plan": plan, "table": _table(facts, report, plan)}
