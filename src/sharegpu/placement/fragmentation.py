"""GPU fragmentation of a node with respect to a workload (Weng et al., USENIX ATC'23, §4).

For one task shape m and node n, the fragment F_n(m) is the free GPU compute of n that m could
not use:

* if m cannot run on n at all (the node lacks the CPU or memory m needs, has no GPU of a model m
  accepts, has fewer usable GPUs than m asks, or m asks no GPU), every free GPU milli of n is a
  fragment;
* otherwise the fragments are the free milli of the GPUs that cannot take one of m's vGPUs
  (less free compute or GPU memory than m asks per vGPU).

The node's fragmentation is the popularity-weighted sum F_n = sum_m p_m F_n(m), and the
fragmentation gradient of a placement is the change of F_n it causes. Everything is computed
for many nodes (and, for one-GPU requests, every GPU of them) at once with numpy.

Shapes are grouped by their GPU part (count, compute, memory, models): within a group only the
host part (CPU, memory) differs, so "can m run" becomes a weight P_g(cpu, mem) = the popularity of
the group's shapes whose host needs fit, and

    F_n = sum_g [cnt_g >= k_g] (P_g A_g + (W_g - P_g) T) + [cnt_g < k_g] W_g T + W_0 T

with A_g the free milli on GPUs unusable by group g, cnt_g the GPUs usable by it, T the node's
free milli, W_g the group's popularity and W_0 that of the shapes without GPUs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sharegpu.placement.workload import Workload

if TYPE_CHECKING:
    from sharegpu.placement.cluster import BoolArray, ClusterState, FloatArray, IntArray


class FragmentationTracker:
    """Per-node fragmentation of one cluster state, kept current node by node."""

    def __init__(self, state: ClusterState, workload: Workload) -> None:
        self.state = state
        weights = workload.normalised()
        groups: dict[tuple[int, int, int, frozenset[str]], int] = {}
        type_group: list[int] = []
        cpu: list[int] = []
        mem: list[int] = []
        p: list[float] = []
        w0 = 0.0
        for shape, w in zip(workload.shapes, weights, strict=True):
            if shape.count == 0:
                w0 += w
                continue
            key = (shape.count, shape.compute_milli, shape.memory_mib, shape.models)
            type_group.append(groups.setdefault(key, len(groups)))
            cpu.append(shape.cpu_milli)
            mem.append(shape.host_memory_mib)
            p.append(w)
        keys = list(groups)
        self.w0 = w0
        self.k: IntArray = np.array([k[0] for k in keys], dtype=np.int64)
        self.gc: IntArray = np.array([k[1] for k in keys], dtype=np.int64)
        self.gm: IntArray = np.array([k[2] for k in keys], dtype=np.int64)
        self.type_cpu: IntArray = np.array(cpu, dtype=np.int64)
        self.type_mem: IntArray = np.array(mem, dtype=np.int64)
        self.pmat: FloatArray = np.zeros((len(p), len(keys)))
        self.pmat[np.arange(len(p)), type_group] = p
        self.w: FloatArray = self.pmat.sum(axis=0)
        # model_ok[model id + 1, group]: row 0 is "no GPU".
        self.model_ok: BoolArray = np.zeros((len(state.models) + 1, len(keys)), dtype=np.bool_)
        for gi, key in enumerate(keys):
            for mi, model in enumerate(state.models):
                self.model_ok[mi + 1, gi] = not key[3] or model in key[3]
        n = len(state.nodes)
        self.a: FloatArray = np.zeros((n, len(keys)))
        self.cnt: IntArray = np.zeros((n, len(keys)), dtype=np.int64)
        self.total: IntArray = np.zeros(n, dtype=np.int64)
        self.f: FloatArray = np.zeros(n)
        self.refresh(np.arange(n))

    # -- building blocks -----------------------------------------------------------------------

    def host_weight(self, cpu: IntArray, mem: IntArray, model: IntArray) -> FloatArray:
        """[d, groups]: P_g, the popularity of each group's shapes whose host needs fit."""
        fits = (self.type_cpu[None, :] <= cpu[:, None]) & (self.type_mem[None, :] <= mem[:, None])
        weight: FloatArray = fits.astype(np.float64) @ self.pmat
        return weight * self.model_ok[model + 1]

    def _usable(self, fc: IntArray, fm: IntArray) -> BoolArray:
        """[..., groups]: can a GPU with ``fc`` free milli and ``fm`` free MiB take one vGPU of g."""
        return (fc[..., None] >= self.gc) & (fm[..., None] >= self.gm)

    def _combine(self, p: FloatArray, a: FloatArray, cnt: IntArray, total: FloatArray) -> FloatArray:
        """F from its parts; ``total`` broadcasts against ``a`` without the group axis."""
        t = total[..., None]
        runs = cnt >= self.k
        per_group = np.where(runs, p * a + (self.w - p) * t, self.w * t)
        out: FloatArray = per_group.sum(axis=-1) + self.w0 * total
        return out

    def evaluate(
        self, cpu: IntArray, mem: IntArray, model: IntArray, *, fc: IntArray, fm: IntArray, valid: BoolArray
    ) -> FloatArray:
        """[d]: F of arbitrary node states (free CPU, memory, per-GPU free compute and memory)."""
        usable = self._usable(fc, fm) & valid[..., None]
        unusable_free = np.where(valid[..., None] & ~usable, fc[..., None], 0)
        a = unusable_free.sum(axis=1).astype(np.float64)
        cnt = usable.sum(axis=1)
        total = np.where(valid, fc, 0).sum(axis=1).astype(np.float64)
        return self._combine(self.host_weight(cpu, mem, model), a, cnt, total)

    # -- the tracked state ---------------------------------------------------------------------

    def refresh(self, nodes: IntArray) -> None:
        s = self.state
        valid = s.valid[nodes]
        fc, fm = s.free_c[nodes], s.free_m[nodes]
        usable = self._usable(fc, fm) & valid[..., None]
        self.a[nodes] = np.where(valid[..., None] & ~usable, fc[..., None], 0).sum(axis=1)
        self.cnt[nodes] = usable.sum(axis=1)
        self.total[nodes] = np.where(valid, fc, 0).sum(axis=1)
        p = self.host_weight(s.cpu_free[nodes], s.mem_free[nodes], s.model_id[nodes])
        self.f[nodes] = self._combine(p, self.a[nodes], self.cnt[nodes], self.total[nodes].astype(np.float64))

    @property
    def cluster_fragmentation(self) -> float:
        """Sum of F_n over the cluster, in milli-GPU."""
        return float(self.f.sum())

    # -- gradients ------------------------------------------------------------------------------

    def delta_one(self, nodes: IntArray, request_c: int, request_m: int, cpu: int, mem: int) -> FloatArray:
        """[d, G]: change of F_n when one vGPU (``request_c`` milli, ``request_m`` MiB, with
        ``cpu``/``mem`` of host) goes onto each GPU of ``nodes``. Slots that cannot take it hold
        garbage: the caller masks them."""
        s = self.state
        fc, fm = s.free_c[nodes], s.free_m[nodes]
        before = self._usable(fc, fm)
        after = self._usable(fc - request_c, fm - request_m)
        a = (
            self.a[nodes][:, None, :]
            - np.where(before, 0, fc[..., None])
            + np.where(after, 0, (fc - request_c)[..., None])
        )
        cnt = self.cnt[nodes][:, None, :] - before + after
        total = np.broadcast_to((self.total[nodes] - request_c).astype(np.float64)[:, None], fc.shape)
        p = self.host_weight(s.cpu_free[nodes] - cpu, s.mem_free[nodes] - mem, s.model_id[nodes])
        f_after = self._combine(p[:, None, :], a, cnt, total)
        out: FloatArray = f_after - self.f[nodes][:, None]
        return out

    def delta_sets(
        self, nodes: IntArray, sets: BoolArray, request_c: int, request_m: int, *, cpu: int, mem: int
    ) -> FloatArray:
        """[d]: change of F_n when one vGPU goes on each GPU marked in ``sets`` (may be empty)."""
        s = self.state
        fc = s.free_c[nodes] - np.where(sets, request_c, 0)
        fm = s.free_m[nodes] - np.where(sets, request_m, 0)
        after = self.evaluate(
            s.cpu_free[nodes] - cpu,
            s.mem_free[nodes] - mem,
            s.model_id[nodes],
            fc=fc,
            fm=fm,
            valid=s.valid[nodes],
        )
        out: FloatArray = after - self.f[nodes]
        return out
