"""NVML queries for the steps, each answer a value or why there is none.

A step's process is started with its target's environment, so `pynvml` loads the machine's
driver (real GPU) or the simulated GPU's library: the same calls read either. Calls a driver
does not have or support become "n/a: <NVML's words>", never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pynvml


@contextmanager
def session() -> Iterator[None]:
    pynvml.nvmlInit()
    try:
        yield
    finally:
        pynvml.nvmlShutdown()


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def ask(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args), or "n/a: ..." when the driver lacks or refuses it."""
    try:
        return text(fn(*args))
    except pynvml.NVMLError as err:
        return f"n/a: {err}"
    except Exception as err:  # a function this nvidia-ml-py or this library lacks, a mismatch
        return f"n/a: {type(err).__name__}: {err}"


def handle(index: int = 0) -> Any:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def memory(index: int = 0) -> tuple[int, int]:
    """(total, used) bytes of GPU `index`, as NVML outside any tenant reports them."""
    info = pynvml.nvmlDeviceGetMemoryInfo(handle(index))
    return int(info.total), int(info.used)


def process_used(index: int = 0) -> dict[int, int]:
    """{pid: bytes} of the compute processes NVML lists on GPU `index`."""
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle(index))
    return {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}


def clocks(index: int = 0) -> dict[str, float]:
    """The SM clock (MHz) and the power drawn (W) now; {} where this NVML cannot say (the
    simulated GPU)."""
    h = handle(index)
    sm = ask(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
    power = ask(pynvml.nvmlDeviceGetPowerUsage, h)
    if not isinstance(sm, int) or not isinstance(power, int):
        return {}
    return {"sm_mhz": float(sm), "power_w": power / 1000}


def settings(index: int = 0) -> dict[str, Any]:
    """The GPU's settings that a check could change (and must leave as found)."""
    h = handle(index)
    return {
        "compute_mode": ask(pynvml.nvmlDeviceGetComputeMode, h),
        "persistence_mode": ask(pynvml.nvmlDeviceGetPersistenceMode, h),
        "mig_mode": ask(pynvml.nvmlDeviceGetMigMode, h),
        "accounting_mode": ask(pynvml.nvmlDeviceGetAccountingMode, h),
        "ecc_mode": ask(pynvml.nvmlDeviceGetEccMode, h),
        "power_limit_mw": ask(pynvml.nvmlDeviceGetPowerManagementLimit, h),
        "applications_clock_sm_mhz": ask(pynvml.nvmlDeviceGetApplicationsClock, h, pynvml.NVML_CLOCK_SM),
        "applications_clock_mem_mhz": ask(pynvml.nvmlDeviceGetApplicationsClock, h, pynvml.NVML_CLOCK_MEM),
    }
