#!/usr/bin/env python3
"""TEST ONLY: the day-two sequence of molecule/day2_driver, run from its side_effect playbook.

Every step is a real ansible-playbook run of the scenario's converge.yml (preflight + host layer) or
preflight.yml against the box molecule created, with the inventory molecule built; a pin change is
``-e nvidia_driver_version=...``, as a user would set it in the inventory. The moves and the runs after
each reboot use the command docs/day-two.md gives for a driver move, ``--tags driver`` (preflight, the
driver role and the reboot gate); the dry run before them, the first run after a reboot (the scenario's
idempotence check) and the last run after them are the whole host layer, so a move that leaves any other
role of it with work to do still fails a test. What each run reported
(exit status, PLAY RECAP counts) and what the box holds afterwards (read with ``podman exec``: driver
packages and versions, holds, the apt pin, the unattended-upgrades blacklist, the reboot gate's
record, the simulated loaded module) is written to --out as JSON; tests/test_day2_driver.py asserts it.

Then the driver BRANCH move (issue 33 item 6): a branch Debian 12's archive does not carry (580) is refused
by preflight before any change; 535.261.03-1 -> bookworm's nvidia-tesla-470 470.256.02-1~deb12u1 and back,
each ``--tags driver -e nvidia_driver_branch=... -e nvidia_driver_version=...``, each one apt transaction
that purges the other branch's packages, then a simulated reboot and a run that must change nothing.

SIMULATED: a container cannot reboot; simulate_reboot.yml stands in for it (the simulated sysfs shows
the module of the installed build loaded, then the reboot gate's own after-reboot record runs). Only
the GPU edge is simulated; the packages are Debian 12's real driver 535 builds and its real tesla-470 build.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.ansible_vars import play_recap

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PIN_A = "535.261.03-1"  # bookworm/non-free
PIN_B = "535.309.01-0+deb12u1"  # bookworm-security/non-free
BAD_PIN = "535.1.2-1"  # in neither suite
# bookworm/non-free, source nvidia-graphics-drivers-tesla-470: the other branch Debian 12 carries, under names
# that carry it (nvidia-tesla-470-smi, ...); the branch move purges the 535 names in the same apt transaction.
PIN_470 = "470.256.02-1~deb12u1"
BAD_BRANCH = ("580", "580.95.05-1")  # a branch Debian 12's archive does not carry
SYSFS = "/srv/gpubox-sim/root"


class Box:
    def __init__(self, name: str) -> None:
        self.name = name

    def sh(self, script: str) -> str:
        out = subprocess.run(
            ["podman", "exec", self.name, "bash", "-c", script], capture_output=True, text=True, check=False
        )
        return out.stdout

    def snapshot(self) -> dict:
        rows = self.sh(
            "dpkg-query -W -f='${binary:Package} ${Version} ${source:Package} ${db:Status-Abbrev}\\n'"
        ).splitlines()
        driver = {}
        for row in rows:
            parts = row.split()
            if len(parts) >= 4 and parts[2] == "nvidia-graphics-drivers" and parts[3] in ("ii", "hi"):
                driver[parts[0]] = parts[1]
        # every package of a driver source in ANY state dpkg still records (rc: removed, conffiles left)
        rows_by_source: dict[str, dict[str, list[str]]] = {}
        for row in rows:
            parts = row.split(maxsplit=3)
            if len(parts) >= 4 and parts[2].startswith("nvidia-graphics-drivers"):
                rows_by_source.setdefault(parts[2], {})[parts[0]] = [parts[1], parts[3].strip()]
        gate = self.sh("cat /etc/ansible/facts.d/gpubox_reboot.fact 2>/dev/null")
        return {
            "driver_packages": driver,
            "driver_sources": rows_by_source,
            "held": sorted(self.sh("apt-mark showhold").split()),
            "pref": self.sh("cat /etc/apt/preferences.d/60-gpubox-nvidia-driver.pref 2>/dev/null"),
            "uu_blacklist": self.sh("apt-config dump Unattended-Upgrade::Package-Blacklist"),
            "gate": json.loads(gate) if gate.strip() else None,
            "loaded_module": self.sh(f"cat {SYSFS}/sys/module/nvidia/version 2>/dev/null").strip(),
            "dkms_status": self.sh("dkms status 2>&1"),
            # Debian's alternatives pick the branch's libraries (/usr/lib/nvidia/current: 535, .../tesla-470)
            "nvidia_alternative": self.sh(
                "update-alternatives --query nvidia 2>/dev/null | sed -n 's/^Value: //p'"
            ).strip(),
        }


def fact_cache_dir() -> Path | None:
    cfg = os.environ.get("ANSIBLE_CONFIG")
    if not cfg:
        return None
    parser = configparser.ConfigParser()
    parser.read(cfg)
    conn = parser.get("defaults", "fact_caching_connection", fallback=None)
    return (Path(cfg).parent / conn) if conn else None


def cached_facts(host: str) -> dict:
    """The facts Ansible's jsonfile cache holds for ``host`` (a file named after it; 2.19 wraps them)."""
    directory = fact_cache_dir()
    for path in sorted(directory.glob(f"*{host}")) if directory and directory.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            return json.loads(data["__payload__"]) if "__payload__" in data else data
        except (OSError, ValueError, KeyError):
            continue
    return {}


def playbook(inventory: str, host: str, book: Path, *extra: str) -> dict:
    cmd = ["ansible-playbook", "-i", inventory, "-l", host, str(book), *extra]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    seconds = round(time.monotonic() - started)
    out = proc.stdout + proc.stderr
    counts = play_recap(out).get(host)
    print(f"day2: {' '.join(cmd[5:]) or book.name}: rc={proc.returncode} {counts} ({seconds} s)", flush=True)
    return {"cmd": cmd, "rc": proc.returncode, "recap": counts, "seconds": seconds, "output_tail": out[-6000:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inventory", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    box = Box(args.host)
    converge = HERE / "converge.yml"
    driver = ("--tags", "driver")  # docs/day-two.md: "Upgrade or downgrade the driver"
    steps: dict[str, dict] = {}

    def step(name: str, book: Path, *extra: str) -> None:
        steps[name] = playbook(args.inventory, args.host, book, *extra)
        steps[name]["box"] = box.snapshot()

    def reboot(name: str) -> None:
        step(name, HERE / "simulate_reboot.yml")

    # 1. the dry run on the converged box: nothing to change
    step("check_converged", converge, "--check", "--diff")
    # 2. a pin the archive does not offer: refused by preflight, nothing changed
    step("bad_pin", ROOT / "playbooks" / "preflight.yml", "-e", f"nvidia_driver_version={BAD_PIN}")
    # 3. reboot into the first build; the next run, the whole host layer, has nothing to do and no reason to
    #    reboot: the scenario's idempotence check (molecule.yml has no idempotence step of its own)
    reboot("reboot_into_a")
    step("after_reboot_a", converge)
    # 4. stale facts: the fact cache now holds the facts of step 3 (its reboot record: nothing pending);
    #    behind Ansible's back the box loads another build. The decision must use the live value.
    cached = cached_facts(args.host)
    steps["stale_cache_before"] = {
        "cached_reboot_record": (cached.get("ansible_local") or {}).get("gpubox_reboot"),
        "cached_kernel": cached.get("ansible_kernel"),
    }
    box.sh(
        "python3 /usr/local/libexec/gpubox-sim/make_sysfs.py --module-version 535.309.01 "
        f"/usr/share/gpubox-sim/fixtures/$(cat /etc/gpubox-sim/box)/sysfs.json {SYSFS}"
    )
    step("stale_facts", converge, *driver)
    reboot("reboot_after_stale")  # back into the installed build (A) before the pin moves
    # 5. upgrade: move the pin to B, reboot, run again
    step("upgrade", converge, *driver, "-e", f"nvidia_driver_version={PIN_B}")
    reboot("reboot_into_b")
    step("after_reboot_b", converge, *driver, "-e", f"nvidia_driver_version={PIN_B}")
    # 6. downgrade: back to A, reboot, then the whole host layer: nothing left to do anywhere
    step("downgrade", converge, *driver, "-e", f"nvidia_driver_version={PIN_A}")
    reboot("reboot_back_into_a")
    step("after_reboot_back_a", converge, "-e", f"nvidia_driver_version={PIN_A}")

    # 7. the branch move on real packages: a branch Debian 12 lacks is refused by preflight (nothing changed);
    #    then 535 -> bookworm's tesla-470 and back, each move one apt transaction, each followed by a reboot
    #    and a run that must be changed=0 with no reboot reason
    step(
        "refuse_branch",
        ROOT / "playbooks" / "preflight.yml",
        *("-e", f"nvidia_driver_branch={BAD_BRANCH[0]}", "-e", f"nvidia_driver_version={BAD_BRANCH[1]}"),
    )
    to_470 = ("-e", "nvidia_driver_branch=470", "-e", f"nvidia_driver_version={PIN_470}")
    back_535 = ("-e", "nvidia_driver_branch=535", "-e", f"nvidia_driver_version={PIN_A}")
    step("branch_470", converge, *driver, *to_470)
    reboot("reboot_into_470")
    step("after_reboot_470", converge, *driver, *to_470)
    step("branch_back_535", converge, *driver, *back_535)
    reboot("reboot_back_into_535")
    step("settled", converge, *driver, *back_535)

    record = {"pins": [PIN_A, PIN_B], "bad_pin": BAD_PIN, "pin_470": PIN_470, "bad_branch": list(BAD_BRANCH)}
    args.out.write_text(json.dumps({**record, "steps": steps}, indent=1))
    refusals = ("bad_pin", "refuse_branch")
    failed = [name for name, s in steps.items() if s.get("rc") not in (None, 0) and name not in refusals]
    if failed:
        for name in failed:
            print(f"day2: step {name} failed:\n{steps[name]['output_tail']}", file=sys.stderr)
    # The verifier judges every step; a failed run is reported here too, for the log.
    return 0


if __name__ == "__main__":
    sys.exit(main())
