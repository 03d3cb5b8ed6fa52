"""The agent API's request and response bodies (pydantic), and the views the CLI prints.

Requests take the strings the CLI takes ("4GiB", "30%", "burst") and are checked by the same
parsers (sharegpu.spec), so the API and `sharegpu run` accept the same input and give the same
errors. Views are built from `sharegpu.report.node_report`, with or without the agent, so
`sharegpu tenants -o json` has one shape either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sharegpu.agent.events import Event
from sharegpu.arbiter import ArbiterStatus
from sharegpu.cgroup import Container
from sharegpu.devices import BUSY_WINDOW_S, Gpu
from sharegpu.errors import (
    AdmissionError,
    AgentError,
    ConfigError,
    DeviceError,
    SharegpuError,
    SpecError,
    TenantBusy,
    TenantError,
    TenantExists,
    TenantNotFound,
    UnknownGpu,
)
from sharegpu.report import GpuTime, TenantReport
from sharegpu.spec import (
    MAX_WEIGHT,
    POLICIES,
    PRIORITIES,
    ComputeSpec,
    GpuSelector,
    format_size,
    parse_memory_cap,
    parse_percent,
    validate_tenant_id,
)

_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$")
MAX_LABELS = 32
# Documented in the OpenAPI schema only: the validators below give clearer errors than a pattern.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
SIZE_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?\s*[a-zA-Z]+\s*$"
PERCENT_PATTERN = r"^\s*[0-9]+\s*%?\s*$"
RESIZE_FIELDS = ("memory", "compute", "ceiling", "policy", "priority", "weight")


class _Request(BaseModel):
    # Unknown fields are refused: a typo ("memroy") must not be silently ignored.
    model_config = ConfigDict(extra="forbid", str_max_length=4096)


def _check_memory(value: str | None) -> str | None:
    if value is not None:
        try:
            parse_memory_cap(value)
        except ArithmeticError as err:  # a number too large for a float
            raise ValueError(f"invalid size {value!r}: too large") from err
    return value


def _check_percent(value: str | None, what: str) -> str | None:
    if value is not None:
        parse_percent(value, what)
    return value


def _check_choice(value: str | None, choices: tuple[str, ...], what: str) -> str | None:
    if value is not None and value.strip().lower() not in choices:
        raise ValueError(f"invalid {what} {value!r}: use one of {', '.join(choices)}")
    return value


class TenantCreate(_Request):
    """A new tenant: a memory cap on each of its GPUs and its compute settings there."""

    name: str = Field(
        description="Tenant id: 1-63 of a-z 0-9 . _ -",
        examples=["web"],
        json_schema_extra={"pattern": NAME_PATTERN},
    )
    memory: str = Field(
        description="Memory cap per GPU",
        examples=["4GiB", "512MiB"],
        json_schema_extra={"pattern": SIZE_PATTERN},
    )
    gpus: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="GPU indexes or UUIDs (a UUID prefix will do); all GPUs when empty",
        examples=[["0"]],
    )
    compute: str | None = Field(
        default=None,
        description="Share, cap or guarantee",
        examples=["30%"],
        json_schema_extra={"pattern": PERCENT_PATTERN},
    )
    policy: str | None = Field(default=None, description="share | cap | burst | native", examples=["cap"])
    ceiling: str | None = Field(
        default=None,
        description="Burst ceiling (burst only)",
        examples=["60%"],
        json_schema_extra={"pattern": PERCENT_PATTERN},
    )
    priority: str | None = Field(default=None, description="online | normal | offline")
    weight: int | None = Field(default=None, description="Tie-break weight within a class, 1-1000")
    supervisor_pid: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Remove the tenant when this process is gone"
    )
    owner: int | None = Field(
        default=None,
        ge=0,
        le=2**32 - 2,
        description="The uid the tenant's processes run as (a container's --user, a pod's runAsUser): "
        "its usage and arbiter files are made writable by it. Default: the supervisor process's "
        "user, else the agent's",
    )
    pgid: int | None = Field(
        default=None, ge=1, le=2**31 - 1, description="Remove the tenant when this process group is empty"
    )
    command: list[str] | None = Field(default=None, max_length=256, description="For humans only")
    labels: dict[str, str] = Field(
        default_factory=dict, description="e.g. namespace, pod, container", examples=[{"pod": "web-0"}]
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return validate_tenant_id(value)

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        _check_memory(value)
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[str]) -> list[str]:
        for text in value:
            GpuSelector.parse(text)
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels, not {len(value)}")
        for key, text in value.items():
            if not _LABEL_KEY.match(key):
                raise ValueError(f"invalid label name {key!r}: 1-63 of A-Z a-z 0-9 . _ / -")
            if len(text) > 253:
                raise ValueError(f"label {key!r} is longer than 253 characters")
        return value

    @model_validator(mode="after")
    def _compute(self) -> TenantCreate:
        self.compute_spec()
        return self

    @property
    def memory_bytes(self) -> int:
        return parse_memory_cap(self.memory)

    @property
    def selectors(self) -> list[GpuSelector]:
        return [GpuSelector.parse(g) for g in self.gpus]

    def compute_spec(self) -> ComputeSpec:
        return ComputeSpec.parse(self.compute, self.policy, self.ceiling, self.priority, self.weight)


class TenantResize(_Request):
    """A live resize: only the fields given change; the others keep their values."""

    memory: str | None = Field(
        default=None,
        description="New memory cap per GPU",
        examples=["2GiB"],
        json_schema_extra={"pattern": SIZE_PATTERN},
    )
    compute: str | None = Field(
        default=None, examples=["50%"], json_schema_extra={"pattern": PERCENT_PATTERN}
    )
    ceiling: str | None = Field(
        default=None, examples=["80%"], json_schema_extra={"pattern": PERCENT_PATTERN}
    )
    policy: str | None = Field(default=None, description="share | cap | burst | native")
    priority: str | None = Field(default=None, description="online | normal | offline")
    weight: int | None = Field(default=None, description="Tie-break weight within a class, 1-1000")

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        return _check_memory(value)

    @field_validator("compute")
    @classmethod
    def _compute(cls, value: str | None) -> str | None:
        return _check_percent(value, "compute share")

    @field_validator("ceiling")
    @classmethod
    def _ceiling(cls, value: str | None) -> str | None:
        return _check_percent(value, "ceiling")

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: str | None) -> str | None:
        return _check_choice(value, POLICIES, "policy")

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: str | None) -> str | None:
        return _check_choice(value, PRIORITIES, "priority")

    @field_validator("weight")
    @classmethod
    def _weight(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= MAX_WEIGHT:
            raise ValueError(f"invalid weight {value}: must be between 1 and {MAX_WEIGHT}")
        return value

    @model_validator(mode="after")
    def _something(self) -> TenantResize:
        if all(getattr(self, name) is None for name in RESIZE_FIELDS):
            raise ValueError("nothing to change: give memory, compute, ceiling, policy, priority or weight")
        return self

    @property
    def memory_bytes(self) -> int | None:
        return parse_memory_cap(self.memory) if self.memory is not None else None


# ---------------------------------------------------------------------------------------------
# Views.


class DeviceView(BaseModel):
    uuid: str
    memory_cap_bytes: int
    memory_used_bytes: int
    memory_overhead_bytes: int
    memory_peak_bytes: int
    oom_events: int = Field(description="Allocations refused at the cap")
    over_cap: bool = Field(description="Usage is above the cap (after a shrink): allocations are refused")
    policy: str
    priority: str
    compute_share_ratio: float
    compute_ceiling_ratio: float
    weight: int
    gpu_busy_ratio: float | None = Field(
        description="GPU time: the share of the card the GPU spent running the tenant's work over the "
        "last busy_window_seconds, from gpu_busy_source; the tenants of a card never sum past 1; null "
        "where nothing measured it"
    )
    gpu_busy_source: Literal["arbiter", "nvml"] | None = Field(
        default=None,
        description="arbiter: the arbiter's charges (exact; an agent measures their rate every second), "
        "for a tenant the arbiter schedules; nvml: NVML's per-process utilization (native tenants, "
        "and without an agent)",
    )
    nvml_busy_ratio: float | None = Field(
        default=None,
        description="NVML's figure of the same, kept beside as the cross-check; null where NVML does "
        "not report per-process utilization",
    )
    busy_window_seconds: float = Field(description="The window of gpu_busy_ratio")
    gpu_time_seconds: float | None = Field(
        default=None,
        description="GPU time measured by the agent (gpu_busy_ratio every second, from its source) "
        "since the agent's start; null when no agent measured it",
    )
    nvml_gpu_time_seconds: float | None = Field(
        default=None,
        description="NVML's GPU time of the tenant integrated by the agent since its start (the "
        "cross-check); null when no agent measured it",
    )
    held_seconds: float = Field(
        description="What the arbiter charged for the tenant's holds of the GPU's token: the GPU time its "
        "work used while it held it (ABI 1.6; older shims: the wall time held, drain included)"
    )
    held_ratio: float | None = Field(description="held_seconds / the tenant's age; null for native tenants")
    wait_seconds: float
    throttled_seconds: float
    preemptions: int


class ContainerView(BaseModel):
    id: str = Field(description="The container's id (64 hex digits), from its cgroup")
    runtime: str = Field(
        description="podman, docker, containerd or cri-o; empty when the cgroup does not say"
    )
    pod_uid: str = Field(description="The Kubernetes pod's UID; empty outside a pod")


class ProcessView(BaseModel):
    pid: int = Field(description="The pid in the process's own namespace (a container's, inside one)")
    host_pid: int = Field(description="The pid the agent knows it by; 0 when it cannot see it")
    alive: bool
    memory_bytes: dict[str, int]
    oom_events: int
    container: ContainerView | None = Field(default=None, description="The container it runs in, if any")


TenantState = Literal["running", "idle", "stale", "error"]


class TenantView(BaseModel):
    id: str
    path: str
    state: TenantState = Field(description="running: live processes; idle: none; stale: owner gone")
    error: str | None
    stale: bool
    over_cap: bool
    note: str | None = Field(default=None, description="What an operator should know, in one line")
    command: Any = None
    labels: dict[str, str] = Field(default_factory=dict)
    supervisor_pid: int | None = None
    created: float | None = None
    age_seconds: float
    limits_generation: int | None = None
    incarnation: int | None = Field(
        default=None, description="The limits' random id: a tenant re-created under this name is another"
    )
    managed: bool = Field(default=False, description="Known to the agent's state (else just found)")
    devices: list[DeviceView] = Field(default_factory=list)
    processes: list[ProcessView] = Field(default_factory=list)
    containers: list[ContainerView] = Field(
        default_factory=list, description="The containers its live processes run in (their cgroups)"
    )
    counters_monotonic: float | None = Field(
        default=None,
        description="The node's CLOCK_MONOTONIC, in seconds, when its arbiter counters (held, wait, "
        "throttled) were read: the rate of a counter between two views is over the difference",
    )


class TenantList(BaseModel):
    items: list[TenantView]


class EventList(BaseModel):
    items: list[Event]
    last_id: int = Field(description="Pass as `since` to get only newer events")


class ArbiterView(BaseModel):
    quantum_ns: int
    offline_inflight_max: int
    online_window_ns: int
    holder_pid: int | None
    waiting: int
    grants: int
    handovers: int
    handover_idle_ns: int = Field(description="Sum over handovers of the idle time between release and grant")
    mean_handover_idle_ns: float
    reclaims: int = Field(description="Tokens taken back from dead holders")
    recoveries: int = Field(description="Repairs of the region's lock after its owner died holding it")
    stall_reclaims: int = Field(
        description="Tokens taken back from live holders stopped past their quantum (SIGSTOP, docker pause)"
    )
    entry_waits: int = Field(description="Processes that waited for a free client entry instead of failing")
    lock_timeouts: int = Field(
        default=0,
        description="Lock attempts that gave up at the deadline (ABI 1.7; the region is then replaced)",
    )
    broken_since_ns: int = Field(
        default=0,
        description="When a lock first timed out (CLOCK_MONOTONIC); 0: healthy. Nonzero, the GPU runs "
        "unarbitrated until the agent replaces the region",
    )
    broken: bool = Field(default=False, description="broken_since_ns is nonzero")
    holdback_max_ns: int = Field(
        description="Longest offline hold-back ahead of a predicted online request; 0: off"
    )
    online_period_ns: int = Field(description="Learned period of online requests; 0: none learned")
    online_jitter_ns: int
    online_samples: int = Field(description="Consistent intervals learned since the period was last (re)set")
    holdbacks: int = Field(description="Offline launches held back ahead of a predicted online request")
    holdback_ns: int = Field(description="Sum of the planned hold-back lengths")
    holdback_misses: int = Field(description="Hold-backs whose predicted request never came")
    online_preempt: str = Field(
        description="How a higher-class request takes the card from a lower-class holder: "
        "drain, early or by-kernel (ABI 1.5)"
    )
    preempt_min_kernel_ns: int = Field(
        description="by-kernel: the holder's kernel length from which it is preempted early"
    )
    offline_quiet_ns: int = Field(
        description="No offline grant for this long after an online request; 0: off"
    )
    early_preemptions: int = Field(
        description="Grants to a higher class made before the lower-class holder drained"
    )
    quiet_windows: int = Field(description="Quiet windows started after online requests")
    online_stalls: int = Field(
        default=0,
        description="Runs of online requests off the learned beat that ended back on it: a stalled "
        "service, predicted again at once (ABI 1.8)",
    )
    online_relearns: int = Field(
        default=0, description="Changed request patterns learned from requests off the old beat (ABI 1.8)"
    )
    loans: int = Field(
        default=0,
        description="Grants that lent the card for a holder's host gap between its bursts to a waiter of "
        "its class (ABI 1.10)",
    )
    online_gap_ns: int = Field(
        default=0,
        description="Learned time from the end of an online request's work to the next request (a "
        "service that waits for each request; ABI 1.11); 0: none learned",
    )
    online_gap_samples: int = Field(default=0, description="Consistent such gaps in a row")
    handoff: str = Field(
        default="drain",
        description="How the token moves within a class at a sync that covers the holder's work: drain "
        "(after the work ends) or queued (at once, the next holder's work waiting on the GPU; ABI 1.12)",
    )
    queued_handovers: int = Field(
        default=0,
        description="Hand-overs made before the holder's work ended, the next holder's queued behind it",
    )
    gated_holds: int = Field(
        default=0, description="Holds whose first work waited on the GPU for the previous holder's work"
    )
    gates_opened: int = Field(
        default=0,
        description="Of those, gates a holder opened itself: the awaited work ran past the bound "
        "(quantum + stall), or the previous holder's event did not open",
    )
    gate_wait_ns: int = Field(default=0, description="Time first work waited at those gates (not charged)")


class GpuView(BaseModel):
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int = Field(description="As NVML reports it (every process on the card)")
    utilization_pct: int
    memory_allocated_bytes: int = Field(description="Sum of the tenants' memory caps")
    memory_tenants_used_bytes: int = Field(description="Sum of the tenants' usage and overhead")
    memory_overcommitted: bool
    compute_guaranteed_ratio: float = Field(description="Sum of cap/burst guarantees")
    compute_used_ratio: float = Field(
        description="Sum of the tenants' GPU time over the busy window (at most 1)"
    )
    tenants: list[str]
    arbiter: ArbiterView | None = None


class GpuList(BaseModel):
    items: list[GpuView]


class ErrorDetail(BaseModel):
    code: str = Field(examples=["admission_refused"])
    message: str = Field(description="One line, for humans")


class ErrorBody(BaseModel):
    error: ErrorDetail


# Each error class's HTTP status and code: the server answers with them, the client raises the
# class back. Most specific first: the first class an error is an instance of wins.
ERROR_CODES: list[tuple[type[SharegpuError], int, str]] = [
    (AdmissionError, 409, "admission_refused"),
    (SpecError, 422, "invalid_request"),
    (UnknownGpu, 422, "unknown_gpu"),
    (DeviceError, 503, "gpu_unavailable"),
    (TenantNotFound, 404, "tenant_not_found"),
    (TenantExists, 409, "tenant_exists"),
    (TenantBusy, 409, "tenant_busy"),
    (ConfigError, 409, "tenant_unreadable"),
    (TenantError, 500, "tenant_error"),
    (AgentError, 500, "agent_error"),
    (SharegpuError, 500, "error"),
]


class LoopHealth(BaseModel):
    interval_s: float
    ticks: int
    errors: int
    last_tick: float | None
    last_error: str | None
    cpu_seconds: float | None = Field(
        default=None, description="CPU time its ticks have taken since the agent started (periodic loops)"
    )


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    pid: int
    uptime_seconds: float
    runtime_dir: str
    allow_overcommit: bool
    enforce: str
    tenants: int
    gpus: int
    loops: dict[str, LoopHealth]


class VersionInfo(BaseModel):
    version: str
    api: str
    abi: str


# ---------------------------------------------------------------------------------------------
# Building the views.


def _state(report: TenantReport) -> TenantState:
    if report.error is not None:
        return "error"
    if report.stale:
        return "stale"
    return "running" if report.live_processes else "idle"


def tenant_view(
    report: TenantReport,
    meta: dict[str, Any] | None = None,
    *,
    generation: int | None = None,
    managed: bool = False,
    gpu_time: Mapping[str, GpuTime] | None = None,
    busy_window_s: float = BUSY_WINDOW_S,
) -> TenantView:
    """The API's and the CLI's view of one tenant (`meta`: its meta.json or the agent's record;
    `gpu_time`: what the agent's meter measured, per GPU uuid)."""
    meta = meta or {}
    devices = []
    notes = []
    for d in report.devices:
        measured = (gpu_time or {}).get(d.uuid)
        used = d.mem_used_bytes + d.overhead_bytes
        over = used > d.mem_cap_bytes
        if over:
            notes.append(
                f"over its cap on {d.uuid} ({format_size(used)} used, cap {format_size(d.mem_cap_bytes)}): "
                "new allocations are refused until usage falls under the cap"
            )
        devices.append(
            DeviceView(
                uuid=d.uuid,
                memory_cap_bytes=d.mem_cap_bytes,
                memory_used_bytes=d.mem_used_bytes,
                memory_overhead_bytes=d.overhead_bytes,
                memory_peak_bytes=d.mem_peak_bytes,
                oom_events=d.oom_events,
                over_cap=over,
                policy=d.policy,
                priority=d.priority,
                compute_share_ratio=d.share_permille / 1000,
                compute_ceiling_ratio=d.ceiling_permille / 1000,
                weight=d.weight,
                gpu_busy_ratio=None if d.busy_ratio is None else round(d.busy_ratio, 4),
                gpu_busy_source=d.busy_source,  # type: ignore[arg-type]
                nvml_busy_ratio=None if d.nvml_ratio is None else round(d.nvml_ratio, 4),
                busy_window_seconds=busy_window_s,
                gpu_time_seconds=None
                if gpu_time is None
                else round(measured.seconds if measured else 0.0, 4),
                nvml_gpu_time_seconds=None
                if gpu_time is None
                else round(measured.nvml_seconds if measured else 0.0, 4),
                held_seconds=d.held_ns / 1e9,
                held_ratio=d.held_ratio,
                wait_seconds=d.wait_ns / 1e9,
                throttled_seconds=d.throttled_ns / 1e9,
                preemptions=d.preemptions,
            )
        )
    supervisor = meta.get("supervisor")
    labels = meta.get("labels")
    created = meta.get("created")
    return TenantView(
        id=report.id,
        path=str(report.path),
        state=_state(report),
        error=report.error,
        stale=report.stale,
        over_cap=any(d.over_cap for d in devices),
        note="; ".join(notes) or None,
        command=report.command if report.command is not None else meta.get("command"),
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        supervisor_pid=int(supervisor["pid"])
        if isinstance(supervisor, dict) and "pid" in supervisor
        else None,
        created=float(created) if isinstance(created, int | float) else None,
        age_seconds=round(report.age_s, 3),
        limits_generation=generation,
        incarnation=report.incarnation or None,
        managed=managed,
        devices=devices,
        counters_monotonic=report.counters_at,
        processes=[
            ProcessView(
                pid=p.pid,
                host_pid=p.host_pid,
                alive=p.alive,
                memory_bytes=p.mem_bytes,
                oom_events=p.oom_events,
                container=_container_view(p.container),
            )
            for p in report.processes
        ],
        containers=[
            ContainerView(id=c.id, runtime=c.runtime, pod_uid=c.pod_uid)
            for c in sorted({p.container for p in report.processes if p.alive and p.container}, key=str)
        ],
    )


def _container_view(container: Container | None) -> ContainerView | None:
    if container is None:
        return None
    return ContainerView(id=container.id, runtime=container.runtime, pod_uid=container.pod_uid)


def arbiter_view(status: ArbiterStatus) -> ArbiterView:
    return ArbiterView.model_validate(status, from_attributes=True)


def gpu_views(
    gpus: list[Gpu], tenants: list[TenantView], arbiters: dict[str, ArbiterStatus] | None = None
) -> list[GpuView]:
    """Each GPU with what the tenants were given on it and what they use."""
    views = []
    for gpu in gpus:
        on = [(t, d) for t in tenants for d in t.devices if d.uuid == gpu.uuid]
        allocated = sum(d.memory_cap_bytes for _, d in on)
        arbiter = (arbiters or {}).get(gpu.uuid)
        views.append(
            GpuView(
                index=gpu.index,
                uuid=gpu.uuid,
                name=gpu.name,
                memory_total_bytes=gpu.memory_total,
                memory_used_bytes=gpu.memory_used,
                utilization_pct=gpu.utilization_pct,
                memory_allocated_bytes=allocated,
                memory_tenants_used_bytes=sum(d.memory_used_bytes + d.memory_overhead_bytes for _, d in on),
                memory_overcommitted=allocated > gpu.memory_total,
                compute_guaranteed_ratio=sum(
                    d.compute_share_ratio for _, d in on if d.policy in ("cap", "burst")
                ),
                compute_used_ratio=round(min(sum(d.gpu_busy_ratio or 0.0 for _, d in on), 1.0), 4),
                tenants=[t.id for t, _ in on],
                arbiter=arbiter_view(arbiter) if arbiter else None,
            )
        )
    return views
