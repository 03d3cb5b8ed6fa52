"""What `Allocate` does for one container: the tenant made from its pod's assignment, the node's
CDI spec rewritten to list it, and the response the kubelet hands the container runtime.

The tenant is `pod-<first 8 of the pod uid>-<container>` (tenant-id rules: lowercase, at most 63
characters; a longer name is cut and given a hash of the whole), made through the one tenant
door (sharegpu.doors: the agent's tenant service when it answers, else the local one, with the
same steps and admission). It carries the labels namespace, pod, container and pod_uid, so metrics and
`sharegpu tenants` name the pod.

The response names the CDI device `sharegpu.io/vgpu=<tenant>`; with `legacy_edits` it also
carries the same edits (environment, mounts, device nodes) as plain fields, for kubelets or
runtimes without CDI. (A runtime that applies both mounts the same files twice at the same
paths: harmless, and `--cdi-only` drops the plain fields.)

The CDI spec is written here, not left to the agent's keeper: the keeper rewrites it within about
a second of a new tenant, but the kubelet creates the container as soon as `Allocate` returns,
and the runtime must find the device then. Both write it under the node lock, so neither drops
a tenant the other has just listed.

The tenant outlives `Allocate` with no supervisor process (the container is not created yet),
so the agent's reaper cannot tell when it is done: the plugin's pod reaper (podwatch.py)
removes it when its pod is deleted or finishes, by the `pod_uid` label.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu.devices import Gpu, list_gpus
from sharegpu.doors import tenant_service
from sharegpu.errors import SharegpuError
from sharegpu.kube.assignment import AssignedContainer
from sharegpu.kube.deviceplugin import api_pb2 as api
from sharegpu.kube.deviceplugin.matching import Match, match
from sharegpu.kube.deviceplugin.pods import PodSource
from sharegpu.kube.request import PodRequestError, run_as_user
from sharegpu.runtime.cdi.generate import KIND, common_edits, node_driver, tenant_device, write_node_spec
from sharegpu.runtime.cdi.model import ContainerEdits
from sharegpu.service import Tenant, TenantRequest
from sharegpu.spec import MIB, ComputeSpec, GpuSelector, tenant_id_from
from sharegpu.tenant import read_device_limits, read_meta, tenants_dir

log = logging.getLogger(__name__)


class AllocationError(SharegpuError):
    """The tenant of a matched container could not be made (admission refused it, ...)."""


def tenant_name(uid: str, container: str) -> str:
    return tenant_id_from(f"pod-{uid[:8]}-{container}")


def _uniform(m: Match) -> tuple[int, int]:
    """The container's memory (MiB) and compute (%): a tenant has one of each for all its GPUs."""
    shapes = {(g.memory_mib, g.compute_pct) for g in m.container.gpus}
    if len(shapes) != 1:
        raise PodRequestError(
            f"pod {m.key}: the assignment of container {m.container.name} gives its GPUs different "
            f"memory or compute ({sorted(shapes)}); a vGPU has the same on each of its GPUs"
        )
    return shapes.pop()


def _selectors(m: Match, gpus: Sequence[Gpu]) -> list[GpuSelector]:
    """The assigned GPUs by index, each checked to be the GPU the extender saw there."""
    by_index = {g.index: g for g in gpus}
    for assigned in m.container.gpus:
        gpu = by_index.get(assigned.index)
        if gpu is None:
            raise PodRequestError(
                f"pod {m.key}: its assignment names GPU {assigned.index}, and this node has {len(gpus)} GPUs"
            )
        if gpu.uuid != assigned.uuid:
            raise PodRequestError(
                f"pod {m.key}: its assignment names GPU {assigned.index} as {assigned.uuid}, but this "
                f"node's GPU {assigned.index} is {gpu.uuid} (the node's GPUs changed since it was scheduled)"
            )
    return [GpuSelector(index=a.index) for a in m.container.gpus]


def _labels(m: Match) -> dict[str, str]:
    return {"namespace": m.namespace, "pod": m.name, "container": m.container.name, "pod_uid": m.uid}


def _add_edits(response: api.ContainerAllocateResponse, edits: ContainerEdits) -> None:
    for entry in edits.env or []:
        key, _, value = entry.partition("=")
        response.envs[key] = value
    for mount in edits.mounts or []:
        read_only = "ro" in (mount.options or [])
        response.mounts.append(
            api.Mount(container_path=mount.container_path, host_path=mount.host_path, read_only=read_only)
        )
    for node in edits.device_nodes or []:
        response.devices.append(
            api.DeviceSpec(
                container_path=node.path,
                host_path=node.host_path or node.path,
                permissions=node.permissions or "rw",
            )
        )


def container_response(
    root: Path, tenant: str, gpus: Sequence[Gpu], *, legacy_edits: bool
) -> api.ContainerAllocateResponse:
    response = api.ContainerAllocateResponse(cdi_devices=[api.CDIDevice(name=f"{KIND}={tenant}")])
    if legacy_edits:
        driver = node_driver(gpus)
        _add_edits(response, common_edits(root, driver))
        _add_edits(response, tenant_device(root, tenant, driver).container_edits)
    return response


@dataclass
class _Made:
    name: str
    created: Tenant | None  # None: made by an earlier Allocate (kept if this one fails)
    match: Match


@dataclass
class Allocator:
    """Allocations, one at a time: the match, the tenant and the mark are one step under a lock,
    so two containers allocated at once never match the same pod's container."""

    node: str
    pods: PodSource
    root: Path
    cdi_spec: Path | None
    legacy_edits: bool = True
    list_gpus: Callable[[], list[Gpu]] = list_gpus
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _taken: set[tuple[str, str]] = field(default_factory=set)  # (pod uid, container) done here

    def peek(self, count: int) -> AssignedContainer | None:
        """The container the next allocation of `count` would be for, if any (a hint only)."""
        with self._lock:
            try:
                return match(self.pods.pending_pods(self.node), self.node, count, self._taken).container
            except Exception:  # advice only: GetPreferredAllocation falls back to packing
                return None

    def allocate(self, counts: Sequence[int]) -> list[api.ContainerAllocateResponse]:
        """One response per container request, or an error and nothing made."""
        with self._lock:
            made: list[_Made] = []
            try:
                responses = [self._one(count, made) for count in counts]
                for done in made:
                    self.pods.mark_allocated(done.match.pod, done.match.container.name)
                    self._taken.add((done.match.uid, done.match.container.name))
            except BaseException:
                self._undo(made)
                raise
            for done in made:
                log.info(
                    "allocated %s container %s: tenant %s",
                    done.match.key,
                    done.match.container.name,
                    done.name,
                )
            return responses

    def _one(self, count: int, made: list[_Made]) -> api.ContainerAllocateResponse:
        pending = self.pods.pending_pods(self.node)
        taken = self._taken | {(d.match.uid, d.match.container.name) for d in made}
        m = match(pending, self.node, count, taken)
        gpus = self.list_gpus()
        memory_mib, compute_pct = _uniform(m)
        compute = ComputeSpec.parse(
            compute=f"{compute_pct}%", policy=m.assignment.policy, priority=m.assignment.priority
        )
        name = tenant_name(m.uid, m.container.name)
        labels = _labels(m)
        if self._made_before(name, m, memory_mib, compute.share_permille, gpus):
            made.append(_Made(name, None, m))
            return container_response(self.root, name, gpus, legacy_edits=self.legacy_edits)
        try:
            with tenant_service(self.root) as service:
                owner = run_as_user(m.pod, m.container.name)
                created = service.create(
                    TenantRequest(
                        name, memory_mib * MIB, _selectors(m, gpus), compute, owner=owner, labels=labels
                    )
                )
        except SharegpuError as err:
            raise AllocationError(f"pod {m.key} container {m.container.name}: {err}") from err
        made.append(_Made(name, created, m))
        if self.cdi_spec is not None:
            write_node_spec(self.root, self.cdi_spec, gpus=gpus)
        return container_response(self.root, name, gpus, legacy_edits=self.legacy_edits)

    def _made_before(
        self, name: str, m: Match, memory_mib: int, share_permille: int, gpus: Sequence[Gpu]
    ) -> bool:
        """Whether an earlier Allocate of this very container made its tenant already: the plugin
        died after making it and before the kubelet had its answer, and the kubelet asks again.
        That tenant is answered with again; a tenant of that name that is not this container's
        (another pod's labels, other limits) is an error, never reused."""
        path = tenants_dir(self.root) / name
        if not path.is_dir():
            return False
        by_index = {g.index: g.uuid for g in gpus}
        wanted = sorted(
            (by_index.get(a.index, "?"), memory_mib * MIB, share_permille) for a in m.container.gpus
        )
        try:
            have = sorted((d.uuid, d.mem_cap_bytes, d.share_permille) for d in read_device_limits(path))
        except (OSError, SharegpuError) as err:
            raise AllocationError(
                f"pod {m.key} container {m.container.name}: tenant {name} exists and cannot be read: {err}"
            ) from err
        if read_meta(path).get("labels") != _labels(m) or have != wanted:
            raise AllocationError(
                f"pod {m.key} container {m.container.name}: a tenant {name} exists that is not this "
                f"container's (labels {read_meta(path).get('labels')}, limits {have}; wanted {wanted})"
            )
        log.info(
            "pod %s container %s: tenant %s was made by an earlier Allocate; answering with it",
            m.key,
            m.container.name,
            name,
        )
        return True

    def _undo(self, made: list[_Made]) -> None:
        for done in made:
            if done.created is None:
                continue
            try:
                with tenant_service(self.root) as service:
                    service.delete(done.name, incarnation=done.created.incarnation, force=True)
            except Exception:
                log.exception("cannot remove tenant %s after a failed allocation", done.name)
        if made and self.cdi_spec is not None:
            try:  # the spec listed them: drop them again (the keeper would, within a second)
                write_node_spec(self.root, self.cdi_spec)
            except Exception as err:
                log.warning("cannot rewrite the CDI spec %s: %s", self.cdi_spec, err)
