"""The node's ResourceSlice: one device per GPU that many claims share (DRA consumable capacity).

Each GPU is a device `gpu-<index>` with `allowMultipleAllocations: true` and two capacities that
the scheduler subtracts each allocation's share from:

- `memory`: the GPU's memory in bytes (written in whole MiB), requested in steps of 1 MiB, at
  least 1 MiB: the shim caps in whole MiB;
- `compute`: 100 (percent of the GPU), requested in steps of 1, from 1 to 100: the arbiter's
  shares are whole percent.

A claim that names neither gets the defaults: all of the GPU's memory and 100% of its compute,
that is a whole GPU, as a device-plugin pod that asks for no memory gets (kube/request.py).

Attributes, for CEL selectors (`device.attributes["sharegpu.io"].model`): `model`, `uuid`,
`index`, `driverVersion` (a string: NVIDIA's versions are not always semantic versions) and
`sharegpuVersion` (a version).

The slice is named `<node>-sharegpu.io`, in pool `<node>`, owned by the Node object (deleting the
node deletes it). Its pool generation is raised at every change, as the API asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sharegpu import __version__
from sharegpu.devices import Gpu
from sharegpu.spec import MIB

DRIVER = "sharegpu.io"
RESOURCE_API = "resource.k8s.io/v1"
MEMORY = "memory"
COMPUTE = "compute"


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def device_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.index}"


def device(gpu: Gpu, driver_version: str) -> dict[str, Any]:
    memory = f"{gpu.memory_total // MIB}Mi"
    return {
        "name": device_name(gpu),
        "allowMultipleAllocations": True,
        "attributes": {
            "model": {"string": gpu.name},
            "uuid": {"string": gpu.uuid},
            "index": {"int": gpu.index},
            "driverVersion": {"string": driver_version},
            "sharegpuVersion": {"version": __version__},
        },
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


def devices_of(gpus: Sequence[Gpu], driver_version: str) -> list[dict[str, Any]]:
    """The slice's devices, by GPU index."""
    return [device(gpu, driver_version) for gpu in sorted(gpus, key=lambda g: g.index)]


def resource_slice(
    node: str, node_uid: str, devices: list[dict[str, Any]], generation: int
) -> dict[str, Any]:
    """The whole ResourceSlice object for `node` (a node with no GPU has one with no devices: the
    pool stays known, and empty)."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
            ],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
