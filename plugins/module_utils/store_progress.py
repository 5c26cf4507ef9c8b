"""The model store's progress file: what the poll loop (model_store_progress) reads while a download runs.

Best effort by design: a progress file that cannot be written never fails a run. Runs on the
managed host (Python >= 3.10).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ansible_collections.gpubox.gpubox.plugins.module_utils.model_manifest import RemoteFile
from ansible_collections.gpubox.gpubox.plugins.module_utils.store_layout import (
    FILE_MODE,
    human_bytes,
    staged_bytes,
    write_file_atomic,
)


@dataclass
class Progress:
    state: str = "running"  # running | done | failed
    phase: str = "starting"
    bytes_done: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_total: int = 0
    write_error: str = ""  # why the progress file could not be written last time (it is not fatal)

    def message(self) -> str:
        if self.bytes_total:
            pct = 100.0 * self.bytes_done / self.bytes_total
            return (
                f"{self.phase}: {human_bytes(self.bytes_done)} of {human_bytes(self.bytes_total)} "
                f"({pct:.0f}%), {self.files_done}/{self.files_total} files"
            )
        return self.phase

    def as_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "phase": self.phase,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "files_done": self.files_done,
            "files_total": self.files_total,
            "message": self.message(),
            "updated": round(time.time(), 1),
            # Who writes this file: the poll loop (model_store_progress) ends when that process is gone.
            "pid": os.getpid(),
            "pid_start": process_start(os.getpid()),
        }


def process_start(pid: int) -> str:
    """The start time of pid in clock ticks since boot (field 22 of /proc/PID/stat): with the pid it
    names one process, even after the pid is reused. Empty when unknown."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return data.rsplit(")", 1)[-1].split()[19] if ")" in data else ""


def write_progress(path: Path | None, progress: Progress) -> None:
    """Best effort: a progress file that cannot be written (full or read-only disk) never fails the
    run; the reason is kept, and the poll loop also ends when the writing process is gone."""
    if path is None:
        return
    try:
        write_file_atomic(path, json.dumps(progress.as_dict()) + "\n", FILE_MODE)
        progress.write_error = ""
    except OSError as exc:
        progress.write_error = f"{path}: {exc.strerror or exc}"
        with contextlib.suppress(OSError):
            path.with_name(f".{path.name}.tmp-{os.getpid()}").unlink()


def staging_progress(staging: Path, files: Iterable[RemoteFile]) -> tuple[int, int]:
    """(bytes on disk, complete files) for the listed files in staging."""
    files = list(files)
    done = staged_bytes(staging, files)
    complete = 0
    for f in files:
        with contextlib.suppress(OSError):
            complete += (staging / f.path).stat().st_size == f.size
    return done, complete
