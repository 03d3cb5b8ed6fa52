"""The node's ResourceSlices: its GPUs as DRA devices, in one of two modes.

**Shared** (the default; consumable capacity, Kubernetes 1.36+ or the DRAConsumableCapacity
gate): each GPU is one device `gpu-<index>` with `allowMultipleAllocations: true` and two
capacities that the scheduler subtracts each allocation's share from:

- `memory`: the GPU's memory in bytes (written in whole MiB), requested in steps of 1 MiB, at
  least 1 MiB: the shim caps in whole MiB;
- `compute`: 100 (percent of the GPU), requested in steps of 1, from 1 to 100: the arbiter's
  shares are whole percent.

A claim that names neither gets the defaults: all of the GPU's memory and 100% of its compute,
that is a whole GPU, as a device-plugin pod that asks for no memory gets (kube/request.py).

**Partitions** (`--partitions 1,2,4`; for clusters without consumable capacity: partitionable
devices, Kubernetes 1.36+ or the DRAPartitionableDevices gate): each GPU is offered whole and
cut into each number of equal parts listed, `gpu-<index>-part<j>-of<k>`, each with its memory
(whole MiB, rounded down) and compute (100/k, rounded down). Every part consumes from its GPU's
counter set (`gpu-<index>`: the GPU's memory and 100 compute), so the scheduler never gives out
overlapping parts of one GPU beyond it: two halves, or a half and two quarters, or the whole.
A claim gets a whole device; it chooses the size by a selector on the device's capacity.

Attributes, for CEL selectors (`device.attributes["sharegpu.io"].model`): `model`, `uuid`,
`index`, `driverVersion` (a string: NVIDIA's versions are not always semantic versions),
`sharegpuVersion` (a version), and `parts` (an int: this device is one of that many equal parts
of its GPU; 1 for the whole).

The slices are named `<node>-sharegpu.io` (then `-2`, `-3`, ... and `-counters`, `-counters-2`,
... when there are more: the API allows 64 devices that consume counters, and 8 counter sets, per
slice), all in pool `<node>`, owned by the Node object (deleting the node deletes them). The
pool's generation is raised at every change, as the API asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sharegpu import __version__
from sharegpu.devices import Gpu
from sharegpu.errors import SharegpuError
from sharegpu.spec import MIB

DRIVER = "sharegpu.io"
RESOURCE_API = "resource.k8s.io/v1"
MEMORY = "memory"
COMPUTE = "compute"
MAX_PARTS = 16  # of one GPU: whole-percent compute, and a listing a human can read
DEVICES_PER_SLICE = 64  # devices that consume counters, per slice (the API's limit)
COUNTER_SETS_PER_SLICE = 8  # (the API's limit)


@dataclass(frozen=True)
class Part:
    """A device of the slices: a whole GPU, or one of `of` equal parts of it."""

    name: str
    gpu: Gpu
    memory_bytes: int
    compute_pct: int
    of: int = 1


def slice_name(node: str, n: int = 1, *, counters: bool = False) -> str:
    base = f"{node}-{DRIVER}" + ("-counters" if counters else "")
    return base if n == 1 else f"{base}-{n}"


def counter_set(gpu: Gpu) -> str:
    return f"gpu-{gpu.index}"


def check_partitions(partitions: Sequence[int]) -> tuple[int, ...]:
    """The partition mode's parts per GPU, sorted; SharegpuError for a list the slices cannot
    carry."""
    if any(not 1 <= k <= MAX_PARTS for k in partitions) or len(set(partitions)) != len(partitions):
        raise SharegpuError(
            f"--partitions {','.join(map(str, partitions))}: each a different number of parts "
            f"from 1 to {MAX_PARTS}"
        )
    return tuple(sorted(partitions))


def device_names(index: int, partitions: Sequence[int] = ()) -> list[tuple[str, int]]:
    """The devices GPU `index` is published as, each with the number of equal parts it is one
    of: the GPU whole (shared mode), or each part of each size listed; by size."""
    if not partitions:
        return [(f"gpu-{index}", 1)]
    return [
        (f"gpu-{index}" if k == 1 else f"gpu-{index}-part{j}-of{k}", k) for k in partitions for j in range(k)
    ]


def parts(gpus: Sequence[Gpu], partitions: Sequence[int] = ()) -> list[Part]:
    """The devices to publish: each GPU whole (shared mode, no partitions), or whole and in
    parts; by GPU index, then by size."""
    out = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        memory_mib = gpu.memory_total // MIB
        for name, k in device_names(gpu.index, partitions):
            out.append(Part(name, gpu, memory_mib // k * MIB, 100 // k, k))
    return out


def _attributes(part: Part, driver_version: str) -> dict[str, Any]:
    return {
        "model": {"string": part.gpu.name},
        "uuid": {"string": part.gpu.uuid},
        "index": {"int": part.gpu.index},
        "driverVersion": {"string": driver_version},
        "sharegpuVersion": {"version": __version__},
        "parts": {"int": part.of},
    }


def shared_device(part: Part, driver_version: str) -> dict[str, Any]:
    memory = f"{part.memory_bytes // MIB}Mi"
    return {
        "name": part.name,
        "allowMultipleAllocations": True,
        "attributes": _attributes(part, driver_version),
        "capacity": {
            MEMORY: {
                "value": memory,
                "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "step": "1Mi"}},
            },
            COMPUTE: {
                "value": "100",
                "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
            },
        },
    }


def partition_device(part: Part, driver_version: str) -> dict[str, Any]:
    size = {MEMORY: {"value": f"{part.memory_bytes // MIB}Mi"}, COMPUTE: {"value": str(part.compute_pct)}}
    return {
        "name": part.name,
        "attributes": _attributes(part, driver_version),
        "capacity": size,
        "consumesCounters": [{"counterSet": counter_set(part.gpu), "counters": size}],
    }


def devices_of(gpus: Sequence[Gpu], driver_version: str) -> list[dict[str, Any]]:
    """The shared mode's devices, by GPU index."""
    return [shared_device(p, driver_version) for p in parts(gpus)]


def _slice(name: str, node: str, node_uid: str, generation: int, count: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {
            "name": name,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            **spec,
        },
    }


def resource_slice(
    node: str, node_uid: str, devices: list[dict[str, Any]], generation: int
) -> dict[str, Any]:
    """The shared mode's one ResourceSlice for `node` (a node with no GPU has one with no
    devices: the pool stays known, and empty)."""
    return _slice(slice_name(node), node, node_uid, generation, 1, devices=devices)


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)] or [[]]


def node_slices(
    node: str,
    node_uid: str,
    gpus: Sequence[Gpu],
    driver_version: str,
    *,
    generation: int,
    partitions: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """Every ResourceSlice of the node's pool, in the mode `partitions` says."""
    if not partitions:
        return [resource_slice(node, node_uid, devices_of(gpus, driver_version), generation)]
    devices = _chunks(
        [partition_device(p, driver_version) for p in parts(gpus, partitions)], DEVICES_PER_SLICE
    )
    counters = [
        {
            "name": counter_set(g),
            "counters": {MEMORY: {"value": f"{g.memory_total // MIB}Mi"}, COMPUTE: {"value": "100"}},
        }
        for g in sorted(gpus, key=lambda g: g.index)
    ]
    counter_chunks = _chunks(counters, COUNTER_SETS_PER_SLICE) if counters else []
    count = len(devices) + len(counter_chunks)
    out = [
        _slice(slice_name(node, n), node, node_uid, generation, count, devices=chunk)
        for n, chunk in enumerate(devices, 1)
    ]
    out += [
        _slice(slice_name(node, n, counters=True), node, node_uid, generation, count, sharedCounters=chunk)
        for n, chunk in enumerate(counter_chunks, 1)
    ]
    return out
