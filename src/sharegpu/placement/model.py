"""The typed input and output of placement: nodes, requests, placements and reasons for no fit.

Units follow the rest of sharegpu at the edges: memory in MiB, compute in thousandths of a GPU
("milli", 1000 = a whole GPU, 300 = 30%), host CPU in milli-cores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from sharegpu.errors import SpecError

FULL_GPU = 1000
"""Compute of one whole GPU, in milli."""


class Priority(StrEnum):
    """The priority class of a request, as in the vGPU spec."""

    online = "online"
    normal = "normal"
    offline = "offline"


@dataclass(frozen=True)
class Topology:
    """Which GPUs of a node talk fast to each other.

    ``nvlink`` lists the NVLink groups (GPUs fully connected by NVLink), ``pcie`` the PCIe switches
    (GPUs under one switch). A GPU in no group is connected only through the host. The distance
    between two GPUs is 1 within an NVLink group, 2 under one PCIe switch and 3 otherwise; a set
    of GPUs is the better connected the smaller the sum of its pairwise distances.
    """

    gpus: int
    nvlink: tuple[tuple[int, ...], ...] = ()
    pcie: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        for kind, groups in (("nvlink", self.nvlink), ("pcie", self.pcie)):
            seen: set[int] = set()
            for group in groups:
                for gpu in group:
                    if not 0 <= gpu < self.gpus:
                        raise SpecError(
                            f"{kind} group {list(group)} names GPU {gpu} of a {self.gpus}-GPU node"
                        )
                    if gpu in seen:
                        raise SpecError(f"GPU {gpu} is in two {kind} groups")
                    seen.add(gpu)

    def distance(self, a: int, b: int) -> int:
        if a == b:
            return 0
        if any(a in g and b in g for g in self.nvlink):
            return 1
        if any(a in g and b in g for g in self.pcie):
            return 2
        return 3

    def cost(self, gpus: tuple[int, ...]) -> int:
        """Sum of pairwise distances: 0 for one GPU, smaller is better connected."""
        return sum(self.distance(a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :])

    @classmethod
    def default(cls, gpus: int, model: str) -> Topology:
        """A plausible layout when the node list says nothing: PCIe switches of two GPUs, and
        NVLink groups of four on 4- and 8-GPU nodes of SXM-class models (not T4, A10 or P100)."""
        pcie = tuple(tuple(range(i, min(i + 2, gpus))) for i in range(0, gpus, 2)) if gpus > 2 else ()
        nvlink: tuple[tuple[int, ...], ...] = ()
        if gpus >= 4 and model.upper() not in _PCIE_ONLY_MODELS:
            nvlink = tuple(tuple(range(i, min(i + 4, gpus))) for i in range(0, gpus, 4))
        return cls(gpus=gpus, nvlink=nvlink, pcie=pcie)

    @classmethod
    def parse(cls, gpus: int, text: str) -> Topology:
        """Parse ``nvlink:0,1,2,3|4,5,6,7 pcie:0,1|2,3`` (either part may be missing)."""
        parts: dict[str, tuple[tuple[int, ...], ...]] = {"nvlink": (), "pcie": ()}
        for chunk in text.split():
            kind, sep, body = chunk.partition(":")
            if not sep or kind not in parts:
                raise SpecError(f"invalid topology {text!r}: expected 'nvlink:0,1|2,3 pcie:0,1|2,3'")
            try:
                parts[kind] = tuple(
                    tuple(int(x) for x in group.split(",")) for group in body.split("|") if group
                )
            except ValueError:
                raise SpecError(f"invalid topology {text!r}: GPU indexes must be integers") from None
        return cls(gpus=gpus, nvlink=parts["nvlink"], pcie=parts["pcie"])


_PCIE_ONLY_MODELS = frozenset({"T4", "A10", "A10G", "P100", "P4", "L4", "L40", "L40S", "A30", "A2"})


@dataclass(frozen=True)
class Node:
    """One node: its host resources and its GPUs (all of one model, as in real nodes)."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int = 0
    model: str = ""
    gpu_memory_mib: int = 0
    """Memory of each GPU; 0 when unknown (then only requests that ask no GPU memory fit)."""
    gpu_compute_milli: int = FULL_GPU
    topology: Topology | None = None
    """None: Topology.default(gpus, model)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("a node needs a name")
        for label, value in (
            ("cpu_milli", self.cpu_milli),
            ("memory_mib", self.memory_mib),
            ("gpus", self.gpus),
            ("gpu_memory_mib", self.gpu_memory_mib),
        ):
            if value < 0:
                raise SpecError(f"node {self.name}: {label} must not be negative, got {value}")
        if self.gpus and not self.model:
            raise SpecError(f"node {self.name}: {self.gpus} GPUs but no GPU model")
        if self.gpu_compute_milli <= 0:
            raise SpecError(f"node {self.name}: gpu_compute_milli must be positive")
        if self.topology is not None and self.topology.gpus != self.gpus:
            raise SpecError(
                f"node {self.name}: topology describes {self.topology.gpus} GPUs, node has {self.gpus}"
            )

    @property
    def layout(self) -> Topology:
        return self.topology if self.topology is not None else Topology.default(self.gpus, self.model)


@dataclass(frozen=True)
class Request:
    """What a pod asks for: ``count`` vGPUs of ``compute_milli`` and ``memory_mib`` each, plus host
    CPU and memory. ``count`` 0 is a pod without GPUs. ``models`` empty means any GPU model."""

    count: int = 1
    compute_milli: int = FULL_GPU
    memory_mib: int = 0
    cpu_milli: int = 0
    host_memory_mib: int = 0
    models: frozenset[str] = field(default_factory=frozenset)
    priority: Priority = Priority.normal
    name: str = ""

    def __post_init__(self) -> None:
        label = f"request {self.name}" if self.name else "request"
        if self.count < 0:
            raise SpecError(f"{label}: GPU count must not be negative, got {self.count}")
        if self.count > 0 and not 0 < self.compute_milli <= FULL_GPU:
            raise SpecError(f"{label}: compute must be 1..1000 milli (0.1%..100%), got {self.compute_milli}")
        for what, value in (
            ("memory", self.memory_mib),
            ("CPU", self.cpu_milli),
            ("host memory", self.host_memory_mib),
        ):
            if value < 0:
                raise SpecError(f"{label}: {what} must not be negative, got {value}")

    @property
    def gpu_milli(self) -> int:
        """Total GPU compute asked for, in milli (the unit of GPU demand and allocation)."""
        return self.count * self.compute_milli if self.count else 0

    @property
    def shape(self) -> tuple[int, int, int, int, int, frozenset[str]]:
        """What placement depends on (not the name or priority): the key of per-shape caches."""
        compute = self.compute_milli if self.count else 0
        memory = self.memory_mib if self.count else 0
        return (self.count, compute, memory, self.cpu_milli, self.host_memory_mib, self.models)

    def describe(self) -> str:
        gpu = "no GPU" if self.count == 0 else f"{self.count} x {self.compute_milli / 10:g}% GPU"
        if self.count and self.memory_mib:
            gpu += f" / {self.memory_mib} MiB"
        models = f" on {'|'.join(sorted(self.models))}" if self.models else ""
        return f"{gpu}{models}, {self.cpu_milli / 1000:g} CPU, {self.host_memory_mib} MiB host memory"


@dataclass(frozen=True)
class Placement:
    """Where a request goes: a node and the indexes of its GPUs (one per vGPU)."""

    node: str
    node_index: int
    gpus: tuple[int, ...]


class NoFitReason(StrEnum):
    """Why a request was not placed, from the most permanent to the most transient."""

    no_such_model = "no_such_model"
    """No node has a GPU of an allowed model."""
    too_large = "too_large"
    """No node could hold the request even empty (too many GPUs, too much CPU or memory)."""
    host_resources = "host_resources"
    """Nodes that could hold the GPUs lack free CPU or host memory now."""
    gpu_resources = "gpu_resources"
    """Not enough free GPUs, GPU compute or GPU memory on any node now."""


@dataclass(frozen=True)
class NoFit:
    """A request that fits nowhere, and why, in words a person reads."""

    reason: NoFitReason
    message: str

    def __str__(self) -> str:
        return self.message


Decision = Placement | NoFit
