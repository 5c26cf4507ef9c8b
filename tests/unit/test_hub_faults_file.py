"""The test hub's --faults-file: written, its faults apply; removed, none is left (a test makes the hub
honest again by deleting the file, as molecule/serving's hostile-hub plays do)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "harness/hub/server.py"
spec = importlib.util.spec_from_file_location("gpubox_test_hub_server", SERVER)
server = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = server  # dataclasses look their module up there
spec.loader.exec_module(server)


def test_a_removed_faults_file_clears_the_faults_it_set(tmp_path: Path) -> None:
    path = tmp_path / "hub-faults.json"
    faults = server.Faults()
    cleared = server.Faults()
    cleared.replace({})  # what POST /_faults {} leaves
    watched = server.FaultsFile(path, faults)
    watched.refresh()
    assert faults.snapshot() == server.Faults().snapshot()  # no file yet: nothing set
    path.write_text(json.dumps({"throttle": {"model.safetensors": 400000}}))
    watched.refresh()
    assert faults.snapshot() != cleared.snapshot()
    os.unlink(path)
    watched.refresh()
    assert faults.snapshot() == cleared.snapshot()
    path.write_text(json.dumps({"listing_fields": {"*": {"Revision": "p/../../x"}}}))
    watched.refresh()
    assert faults.snapshot() != cleared.snapshot()
