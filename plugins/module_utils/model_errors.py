"""The model store's failures: one base class, and OSErrors turned into messages that name the fix.

Shared by the store's parts (hub_listing, store_layout, model_client, model_publish) so that each
trust boundary lives in its own file and all of them fail the same way. Runs on the managed host.
"""

from __future__ import annotations

import errno

from ansible_collections.gpubox.gpubox.plugins.module_utils.model_manifest import FileProblem


class ModelStoreError(Exception):
    """A failure the caller should report as-is: every message names the input and the fix."""


class ListingError(ModelStoreError):
    """A hub listing (or a field of it) that cannot be trusted or used."""


class DiskSpaceError(ModelStoreError):
    pass


class IntegrityError(ModelStoreError):
    def __init__(self, message: str, problems: list[FileProblem]) -> None:
        super().__init__(message)
        self.problems = problems


_OS_FIXES = {
    errno.ENOSPC: "free space on that file system or point gpubox_model_root at a larger one",
    errno.EDQUOT: "raise the disk quota there or point gpubox_model_root at another file system",
    errno.EROFS: "the file system is read-only: remount it read-write or point gpubox_model_root elsewhere",
    errno.EACCES: "check the ownership and mode of that path (the store runs as root, the client as "
    "model_store_download_user) and any mandatory access control",
    errno.EPERM: "check the ownership, attributes (chattr) and mount options of that path",
    errno.EIO: "the disk reported an I/O error: check it (dmesg, smartctl) before re-running",
}


def os_error(exc: OSError, doing: str) -> ModelStoreError:
    """An OSError as a failure that names the path, the cause and what to do."""
    where = exc.filename if exc.filename is not None else "?"
    if exc.filename2 is not None:
        where = f"{where} -> {exc.filename2}"
    name = errno.errorcode.get(exc.errno or 0, "error")
    fix = _OS_FIXES.get(exc.errno or 0, "fix the cause and re-run")
    return ModelStoreError(
        f"{doing} failed at {where}: {exc.strerror or exc} ({name}). {fix}. The live model is unchanged; "
        "a re-run resumes from what was downloaded."
    )
