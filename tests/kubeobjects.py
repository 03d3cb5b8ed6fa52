"""Kubernetes objects for the extender's tests: nodes with a sharegpu inventory and pods asking
for vGPUs, built with the `kubernetes` client's models and serialised as the API server and the
kube-scheduler send them."""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client

from sharegpu.kube.assignment import Assignment
from sharegpu.kube.bindings import BindError, Fits, PodRef
from sharegpu.kube.inventory import ANNOTATION_INVENTORY, Inventory, InventoryGpu

SERIALISE = client.ApiClient().sanitize_for_serialization
NOW = 1_000_000.0
H100 = "NVIDIA H100 80GB HBM3"


def node(
    name: str,
    gpus: int = 2,
    model: str = H100,
    *,
    age_s: float = 0.0,
    inventory: bool = True,
    now: float = NOW,
) -> Any:
    annotations = {}
    if inventory:
        inv = Inventory(
            gpus=tuple(
                InventoryGpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=81559)
                for i in range(gpus)
            ),
            published_at=now - age_s,
        )
        annotations[ANNOTATION_INVENTORY] = inv.to_annotation()
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        status=client.V1NodeStatus(allocatable={"cpu": "32", "memory": "256Gi", "pods": "110"}),
    )


def pod(
    name: str,
    memory: int | None = 4096,
    compute: int = 30,
    count: int = 1,
    *,
    containers: int = 1,
    **annotations: str,
) -> dict[str, Any]:
    """A pod in namespace ml, uid `uid-<name>`, of `containers` containers (serve, serve-1, ...)
    each asking `count` vGPUs of `memory` MiB and `compute` %."""
    limits = {"sharegpu.io/vgpu": str(count), "sharegpu.io/vgpu-compute": str(compute)}
    if memory is not None:
        limits["sharegpu.io/vgpu-memory"] = str(memory)
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            namespace="ml",
            uid=f"uid-{name}",
            annotations={f"sharegpu.io/{k.replace('_', '-')}": v for k, v in annotations.items()} or None,
        ),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="serve" if k == 0 else f"serve-{k}",
                    image="serve:1",
                    resources=client.V1ResourceRequirements(
                        limits=limits, requests={"cpu": "2", "memory": "8Gi"}
                    ),
                )
                for k in range(containers)
            ]
        ),
    )
    serialised: dict[str, Any] = SERIALISE(body)
    return serialised


# The scheduler extender's side (tests/unit and tests/e2e test_kube_extender.py).


def args(the_pod: dict[str, Any], nodes: list[Any]) -> dict[str, Any]:
    """ExtenderArgs as the kube-scheduler sends them to an extender that is not node-cache capable."""
    return {"Pod": the_pod, "Nodes": SERIALISE(client.V1NodeList(items=nodes)), "NodeNames": None}


class RecordingBinder:
    def __init__(self, fail: str | None = None) -> None:
        self.bound: list[tuple[str, str, Assignment]] = []
        self.fail = fail
        self.lock = threading.Lock()

    def bind(self, pod: PodRef, assignment: Assignment, fits: Fits) -> str:
        if self.fail:
            raise RuntimeError(self.fail)
        why = fits([])
        if why is not None:
            raise BindError(why)
        with self.lock:
            self.bound.append((pod.key, pod.uid, assignment))
        return ""


def kept(result: dict[str, Any]) -> list[str]:
    return [n["metadata"]["name"] for n in result["Nodes"]["items"]]
