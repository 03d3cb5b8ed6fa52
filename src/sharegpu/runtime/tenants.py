"""Creating and removing a tenant from a runtime door (`sharegpu run`, the CDI hooks).

Through the node agent when one answers on the runtime directory (its service admits, records
and reports the tenant); otherwise directly on the runtime directory under the node lock, with
the same planning and admission code (sharegpu.agent.plan, sharegpu.tenant). Either way a
request fails with the same one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharegpu.agent.plan import memory_totals, plan_devices
from sharegpu.arbiter import ensure_arbiter, grant_arbiter
from sharegpu.devices import list_gpus
from sharegpu.errors import AgentError
from sharegpu.spec import MIB, ComputeSpec, GpuSelector
from sharegpu.tenant import create_tenant, overcommit_allowed, remove_tenant, runtime_dir, tenant_path

if TYPE_CHECKING:
    from sharegpu.agent.client import AgentClient

# Mirrors of sharegpu.agent.client's names: the client (httpx, the API models) takes about half a
# second to import, which a container's hooks pay twice per start when no agent runs.
_SOCKET_NAME = "agent.sock"
_NO_AGENT_ENV = "SHAREGPU_NO_AGENT"


def _agent() -> AgentClient | None:
    """The node agent's client when one answers; the client is imported only if its socket is
    there."""
    if os.environ.get(_NO_AGENT_ENV, "") not in ("", "0") or not (runtime_dir() / _SOCKET_NAME).exists():
        return None
    from sharegpu.agent.client import AgentClient

    return AgentClient.connect(runtime_dir())


@dataclass(frozen=True)
class Created:
    path: Path
    uuids: list[str]
    through_agent: bool


def _create_body(
    name: str,
    memory_bytes: int,
    gpus: Sequence[GpuSelector],
    compute: ComputeSpec,
    meta: Mapping[str, Any],
) -> dict[str, object]:
    """The request as the agent's API takes it (the strings the CLI took)."""
    body: dict[str, object] = {
        "name": name,
        "memory": f"{memory_bytes // MIB}MiB",
        "gpus": [str(s) for s in gpus],
        "policy": compute.policy,
        "priority": compute.priority,
        "weight": compute.weight,
        **meta,
    }
    if compute.policy != "native":
        body["compute"] = f"{compute.share_permille // 10}%"
    if compute.policy == "burst":
        body["ceiling"] = f"{compute.ceiling_permille // 10}%"
    return body


def create(
    name: str,
    memory_bytes: int,
    gpus: Sequence[GpuSelector],
    compute: ComputeSpec,
    *,
    api_meta: Mapping[str, Any],
    direct_meta: Mapping[str, Any],
) -> Created:
    """The tenant `name`, admitted next to the node's others.  `api_meta` are the agent API's
    own fields (supervisor_pid, command, labels); `direct_meta` goes into meta.json without it."""
    client = _agent()
    if client is not None:
        with client:
            view = client.create_tenant(_create_body(name, memory_bytes, gpus, compute, api_meta))
        return Created(Path(view.path), [d.uuid for d in view.devices], through_agent=True)
    node_gpus = list_gpus()
    limits = plan_devices(memory_bytes, gpus, compute, node_gpus)
    if compute.policy != "native":
        for dev in limits:
            ensure_arbiter(runtime_dir(), dev.uuid)
            grant_arbiter(runtime_dir(), dev.uuid, os.geteuid())
    path = create_tenant(
        name, limits, meta=dict(direct_meta), memory_totals=memory_totals(node_gpus, overcommit_allowed())
    )
    return Created(path, [d.uuid for d in limits], through_agent=False)


def delete(name: str, path: Path | None = None, *, through_agent: bool | None = None) -> None:
    """Remove the tenant whatever its processes do (they are gone, or going): the way it was
    made when the caller knows it (`through_agent`), else through the agent if one answers.
    Through the agent, TenantNotFound when it does not exist."""
    client = _agent() if through_agent is not False else None
    if client is not None:
        try:
            with client:
                client.delete_tenant(name, force=True)
            return
        except AgentError:
            pass  # the agent went away meanwhile: clean up as without it
    remove_tenant(path or tenant_path(name))
