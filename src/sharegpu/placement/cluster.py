"""The live state of a cluster as arrays, updated in place one allocation at a time.

Every per-GPU figure is an ``[N, G]`` array (N nodes, G the most GPUs on one node; slots past a
node's GPU count hold -1 free and never fit). A placement changes one node, so everything derived
per node (the fragmentation of each node, the caches of the policies) is refreshed for that node
only: a node's ``version`` increases on every change and caches compare it with what they saw.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sharegpu.errors import SpecError
from sharegpu.placement.fragmentation import FragmentationTracker
from sharegpu.placement.model import Node, Placement, Priority, Request, Topology
from sharegpu.placement.workload import Workload

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Allocation:
    """A request placed on a node: what the cluster state holds per tenant."""

    id: str
    node: int
    gpus: tuple[int, ...]
    request: Request


class TopologyTables:
    """Per distinct topology: GPU-set candidates sorted from best to worst connected."""

    def __init__(self, topo: Topology, width: int) -> None:
        self.topology = topo
        self.same_nvlink = np.zeros((width, width), dtype=np.bool_)
        self.same_pcie = np.zeros((width, width), dtype=np.bool_)
        for groups, matrix in ((topo.nvlink, self.same_nvlink), (topo.pcie, self.same_pcie)):
            for group in groups:
                for a in group:
                    for b in group:
                        matrix[a, b] = True
        for g in range(topo.gpus):
            self.same_nvlink[g, g] = self.same_pcie[g, g] = True
        # combos[k]: every k-subset of the node's GPUs as a bool row, best connected first.
        self.combos: dict[int, BoolArray] = {}
        self.costs: dict[int, IntArray] = {}
        for k in range(1, topo.gpus + 1):
            subsets = sorted(itertools.combinations(range(topo.gpus), k), key=lambda s: (topo.cost(s), s))
            rows = np.zeros((len(subsets), width), dtype=np.bool_)
            for i, s in enumerate(subsets):
                rows[i, list(s)] = True
            self.combos[k] = rows
            self.costs[k] = np.array([topo.cost(s) for s in subsets], dtype=np.int64)


class ClusterState:
    """Nodes, their free resources and the allocations on them."""

    def __init__(self, nodes: Sequence[Node], workload: Workload | None = None) -> None:
        if not nodes:
            raise SpecError("a cluster needs at least one node")
        self.nodes = tuple(nodes)
        self.index: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node.name in self.index:
                raise SpecError(f"two nodes are named {node.name}")
            self.index[node.name] = i
        n = len(self.nodes)
        self.width = width = max(1, *(node.gpus for node in self.nodes))
        self.models: tuple[str, ...] = tuple(sorted({node.model for node in self.nodes if node.gpus}))
        model_ids = {m: i for i, m in enumerate(self.models)}
        self.model_id: IntArray = np.array(
            [model_ids[node.model] if node.gpus else -1 for node in self.nodes], dtype=np.int64
        )
        self.ngpu: IntArray = np.array([node.gpus for node in self.nodes], dtype=np.int64)
        self.valid: BoolArray = np.arange(width)[None, :] < self.ngpu[:, None]
        self.cap_c: IntArray = np.where(
            self.valid, np.array([node.gpu_compute_milli for node in self.nodes])[:, None], 0
        ).astype(np.int64)
        self.cap_m: IntArray = np.where(
            self.valid, np.array([node.gpu_memory_mib for node in self.nodes])[:, None], 0
        ).astype(np.int64)
        self.free_c: IntArray = np.where(self.valid, self.cap_c, -1)
        self.free_m: IntArray = np.where(self.valid, self.cap_m, -1)
        self.cpu_cap: IntArray = np.array([node.cpu_milli for node in self.nodes], dtype=np.int64)
        self.mem_cap: IntArray = np.array([node.memory_mib for node in self.nodes], dtype=np.int64)
        self.cpu_free: IntArray = self.cpu_cap.copy()
        self.mem_free: IntArray = self.mem_cap.copy()
        self.tenants: IntArray = np.zeros((n, width), dtype=np.int64)
        self.online: IntArray = np.zeros((n, width), dtype=np.int64)
        self.node_online: IntArray = np.zeros(n, dtype=np.int64)
        self.version: IntArray = np.zeros(n, dtype=np.int64)
        self.set_cache: dict[tuple[int, int, int], tuple[IntArray, BoolArray]] = {}
        """(count, compute, memory) -> (node versions seen, [N, G] GPU sets): candidates.node_sets."""
        self.shape_count: dict[int, IntArray] = {}
        """compute_milli -> [N, G] number of tenants of that size on each GPU (GPU clustering)."""
        self.gpu_cap_node: IntArray = self.cap_c.sum(axis=1)
        self.capacity_milli = int(self.gpu_cap_node.sum())
        self.allocated_milli = 0
        tables: dict[Topology, int] = {}
        self.topo_tables: list[TopologyTables] = []
        topo_ids = []
        for node in self.nodes:
            layout = node.layout
            if layout not in tables:
                tables[layout] = len(self.topo_tables)
                self.topo_tables.append(TopologyTables(layout, width))
            topo_ids.append(tables[layout])
        self.topo_id: IntArray = np.array(topo_ids, dtype=np.int64)
        self.same_nvlink: BoolArray = np.stack([self.topo_tables[t].same_nvlink for t in topo_ids])
        self.same_pcie: BoolArray = np.stack([self.topo_tables[t].same_pcie for t in topo_ids])
        self._nvlink64: IntArray = self.same_nvlink.astype(np.int64)
        self._pcie64: IntArray = self.same_pcie.astype(np.int64)
        self._pressure: IntArray = np.zeros((n, width), dtype=np.int64)
        self._pressure_seen: IntArray = np.full(n, -1, dtype=np.int64)
        self.allocations: dict[str, Allocation] = {}
        self.node_allocations: list[dict[str, Allocation]] = [{} for _ in range(n)]
        self._next_id = 0
        self.workload = workload if workload is not None else Workload.default()
        self.frag = FragmentationTracker(self, self.workload)

    # -- queries -----------------------------------------------------------------------------

    def model_mask(self, models: frozenset[str]) -> BoolArray:
        """[N]: nodes whose GPU model is allowed (all GPU nodes when ``models`` is empty)."""
        if not models:
            return self.ngpu > 0
        ids = [i for i, m in enumerate(self.models) if m in models]
        mask: BoolArray = np.isin(self.model_id, ids)
        return mask

    def host_ok(self, request: Request) -> BoolArray:
        """[N]: nodes with the host CPU and memory, GPU model and GPU count the request needs now."""
        ok = (self.cpu_free >= request.cpu_milli) & (self.mem_free >= request.host_memory_mib)
        if request.count:
            ok &= self.model_mask(request.models) & (self.ngpu >= request.count)
        return ok

    def could_ever_host(self, request: Request) -> BoolArray:
        """[N]: nodes that could take the request when empty (host_ok on capacity, not on what is
        free): the only nodes whose state matters to a decision about it."""
        ok = (self.cpu_cap >= request.cpu_milli) & (self.mem_cap >= request.host_memory_mib)
        if request.count:
            fits = (self.cap_c >= request.compute_milli) & (self.cap_m >= request.memory_mib)
            ok &= self.model_mask(request.models) & (fits.sum(axis=1) >= request.count)
        return ok

    def idle(self, nodes: IntArray) -> BoolArray:
        """[len(nodes), G]: GPUs with nothing allocated."""
        idle: BoolArray = (
            self.valid[nodes]
            & (self.free_c[nodes] == self.cap_c[nodes])
            & (self.free_m[nodes] == self.cap_m[nodes])
        )
        return idle

    def group_pressure(self, nodes: IntArray) -> IntArray:
        """[len(nodes), G]: what taking each GPU would break, for keeping groups whole.

        0 for a GPU already in use (taking more of it breaks nothing); for an idle GPU, 1 plus the
        idle GPUs in its NVLink group plus those under its PCIe switch: taking from a group that is
        already broken is cheaper than breaking a whole one.
        """
        # Cached per node and recomputed only where the node changed: the tie key of an early
        # decision asks it for thousands of tied GPUs, which cost 1 ms a time (the slowest 1%).
        dirty = np.flatnonzero(self._pressure_seen != self.version)
        if len(dirty):
            idle = self.idle(dirty).astype(np.int64)
            nv = np.einsum("ngh,nh->ng", self._nvlink64[dirty], idle)
            pc = np.einsum("ngh,nh->ng", self._pcie64[dirty], idle)
            self._pressure[dirty] = idle * (1 + nv + pc)
            self._pressure_seen[dirty] = self.version[dirty]
        out: IntArray = self._pressure[nodes]
        return out

    @property
    def allocation_ratio(self) -> float:
        return self.allocated_milli / self.capacity_milli if self.capacity_milli else 0.0

    # -- changes -----------------------------------------------------------------------------

    def allocate(self, placement: Placement, request: Request, alloc_id: str | None = None) -> Allocation:
        """Record ``request`` on ``placement``; SpecError if it does not fit there."""
        n = placement.node_index
        if not 0 <= n < len(self.nodes) or self.nodes[n].name != placement.node:
            raise SpecError(f"unknown node {placement.node}")
        gpus = placement.gpus
        if len(gpus) != request.count or len(set(gpus)) != len(gpus):
            raise SpecError(f"request for {request.count} GPUs placed on GPUs {list(gpus)}")
        if any(not 0 <= g < self.ngpu[n] for g in gpus):
            raise SpecError(f"node {placement.node} has no GPU {max(gpus)}")
        if self.cpu_free[n] < request.cpu_milli or self.mem_free[n] < request.host_memory_mib:
            raise SpecError(f"node {placement.node} lacks the CPU or memory for {request.describe()}")
        for g in gpus:
            if self.free_c[n, g] < request.compute_milli or self.free_m[n, g] < request.memory_mib:
                raise SpecError(f"GPU {g} of node {placement.node} lacks room for {request.describe()}")
        if alloc_id is None:
            alloc_id = f"a{self._next_id}"
            self._next_id += 1
        elif alloc_id in self.allocations:
            raise SpecError(f"allocation {alloc_id} exists already")
        alloc = Allocation(id=alloc_id, node=n, gpus=tuple(gpus), request=request)
        self._apply(alloc, +1)
        self.allocations[alloc_id] = alloc
        self.node_allocations[n][alloc_id] = alloc
        return alloc

    def release(self, alloc_id: str) -> Allocation:
        alloc = self.allocations.pop(alloc_id, None)
        if alloc is None:
            raise SpecError(f"no allocation {alloc_id}")
        del self.node_allocations[alloc.node][alloc_id]
        self._apply(alloc, -1)
        return alloc

    def _apply(self, alloc: Allocation, sign: int) -> None:
        n, req = alloc.node, alloc.request
        self.cpu_free[n] -= sign * req.cpu_milli
        self.mem_free[n] -= sign * req.host_memory_mib
        if alloc.gpus:
            gpus = list(alloc.gpus)
            self.free_c[n, gpus] -= sign * req.compute_milli
            self.free_m[n, gpus] -= sign * req.memory_mib
            self.tenants[n, gpus] += sign
            counts = self.shape_count.get(req.compute_milli)
            if counts is None:
                counts = self.shape_count[req.compute_milli] = np.zeros_like(self.tenants)
            counts[n, gpus] += sign
            if req.priority is Priority.online:
                self.online[n, gpus] += sign
                self.node_online[n] += sign
            self.allocated_milli += sign * req.gpu_milli
        self.version[n] += 1
        self.frag.refresh(np.array([n]))
