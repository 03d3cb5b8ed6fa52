"""A region as a file: its header (written, and checked on every read), publishing it whole by
rename, and the robust process-shared mutex it holds."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import mmap
import os
import tempfile
import time
from pathlib import Path

from sharegpu.errors import ConfigError, TenantError
from sharegpu.regions import abi, mapping

_PTHREAD_PROCESS_SHARED = 1
_PTHREAD_MUTEX_ROBUST = 1


def new_header(magic: int, size: int) -> abi.RegionHeader:
    """The header of a region of `size` bytes written now by this ABI."""
    return abi.RegionHeader(
        magic=magic,
        abi_major=abi.ABI_MAJOR,
        abi_minor=abi.ABI_MINOR,
        header_size=ctypes.sizeof(abi.RegionHeader),
        total_size=size,
        created_ns=time.time_ns(),
    )


def header_problem(
    data: bytes | mmap.mmap, magic: int, size: int, path: Path, kind: str
) -> tuple[str, bool] | None:
    """What is wrong with the region bytes `data` (which should hold a `kind` region of at least
    `size` bytes): (message, damaged), or None. `damaged` is False for a region of another ABI
    major: a newer sharegpu wrote it, which is not damage."""
    if len(data) < ctypes.sizeof(abi.RegionHeader):
        return f"{path}: truncated ({len(data)} bytes)", True
    hdr = abi.RegionHeader.from_buffer_copy(data[: ctypes.sizeof(abi.RegionHeader)])
    if hdr.magic != magic:
        return f"{path}: not a sharegpu {kind} region (bad magic {hdr.magic:#x})", True
    if hdr.abi_major != abi.ABI_MAJOR:
        return f"{path}: ABI {hdr.abi_major}.{hdr.abi_minor}, this is {abi.ABI_MAJOR}.x", False
    if hdr.total_size < size:
        return f"{path}: region is {hdr.total_size} bytes, need {size}", True
    if len(data) < size:
        return f"{path}: truncated ({len(data)} of {size} bytes)", True
    return None


def mapped_region(path: Path, magic: int, size: int, kind: str) -> mmap.mmap:
    """The region at `path`, mapped read-only (cached), its header checked."""
    view = mapping.mapped(path)
    if (problem := header_problem(view, magic, size, path, kind)) is not None:
        raise ConfigError(problem[0])
    return view


def publish_region(
    directory: Path, name: str, data: bytes | None, size: int, mode: int, *, fill: object = None
) -> None:
    """Write `name` in `directory` atomically: temp file, optional in-place init, rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as view:
            if data is not None:
                view[: len(data)] = data
            if callable(fill):
                fill(view)
            view.flush()
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.rename(tmp, directory / name)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@functools.cache
def _libc() -> ctypes.CDLL:
    # Once per process: find_library runs `ldconfig -p` (2 ms, and a fork of the agent) per call,
    # and every tenant made used to call it twice.
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def init_robust_mutex(address: int, what: str = "usage") -> None:
    """Initialise the pthread mutex at `address` as robust and process-shared (through libc):
    the usage region's and the GPU arbiter's. The shim refuses a region whose mutex lacks
    either attribute."""
    libc = _libc()
    attr = ctypes.create_string_buffer(64)  # pthread_mutexattr_t is 4 bytes on glibc; be generous
    for call, args in (
        (libc.pthread_mutexattr_init, (attr,)),
        (libc.pthread_mutexattr_setpshared, (attr, _PTHREAD_PROCESS_SHARED)),
        (libc.pthread_mutexattr_setrobust, (attr, _PTHREAD_MUTEX_ROBUST)),
        (libc.pthread_mutex_init, (ctypes.c_void_p(address), attr)),
    ):
        if rc := call(*args):
            raise TenantError(f"cannot initialise the {what} mutex: {os.strerror(rc)}")
    libc.pthread_mutexattr_destroy(attr)
