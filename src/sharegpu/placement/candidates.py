"""Where a request could go now: every candidate node, and for a GPU request the GPUs it would
use (one GPU for a one-GPU request; for a multi-GPU request the best-connected set of fitting
GPUs on each node, taken preferably from groups already broken). The placement engine narrows
these with keys (engine.py); the policies compute their keys over them (policies.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sharegpu.placement.model import Request

if TYPE_CHECKING:
    from sharegpu.placement.cluster import BoolArray, ClusterState, IntArray

Key = Callable[["IntArray"], "np.ndarray"]
"""Values (smaller is better) of a key for the candidates at the given positions."""


@dataclass
class Candidates:
    """Where a request could go now. ``slots`` for one-GPU requests, ``sets`` for multi-GPU ones."""

    request: Request
    nodes: IntArray
    slots: IntArray | None = None
    sets: BoolArray | None = None

    def __len__(self) -> int:
        return len(self.nodes)

    def gpus(self, i: int) -> tuple[int, ...]:
        if self.slots is not None:
            return (int(self.slots[i]),)
        if self.sets is not None:
            return tuple(int(g) for g in np.flatnonzero(self.sets[i]))
        return ()


def candidates(state: ClusterState, request: Request) -> Candidates:
    ok = state.host_ok(request)
    if request.count == 0:
        return Candidates(request, np.flatnonzero(ok))
    fit = ok[:, None] & (state.free_c >= request.compute_milli) & (state.free_m >= request.memory_mib)
    if request.count == 1:
        nodes, slots = np.nonzero(fit)
        return Candidates(request, nodes.astype(np.int64), slots=slots.astype(np.int64))
    nodes = np.flatnonzero(fit.sum(axis=1) >= request.count)
    sets = node_sets(state, request.count, request.compute_milli, request.memory_mib)
    return Candidates(request, nodes, sets=sets[nodes])


def node_sets(state: ClusterState, count: int, compute: int, memory: int) -> BoolArray:
    """[N, G]: ``gpu_sets`` of every node for vGPUs of this size (empty rows where they do not
    fit), cached per size and recomputed only for nodes that changed."""
    key = (count, compute, memory)
    entry = state.set_cache.get(key)
    if entry is None:
        entry = state.set_cache[key] = (
            np.full(len(state.nodes), -1, dtype=np.int64),
            np.zeros((len(state.nodes), state.width), dtype=np.bool_),
        )
    seen, sets = entry
    dirty = np.flatnonzero(seen != state.version)
    if len(dirty):
        fit = (state.free_c[dirty] >= compute) & (state.free_m[dirty] >= memory)
        ok = fit.sum(axis=1) >= count
        sets[dirty] = False
        if ok.any():
            sets[dirty[ok]] = gpu_sets(state, dirty[ok], fit[ok], count)
        seen[dirty] = state.version[dirty]
    return sets


def gpu_sets(state: ClusterState, nodes: IntArray, fit: BoolArray, count: int) -> BoolArray:
    """[len(nodes), G]: per node, the best-connected ``count`` GPUs among ``fit``, ties going to
    GPUs whose NVLink group or PCIe switch is already broken."""
    out = np.zeros((len(nodes), state.width), dtype=np.bool_)
    if not len(nodes):
        return out
    pressure = state.group_pressure(nodes)
    topo = state.topo_id[nodes]
    for t in np.unique(topo):
        rows = np.flatnonzero(topo == t)
        tables = state.topo_tables[int(t)]
        combos = tables.combos[count]
        ok = ~(combos[None, :, :] & ~fit[rows][:, None, :]).any(axis=2)
        score = tables.costs[count][None, :] * (1 << 20) + pressure[rows] @ combos.T.astype(np.int64)
        best = np.where(ok, score, np.iinfo(np.int64).max).argmin(axis=1)
        out[rows] = combos[best]
    return out
