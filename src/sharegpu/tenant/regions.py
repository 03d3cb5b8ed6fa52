"""The limits and usage regions as files: published whole by rename, the limits rewritten in
place under their seqlock, read back with their headers checked (the structures are sharegpu.regions.abi)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sharegpu.errors import ConfigError, TenantError
from sharegpu.regions import abi
from sharegpu.regions.files import init_robust_mutex, mapped_region, new_header
from sharegpu.tenant.records import DeviceLimit

# ---------------------------------------------------------------------------------------------
# Writing regions.


def limits_bytes(tenant_id: str, devices: Sequence[DeviceLimit], generation: int = 0) -> bytes:
    if not devices:
        raise TenantError("a tenant needs at least one GPU")
    if len(devices) > abi.MAX_DEVICES:
        raise TenantError(f"a tenant can use at most {abi.MAX_DEVICES} GPUs, not {len(devices)}")
    region = abi.Limits()
    region.hdr = new_header(abi.MAGIC_LIMITS, ctypes.sizeof(abi.Limits))
    region.generation = generation
    region.tenant_id = tenant_id.encode()
    region.device_count = len(devices)
    region.incarnation = secrets.randbits(64) | 1  # nonzero: a re-created tenant is another
    for slot, dev in zip(region.devices, devices, strict=False):
        _fill_slot(slot, dev)
    return bytes(region)


def _fill_slot(slot: abi.LimitsDevice, dev: DeviceLimit) -> None:
    slot.uuid[:] = abi.uuid_to_bytes(dev.uuid)
    slot.mem_cap_bytes = dev.mem_cap_bytes
    slot.policy = dev.policy
    slot.priority = dev.priority
    slot.share_permille = dev.share_permille
    slot.ceiling_permille = dev.ceiling_permille
    slot.weight = dev.weight


def device_limit_of(slot: abi.LimitsDevice) -> DeviceLimit:
    """One device entry of a limits region as a DeviceLimit (the inverse of _fill_slot)."""
    return DeviceLimit(
        uuid=abi.bytes_to_uuid(bytes(slot.uuid)),
        mem_cap_bytes=int(slot.mem_cap_bytes),
        policy=int(slot.policy),
        priority=int(slot.priority),
        share_permille=int(slot.share_permille),
        ceiling_permille=int(slot.ceiling_permille),
        weight=int(slot.weight),
    )


def init_usage_region(view: mmap.mmap) -> None:
    region = abi.Usage.from_buffer(view)
    region.hdr = new_header(abi.MAGIC_USAGE, ctypes.sizeof(abi.Usage))
    region.slot_count = abi.MAX_PROCS
    region.device_count = abi.MAX_DEVICES
    init_robust_mutex(ctypes.addressof(region) + abi.Usage.lock.offset)
    del region  # release the buffer export before the mmap closes


def write_limits_in_place(path: Path, devices: Sequence[DeviceLimit]) -> int:
    """Rewrite the device entries of `path`/limits under the seqlock; returns the new generation.

    Writer protocol of abi.h: store generation+1 (odd), write the fields, store generation+2.
    Each store is one aligned 8-byte write and x86 keeps stores in program order, which is what
    the shim's acquire loads pair with. A generation left odd by a writer that died is first
    rounded up, so this write repairs it. Caller holds the node lock (the single writer)."""
    if not devices or len(devices) > abi.MAX_DEVICES:
        raise TenantError(f"a tenant needs 1 to {abi.MAX_DEVICES} GPUs, not {len(devices)}")
    file = path / abi.LIMITS_FILE
    _read_region(file, abi.Limits, abi.MAGIC_LIMITS)  # magic, ABI and size, before writing a byte
    try:
        mode = file.stat().st_mode & 0o777
        # The file is 0444 (the tenant must not write it): lend its owner write permission just
        # long enough to open it; an open descriptor keeps working after the mode is restored.
        os.chmod(file, mode | 0o200)
        try:
            fd = os.open(file, os.O_RDWR | os.O_CLOEXEC)
        finally:
            os.chmod(file, mode)
    except OSError as err:
        raise TenantError(f"cannot open {file} for a resize: {err.strerror}") from err
    try:
        with mmap.mmap(fd, ctypes.sizeof(abi.Limits)) as view:
            region = abi.Limits.from_buffer(view)
            gen = int(region.generation)
            gen += gen % 2
            region.generation = gen + 1
            region.device_count = len(devices)
            for i in range(abi.MAX_DEVICES):
                slot = abi.LimitsDevice()
                if i < len(devices):
                    _fill_slot(slot, devices[i])
                region.devices[i] = slot
            region.generation = gen + 2
            del region  # release the buffer export before the mmap closes
    finally:
        os.close(fd)
    return gen + 2


# ---------------------------------------------------------------------------------------------
# Reading regions.


def _mapped_region(path: Path, size: int, magic: int) -> mmap.mmap:
    kind = "limits" if magic == abi.MAGIC_LIMITS else "usage"
    return mapped_region(path, magic, size, kind)


def _read_region(path: Path, struct: type[ctypes.Structure], magic: int) -> ctypes.Structure:
    return struct.from_buffer_copy(_mapped_region(path, ctypes.sizeof(struct), magic))


def read_limits(path: Path) -> abi.Limits:
    """Read a limits file with the seqlock protocol (retry while a writer is active)."""
    for _ in range(100):
        region = _read_region(path / abi.LIMITS_FILE, abi.Limits, abi.MAGIC_LIMITS)
        assert isinstance(region, abi.Limits)
        if region.generation % 2 == 0:
            if region.device_count > abi.MAX_DEVICES:
                raise ConfigError(f"{path / abi.LIMITS_FILE}: device_count {region.device_count} too large")
            return region
        time.sleep(0.001)
    raise ConfigError(f"{path / abi.LIMITS_FILE}: a writer never finished (generation stays odd)")


def read_device_limits(path: Path) -> list[DeviceLimit]:
    """The vGPUs in `path`/limits as DeviceLimit (read under the seqlock)."""
    limits = read_limits(path)
    return [device_limit_of(d) for d in limits.devices[: limits.device_count]]


@dataclass
class UsageSnapshot:
    """A copy of a usage region: its per-device totals and its occupied process slots only (a
    region has 256 slots, nearly all empty; copying and walking them all was the agent's main
    cost)."""

    hdr: abi.RegionHeader
    slot_count: int
    device_count: int
    recoveries: int
    devices: ctypes.Array[abi.UsageDevice]
    procs: list[abi.UsageProc]  # occupied slots (pid != 0), in slot order
    slots: list[int]  # their indexes
    path: Path | None = None  # the tenant directory it was read from


_PROCS_AT = abi.Usage.procs.offset
_SLOT_SIZE = ctypes.sizeof(abi.UsageProc)
_PID_AT = abi.UsageProc.pid.offset


def _u32(view: mmap.mmap, at: int) -> int:
    return int.from_bytes(view[at : at + 4], "little")


def read_usage(path: Path) -> UsageSnapshot:
    view = _mapped_region(path / abi.USAGE_FILE, ctypes.sizeof(abi.Usage), abi.MAGIC_USAGE)
    import numpy as np  # here, not at the top: the CDI hooks import this module and never call this

    pids = np.ndarray(
        (abi.MAX_PROCS,), dtype=np.int32, buffer=view, offset=_PROCS_AT + _PID_AT, strides=(_SLOT_SIZE,)
    )
    slots = [int(i) for i in np.flatnonzero(pids)]
    procs = [abi.UsageProc.from_buffer_copy(view, _PROCS_AT + i * _SLOT_SIZE) for i in slots]
    del pids  # the array holds an export of the mapping
    return UsageSnapshot(
        hdr=abi.RegionHeader.from_buffer_copy(view),
        slot_count=_u32(view, abi.Usage.slot_count.offset),
        device_count=_u32(view, abi.Usage.device_count.offset),
        recoveries=int.from_bytes(
            view[abi.Usage.recoveries.offset : abi.Usage.recoveries.offset + 8], "little"
        ),
        devices=(abi.UsageDevice * abi.MAX_DEVICES).from_buffer_copy(view, abi.Usage.devices.offset),
        procs=[p for p in procs if p.pid != 0],  # a slot freed between the two reads
        slots=[i for i, p in zip(slots, procs, strict=True) if p.pid != 0],
        path=path,
    )
