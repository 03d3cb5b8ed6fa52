"""The decision the scheduler extender writes on a pod at bind, and the device plugin reads at
`Allocate`: which GPUs of which node, with what memory, compute, priority and policy, per
container. It travels as the pod annotation `sharegpu.io/assignment` (JSON), written in the same
update as the binding's node, so a pod carries its decision wherever it is read from (a watch,
a list, the API server after an extender restart).

The kubelet's `Allocate` says neither which pod nor which container it is for, only how many
`sharegpu.io/vgpu` devices: the device plugin takes the pod bound to its node whose assignment
has a container not yet allocated with that many vGPUs, the earliest bound first (`bound_at`),
and marks it allocated (`sharegpu.io/allocated`: the container names done), as the kubelet
allocates a pod's containers in order, one pod at a time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sharegpu.kube.request import ANNOTATION_ALLOCATED, ANNOTATION_ASSIGNMENT, PodRequestError, read_versioned

VERSION = 1


class AssignedGpu(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, description="The GPU's NVML index on the node")
    uuid: str = Field(min_length=1, description="The GPU's UUID (GPU-...)")
    memory_mib: int = Field(gt=0, description="The vGPU's memory cap")
    compute_pct: int = Field(ge=1, le=100, description="The vGPU's compute share")


class AssignedContainer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    gpus: tuple[AssignedGpu, ...] = Field(min_length=1)


class Assignment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = VERSION
    node: str = Field(min_length=1)
    priority: Literal["online", "normal", "offline"]
    policy: Literal["share", "cap", "burst"]
    containers: tuple[AssignedContainer, ...] = Field(min_length=1)
    bound_at: float = Field(description="Unix time of the bind: the device plugin's order")

    def to_annotation(self) -> str:
        return self.model_dump_json()

    def container(self, name: str) -> AssignedContainer | None:
        return next((c for c in self.containers if c.name == name), None)


def read_assignment(annotations: dict[str, str] | None, pod_key: str) -> Assignment | None:
    """The pod's assignment, None when it has none; PodRequestError when it is not one of ours
    (edited by hand, or written by a newer extender)."""
    text = (annotations or {}).get(ANNOTATION_ASSIGNMENT)
    if text is None:
        return None
    where = f"pod {pod_key}: {ANNOTATION_ASSIGNMENT}"
    return read_versioned(Assignment, text, where=where, version=VERSION, error=PodRequestError)


def allocated_containers(annotations: dict[str, str] | None) -> list[str]:
    """The containers of the pod the device plugin has allocated already."""
    text = (annotations or {}).get(ANNOTATION_ALLOCATED, "")
    return [c for c in text.split(",") if c]
