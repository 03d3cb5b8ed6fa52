"""GPU discovery and per-process usage through NVML (nvidia-ml-py). The only module that
imports pynvml.

NVML is found the way the driver installs it (``libnvidia-ml.so.1`` on the library path). To use
the simulated GPU, put its directory first on ``LD_LIBRARY_PATH`` (``sharegpu simgpu env``) or
call :func:`use_library` before the first query.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pynvml

from sharegpu.errors import DeviceError
from sharegpu.spec import GpuSelector

log = logging.getLogger(__name__)
T = TypeVar("T")

_lock = threading.Lock()
_preloaded: list[ctypes.CDLL] = []  # keeps a preloaded NVML alive for the process
_said_faults: set[GpuFault] = set()  # [_lock] the faults logged last


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    utilization_pct: int
    minor: int | None = None  # of /dev/nvidia<minor>; None where NVML has none (the simulated GPU)


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int


@dataclass(frozen=True)
class GpuFault:
    """A GPU that NVML counts but cannot query: fallen off the bus (GPU is lost), outside this
    container's devices (no permission), or failing otherwise. Left out of every listing, so
    that one such GPU does not hide the others."""

    index: int
    error: str  # NVML's words
    no_permission: bool = False

    @property
    def reason(self) -> str:
        if self.no_permission:
            return f"not this process's to query ({self.error}: outside its devices?)"
        return f"NVML cannot query it ({self.error})"

    def describe(self) -> str:
        return f"GPU {self.index}: {self.reason}"


@dataclass(frozen=True)
class GpuListing:
    gpus: list[Gpu]
    faults: list[GpuFault]


def use_library(path: Path) -> None:
    """Load NVML from `path` before pynvml looks for it: dlopen of the same soname then returns
    this copy (used for the simulated GPU when the library path was not set at start-up)."""
    _preloaded.append(ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@contextmanager
def nvml() -> Iterator[None]:
    """An NVML session; errors become DeviceError with NVML's own words."""
    with _lock:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise DeviceError(f"NVML is not available: {err} (is the NVIDIA driver installed?)") from err
        try:
            yield
        except pynvml.NVMLError as err:
            raise DeviceError(f"NVML query failed: {err}") from err
        finally:
            pynvml.nvmlShutdown()


def _gpu(index: int, handle: object) -> Gpu:
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        util = int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except pynvml.NVMLError_NotSupported:
        util = 0
    try:
        minor: int | None = int(pynvml.nvmlDeviceGetMinorNumber(handle))
    except pynvml.NVMLError:  # the simulated NVML lacks the call
        minor = None
    return Gpu(
        index=index,
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        memory_total=int(mem.total),
        memory_used=int(mem.used),
        utilization_pct=util,
        minor=minor,
    )


def _each_gpu(query: Callable[[int, object], T]) -> tuple[list[T], list[GpuFault]]:
    """`query(index, handle)` of every GPU NVML counts (inside an NVML session), and the GPUs
    that failed: an NVML error of one GPU skips that GPU only. A failure of NVML as a whole
    (init, count) is still a DeviceError. A fault seen for the first time is logged."""
    found: list[T] = []
    faults: list[GpuFault] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        try:
            found.append(query(i, pynvml.nvmlDeviceGetHandleByIndex(i)))
        except pynvml.NVMLError as err:
            faults.append(GpuFault(i, str(err), isinstance(err, pynvml.NVMLError_NoPermission)))
    _say(faults)
    return found, faults


def _say(faults: list[GpuFault]) -> None:
    """Log faults once while they last (a listing runs every second in some loops); a GPU
    outside this container's devices is routine, said at debug level."""
    now = set(faults)
    for fault in now - _said_faults:
        log.log(logging.DEBUG if fault.no_permission else logging.WARNING, "%s; left out", fault.describe())
    for fault in _said_faults - now:
        log.info("GPU %d answers NVML again", fault.index)
    _said_faults.clear()
    _said_faults.update(now)


def scan_gpus() -> GpuListing:
    """The GPUs that answer NVML, and the ones it counts but cannot query."""
    with nvml():
        gpus, faults = _each_gpu(_gpu)
    return GpuListing(gpus, faults)


def list_gpus() -> list[Gpu]:
    """The GPUs that answer NVML (see scan_gpus for the ones that do not)."""
    return scan_gpus().gpus


def gpu_faults() -> list[GpuFault]:
    """The GPUs NVML counts but cannot query now (see GpuFault)."""
    return scan_gpus().faults


def nvml_library() -> Path | None:
    """The file of libnvidia-ml.so.1 this process uses (after an NVML session: the driver's, or
    the simulated GPU's), from /proc/self/maps; None when NVML cannot be loaded."""
    try:
        with nvml():
            maps = Path("/proc/self/maps").read_text()
    except (DeviceError, OSError):
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if Path(path).name.startswith("libnvidia-ml.so"):
            return Path(path).resolve()
    return None


def driver_version() -> str:
    with nvml():
        return _text(pynvml.nvmlSystemGetDriverVersion())


def _running(handle: object) -> list[GpuProcess]:
    """A GPU's compute processes and MPS clients, each pid once. Under an MPS server the driver
    lists the clients apart from the compute processes (where the server itself is): reading
    the compute list alone would miss every client, a shim-bypassing one included. A driver
    without the MPS query (NOT_SUPPORTED, or too old to have the symbol) has no clients."""
    found: dict[int, int] = {}
    lists = [pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    with contextlib.suppress(pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        lists.append(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(handle))
    for listed in lists:
        for p in listed:
            found[int(p.pid)] = max(found.get(int(p.pid), 0), int(p.usedGpuMemory or 0))
    return [GpuProcess(pid=pid, used_bytes=used) for pid, used in found.items()]


def gpu_processes(uuid: str) -> list[GpuProcess]:
    """Processes using `uuid` as NVML sees them (host pids, bytes), MPS clients included."""
    with nvml():
        return _running(pynvml.nvmlDeviceGetHandleByUUID(uuid))


def processes_by_gpu() -> dict[str, list[GpuProcess]]:
    """Every GPU's compute processes and MPS clients in one NVML session: {uuid: [(host pid,
    bytes)]}.

    `used_bytes` is what the driver charges the process on that GPU: its allocations plus its
    contexts and library workspaces (what a shim's ledger cannot see)."""
    with nvml():
        listed, _ = _each_gpu(lambda _i, handle: (_text(pynvml.nvmlDeviceGetUUID(handle)), _running(handle)))
    return dict(listed)


# NVML keeps per-process utilization samples for a short while (the driver's buffer; the
# simulated GPU: one second): GPU time is measured over at most this window.
BUSY_WINDOW_S = 1.0


@dataclass(frozen=True)
class GpuBusy:
    """One GPU over the last window, as NVML saw it."""

    card: float | None  # the share of the time the GPU ran any work (device utilization)
    by_pid: dict[int, float]  # each process's share, from its samples (host pids)


def gpu_busy(window_s: float = BUSY_WINDOW_S) -> dict[str, GpuBusy]:
    """Every GPU's busy time over the last `window_s` seconds (at most BUSY_WINDOW_S): the card's
    (NVML's device utilization, over its own sample period of 1/6 s to 1 s; None where it is
    not supported) and each process's, from NVML's per-process utilization samples. A GPU that
    reports no per-process samples, or that NVML cannot query, is left out; one with no samples
    in the window maps to an empty `by_pid`.

    The per-process figures overlap on a real GPU: a sample counts a process busy when any of
    its work ran in the sample's period, so time-sliced processes add up to more than the card
    (an H200 showed 49% and 60% for processes that did 29% and 69% of the work); the card's
    figure does not."""
    since_us = int((time.time() - min(window_s, BUSY_WINDOW_S)) * 1e6)

    def busy(_index: int, handle: object) -> tuple[str, GpuBusy] | None:
        uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        except pynvml.NVMLError_NotFound:
            samples = []
        except pynvml.NVMLError_NotSupported:
            return None
        try:
            card: float | None = min(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu), 100) / 100
        except pynvml.NVMLError:
            card = None
        # Several samples of one process (one per sampling period): their mean.
        per_pid: dict[int, list[int]] = {}
        for sample in samples:
            per_pid.setdefault(int(sample.pid), []).append(int(sample.smUtil))
        return uuid, GpuBusy(card, {pid: min(sum(v) / len(v), 100.0) / 100 for pid, v in per_pid.items()})

    with nvml():
        listed, _ = _each_gpu(busy)
    return dict(row for row in listed if row is not None)


def busy_by_pid(window_s: float = BUSY_WINDOW_S) -> dict[str, dict[int, float]]:
    """Every GPU's processes with their share of the card (0-1) over the last `window_s`
    seconds: {uuid: {host pid: ratio}} (gpu_busy without the card's figure)."""
    return {uuid: busy.by_pid for uuid, busy in gpu_busy(window_s).items()}


def select_gpus(selectors: list[GpuSelector], gpus: list[Gpu]) -> list[Gpu]:
    """Resolve --gpu selectors against the discovered GPUs; all GPUs when none are given."""
    if not gpus:
        raise DeviceError("no GPU found")
    if not selectors:
        return list(gpus)
    chosen: list[Gpu] = []
    for sel in selectors:
        if sel.index is not None:
            match = [g for g in gpus if g.index == sel.index]
        else:
            match = [g for g in gpus if sel.uuid and g.uuid.lower().startswith(sel.uuid.lower())]
        if not match:
            known = ", ".join(f"{g.index} ({g.uuid})" for g in gpus)
            raise DeviceError(f"unknown GPU {sel}: this node has {known}")
        if len(match) > 1:
            raise DeviceError(f"GPU {sel} is ambiguous: it matches {len(match)} GPUs")
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen
