"""The one rule for an existing model store root and for each directory above it (stdlib only, a leaf).

state_checks re-exports both functions; preflight and the model store (store_layout) apply them, so nothing preflight
accepts is refused later. Each returns None when fine, else one line naming the variable and the fix.
"""

from __future__ import annotations

# An existing model store root must be a real directory owned by root and writable by no one else:
# whoever can write it can swap the live symlink the service reads.
_GROUP_OTHER_WRITE = 0o022


def store_root_problem(name: str, path: str, uid: int | None, mode: int | None, is_dir: bool) -> str | None:
    """The one rule for an existing store root (preflight and the model store alike): None when fine."""
    if not is_dir:
        return f"{name} {path} exists but is not a directory: remove it or choose another path"
    if uid != 0:
        return (
            f"{name} {path} is owned by uid {uid}, not root: another user could replace the model the service "
            f"reads. Fix: `chown root:root {path}` (gpubox never changes a directory it did not create) or choose "
            "another path"
        )
    if mode is None or mode & _GROUP_OTHER_WRITE:
        shown = "unknown" if mode is None else f"{mode & 0o7777:04o}"
        return (
            f"{name} {path} has mode {shown}, writable by group or others: another user could replace the model "
            f"the service reads. Fix: `chmod go-w {path}` (gpubox never changes a directory it did not create) or "
            "choose another path"
        )
    return None


def store_ancestor_problem(name: str, root: str, ancestor: str, uid: int | None, mode: int | None) -> str | None:
    """The rule for each existing directory above the store root: root's, and not writable by group or
    others unless sticky (like /tmp: then no other user may rename what root put there). A writable
    ancestor lets another user move the whole store aside and put their own in its place."""
    if uid != 0:
        return (
            f"{name} {root} lies under {ancestor}, owned by uid {uid}, not root: that user could swap the whole "
            f"store. Fix: `chown root:root {ancestor}` or choose a path whose every parent is root's"
        )
    if mode is None or (mode & _GROUP_OTHER_WRITE and not mode & 0o1000):
        shown = "unknown" if mode is None else f"{mode & 0o7777:04o}"
        return (
            f"{name} {root} lies under {ancestor}, mode {shown}, writable by group or others: another user could "
            f"swap the whole store. Fix: `chmod go-w {ancestor}` (or +t) or choose another path"
        )
    return None
