"""The tenant service: the one way a tenant is created, resized, deleted and listed.

* ``interface``: the requests, the Tenant answered, and the TenantService protocol;
* ``plan``: from a spec (memory, GPUs, compute) to a tenant's vGPUs, and a resize of them;
* ``settings``: the node's arbiter settings, applied to a GPU's region by every creation;
* ``local``: the service on the runtime directory (plan → ensure the GPU's arbiter → create →
  grant → tune; delete by name and incarnation, under the node lock).

The agent is the local service plus its store and events (sharegpu.agent.service); its API is
the other transport, and sharegpu.doors picks between the two for every door.
"""

from __future__ import annotations

from sharegpu.service.interface import ResizeRequest, Tenant, TenantRequest, TenantService
from sharegpu.service.local import LocalTenantService

__all__ = ["LocalTenantService", "ResizeRequest", "Tenant", "TenantRequest", "TenantService"]
