"""Read shared-memory regions through cached read-only mappings.

The agent reads every tenant's usage region several times a second. A usage region is about
280 KB (256 process slots), almost all of it empty; reading the whole file and copying it into
ctypes costs ~0.3 ms per tenant, which with 50 tenants was most of the agent's CPU. A mapping is
made once per file and kept while the file keeps its inode (creation publishes a new inode by
rename; resizes write in place), so a read is one stat() and a copy of the bytes wanted.

Regions are never truncated once published, so a mapping stays valid even after the file is
removed; removed files are dropped from the cache the next time they are asked for.
"""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

from sharegpu.errors import ConfigError

_MAX_CACHED = 4096
_lock = threading.Lock()
_maps: dict[str, tuple[tuple[int, int], mmap.mmap]] = {}


def mapped(path: Path) -> mmap.mmap:
    """A read-only mapping of the whole file at `path` (cached while its inode is the same)."""
    key = str(path)
    try:
        st = os.stat(key)
    except OSError as err:
        forget(path)
        raise ConfigError(f"{path}: {err.strerror}") from err
    ident = (st.st_dev, st.st_ino)
    with _lock:
        hit = _maps.get(key)
        if hit is not None and hit[0] == ident and len(hit[1]) == st.st_size:
            return hit[1]
    if st.st_size == 0:
        raise ConfigError(f"{path}: truncated (0 bytes)")
    try:
        fd = os.open(key, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror}") from err
    try:
        view = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot map: {err}") from err
    finally:
        os.close(fd)
    with _lock:
        old = _maps.pop(key, None)
        if len(_maps) >= _MAX_CACHED:
            _maps.clear()  # rare: a node with thousands of regions gone by; mappings close on GC
        _maps[key] = (ident, view)
    del old  # unmapped when the last reader lets go of it (never closed under a reader)
    return view


def forget(path: Path) -> None:
    with _lock:
        _maps.pop(str(path), None)
