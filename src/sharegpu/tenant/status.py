"""A tenant as operators and reapers see it: its meta.json, its limits and usage, its processes."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sharegpu.cgroup import container_of_process
from sharegpu.errors import ConfigError
from sharegpu.regions import abi
from sharegpu.tenant.processes import slot_alive, slot_host_pid, supervisor_gone
from sharegpu.tenant.records import DeviceUsage, ProcessUsage, TenantStatus
from sharegpu.tenant.regions import read_limits, read_usage

_meta_cache: dict[str, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def read_meta(path: Path) -> dict[str, Any]:
    """The tenant's meta.json ({} when missing or unreadable: it is for humans and reapers).

    The agent asks for every tenant's several times a second; a parsed copy is kept while the
    file keeps its inode, size and mtime (it is only ever replaced by rename).  Callers get their
    own top-level copy: they may set keys, not change nested values in place."""
    name = str(path / "meta.json")
    try:
        st = os.stat(name)
    except OSError:
        _meta_cache.pop(name, None)
        return {}
    ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _meta_cache.get(name)
    if hit is not None and hit[0] == ident:
        return dict(hit[1])
    with contextlib.suppress(OSError, ValueError):
        with open(name, encoding="utf-8") as f:
            meta = json.load(f)
        if isinstance(meta, dict):
            if len(_meta_cache) > 4096:
                _meta_cache.clear()
            _meta_cache[name] = (ident, meta)
            return dict(meta)
    return {}


def tenant_status(path: Path) -> TenantStatus:
    meta = read_meta(path)
    try:
        limits = read_limits(path)
        usage = read_usage(path)
    except ConfigError as err:
        return TenantStatus(id=path.name, path=path, devices=[], processes=[], meta=meta, error=str(err))
    uuids = [abi.bytes_to_uuid(bytes(d.uuid)) for d in limits.devices[: limits.device_count]]
    processes = []
    live_bytes = [0] * limits.device_count
    # The slot's own index, not its place among the occupied ones: its liveness lock is there.
    for index, proc in zip(usage.slots, usage.procs, strict=True):
        alive = slot_alive(path, index, proc)
        # A process's spare (charged, not allocated: ledger.c) is free memory, not its use.
        allocated = [
            max(0, proc.dev[i].mem_bytes - proc.dev[i].spare_bytes) for i in range(limits.device_count)
        ]
        per_dev = {uuids[i]: allocated[i] for i in range(limits.device_count) if allocated[i]}
        if alive:
            for i in range(limits.device_count):
                live_bytes[i] += allocated[i]
        here = slot_host_pid(proc) if alive else None
        processes.append(
            ProcessUsage(
                pid=proc.pid,
                host_pid=here or 0,
                alive=alive,
                container=container_of_process(here, int(proc.start_time)) if here else None,
                mem_bytes=per_dev,
                oom_events=sum(proc.dev[i].oom_events for i in range(limits.device_count)),
            )
        )
    devices = [
        DeviceUsage(
            uuid=uuids[i],
            mem_cap_bytes=limits.devices[i].mem_cap_bytes,
            # Dead processes still in the ledger are not using memory: show live usage only.
            mem_used_bytes=live_bytes[i],
            overhead_bytes=usage.devices[i].overhead_bytes,
            mem_peak_bytes=usage.devices[i].mem_peak_bytes,
            oom_events=usage.devices[i].oom_events,
        )
        for i in range(limits.device_count)
    ]
    return TenantStatus(
        id=limits.tenant_id.decode(), path=path, devices=devices, processes=processes, meta=meta
    )


def is_stale(status: TenantStatus) -> bool:
    """A tenant whose supervisor died and that has no live process left (nobody will remove it)."""
    if status.error is not None or not supervisor_gone(status.meta):
        return False
    return not any(p.alive for p in status.processes)


SHRUNK_KEY = "shrunk_from_bytes"


def shrunk_from(meta: Mapping[str, Any]) -> dict[str, int]:
    """GPU UUID -> the cap a tenant had before its memory was shrunk (sharegpu.tenant.lifecycle notes it)."""
    value = meta.get(SHRUNK_KEY)
    if not isinstance(value, dict):
        return {}
    return {str(k): int(v) for k, v in value.items() if isinstance(v, int)}
