"""The tenant service on the runtime directory itself: the one implementation of the steps.

create: plan the vGPUs (sharegpu.service.plan) → ensure each GPU's arbiter region → create the
tenant (admission under the node lock, sharegpu.tenant) → grant the tenant's owner the arbiter
region → tune the region to the node's arbiter settings (sharegpu.service.settings).
resize: the same planning rules, admission and in-place rewrite under the node lock.
delete: under the node lock, only the incarnation asked for, and only without live processes
unless forced.

The agent runs this service too and adds its store and events (sharegpu.agent.service), so a
tenant is the same whichever door it came in by.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from sharegpu.arbiter import arbiter_path, ensure_arbiter, grant_arbiter
from sharegpu.devices import Gpu, list_gpus
from sharegpu.errors import ConfigError, SpecError, TenantBusy, TenantNotFound
from sharegpu.service.interface import ResizeRequest, Tenant, TenantRequest
from sharegpu.service.plan import memory_totals, plan_devices, resized
from sharegpu.service.settings import Changes, read_arbiter_settings, tune_region
from sharegpu.tenant import (
    DeviceLimit,
    create_tenant,
    iter_tenants,
    node_lock,
    overcommit_allowed,
    process_start_time,
    process_uid,
    read_device_limits,
    read_limits,
    remove_tenant,
    resize_tenant,
    runtime_dir,
    tenant_path,
    tenant_status,
)

log = logging.getLogger(__name__)

Tuner = Callable[[Path], tuple[str, Changes]]  # an arbiter region -> (its GPU, what changed)


def tenant_of(path: Path) -> Tenant:
    """The tenant at `path` as the service names it (its limits read under their seqlock)."""
    limits = read_limits(path)
    uuids = tuple(d.uuid for d in read_device_limits(path))
    return Tenant(path.name, path, int(limits.incarnation), uuids)


class LocalTenantService:
    """Tenants created, resized and deleted on the runtime directory `root` by this process."""

    def __init__(
        self,
        root: Path | None = None,
        *,
        allow_overcommit: bool | None = None,
        gpu_source: Callable[[], list[Gpu]] = list_gpus,
        created_by: str = "sharegpu",
        tuner: Tuner | None = None,
    ) -> None:
        self.root = root if root is not None else runtime_dir()
        # None: the node's rule, as the agent last wrote it (sharegpu.tenant.admission).
        self.allow_overcommit = allow_overcommit
        self.gpu_source = gpu_source
        self.created_by = created_by  # meta.json says which door's service made the tenant
        self.tuner = tuner or self.tune_to_node_settings

    def __enter__(self) -> LocalTenantService:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing held: the interface's, for the agent's transport."""

    def _overcommit(self) -> bool:
        if self.allow_overcommit is None:
            return overcommit_allowed(self.root)
        return self.allow_overcommit

    def tune_to_node_settings(self, region: Path) -> tuple[str, Changes]:
        """The default tuner: the node's settings, as the agent last wrote them."""
        return tune_region(region, read_arbiter_settings(self.root))

    # -- the interface ---------------------------------------------------------------------------

    def create(self, request: TenantRequest) -> Tenant:
        return self.create_reporting(request)[0]

    def resize(self, name: str, request: ResizeRequest) -> Tenant:
        return self.resize_reporting(name, request)[0]

    def delete(self, name: str, *, incarnation: int | None = None, force: bool = False) -> None:
        self.delete_reporting(name, incarnation=incarnation, force=force)

    def list_tenants(self) -> list[Tenant]:
        found = []
        for path in iter_tenants(self.root):
            try:
                found.append(tenant_of(path))
            except (ConfigError, OSError):
                found.append(Tenant(path.name, path, 0, ()))  # damaged: still there to remove
        return found

    # -- the same, saying what was done (the agent's events) -------------------------------------

    def create_reporting(
        self, request: TenantRequest
    ) -> tuple[Tenant, list[DeviceLimit], dict[str, Changes]]:
        """The new tenant, its limits, and the arbiter settings this creation applied per GPU."""
        gpus = self.gpu_source()
        limits = plan_devices(request.memory_bytes, request.gpus, request.compute, gpus)
        meta: dict[str, object] = {
            "command": list(request.command) if request.command is not None else None,
            "labels": dict(request.labels),
            "created_by": self.created_by,
        }
        if request.supervisor_pid is not None:
            start = process_start_time(request.supervisor_pid)
            if start is None:
                raise SpecError(f"supervisor process {request.supervisor_pid} does not exist")
            meta["supervisor"] = {"pid": request.supervisor_pid, "start_time": start}
        if request.pgid is not None:
            meta["pgid"] = request.pgid
        # The tenant is the user named, else its supervisor's user's (`sharegpu run` as that
        # user), else this process's.
        owner = request.owner
        if owner is None and request.supervisor_pid is not None:
            owner = process_uid(request.supervisor_pid)
        arbitrated = request.compute.policy != "native"
        if arbitrated:
            for dev in limits:
                ensure_arbiter(self.root, dev.uuid)
        path = create_tenant(
            request.name,
            limits,
            root=self.root,
            meta=meta,
            memory_totals=memory_totals(gpus, self._overcommit()),
            owner=owner,
        )
        tuned: dict[str, Changes] = {}
        if arbitrated:
            for dev in limits:
                grant_arbiter(self.root, dev.uuid, os.geteuid() if owner is None else owner)
                try:
                    uuid, changes = self.tuner(arbiter_path(self.root, dev.uuid))
                except (ConfigError, SpecError) as err:
                    # The tenant exists and works with the region's defaults; the agent's loop
                    # retries the settings, and says so.
                    log.warning("arbiter settings of %s: %s", dev.uuid, err)
                    continue
                if changes:
                    tuned[uuid] = changes
        return tenant_of(path), limits, tuned

    def resize_reporting(
        self, name: str, request: ResizeRequest
    ) -> tuple[Tenant, list[DeviceLimit], list[DeviceLimit], int]:
        """The tenant, its limits before and after, and the limits' new generation."""
        gpus = self.gpu_source()

        def update(current: list[DeviceLimit]) -> list[DeviceLimit]:
            return resized(
                current,
                gpus,
                memory_bytes=request.memory_bytes,
                compute=request.compute,
                policy=request.policy,
                ceiling=request.ceiling,
                priority=request.priority,
                weight=request.weight,
            )

        before, after, generation = resize_tenant(
            name, update, root=self.root, memory_totals=memory_totals(gpus, self._overcommit())
        )
        return tenant_of(tenant_path(name, self.root)), before, after, generation

    def delete_reporting(
        self, name: str, *, incarnation: int | None = None, force: bool = False
    ) -> list[int]:
        """The pids of the live processes a forced delete left running (they keep their limits
        until they exit)."""
        with node_lock(self.root):
            path = tenant_path(name, self.root)
            status = tenant_status(path)
            if incarnation is not None:
                found = _incarnation(path)
                if found != incarnation:
                    raise TenantNotFound(
                        f"no tenant {name!r} of incarnation {incarnation:#x} on this node: "
                        f"{name!r} is now another tenant (incarnation {found:#x}); nothing removed"
                    )
            live = [p.host_pid or p.pid for p in status.processes if p.alive]
            if live and not force:
                raise TenantBusy(
                    f"tenant {name} has {len(live)} live process(es) ({', '.join(map(str, live))}): "
                    "stop them first, or delete with force=true (they keep their limits until they exit)"
                )
            remove_tenant(path)
        return live


def _incarnation(path: Path) -> int:
    try:
        return int(read_limits(path).incarnation)
    except ConfigError:
        return 0  # damaged limits: no incarnation matches, so nothing is removed by mistake
