"""Prepare and unprepare: a claim's tenant made and removed through the one tenant door
(sharegpu.doors: the agent's service when it answers, else the local one), one claim at a time.

Prepare reads the claim from the API server (the kubelet sends its name and UID only), plans its
tenant (claims.py), records the claim as `preparing` in the checkpoint, makes the tenant,
rewrites the node's CDI spec so the runtime finds the new device when the container is created,
and records the answer as `prepared`. Any failure removes what this call made and the record,
and is the claim's error, which the kubelet shows on the pod and retries. A prepared claim is
answered from the checkpoint again (the kubelet asks again after its own restart).

Unprepare removes the claim's tenant (forced: the kubelet calls it once no container of the
claim runs, and a process left behind must not keep the memory) and its record; a claim this
plugin does not know is already unprepared. A prepared claim is reported on the claim itself
(status.py: its `status.devices`), and the report removed at unprepare.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sharegpu.devices import Gpu, list_gpus
from sharegpu.doors import tenant_service
from sharegpu.errors import SharegpuError, TenantNotFound
from sharegpu.kube.dra.checkpoint import PREPARED, PREPARING, Checkpoint, Entry
from sharegpu.kube.dra.claims import ClaimError, ClaimPlan, ClaimRef, plan_claim, tenant_name
from sharegpu.kube.dra.slices import parts
from sharegpu.kube.request import run_as_user
from sharegpu.runtime.cdi.generate import KIND, write_node_spec
from sharegpu.service import TenantRequest
from sharegpu.spec import MIB, GpuSelector
from sharegpu.tenant import read_device_limits, read_meta, tenants_dir

log = logging.getLogger(__name__)

ReadClaim = Callable[[ClaimRef], Mapping[str, Any]]
ReadPod = Callable[[str, str], Mapping[str, Any]]


class StatusReport(Protocol):
    """Where a claim's tenant is reported (status.py: the claim's status.devices)."""

    def prepared(self, plan: ClaimPlan) -> None: ...

    def unprepared(self, ref: ClaimRef) -> None: ...


def pod_user(pod: Mapping[str, Any]) -> int | None:
    """The uid the pod's containers run as (each as `run_as_user` reads it: its own, else the
    pod's) when they all agree; None when they differ or none is known (the image's user). The
    tenant's files are given to it, so a pod that runs as non-root can use its vGPU."""
    names = [c.get("name", "") for c in (pod.get("spec") or {}).get("containers") or []] or [""]
    uids = {run_as_user(pod, name) for name in names} - {None}
    return uids.pop() if len(uids) == 1 else None


@dataclass
class Preparer:
    node: str
    root: Path  # the runtime directory
    checkpoint: Checkpoint
    read_claim: ReadClaim
    read_pod: ReadPod | None = None
    cdi_spec: Path | None = None
    list_gpus: Callable[[], list[Gpu]] = list_gpus
    partitions: tuple[int, ...] = ()  # the slices' mode (slices.py): the devices' sizes
    status: StatusReport | None = None
    explain: Callable[[BaseException], str] = str  # an error of read_claim, in one line
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def recover(self) -> list[str]:
        """Roll back the prepares a dead plugin left half done; the claims rolled back."""
        rolled = []
        for uid, entry in list(self.checkpoint.entries.items()):
            if entry.state == PREPARING:
                self._remove_tenant(entry.tenant, uid)
                self.checkpoint.drop(uid)
                rolled.append(f"{entry.namespace}/{entry.name}")
        if rolled:
            self._rewrite_spec()
            log.warning("rolled back the half-done prepare of claims %s", ", ".join(rolled))
        return rolled

    def prepare(self, ref: ClaimRef) -> list[dict[str, Any]]:
        """The kubelet's answer for `ref`: one entry per device (request_names, pool_name,
        device_name, cdi_device_ids, share_id). ClaimError or the tenant service's error."""
        with self._lock:
            entry = self.checkpoint.get(ref.uid)
            if entry is not None and entry.state == PREPARED:
                if (tenants_dir(self.root) / entry.tenant).is_dir():
                    return entry.devices
                log.warning("claim %s: its tenant %s is gone; preparing it again", ref.key, entry.tenant)
            gpus = self.list_gpus()
            try:
                claim = self.read_claim(ref)
            except Exception as err:  # the API server's answer, in one line
                raise ClaimError(
                    f"claim {ref.key}: cannot read it from the API server: {self.explain(err)}"
                ) from err
            plan = plan_claim(claim, ref, self.node, {p.name: p for p in parts(gpus, self.partitions)})
            self.checkpoint.put(ref.uid, Entry(ref.namespace, ref.name, plan.tenant, PREPARING))
            made = False
            try:
                made = self._make_tenant(plan, gpus)
                if self.cdi_spec is not None:
                    try:
                        write_node_spec(self.root, self.cdi_spec, gpus=gpus)
                    except SharegpuError as err:
                        raise ClaimError(f"claim {ref.key}: cannot write the CDI spec: {err}") from err
                devices = [
                    {
                        "request_names": [d.request],
                        "pool_name": d.pool,
                        "device_name": d.device,
                        "cdi_device_ids": [f"{KIND}={plan.tenant}"],
                        **({"share_id": d.share_id} if d.share_id else {}),
                    }
                    for d in plan.devices
                ]
                self.checkpoint.put(ref.uid, Entry(ref.namespace, ref.name, plan.tenant, PREPARED, devices))
            except BaseException:
                if made:
                    self._remove_tenant(plan.tenant, ref.uid)
                self.checkpoint.drop(ref.uid)
                raise
            if self.status is not None:
                self.status.prepared(plan)
            log.info(
                "prepared claim %s: tenant %s, %d MiB and %d%% on %s",
                ref.key,
                plan.tenant,
                plan.memory_bytes // MIB,
                plan.devices[0].compute_pct,
                ", ".join(d.device for d in plan.devices),
            )
            return devices

    def unprepare(self, ref: ClaimRef) -> None:
        with self._lock:
            entry = self.checkpoint.get(ref.uid)
            tenant = entry.tenant if entry is not None else tenant_name(ref)
            if self._remove_tenant(tenant, ref.uid):
                self._rewrite_spec()
                log.info("unprepared claim %s: tenant %s removed", ref.key, tenant)
            self.checkpoint.drop(ref.uid)
            if self.status is not None and entry is not None:
                self.status.unprepared(ref)

    def _make_tenant(self, plan: ClaimPlan, gpus: list[Gpu]) -> bool:
        """Make the claim's tenant; False when it is there already, made for this very claim
        by a prepare whose record was lost. A tenant of that name that is another's is an error."""
        path = tenants_dir(self.root) / plan.tenant
        if path.is_dir():
            labels = read_meta(path).get("labels") or {}
            have = sorted((d.mem_cap_bytes, d.share_permille) for d in read_device_limits(path))
            wanted = [(plan.memory_bytes, plan.compute.share_permille)] * len(plan.devices)
            if labels.get("claim_uid") != plan.ref.uid or have != wanted:
                raise ClaimError(
                    f"claim {plan.ref.key}: a tenant {plan.tenant} exists that is not this claim's "
                    f"(labels {labels}, limits {have})"
                )
            log.info("claim %s: its tenant %s is there already; answering with it", plan.ref.key, plan.tenant)
            return False
        owner = None
        if self.read_pod is not None and plan.pod is not None:
            try:
                owner = pod_user(self.read_pod(plan.ref.namespace, plan.pod))
            except Exception as err:  # the owner is a convenience: root owns it then
                log.warning("claim %s: cannot read pod %s for its user: %s", plan.ref.key, plan.pod, err)
        request = TenantRequest(
            plan.tenant,
            plan.memory_bytes,
            [GpuSelector(index=d.gpu_index) for d in plan.devices],
            plan.compute,
            owner=owner,
            labels=plan.labels,
        )
        try:
            with tenant_service(self.root) as service:
                service.create(request)
        except SharegpuError as err:
            raise ClaimError(f"claim {plan.ref.key}: {err}") from err
        return True

    def _remove_tenant(self, tenant: str, uid: str) -> bool:
        """Remove `tenant` if it is the claim `uid`'s; whether one was removed."""
        path = tenants_dir(self.root) / tenant
        if not path.is_dir():
            return False
        if (read_meta(path).get("labels") or {}).get("claim_uid") != uid:
            log.warning("tenant %s is not claim %s's: left as it is", tenant, uid)
            return False
        try:
            with tenant_service(self.root) as service:
                service.delete(tenant, force=True)
        except TenantNotFound:
            return False
        return True

    def _rewrite_spec(self) -> None:
        if self.cdi_spec is None:
            return
        try:  # the keeper would drop the tenant from it within a second too
            write_node_spec(self.root, self.cdi_spec)
        except Exception as err:
            log.warning("cannot rewrite the CDI spec %s: %s", self.cdi_spec, err)
