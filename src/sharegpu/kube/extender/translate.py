"""Between pods and sharegpu.placement: the placement request of a pod, the assignment of a
placement, whether an assignment fits beside what the API server says a node holds, and the
workload files the extender measures fragmentation against."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sharegpu.errors import SpecError
from sharegpu.kube.assignment import AssignedContainer, AssignedGpu, Assignment
from sharegpu.kube.inventory import Inventory, quantity
from sharegpu.kube.request import PodRequest, PodRequestError
from sharegpu.placement import Placement, Priority, Request, Workload


def placement_request(pod: Mapping[str, Any], request: PodRequest) -> Request:
    """The placement request of a pod: the vGPUs of all its containers, each on a GPU of its own
    (a placement request has one size of vGPU, so the containers' vGPUs must be the same size),
    and the pod's CPU and memory."""
    sizes = {(c.memory_mib, c.compute_pct) for c in request.containers}
    if len(sizes) != 1:
        shown = ", ".join(
            f"{c.name}: {c.memory_mib or 'whole'} MiB / {c.compute_pct}%" for c in request.containers
        )
        raise PodRequestError(
            f"pod {request.key}: its containers ask vGPUs of different sizes ({shown}); the vGPUs "
            "of one pod must be the same size (give each size a pod of its own)"
        )
    container = request.containers[0]
    count = sum(c.count for c in request.containers)
    cpu = memory = 0.0
    for spec in (pod.get("spec") or {}).get("containers") or []:
        asked = (spec.get("resources") or {}).get("requests") or {}
        try:
            cpu += quantity(asked.get("cpu", "0"))
            memory += quantity(asked.get("memory", "0"))
        except SpecError as err:
            raise PodRequestError(f"pod {request.key}: requests {err}") from err
    return Request(
        count=count,
        compute_milli=container.compute_pct * 10,
        memory_mib=container.memory_mib or 0,
        cpu_milli=round(cpu * 1000),
        host_memory_mib=int(memory // (1 << 20)),
        models=request.models,
        priority=Priority(request.priority),
        name=request.key,
    )


def assignment_for(
    known: Inventory, node: str, placement: Placement, request: PodRequest, bound_at: float
) -> Assignment:
    """The assignment of a placement on a node, its GPUs named by the node's inventory and dealt
    to the pod's containers in their order (placement_request made them one request)."""
    by_index = {g.index: g for g in known.gpus}
    dealt = iter(placement.gpus)
    containers = []
    for container in request.containers:
        gpus = tuple(
            AssignedGpu(
                index=i,
                uuid=by_index[i].uuid,
                memory_mib=container.memory_mib or by_index[i].memory_mib,
                compute_pct=container.compute_pct,
            )
            for i in (next(dealt) for _ in range(container.count))
        )
        containers.append(AssignedContainer(name=container.name, gpus=gpus))
    return Assignment(
        node=node,
        priority=request.priority,  # type: ignore[arg-type]
        policy=request.policy,  # type: ignore[arg-type]
        containers=tuple(containers),
        bound_at=bound_at,
    )


def oversubscribed(
    inventory: Inventory, mine: Assignment, others: Sequence[tuple[Mapping[str, Any], Assignment]]
) -> str | None:
    """Why `mine` beside `others` (what the API server says the node holds) would oversubscribe
    a GPU: its memory, or 100% of its compute; None if it would not. Independent of the state."""
    memory = {g.index: g.memory_mib for g in inventory.gpus}
    used: dict[int, list[int]] = {i: [0, 0, 0] for i in memory}  # memory MiB, compute %, pods
    for _, other in others:
        for container in other.containers:
            for gpu in container.gpus:
                if gpu.index in used:
                    row = used[gpu.index]
                    row[0] += gpu.memory_mib
                    row[1] += gpu.compute_pct
                    row[2] += 1
    for container in mine.containers:
        for gpu in container.gpus:
            held_m, held_c, pods = used.get(gpu.index, [0, 0, 0])
            if gpu.index not in memory:
                return f"node {mine.node} has no GPU {gpu.index} in its inventory"
            if held_m + gpu.memory_mib > memory[gpu.index] or held_c + gpu.compute_pct > 100:
                return (
                    f"GPU {gpu.index} of node {mine.node} holds {held_m} MiB / {held_c}% for {pods} pod(s) "
                    f"bound meanwhile; {gpu.memory_mib} MiB / {gpu.compute_pct}% more would exceed "
                    f"its {memory[gpu.index]} MiB / 100%"
                )
    return None


def workload_json(workload: Workload) -> str:
    return json.dumps(
        [
            {
                "shape": {**dataclasses.asdict(r), "models": sorted(r.models), "priority": str(r.priority)},
                "weight": w,
            }
            for r, w in zip(workload.shapes, workload.weights, strict=True)
        ]
    )


def read_workload(path: Path) -> Workload:
    rows = json.loads(path.read_text())
    shapes = tuple(
        Request(**{**row["shape"], "models": frozenset(row["shape"].get("models", ()))}) for row in rows
    )
    return Workload(shapes=shapes, weights=tuple(float(row["weight"]) for row in rows))
