"""Which pod and container a kubelet `Allocate` is for.

The kubelet says only how many devices a container gets. Its pod is the one bound to this node
whose assignment's next container not yet allocated (in the assignment's order, the pod's order)
asks for that many vGPUs, the earliest bound first (`bound_at`): the kubelet admits one pod at a
time and allocates its containers in order (kube/assignment.py). `taken` is what this plugin
allocated already, so an API server list that lags the `sharegpu.io/allocated` patch is safe.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sharegpu.kube.assignment import AssignedContainer, Assignment, allocated_containers, read_assignment
from sharegpu.kube.deviceplugin.pods import Pod
from sharegpu.kube.request import RESOURCE_VGPU, PodRequestError


class NoPodError(PodRequestError):
    """No pod pending on this node is waiting for an allocation of this size."""


@dataclass(frozen=True)
class Match:
    pod: Pod
    namespace: str
    name: str
    uid: str
    assignment: Assignment
    container: AssignedContainer

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _asks_vgpu(pod: Pod) -> bool:
    for spec in (pod.get("spec") or {}).get("containers") or []:
        resources = spec.get("resources") or {}
        if any(RESOURCE_VGPU in (resources.get(k) or {}) for k in ("limits", "requests")):
            return True
    return False


def _key(pod: Pod) -> tuple[str, str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name", "")), str(meta.get("uid", ""))


def next_container(
    assignment: Assignment, uid: str, annotations: dict[str, str] | None, taken: set[tuple[str, str]]
) -> AssignedContainer | None:
    done = set(allocated_containers(annotations))
    return next((c for c in assignment.containers if c.name not in done and (uid, c.name) not in taken), None)


def match(pods: Iterable[Pod], node: str, count: int, taken: set[tuple[str, str]]) -> Match:
    """The pod being started with a container of `count` vGPUs; NoPodError saying what was
    found instead, PodRequestError naming a pod whose assignment cannot be read when no other
    pod matches."""
    found: list[Match] = []
    broken: list[str] = []
    unassigned: list[str] = []
    other_sizes: list[str] = []
    for pod in pods:
        namespace, name, uid = _key(pod)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        try:
            assignment = read_assignment(annotations, f"{namespace}/{name}")
        except PodRequestError as err:
            broken.append(str(err))
            continue
        if assignment is None:
            if _asks_vgpu(pod):
                unassigned.append(f"{namespace}/{name}")
            continue
        if assignment.node != node:
            continue  # bound elsewhere after its assignment (never by the extender): not ours
        container = next_container(assignment, uid, annotations, taken)
        if container is None:
            continue
        if len(container.gpus) != count:
            other_sizes.append(f"{namespace}/{name} container {container.name}: {len(container.gpus)}")
            continue
        found.append(Match(pod, namespace, name, uid, assignment, container))
    if found:
        return min(found, key=lambda m: (m.assignment.bound_at, m.key))
    if broken:
        raise PodRequestError("; ".join(broken))
    why = [f"no pod pending on node {node} has a sharegpu assignment with a container of {count} vGPUs"]
    why += [f"pending with another count: {', '.join(other_sizes)}"] if other_sizes else []
    if unassigned:
        why.append(
            "pending without an assignment (not scheduled through sharegpu's extender?): "
            + ", ".join(unassigned)
        )
    raise NoPodError("; ".join(why))
