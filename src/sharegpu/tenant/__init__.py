"""Tenant directories: the files the shim reads its limits from and writes its usage to.

Layout under the runtime directory (docs/architecture.md)::

    <runtime>/tenants/<id>/limits     struct sg_limits, mode 0444, never written by the tenant
    <runtime>/tenants/<id>/usage      struct sg_usage, written by every shim of the tenant
    <runtime>/tenants/<id>/meta.json  who made the tenant and for what command (for humans)
    <runtime>/tenants/<id>/gpus       symlink to <runtime>/gpus: the per-GPU arbiter regions
                                      (a container runtime mounts <runtime>/gpus/<uuid> there)

Each file is published by writing a temporary file in the same directory and renaming it, so a
reader never sees half a file. The usage region's robust, process-shared mutex is initialised
here through libc (``pthread_mutex_init``) before the rename.

A resize rewrites the limits file *in place* under its seqlock (generation odd while writing,
+2 when done), never by rename: a container's read-only bind mount pins the inode, and the shim
keeps the file mapped, so only an in-place write reaches them (``resize_tenant``).

Admission (under the node lock, so concurrent creators and resizers see each other): compute
guarantees (cap and burst) on a GPU sum to at most 100%; and, when the caller passes the cards'
memory (``memory_totals``), memory caps on a GPU sum to at most the card's memory.

The package, one job per module, each importing only modules listed before it (pyproject.toml's
import contract checks it):

* ``paths``: the runtime directory, its ``tenants`` and ``gpus`` folders, finding a tenant;
* ``records``: DeviceLimit and the status records;
* ``regions``: the limits and usage files, written and read (structures: sharegpu.regions.abi);
* ``processes``: the ledger's processes and the supervisor, alive or not;
* ``status``: a tenant as operators and reapers see it;
* ``admission``: what a GPU can still honour, and the node's overcommit rule;
* ``lifecycle``: create, resize, remove and collect, under the node lock.
"""

from __future__ import annotations

from sharegpu.tenant.admission import ADMISSION_FILE, overcommit_allowed, write_admission_policy
from sharegpu.tenant.lifecycle import (
    collect_stale,
    create_tenant,
    directory_lock,
    node_lock,
    remove_tenant,
    resize_tenant,
)
from sharegpu.tenant.paths import (
    GPUS_DIR,
    RUNTIME_ENV,
    gpus_dir,
    iter_tenants,
    runtime_dir,
    tenant_path,
    tenants_dir,
)
from sharegpu.tenant.processes import (
    process_start_time,
    process_uid,
    slot_alive,
    slot_host_pid,
    supervisor_gone,
    supervisor_identity,
)
from sharegpu.tenant.records import DeviceLimit, DeviceUsage, ProcessUsage, TenantStatus
from sharegpu.tenant.regions import (
    UsageSnapshot,
    device_limit_of,
    limits_bytes,
    read_device_limits,
    read_limits,
    read_usage,
    write_limits_in_place,
)
from sharegpu.tenant.status import SHRUNK_KEY, is_stale, read_meta, shrunk_from, tenant_status

__all__ = [
    "ADMISSION_FILE",
    "GPUS_DIR",
    "RUNTIME_ENV",
    "SHRUNK_KEY",
    "DeviceLimit",
    "DeviceUsage",
    "ProcessUsage",
    "TenantStatus",
    "UsageSnapshot",
    "collect_stale",
    "create_tenant",
    "device_limit_of",
    "directory_lock",
    "gpus_dir",
    "is_stale",
    "iter_tenants",
    "limits_bytes",
    "node_lock",
    "overcommit_allowed",
    "process_start_time",
    "process_uid",
    "read_device_limits",
    "read_limits",
    "read_meta",
    "read_usage",
    "remove_tenant",
    "resize_tenant",
    "runtime_dir",
    "shrunk_from",
    "slot_alive",
    "slot_host_pid",
    "supervisor_gone",
    "supervisor_identity",
    "tenant_path",
    "tenant_status",
    "tenants_dir",
    "write_admission_policy",
    "write_limits_in_place",
]
