"""What every door asks of the tenant service, whichever transport serves it (local or the
agent's API): the requests, the tenant it answers with, and the interface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sharegpu.spec import ComputeSpec, GpuSelector


@dataclass(frozen=True)
class TenantRequest:
    """A new tenant: a memory cap on each selected GPU (all when none) and its compute settings.
    `supervisor_pid`: the process whose end ends the tenant (the reaper's clue), whose user owns
    it unless `owner` names the user (a uid): the user a container runs as (`--user`, a pod's
    `runAsUser`), whose processes must write the tenant's usage and arbiter files; `command` and
    `labels` are for humans and metrics."""

    name: str
    memory_bytes: int
    gpus: Sequence[GpuSelector] = ()
    compute: ComputeSpec = field(default_factory=ComputeSpec)
    supervisor_pid: int | None = None
    owner: int | None = None
    pgid: int | None = None
    command: Sequence[str] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ResizeRequest:
    """A live resize: only the fields given (not None) change; strings as the CLI takes them."""

    memory_bytes: int | None = None
    compute: str | None = None
    ceiling: str | None = None
    policy: str | None = None
    priority: str | None = None
    weight: int | None = None


@dataclass(frozen=True)
class Tenant:
    """A tenant as the service names it: its name, its directory, and its incarnation (the
    limits' random id: a tenant re-created under the same name is another)."""

    name: str
    path: Path
    incarnation: int
    uuids: tuple[str, ...]


class TenantService(Protocol):
    """Create, resize, delete and list tenants; errors are sharegpu.errors, one line each."""

    def create(self, request: TenantRequest) -> Tenant: ...

    def resize(self, name: str, request: ResizeRequest) -> Tenant: ...

    def delete(self, name: str, *, incarnation: int | None = None, force: bool = False) -> None:
        """Remove the tenant `name`; with `incarnation`, only that one (TenantNotFound when the
        name is another tenant's now, and nothing is removed). Live processes refuse it
        (TenantBusy) unless `force`."""
        ...

    def list_tenants(self) -> list[Tenant]: ...

    def close(self) -> None: ...

    def __enter__(self) -> TenantService: ...

    def __exit__(self, *_exc: object) -> None: ...
