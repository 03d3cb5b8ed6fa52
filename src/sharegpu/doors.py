"""How every door reaches the tenant service: through the node agent when one answers on the
runtime directory, else on the runtime directory itself. `tenant_service()` is the only place
that decides; `sharegpu run`, the CDI hooks, the device plugin and its pod reaper, `resize` and
the `ops` readings all ask it.

Both transports run the same steps (sharegpu.service.local: the agent is that service plus its
store and events) and fail with the same one-line errors (the agent's client turns an error
answer back into the class the agent raised), so a tenant is the same whichever way it came.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sharegpu.errors import AgentError, TenantNotFound
from sharegpu.service import LocalTenantService, ResizeRequest, Tenant, TenantRequest, TenantService
from sharegpu.spec import MIB
from sharegpu.tenant import runtime_dir

if TYPE_CHECKING:
    from sharegpu.agent.client import AgentClient
    from sharegpu.agent.models import TenantView

# Mirrors of sharegpu.agent.client's names: the client (httpx, the API models) takes about half a
# second to import, which a container's hooks pay twice per start when no agent runs.
_SOCKET_NAME = "agent.sock"
_NO_AGENT_ENV = "SHAREGPU_NO_AGENT"


def tenant_service(root: Path | None = None, *, timeout: float = 1.0) -> TenantService:
    """The agent's service when an agent answers on `root` (default: the runtime directory)
    within `timeout` and SHAREGPU_NO_AGENT is not set; else the local service. The client is
    imported only when the agent's socket is there."""
    root = root if root is not None else runtime_dir()
    if os.environ.get(_NO_AGENT_ENV, "") in ("", "0") and (root / _SOCKET_NAME).exists():
        from sharegpu.agent.client import AgentClient

        client = AgentClient.connect(root, timeout=timeout)
        if client is not None:
            return AgentTenantService(root, client)
    return LocalTenantService(root)


def agent_client(service: TenantService) -> AgentClient | None:
    """The agent's client behind `service`, for what only the agent keeps (health, events, its
    GPU views); None for the local service."""
    return service.client if isinstance(service, AgentTenantService) else None


def tenant_views(service: TenantService, only: str | None = None) -> list[TenantView]:
    """The tenants (or `only` that one) as the agent's API shows them, through `service`'s
    transport: with the agent, its views (with what it measured and keeps); without, the same
    views read from the runtime directory."""
    client = agent_client(service)
    if client is None:
        from sharegpu.agent.service import views

        assert isinstance(service, LocalTenantService)
        return views(service.root, only=only)
    if only is None:
        return client.list_tenants()
    try:
        return [client.get_tenant(only)]
    except TenantNotFound:
        return []


class AgentTenantService:
    """The tenant service over the node agent's API."""

    def __init__(self, root: Path, client: AgentClient) -> None:
        self.root = root
        self.client = client

    def __enter__(self) -> AgentTenantService:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.client.close()

    def create(self, request: TenantRequest) -> Tenant:
        return _tenant(self.client.create_tenant(create_body(request)))

    def resize(self, name: str, request: ResizeRequest) -> Tenant:
        return _tenant(self.client.resize_tenant(name, resize_body(request)))

    def delete(self, name: str, *, incarnation: int | None = None, force: bool = False) -> None:
        try:
            self.client.delete_tenant(name, incarnation=incarnation, force=force)
        except AgentError:
            # The agent went away meanwhile: the tenant still goes, as it would without one.
            LocalTenantService(self.root).delete(name, incarnation=incarnation, force=force)

    def list_tenants(self) -> list[Tenant]:
        return [_tenant(view) for view in self.client.list_tenants()]


def _tenant(view: TenantView) -> Tenant:
    return Tenant(view.id, Path(view.path), view.incarnation or 0, tuple(d.uuid for d in view.devices))


def create_body(request: TenantRequest) -> dict[str, object]:
    """The request as the agent's API takes it (the strings the CLI takes)."""
    compute = request.compute
    body: dict[str, object] = {
        "name": request.name,
        "memory": f"{request.memory_bytes // MIB}MiB",
        "gpus": [str(s) for s in request.gpus],
        "policy": compute.policy,
        "priority": compute.priority,
        "weight": compute.weight,
        "labels": dict(request.labels),
    }
    if compute.policy != "native":
        body["compute"] = f"{compute.share_permille // 10}%"
    if compute.policy == "burst":
        body["ceiling"] = f"{compute.ceiling_permille // 10}%"
    if request.supervisor_pid is not None:
        body["supervisor_pid"] = request.supervisor_pid
    if request.owner is not None:
        body["owner"] = request.owner
    if request.pgid is not None:
        body["pgid"] = request.pgid
    if request.command is not None:
        body["command"] = list(request.command)
    return body


def resize_body(request: ResizeRequest) -> dict[str, object]:
    """The fields of a resize that change, as the agent's API takes them."""
    body: dict[str, object] = {
        "compute": request.compute,
        "ceiling": request.ceiling,
        "policy": request.policy,
        "priority": request.priority,
        "weight": request.weight,
    }
    if request.memory_bytes is not None:
        body["memory"] = f"{request.memory_bytes // MIB}MiB"
    return {k: v for k, v in body.items() if v is not None}
