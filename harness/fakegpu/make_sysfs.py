#!/usr/bin/env python3
"""TEST-ONLY: write a fake sysfs PCI view of one box under a root directory.

Simulates the GPU edge only: from a fixture's sysfs.json (tests/fixtures/nvidia-smi/<box>/) it writes

    <root>/sys/bus/pci/devices/<bdf>/{vendor,device,class,subsystem_vendor,subsystem_device,
        current_link_width,max_link_width,current_link_speed,max_link_speed,numa_node,resource}
    <root>/sys/module/nvidia/version        (unless --no-module, or the JSON has none)

so that code reading sysfs under a configurable root (gpu_parsers.scan_sysfs) sees that box. Real
sysfs holds symlinks into /sys/devices; plain directories are enough for readers of these files.

usage: make_sysfs.py SYSFS_JSON ROOT [--no-module | --module-version VERSION]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ATTRIBUTES = (
    "vendor",
    "device",
    "class",
    "subsystem_vendor",
    "subsystem_device",
    "current_link_width",
    "max_link_width",
    "current_link_speed",
    "max_link_speed",
    "numa_node",
)


def write_sysfs(spec: dict[str, Any], root: Path, module_version: str | None = None, module: bool = True) -> None:
    """Write the tree described by ``spec`` (a parsed sysfs.json) under ``root``.

    ``module_version`` overrides the JSON's nvidia_module_version (e.g. to fake a driver/library
    mismatch); ``module=False`` leaves the nvidia module out (driver not loaded).
    """
    devices = spec.get("devices")
    if not isinstance(devices, dict):
        raise ValueError("sysfs.json has no 'devices' object; see tests/fixtures/nvidia-smi/README.md")
    base = root / "sys" / "bus" / "pci" / "devices"
    for bdf, attrs in devices.items():
        dev = base / bdf
        dev.mkdir(parents=True, exist_ok=True)
        for name in ATTRIBUTES:
            value = attrs.get(name)
            if value is not None:
                (dev / name).write_text(f"{value}\n")
        resource = attrs.get("resource")
        if resource is not None:
            (dev / "resource").write_text("".join(f"{line}\n" for line in resource))
    version = module_version if module_version is not None else spec.get("nvidia_module_version")
    if module and version:
        mod = root / "sys" / "module" / "nvidia"
        mod.mkdir(parents=True, exist_ok=True)
        (mod / "version").write_text(f"{version}\n")


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sysfs_json", type=Path, help="a fixture's sysfs.json")
    parser.add_argument("root", type=Path, help="directory that plays /")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--no-module", action="store_true", help="do not write sys/module/nvidia/version")
    group.add_argument("--module-version", help="write this loaded-module version instead of the JSON's")
    args = parser.parse_args(argv)
    try:
        spec = json.loads(args.sysfs_json.read_text())
    except (OSError, ValueError) as exc:
        print(f"make_sysfs.py: cannot read {args.sysfs_json}: {exc}", file=sys.stderr)
        return 2
    write_sysfs(spec, args.root, module_version=args.module_version, module=not args.no_module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
