"""The rules of the shared regions that are C's, called in libsgagent.so (native/agentlib).

Reaping a dead process must take the region's robust mutex and change exactly what the shims
change under it; the C library is compiled from the shim's own ``ledger.c``, ``arbregion.c``,
``arbsched.c`` and ``live.c``, so the agent frees a dead process's charges and hands on a GPU
token that a dead process held, and the agent and the CLI judge whether an entry's process lives
and whether an arbiter region is damaged, with the shim's code rather than a copy of it. The
shim itself (``libsharegpu.so``) is never loaded into the agent.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from sharegpu import native
from sharegpu.errors import ConfigError
from sharegpu.regions import abi

ERR_LEN = 256
MAX_REPORTED = 64  # reaped entries described per call (the rest are still freed)


class _UsageReaped(ctypes.Structure):
    _fields_ = (
        ("pid", ctypes.c_int32),
        ("host_pid", ctypes.c_int32),
        ("start_time", ctypes.c_uint64),
        ("mem_bytes", ctypes.c_uint64 * abi.MAX_DEVICES),
    )


class _ArbReaped(ctypes.Structure):
    _fields_ = (
        ("pid", ctypes.c_int32),
        ("held_token", ctypes.c_uint32),
        ("start_time", ctypes.c_uint64),
        ("tenant_id", ctypes.c_char * abi.TENANT_ID_LEN),
    )


class _ArbResult(ctypes.Structure):
    _fields_ = (
        ("new_holder_pid", ctypes.c_int32),
        ("recovered", ctypes.c_uint32),
        ("reaped", ctypes.c_uint32),
        ("reserved", ctypes.c_uint32),
    )


@dataclass(frozen=True)
class ReapedSlot:
    """A usage slot freed because its process died; mem_bytes per limits index."""

    pid: int
    host_pid: int
    start_time: int
    mem_bytes: tuple[int, ...]


@dataclass(frozen=True)
class UsageReap:
    slots: list[ReapedSlot]
    recovered: bool  # the mutex was EOWNERDEAD and the shim's recovery ran


@dataclass(frozen=True)
class ReapedClient:
    pid: int
    start_time: int
    tenant: str
    held_token: bool


@dataclass(frozen=True)
class ArbiterReap:
    clients: list[ReapedClient]
    new_holder_pid: int | None  # who this reap granted the token to
    recovered: bool


_lib: list[ctypes.CDLL] = []  # loaded once
_lib_lock = threading.Lock()


def _load() -> ctypes.CDLL:
    if _lib:
        return _lib[0]
    with _lib_lock:
        if not _lib:
            lib = ctypes.CDLL(str(native.agent_lib_path()))
            lib.sga_usage_reap.argtypes = (
                ctypes.c_char_p,
                ctypes.POINTER(_UsageReaped),
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int),
                ctypes.c_char_p,
            )
            lib.sga_usage_reap.restype = ctypes.c_int
            lib.sga_usage_set_overhead.argtypes = (
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_uint64,
                ctypes.c_char_p,
            )
            lib.sga_usage_set_overhead.restype = ctypes.c_int
            lib.sga_usage_swap_overhead.argtypes = (
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_uint64,
                ctypes.c_uint64,
                ctypes.c_char_p,
            )
            lib.sga_usage_swap_overhead.restype = ctypes.c_int
            lib.sga_arbiter_reap.argtypes = (
                ctypes.c_char_p,
                ctypes.POINTER(_ArbReaped),
                ctypes.c_int,
                ctypes.POINTER(_ArbResult),
                ctypes.c_char_p,
            )
            lib.sga_arbiter_reap.restype = ctypes.c_int
            lib.sga_arbiter_check.argtypes = (ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p)
            lib.sga_arbiter_check.restype = ctypes.c_int
            lib.sga_entry_alive.argtypes = (
                ctypes.c_char_p,
                ctypes.c_uint32,
                ctypes.c_uint32,
                ctypes.c_uint64,
                ctypes.c_int32,
                ctypes.c_uint64,
            )
            lib.sga_entry_alive.restype = ctypes.c_int
            lib.sga_start_time.argtypes = (ctypes.c_int32, ctypes.POINTER(ctypes.c_uint64))
            lib.sga_start_time.restype = ctypes.c_int
            _lib.append(lib)
        return _lib[0]


def _fail(err: ctypes.Array[ctypes.c_char]) -> ConfigError:
    return ConfigError(err.value.decode(errors="replace") or "libsgagent: unknown error")


def reap_usage(tenant_dir: Path) -> UsageReap:
    """Free the usage slots of the tenant's dead processes (their bytes leave the totals)."""
    lib = _load()
    out = (_UsageReaped * MAX_REPORTED)()
    recovered = ctypes.c_int(0)
    err = ctypes.create_string_buffer(ERR_LEN)
    n = lib.sga_usage_reap(
        str(tenant_dir / abi.USAGE_FILE).encode(), out, MAX_REPORTED, ctypes.byref(recovered), err
    )
    if n < 0:
        raise _fail(err)
    slots = [
        ReapedSlot(pid=r.pid, host_pid=r.host_pid, start_time=r.start_time, mem_bytes=tuple(r.mem_bytes))
        for r in out[: min(n, MAX_REPORTED)]
    ]
    return UsageReap(slots=slots, recovered=bool(recovered.value))


def set_overhead(tenant_dir: Path, index: int, overhead_bytes: int) -> None:
    """Store the agent-measured overhead of limits index `index` (counted against the cap)."""
    lib = _load()
    err = ctypes.create_string_buffer(ERR_LEN)
    if lib.sga_usage_set_overhead(str(tenant_dir / abi.USAGE_FILE).encode(), index, overhead_bytes, err) < 0:
        raise _fail(err)


def swap_overhead(tenant_dir: Path, index: int, expected: int, overhead_bytes: int) -> bool:
    """Store the overhead of limits index `index` only if it still is `expected` (read before
    measuring); False when a shim moved it meanwhile (a context's memory admitted or given back
    at its creation or end: the measurement may not include it), and nothing was written."""
    lib = _load()
    err = ctypes.create_string_buffer(ERR_LEN)
    rc: int = lib.sga_usage_swap_overhead(
        str(tenant_dir / abi.USAGE_FILE).encode(), index, expected, overhead_bytes, err
    )
    if rc < 0:
        raise _fail(err)
    return rc == 1


def reap_arbiter(path: Path) -> ArbiterReap:
    """Free the arbiter entries of dead processes; a token one held goes to the best waiter."""
    lib = _load()
    out = (_ArbReaped * MAX_REPORTED)()
    res = _ArbResult()
    err = ctypes.create_string_buffer(ERR_LEN)
    n = lib.sga_arbiter_reap(str(path).encode(), out, MAX_REPORTED, ctypes.byref(res), err)
    if n < 0:
        raise _fail(err)
    clients = [
        ReapedClient(
            pid=r.pid,
            start_time=r.start_time,
            tenant=r.tenant_id.decode(errors="replace"),
            held_token=bool(r.held_token),
        )
        for r in out[: min(n, MAX_REPORTED)]
    ]
    return ArbiterReap(
        clients=clients,
        new_holder_pid=res.new_holder_pid or None,
        recovered=bool(res.recovered),
    )


def entry_alive(region: Path, index: int, *, flags: int, pidns: int, pid: int, start: int) -> bool:
    """The shim's liveness test of entry `index` of `region` (shim/live.c sg_entry_alive): its
    liveness lock if the entry has one, else pid + start time, judged only from the writer's pid
    namespace (elsewhere: alive, never guessed dead)."""
    if not 0 < pid < 2**31:
        return False
    return bool(_load().sga_entry_alive(os.fsencode(region), index, flags, pidns, pid, start))


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot), or None if the pid is gone, only a
    zombie, or not ours to read."""
    if not 0 < pid < 2**31:
        return None
    out = ctypes.c_uint64()
    return int(out.value) if _load().sga_start_time(pid, ctypes.byref(out)) == 0 else None


# sga_arbiter_check's answers (sgagent.h)
_ARB_USABLE, _ARB_MISSING, _ARB_OTHER_ABI, _ARB_DAMAGED = range(4)


def arbiter_problem(path: Path, uuid: str) -> tuple[str, bool] | None:
    """Why a shim would refuse the arbiter region at `path` for GPU `uuid` (its own rule,
    shim/arbregion.c, plus a region marked broken): (message, damaged), or None when it is
    usable or missing. A region of another ABI major is refused but not damaged (a newer
    sharegpu wrote it)."""
    err = ctypes.create_string_buffer(ERR_LEN)
    rc = _load().sga_arbiter_check(os.fsencode(path), abi.uuid_to_bytes(uuid), err)
    if rc in (_ARB_USABLE, _ARB_MISSING):
        return None
    return err.value.decode(errors="replace"), rc != _ARB_OTHER_ABI
