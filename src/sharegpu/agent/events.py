"""Events: what the agent noticed or decided, one record each (audit findings, reaping, QoS).

Every periodic loop returns a list of these from its `tick()`; the daemon stores them in SQLite
and serves them through the API, so an operator can see why something happened.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

Severity = Literal["info", "warning", "error"]

# The kinds an operator can filter on.  Keep this list and docs/agent.md in step.
EventKind = Literal[
    "agent.started",
    "agent.stopped",
    "agent.store_restored",  # the agent's database was removed or replaced under it: written again
    "agent.cpu_latency",  # the CPU wake-up latency request held or withdrawn (while: online)
    "gpu.added",
    "gpu.removed",
    "tenant.created",
    "tenant.resized",
    "tenant.deleted",
    "tenant.recovered",
    "tenant.reaped",  # its supervisor / process group / container is gone
    "process.reaped",  # a dead process's charges and arbiter entries were released
    "process.lock_holder_killed",  # stopped while holding a region's lock: killed (stalls.py)
    "gpu.arbiter_rebuilt",  # a GPU's arbiter region was damaged: moved aside, made anew
    "gpu.token_stall_reclaimed",  # waiters took the token from a holder stopped past its quantum
    "reconcile.overhead",  # the overhead written for a tenant changed noticeably
    "audit.untracked",  # a GPU process that belongs to no tenant
    "audit.bypass",  # a tenant using more than its cap (NVML) beyond the tolerance
    "audit.compute_uncharged",  # NVML sees an arbitrated tenant run well past its charges
    "audit.killed",  # with --enforce kill: an offending process was killed
    "qos.decision",  # the QoS loop changed (or held) an arbiter knob
    "arbiter.tuned",  # the agent set a GPU's arbiter region to its configured settings (tuning.py)
    "shim.upgraded",
    "cdi.written",  # the node's CDI spec changed (sharegpu.runtime.cdi.keeper)
    "cdi.failed",  # the CDI spec could not be built or written; the last good one stays
    "cdi.tenant_left_out",  # a damaged tenant (files unreadable) left out of the written spec
    "cdi.restored",  # the spec was changed or removed by another writer and written again
]


class Event(BaseModel):
    """One event.  `id` is assigned by the store; `data` carries the figures behind it."""

    id: int | None = None
    time: float = Field(default_factory=time.time, description="Unix time, seconds")
    kind: EventKind
    severity: Severity = "info"
    tenant: str | None = None
    gpu: str | None = Field(default=None, description="GPU UUID, NVML form (GPU-...)")
    pid: int | None = None
    message: str
    data: dict[str, Any] = Field(default_factory=dict)


class Loop(Protocol):
    """A periodic job of the agent (reaper, reconciler, audit, QoS).

    `tick()` is synchronous and quick (well under `interval_s`); the daemon calls it from a
    worker thread every `interval_s` seconds and stores the events it returns.  A tick that
    raises is logged and retried at the next interval; it never stops the agent."""

    name: str
    interval_s: float

    def tick(self) -> list[Event]: ...
