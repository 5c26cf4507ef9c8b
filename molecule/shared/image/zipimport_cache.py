"""TEST HARNESS ONLY (the box image of molecule/shared/image, never a real box): a compile cache for
Python modules imported from zip archives.

Every Ansible task runs its module as an AnsiballZ payload: a zip of the module and the
ansible.module_utils it needs, imported through zipimport, which compiles each module's source on every
import (a zip of sources has no __pycache__). On the test boxes that compile was about a quarter of a
task's CPU (measured: the stat module 0.37 s -> 0.23 s of box CPU), and a `make test` runs some
thirteen thousand tasks on two cores. This keeps each compiled module under /var/cache, keyed by its
source and checked against it byte for byte, so the code that runs is the code zipimport would compile.
Loaded at interpreter start by the .pth file layer.sh writes beside it.
"""

import marshal
import os
import zipimport

CACHE = "/var/cache/gpubox-zipimport"
_compile_source = zipimport._compile_source  # CPython 3.10-3.12: (pathname, source bytes) -> code


def _with_filename(code, filename):
    """The code object, and every code object nested in it, as if compiled from `filename`."""
    consts = tuple(_with_filename(c, filename) if isinstance(c, type(code)) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def cached_compile_source(pathname, source, cache=CACHE):
    import zlib  # zipimport needs it for any compressed member anyway

    entry = f"{cache}/{zlib.crc32(source):08x}-{len(source):x}"
    try:
        with open(entry, "rb") as fh:
            cached_source, code = marshal.load(fh)
        if cached_source == source:
            return _with_filename(code, pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile_source(pathname, source)
    try:
        os.makedirs(cache, mode=0o755, exist_ok=True)
        tmp = f"{entry}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            marshal.dump((source, code), fh)
        os.replace(tmp, entry)
    except OSError:  # a read-only or foreign cache: compile every time, as without it
        pass
    return code


if os.geteuid() == 0:  # only root's processes fill or read it: no user can plant code for root
    zipimport._compile_source = cached_compile_source
