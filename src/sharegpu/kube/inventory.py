"""A node's GPUs as the scheduler extender sees them: the inventory the node's sharegpu agent
publishes on its Node object, and the node's host resources.

The node component writes the annotation `sharegpu.io/inventory` (JSON: each GPU's index, UUID,
model and memory, and when it was published) and refreshes it every `PUBLISH_INTERVAL_S`. An
inventory older than `STALE_AFTER_S` is stale: its agent is down or cut off, and nothing is
placed on the node until it is fresh again (a GPU may have fallen off meanwhile).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sharegpu.errors import SpecError
from sharegpu.kube.request import PREFIX, read_versioned
from sharegpu.placement import Node

ANNOTATION_INVENTORY = PREFIX + "inventory"
VERSION = 1
PUBLISH_INTERVAL_S = 10.0
STALE_AFTER_S = 60.0

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")
_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "m": 10**-3}


class InventoryError(SpecError):
    """A node's inventory cannot be read (bad input on the Node object)."""


class InventoryGpu(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0)
    uuid: str = Field(min_length=1)
    model: str = Field(min_length=1)
    memory_mib: int = Field(gt=0)


class Inventory(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = VERSION
    gpus: tuple[InventoryGpu, ...]
    published_at: float = Field(description="Unix time the agent wrote it")

    def to_annotation(self) -> str:
        return self.model_dump_json()


def quantity(text: object) -> float:
    """A Kubernetes resource quantity ("32", "500m", "256Gi", "1e3" is not one) as a number."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        raise InventoryError(f"not a resource quantity: {text!r}")
    number, suffix = float(match.group(1)), match.group(2)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    raise InventoryError(f"not a resource quantity: {text!r} (unknown suffix {suffix!r})")


def node_name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name", ""))


def read_inventory(node: Mapping[str, Any]) -> Inventory | None:
    """The node's published inventory; None when it has none (no sharegpu agent on it)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ANNOTATION_INVENTORY)
    if text is None:
        return None
    where = f"node {node_name(node)}: {ANNOTATION_INVENTORY}"
    return read_versioned(Inventory, text, where=where, version=VERSION, error=InventoryError)


def placement_node(node: Mapping[str, Any], inventory: Inventory) -> Node:
    """The node for sharegpu.placement: its allocatable CPU and memory, and its GPUs (one
    model per node, as the placement model has it; a node of mixed models is refused)."""
    name = node_name(node)
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpu_milli = round(quantity(allocatable.get("cpu", "0")) * 1000)
        memory_mib = int(quantity(allocatable.get("memory", "0")) // (1 << 20))
    except InventoryError as err:
        raise InventoryError(f"node {name}: allocatable {err}") from err
    models = sorted({g.model for g in inventory.gpus})
    if len(models) > 1:
        raise InventoryError(f"node {name}: GPUs of several models ({', '.join(models)}): not supported")
    return Node(
        name=name,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=len(inventory.gpus),
        model=models[0] if models else "",
        gpu_memory_mib=min((g.memory_mib for g in inventory.gpus), default=0),
    )
