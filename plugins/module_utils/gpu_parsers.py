"""Pure parsers for the GPU edge of a gpubox: nvidia-smi output, the PCI view in sysfs, and the
decision whether NCCL may use peer-to-peer.

Shared by the Ansible module ``gpubox.gpubox.gpu_facts`` and the boot-time ``gpubox-gpu-check``
script: the module ``gpubox.gpubox.gpu_check_library`` writes this very file, as shipped to the box
inside its own payload, to /usr/local/lib/gpubox/gpu_parsers.py. So it imports nothing but the
standard library and runs on Python >= 3.9 (the box's, Ubuntu 22.04: 3.10).

Formats (seen on a real 2x H200 box with driver 580.159.04, see tests/fixtures/nvidia-smi/h200x2):

- ``nvidia-smi -q -x``: XML, root ``nvidia_smi_log``, one ``gpu`` element per GPU in index order.
- ``nvidia-smi topo -m`` / ``topo -p2p r``: tab-separated matrices whose header line is wrapped in
  ANSI underline codes even when piped; a legend follows after a blank line. Rows and columns may
  include NICs (``NIC0``), which are ignored here.
- ``--query-gpu=... --format=csv[,noheader][,nounits]``: ``", "``-separated values.

Every parse failure raises :class:`GpuParseError`, whose message names the command whose output
could not be read and why.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NVIDIA_VENDOR_ID = 0x10DE
# PCI class codes (base class << 8 | subclass) of a GPU: VGA controller, 3D controller.
GPU_PCI_CLASSES = (0x0300, 0x0302)

CMD_QUERY_XML = "nvidia-smi -q -x"
CMD_TOPO_M = "nvidia-smi topo -m"
CMD_TOPO_P2P_R = "nvidia-smi topo -p2p r"
CMD_QUERY_CSV = "nvidia-smi --query-gpu=... --format=csv"

QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "persistence_mode",
    "pcie.link.gen.current",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "driver_version",
)

# Link types in `topo -m` and statuses in `topo -p2p`; see the legend the tool prints.
TOPO_LINK_RE = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV\d+)$")
P2P_STATUS_RE = re.compile(r"^(X|OK|CNS|GNS|TNS|NS|U|DR)$")

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_LABEL_RE = re.compile(r"^GPU(\d+)$")
# PCIe transfer rate per lane (GT/s) -> generation.
_PCIE_GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_IORESOURCE_MEM = 0x200
_MIB = 1024 * 1024


class GpuParseError(ValueError):
    """The output of a GPU command (or a sysfs file) could not be understood."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"could not parse the output of `{source}`: {reason}")
        self.source = source
        self.reason = reason


@dataclass
class GpuInfo:
    """One GPU as seen by nvidia-smi or, with fewer fields known, by sysfs."""

    index: int
    pci_bus_id: str
    name: str | None = None
    uuid: str | None = None
    pci_device_id: str | None = None
    memory_total_mib: int | None = None
    persistence_mode: bool | None = None
    pcie_link_gen_current: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width_current: int | None = None
    pcie_link_width_max: int | None = None
    bar1_total_mib: int | None = None


@dataclass
class QueryXml:
    """What ``nvidia-smi -q -x`` says about the driver and the GPUs."""

    driver_version: str | None
    cuda_version: str | None
    gpus: list[GpuInfo]


@dataclass
class SysfsGpu:
    """One NVIDIA GPU function found under <root>/sys/bus/pci/devices."""

    bdf: str
    device_id: str
    pci_class: str
    current_link_width: int | None
    max_link_width: int | None
    current_link_gen: int | None
    max_link_gen: int | None
    bar_sizes_mib: dict[str, int] = field(default_factory=dict)

    @property
    def bar1_total_mib(self) -> int | None:
        """Size of what nvidia-smi calls BAR1: the second memory BAR in register order.

        With a 32-bit BAR0 it sits at index 1 (RTX 3090); with a 64-bit BAR0 at index 2 (H200).
        """
        sizes = [self.bar_sizes_mib[index] for index in sorted(self.bar_sizes_mib, key=int)]
        return sizes[1] if len(sizes) > 1 else None


@dataclass
class P2PDecision:
    """Whether NCCL may use peer-to-peer, per unordered GPU pair and overall, with the reasons."""

    p2p_enabled: bool
    pairs: dict[str, str]
    reasons: list[str]


# --------------------------------------------------------------------------- small helpers


def strip_ansi(text: str) -> str:
    """Remove ANSI escape sequences (nvidia-smi underlines matrix headers even when piped)."""
    return _ANSI_RE.sub("", text)


def pair_key(i: int, j: int) -> str:
    """Key of an unordered GPU pair: "i-j" with i < j."""
    lo, hi = sorted((i, j))
    return f"{lo}-{hi}"


def normalize_bus_id(bus_id: str) -> str:
    """Write a PCI address the way nvidia-smi does: 8-digit domain, upper-case hex
    ("0000:1a:00.0" -> "00000000:1A:00.0")."""
    match = re.match(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$", bus_id.strip())
    if not match:
        raise GpuParseError("PCI bus id", f"{bus_id!r} is not of the form DOMAIN:BUS:DEVICE.FUNCTION")
    domain, bus, dev, fn = match.groups()
    return f"{int(domain, 16):08X}:{bus.upper()}:{dev.upper()}.{fn}"


def _int_or_none(value: str | None, unit_suffix: str = "") -> int | None:
    """Parse "143771 MiB" / "16x" / "5" to int; None for N/A, [N/A], empty or missing."""
    if value is None:
        return None
    text = value.strip()
    if unit_suffix and text.endswith(unit_suffix):
        text = text[: -len(unit_suffix)].strip()
    if text in ("", "N/A", "[N/A]", "[Not Supported]", "Unknown Error"):
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _bool_from_enabled(value: str | None) -> bool | None:
    if value is None:
        return None
    text = value.strip()
    if text == "Enabled":
        return True
    if text == "Disabled":
        return False
    return None


def _text(elem: ET.Element, path: str) -> str | None:
    found = elem.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text in ("", "N/A") else text


def pcie_gen_from_speed(speed: str | None) -> int | None:
    """Map a sysfs link speed ("16.0 GT/s PCIe", "8 GT/s") to a PCIe generation."""
    if not speed:
        return None
    match = re.match(r"^\s*([0-9.]+)\s*GT/s", speed)
    if not match:
        return None
    return _PCIE_GEN_BY_GTS.get(float(match.group(1)))


# --------------------------------------------------------------------------- nvidia-smi -q -x


def parse_query_xml(text: str) -> QueryXml:
    """Parse ``nvidia-smi -q -x``. GPUs are indexed in document order, which is nvidia-smi's."""
    if not text or not text.strip():
        raise GpuParseError(CMD_QUERY_XML, "the output is empty")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise GpuParseError(CMD_QUERY_XML, f"not well-formed XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise GpuParseError(CMD_QUERY_XML, f"root element is <{root.tag}>, expected <nvidia_smi_log>")
    gpu_elems = root.findall("gpu")
    attached = _int_or_none(_text(root, "attached_gpus"))
    if attached is not None and attached != len(gpu_elems):
        raise GpuParseError(
            CMD_QUERY_XML, f"attached_gpus says {attached} but {len(gpu_elems)} <gpu> elements are present"
        )
    gpus: list[GpuInfo] = []
    for index, elem in enumerate(gpu_elems):
        bus_id = _text(elem, "pci/pci_bus_id") or elem.get("id")
        if not bus_id:
            raise GpuParseError(CMD_QUERY_XML, f"<gpu> number {index} has neither pci_bus_id nor an id attribute")
        device_id = _text(elem, "pci/pci_device_id")  # e.g. 233510DE: device 0x2335, vendor 0x10DE
        gpus.append(
            GpuInfo(
                index=index,
                pci_bus_id=normalize_bus_id(bus_id),
                name=_text(elem, "product_name"),
                uuid=_text(elem, "uuid"),
                pci_device_id=f"0x{device_id[:4].lower()}" if device_id and len(device_id) == 8 else None,
                memory_total_mib=_int_or_none(_text(elem, "fb_memory_usage/total"), "MiB"),
                persistence_mode=_bool_from_enabled(_text(elem, "persistence_mode")),
                pcie_link_gen_current=_int_or_none(_text(elem, "pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
                pcie_link_gen_max=_int_or_none(_text(elem, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
                pcie_link_width_current=_int_or_none(
                    _text(elem, "pci/pci_gpu_link_info/link_widths/current_link_width"), "x"
                ),
                pcie_link_width_max=_int_or_none(_text(elem, "pci/pci_gpu_link_info/link_widths/max_link_width"), "x"),
                bar1_total_mib=_int_or_none(_text(elem, "bar1_memory_usage/total"), "MiB"),
            )
        )
    return QueryXml(driver_version=_text(root, "driver_version"), cuda_version=_text(root, "cuda_version"), gpus=gpus)


# --------------------------------------------------------------------------- topo matrices


def _parse_gpu_matrix(text: str, source: str, value_re: re.Pattern[str]) -> dict[str, str]:
    """Read the GPU x GPU part of a `topo` matrix into {"i-j": value} with i < j."""
    if not text or not text.strip():
        raise GpuParseError(source, "the output is empty")
    lines = strip_ansi(text).splitlines()
    header_at = next((n for n, line in enumerate(lines) if "GPU0" in line.split("\t")), None)
    if header_at is None:
        header_at = next((n for n, line in enumerate(lines) if "GPU0" in line), None)
    if header_at is None:
        raise GpuParseError(source, "no header line naming GPU0 was found")
    header = [cell.strip() for cell in lines[header_at].split("\t")]
    columns = {n: int(m.group(1)) for n, cell in enumerate(header) if (m := _GPU_LABEL_RE.match(cell))}
    if not columns:
        raise GpuParseError(source, f"the header line has no GPU columns: {lines[header_at]!r}")
    rows: dict[int, list[str]] = {}
    for line in lines[header_at + 1 :]:
        if not line.strip() or line.strip().startswith("Legend"):
            break  # the matrix ends at the blank line before the legend
        cells = [cell.strip() for cell in line.split("\t")]
        label = _GPU_LABEL_RE.match(cells[0])
        if label:  # NIC rows and anything else are not ours
            rows[int(label.group(1))] = cells
    gpu_ids = sorted(columns.values())
    if sorted(rows) != gpu_ids:
        raise GpuParseError(source, f"the header names GPUs {gpu_ids} but rows were found for {sorted(rows)}")
    result: dict[str, str] = {}
    for row_gpu, cells in rows.items():
        for col, col_gpu in columns.items():
            if col >= len(cells):
                raise GpuParseError(source, f"row GPU{row_gpu} has no cell for GPU{col_gpu}")
            value = cells[col]
            if not value_re.match(value):
                raise GpuParseError(source, f"unexpected value {value!r} at GPU{row_gpu}/GPU{col_gpu}")
            if row_gpu == col_gpu:
                if value != "X":
                    raise GpuParseError(source, f"diagonal GPU{row_gpu}/GPU{col_gpu} is {value!r}, expected 'X'")
            elif row_gpu < col_gpu:
                result[pair_key(row_gpu, col_gpu)] = value
    return result


def parse_topo_matrix(text: str) -> dict[str, str]:
    """Parse ``nvidia-smi topo -m`` into {"0-1": "NV18", ...} for GPU pairs only."""
    return _parse_gpu_matrix(text, CMD_TOPO_M, TOPO_LINK_RE)


def parse_topo_p2p(text: str) -> dict[str, str]:
    """Parse ``nvidia-smi topo -p2p r`` into {"0-1": "OK", ...} (OK, CNS, GNS, TNS, NS, U, DR)."""
    return _parse_gpu_matrix(text, CMD_TOPO_P2P_R, P2P_STATUS_RE)


# --------------------------------------------------------------------------- --query-gpu csv


def parse_query_csv(text: str, fields: Sequence[str] = QUERY_FIELDS) -> list[dict[str, str | None]]:
    """Parse ``--query-gpu=<fields> --format=csv[,noheader][,nounits]`` into one dict per GPU.

    A header line, if present, must name the same fields (units in brackets are allowed). Values are
    strings with units removed; "[N/A]" becomes None.
    """
    if text is None or not text.strip():
        raise GpuParseError(CMD_QUERY_CSV, "the output is empty")
    lines = [line for line in text.splitlines() if line.strip()]
    first = [cell.strip() for cell in lines[0].split(",")]
    if [re.sub(r"\s*\[.*\]$", "", cell) for cell in first] == list(fields):
        lines = lines[1:]
    rows: list[dict[str, str | None]] = []
    for number, line in enumerate(lines, start=1):
        cells = [cell.strip() for cell in line.split(", ")]
        if len(cells) != len(fields):
            raise GpuParseError(
                CMD_QUERY_CSV, f"line {number} has {len(cells)} values for {len(fields)} fields: {line!r}"
            )
        row: dict[str, str | None] = {}
        for name, cell in zip(fields, cells):
            if cell in ("[N/A]", "N/A", "[Not Supported]"):
                row[name] = None
            else:
                row[name] = re.sub(r"\s+(MiB|MHz|W|%)$", "", cell)
        rows.append(row)
    return rows


def gpus_from_csv(rows: Sequence[Mapping[str, str | None]]) -> list[GpuInfo]:
    """Turn rows of :func:`parse_query_csv` (default fields) into GpuInfo records."""
    gpus = []
    for row in rows:
        index = _int_or_none(row.get("index"))
        bus_id = row.get("pci.bus_id")
        if index is None or not bus_id:
            raise GpuParseError(CMD_QUERY_CSV, f"a row lacks index or pci.bus_id: {dict(row)}")
        gpus.append(
            GpuInfo(
                index=index,
                pci_bus_id=normalize_bus_id(bus_id),
                name=row.get("name"),
                uuid=row.get("uuid"),
                memory_total_mib=_int_or_none(row.get("memory.total"), "MiB"),
                persistence_mode=_bool_from_enabled(row.get("persistence_mode")),
                pcie_link_gen_current=_int_or_none(row.get("pcie.link.gen.current")),
                pcie_link_width_current=_int_or_none(row.get("pcie.link.width.current")),
                pcie_link_width_max=_int_or_none(row.get("pcie.link.width.max")),
            )
        )
    return gpus


# --------------------------------------------------------------------------- sysfs


def _read_attr(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def parse_resource(text: str, source: str = "resource") -> dict[str, int]:
    """Sizes in MiB of the non-empty memory BARs (indices 0-5) in a sysfs ``resource`` file."""
    sizes: dict[str, int] = {}
    for number, line in enumerate(text.splitlines()):
        if number > 5:  # 6 is the expansion ROM, later lines are bridge/SR-IOV windows
            break
        parts = line.split()
        if len(parts) != 3:
            raise GpuParseError(source, f"line {number} is {line!r}, expected 'start end flags'")
        try:
            start, end, flags = (int(part, 16) for part in parts)
        except ValueError:
            raise GpuParseError(source, f"line {number} is {line!r}, expected three hex numbers") from None
        if end > start and flags & _IORESOURCE_MEM:
            sizes[str(number)] = (end - start + 1) // _MIB
    return sizes


def scan_sysfs(root: str | Path = "/") -> list[SysfsGpu]:
    """Find NVIDIA GPUs (vendor 0x10de, class 0x0300xx or 0x0302xx) under <root>/sys/bus/pci/devices,
    in PCI address order (nvidia-smi's default order)."""
    devices_dir = Path(root) / "sys" / "bus" / "pci" / "devices"
    if not devices_dir.is_dir():
        return []
    found = []
    for dev in sorted(devices_dir.iterdir(), key=lambda p: p.name):
        vendor = _read_attr(dev / "vendor")
        pci_class = _read_attr(dev / "class")
        if vendor is None or pci_class is None:
            continue
        try:
            if int(vendor, 16) != NVIDIA_VENDOR_ID or int(pci_class, 16) >> 8 not in GPU_PCI_CLASSES:
                continue
        except ValueError:
            raise GpuParseError(f"sysfs {dev}", f"vendor {vendor!r} or class {pci_class!r} is not hex") from None
        resource = _read_attr(dev / "resource")
        found.append(
            SysfsGpu(
                bdf=dev.name,
                device_id=_read_attr(dev / "device") or "",
                pci_class=pci_class,
                current_link_width=_int_or_none(_read_attr(dev / "current_link_width")),
                max_link_width=_int_or_none(_read_attr(dev / "max_link_width")),
                current_link_gen=pcie_gen_from_speed(_read_attr(dev / "current_link_speed")),
                max_link_gen=pcie_gen_from_speed(_read_attr(dev / "max_link_speed")),
                bar_sizes_mib=parse_resource(resource, f"sysfs {dev / 'resource'}") if resource else {},
            )
        )
    return found


def gpus_from_sysfs(devices: Sequence[SysfsGpu]) -> list[GpuInfo]:
    """GpuInfo records from a sysfs scan: no name, uuid, memory or persistence are known there."""
    return [
        GpuInfo(
            index=index,
            pci_bus_id=normalize_bus_id(dev.bdf),
            name=f"PCI 10de:{dev.device_id[2:]}" if dev.device_id.startswith("0x") else None,
            pci_device_id=dev.device_id or None,
            pcie_link_gen_current=dev.current_link_gen,
            pcie_link_gen_max=dev.max_link_gen,
            pcie_link_width_current=dev.current_link_width,
            pcie_link_width_max=dev.max_link_width,
            bar1_total_mib=dev.bar1_total_mib,
        )
        for index, dev in enumerate(devices)
    ]


def loaded_module_version(root: str | Path = "/") -> str | None:
    """Version of the loaded nvidia kernel module (<root>/sys/module/nvidia/version), None if absent."""
    return _read_attr(Path(root) / "sys" / "module" / "nvidia" / "version") or None


# --------------------------------------------------------------------------- facts


def gpu_facts(
    *,
    query_xml: str | None = None,
    topo_m: str | None = None,
    topo_p2p_r: str | None = None,
    query_csv: str | None = None,
    sysfs_root: str | Path = "/",
    nvidia_smi_error: str | None = None,
) -> dict[str, Any]:
    """Assemble the ``gpubox_gpu`` fact.

    With ``query_xml`` the source is nvidia-smi (the csv, when given, must agree on the GPUs and
    fills gaps); without it the PCI view under ``sysfs_root`` is used. ``links`` and ``p2p_read``
    come from the topo outputs ({} when not given).
    """
    driver_version: str | None = None
    cuda_version: str | None = None
    if query_xml is not None:
        source = "nvidia-smi"
        parsed = parse_query_xml(query_xml)
        driver_version, cuda_version, gpus = parsed.driver_version, parsed.cuda_version, parsed.gpus
        if query_csv is not None:
            gpus = _merge_csv(gpus, gpus_from_csv(parse_query_csv(query_csv)))
    else:
        source = "sysfs"
        gpus = gpus_from_sysfs(scan_sysfs(sysfs_root))
    links = parse_topo_matrix(topo_m) if topo_m is not None else {}
    p2p_read = parse_topo_p2p(topo_p2p_r) if topo_p2p_r is not None else {}
    return {
        "source": source,
        "driver_version": driver_version,
        "cuda_version": cuda_version,
        "count": len(gpus),
        "gpus": [asdict(gpu) for gpu in gpus],
        "links": links,
        "p2p_read": p2p_read,
        "loaded_module_version": loaded_module_version(sysfs_root),
        "nvidia_smi_error": nvidia_smi_error,
    }


def _merge_csv(xml_gpus: list[GpuInfo], csv_gpus: list[GpuInfo]) -> list[GpuInfo]:
    by_bus = {gpu.pci_bus_id: gpu for gpu in csv_gpus}
    if set(by_bus) != {gpu.pci_bus_id for gpu in xml_gpus}:
        raise GpuParseError(
            CMD_QUERY_CSV,
            f"its GPUs {sorted(by_bus)} differ from those of `{CMD_QUERY_XML}` "
            f"{sorted(gpu.pci_bus_id for gpu in xml_gpus)}",
        )
    merged = []
    for gpu in xml_gpus:
        row = by_bus[gpu.pci_bus_id]
        values = asdict(gpu)
        for key, value in asdict(row).items():
            if values.get(key) is None:
                values[key] = value
        values["index"] = row.index  # the csv states the index; the XML only implies it by order
        merged.append(GpuInfo(**values))
    return sorted(merged, key=lambda gpu: gpu.index)


# --------------------------------------------------------------------------- P2P decision


def _pair_of(key: str) -> tuple[int, int]:
    match = re.match(r"^(\d+)-(\d+)$", key)
    if not match:
        raise ValueError(f"GPU pair key {key!r} is not of the form 'i-j'")
    return int(match.group(1)), int(match.group(2))


def p2p_decision(p2p_read: Mapping[str, str], probe_verdict: Mapping[str, str] | None) -> P2PDecision:
    """Decide per GPU pair whether P2P is usable.

    ``p2p_read`` is the driver's matrix ({"0-1": "OK"}); ``probe_verdict`` the value-checked probe's
    result per ordered pair ({"0-1": "OK", "1-0": "MISMATCH"}), or None when no probe ran. For a pair
    the probe covered, the probe wins (both directions must be "OK"); otherwise the matrix decides.
    """
    matrix = {pair_key(*_pair_of(key)): value for key, value in p2p_read.items()}
    probe: dict[str, list[str]] = {}
    for key, value in (probe_verdict or {}).items():
        i, j = _pair_of(key)
        if i != j:
            probe.setdefault(pair_key(i, j), []).append(f"{i}-{j}: {value}")
    pairs: dict[str, str] = {}
    reasons: list[str] = []
    for key in sorted(set(matrix) | set(probe), key=_pair_of):
        if key in probe:
            bad = [item for item in probe[key] if not item.endswith(": OK")]
            pairs[key] = "OK" if not bad else "FAILED"
            if bad:
                reasons.append(f"probe {', '.join(bad)}")
        else:
            value = matrix[key]
            pairs[key] = "OK" if value == "OK" else "FAILED"
            if value != "OK":
                reasons.append(f"driver p2p matrix {key}: {value}")
    return P2PDecision(p2p_enabled=all(v == "OK" for v in pairs.values()), pairs=pairs, reasons=reasons)


def nccl_env_for(p2p_read: Mapping[str, str], probe_verdict: Mapping[str, str] | None) -> dict[str, str]:
    """NCCL environment for this box: {"NCCL_P2P_DISABLE": "1"} when any GPU pair cannot use P2P
    (see :func:`p2p_decision`), {} when all pairs can or there is only one GPU."""
    return {} if p2p_decision(p2p_read, probe_verdict).p2p_enabled else {"NCCL_P2P_DISABLE": "1"}


# --------------------------------------------------------------------------- probe output


@dataclass
class ProbeResult:
    """Outcome of running gpubox-p2p-probe.

    status: "passed" (every pair with peer access verified), "failed" (a pair MISMATCH/ERROR, a
    timeout, or a crash: P2P must not be trusted), "unavailable" (it could not run: no CUDA device,
    e.g. in a container; the driver matrix decides) or "absent" (no probe binary).
    pairs: per ordered pair, as the probe reported it (or TIMEOUT/CRASHED for all known pairs).
    """

    status: str
    pairs: dict[str, str]
    detail: str

    @property
    def verdict(self) -> dict[str, str] | None:
        """The per-pair verdict for :func:`nccl_env_for`: None unless the probe ran."""
        return self.pairs if self.status in ("passed", "failed") else None


def parse_probe_output(
    stdout: str, returncode: int | None, *, timed_out: bool = False, gpu_count: int = 0
) -> ProbeResult:
    """Interpret the probe's JSON line and exit status (0 passed, 1 failed, 2 could not run)."""
    import json  # local: keeps the module's import surface small for the boot script

    all_pairs = [f"{i}-{j}" for i in range(gpu_count) for j in range(gpu_count) if i != j]
    if timed_out:
        return ProbeResult("failed", {key: "TIMEOUT" for key in all_pairs}, "the probe did not finish in time")
    data: Any = None
    for line in reversed((stdout or "").splitlines()):
        if line.strip().startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                data = None
            break
    if returncode == 2 and isinstance(data, dict) and data.get("error"):
        return ProbeResult("unavailable", {}, str(data["error"]))
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), dict):
        return ProbeResult(
            "failed",
            {key: "CRASHED" for key in all_pairs},
            f"the probe exited with status {returncode} without its JSON result",
        )
    pairs = {str(key): str(value) for key, value in data["pairs"].items()}
    bad = {key: value for key, value in pairs.items() if value not in ("OK", "NO_PEER_ACCESS")}
    if returncode == 0 and not bad:
        return ProbeResult("passed", pairs, f"{len(pairs)} ordered pairs checked on {data.get('devices')} GPUs")
    detail = ", ".join(f"{key}: {value}" for key, value in sorted(bad.items())) or f"exit status {returncode}"
    return ProbeResult("failed", pairs, detail)
