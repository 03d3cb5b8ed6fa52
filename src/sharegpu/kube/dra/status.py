"""What a prepared claim's tenant got, on the claim itself: `status.devices`, one entry per GPU
(driver, pool, device, shareID) with a `Ready` condition and the tenant's limits as `data`, so
`kubectl get resourceclaim -o yaml` shows the tenant's name, memory, compute, policy and
priority without a node login.

Written by server-side apply of the plugin's own entries (field manager `sharegpu.io`), so other
drivers' entries on the same claim are left alone; unprepare applies none, which removes them.
The API server admits the write only from the node the claim is prepared on (Kubernetes 1.36+:
`resourceclaims/driver` with the verb `associated-node:patch`, which a node DaemonSet's token
carries, and `resourceclaims/status`). It is a report: a failed write is logged and does not fail
the prepare, whose tenant is made and whose pod can start.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sharegpu.kube.apiclient import REQUEST_TIMEOUT_S, failure
from sharegpu.kube.dra.claims import ClaimPlan, ClaimRef
from sharegpu.kube.dra.slices import DRIVER, RESOURCE_API
from sharegpu.spec import MIB

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

FIELD_MANAGER = DRIVER
APPLY_PATCH = "application/apply-patch+yaml"


def device_statuses(plan: ClaimPlan, now: datetime) -> list[dict[str, Any]]:
    """The claim's `status.devices` entries for its tenant (pure)."""
    memory_mib = plan.memory_bytes // MIB
    compute = plan.devices[0].compute_pct
    data = {
        "tenant": plan.tenant,
        "memoryMiB": memory_mib,
        "computePercent": compute,
        "policy": plan.compute.policy,
        "priority": plan.compute.priority,
    }
    entries = []
    for d in plan.devices:
        entry: dict[str, Any] = {
            "driver": DRIVER,
            "pool": d.pool,
            "device": d.device,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "TenantReady",
                    "message": f"tenant {plan.tenant}: {memory_mib} MiB, {compute}% "
                    f"({plan.compute.policy}, {plan.compute.priority})",
                    "lastTransitionTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ],
            "data": data,
        }
        if d.share_id:
            entry["shareID"] = d.share_id
        entries.append(entry)
    return entries


def _apply_body(ref: ClaimRef, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": ref.name, "namespace": ref.namespace},
        "status": {"devices": devices},
    }


class ClaimStatus:
    def __init__(self, api: ApiClient):
        from kubernetes.client import CustomObjectsApi

        self.api = api
        self.objects = CustomObjectsApi(api)

    def _apply(self, ref: ClaimRef, devices: list[dict[str, Any]]) -> None:
        self.objects.patch_namespaced_custom_object_status(
            "resource.k8s.io",
            "v1",
            ref.namespace,
            "resourceclaims",
            ref.name,
            _apply_body(ref, devices),
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type=APPLY_PATCH,
            _request_timeout=REQUEST_TIMEOUT_S,
        )

    def prepared(self, plan: ClaimPlan) -> None:
        try:
            self._apply(plan.ref, device_statuses(plan, datetime.now(UTC)))
        except Exception as err:
            log.warning("claim %s: cannot write its status.devices: %s", plan.ref.key, failure(err, self.api))

    def unprepared(self, ref: ClaimRef) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._apply(ref, [])
        except ApiException as err:
            if err.status not in (404, 409, 422):  # gone, or deallocated with its devices
                log.warning("claim %s: cannot clear its status.devices: %s", ref.key, failure(err, self.api))
        except Exception as err:
            log.warning("claim %s: cannot clear its status.devices: %s", ref.key, failure(err, self.api))
