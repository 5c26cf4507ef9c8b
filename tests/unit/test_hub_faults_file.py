"""The test hub's --faults-file: written, its faults apply; removed, none is left (a test makes the hub
honest again by deleting the file, as molecule/serving's hostile-hub plays do)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.hub import server


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
