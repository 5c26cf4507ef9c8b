#!/usr/bin/env python3
"""Run molecule scenarios, a few at a time, and report each one's result and duration.

Each scenario's full output goes to .cache/molecule-logs/<scenario>.log; a failed scenario's tail is
printed. Exit status is non-zero when any scenario fails or when none ran. Every scenario is merged
over the one molecule base, .config/molecule/config.yml, named explicitly so that a copy of the tree
without .git (where molecule would not find it) runs the same configuration.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / ".config" / "molecule" / "config.yml"
# Scenarios that need inputs our CI machines cannot reach; without them they are reported as skipped.
REQUIRES = {
    "python_env_conda": ("GPUBOX_MINIFORGE_INSTALLER", "GPUBOX_MINIFORGE_SHA256", "GPUBOX_CONDA_CHANNEL"),
    # Ubuntu's archive (the image and the real 535 packages): .github/workflows/ubuntu.yml sets it.
    "host_ubuntu": ("GPUBOX_UBUNTU_DRIVER_PIN",),
}


@dataclass
class Result:
    scenario: str
    ok: bool
    seconds: float
    log: Path
    skipped: str = ""


def run(scenario: str, logdir: Path) -> Result:
    if not (ROOT / "molecule" / scenario / "molecule.yml").is_file():
        raise SystemExit(f"run_scenarios: no scenario molecule/{scenario}/molecule.yml")
    log = logdir / f"{scenario}.log"
    missing = [name for name in REQUIRES.get(scenario, ()) if not os.environ.get(name)]
    if missing:
        why = "needs " + ", ".join(missing) + " (not reachable from this machine)"
        print(f"[molecule] {scenario}: SKIPPED, {why}", flush=True)
        return Result(scenario, True, 0.0, log, skipped=why)
    start = time.monotonic()
    print(f"[molecule] {scenario}: started", flush=True)
    with log.open("w") as out:
        proc = subprocess.run(
            ["molecule", "--base-config", str(BASE_CONFIG), "test", "-s", scenario],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    res = Result(scenario, proc.returncode == 0, time.monotonic() - start, log)
    print(f"[molecule] {scenario}: {'passed' if res.ok else 'FAILED'} in {res.seconds:.0f} s", flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("scenarios", nargs="+")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    logdir = ROOT / ".cache" / "molecule-logs"
    logdir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda s: run(s, logdir), args.scenarios))
    for r in results:
        if not r.ok:
            lines = r.log.read_text(errors="replace").splitlines()
            print(f"\n===== {r.scenario}: last 80 lines of {r.log} =====")
            print("\n".join(lines[-80:]))
    print("\nmolecule summary:")
    for r in results:
        state = "SKIPPED" if r.skipped else "passed" if r.ok else "FAILED"
        print(f"  {r.scenario:<24} {state:<7} {r.seconds:6.0f} s {r.skipped}")
    ran = [r for r in results if not r.skipped]
    return 0 if ran and all(r.ok for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
