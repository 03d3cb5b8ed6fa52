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
free milli, W_g the group's popularity and W_0 that of the shapes without GPUs. A group that may
not use the node's GPU model has P_g = 0, so its term is W_g T whatever the node's state: the
gradients sum only over the groups each model allows (``GroupView``), which with pods pinned to
models is a fraction of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sharegpu.placement.workload import Workload

if TYPE_CHECKING:
    from sharegpu.placement.cluster import BoolArray, ClusterState, FloatArray, IntArray


@dataclass(frozen=True)
class GroupView:
    """Some of the workload's GPU groups (columns ``groups`` of the tracker's arrays), with the
    shapes in them and ``w_rest``, the popularity of the groups left out (each counts the whole
    free GPU as fragment), so that F computed from the view alone is the node's whole F."""

    groups: IntArray | slice
    k: IntArray
    gc: IntArray
    gm: IntArray
    w: FloatArray
    pmat: FloatArray
    type_cpu: IntArray
    type_mem: IntArray
    model_ok: BoolArray
    w_rest: float

    @classmethod
    def of(cls, tracker: FragmentationTracker, chosen: BoolArray) -> GroupView:
        # All groups as a slice: indexing with it is a view, not a copy.
        groups = slice(None) if chosen.all() else np.flatnonzero(chosen)
        types = np.flatnonzero(tracker.pmat[:, groups].any(axis=1))
        return cls(
            groups=groups,
            k=tracker.k[groups],
            gc=tracker.gc[groups],
            gm=tracker.gm[groups],
            w=tracker.w[groups],
            pmat=tracker.pmat[types][:, groups],
            type_cpu=tracker.type_cpu[types],
            type_mem=tracker.type_mem[types],
            model_ok=tracker.model_ok[:, groups],
            w_rest=float(tracker.w[~chosen].sum()),
        )

    def host_weight(self, cpu: IntArray, mem: IntArray, model: IntArray) -> FloatArray:
        """[d, groups]: P_g, the popularity of each group's shapes whose host needs fit."""
        fits = (self.type_cpu[None, :] <= cpu[:, None]) & (self.type_mem[None, :] <= mem[:, None])
        weight: FloatArray = fits.astype(np.float64) @ self.pmat
        return weight * self.model_ok[model + 1]

    def usable(self, fc: IntArray, fm: IntArray) -> BoolArray:
        """[..., groups]: can a GPU with ``fc`` free milli and ``fm`` free MiB take one vGPU of g."""
        return (fc[..., None] >= self.gc) & (fm[..., None] >= self.gm)

    def combine(
        self, p: FloatArray, a: FloatArray, cnt: IntArray, total: FloatArray, *, w0: float
    ) -> FloatArray:
        """F from its parts (``w0``: popularity of the shapes without GPUs); ``total`` broadcasts
        against ``a`` without the group axis."""
        t = total[..., None]
        runs = cnt >= self.k
        per_group = np.where(runs, p * a + (self.w - p) * t, self.w * t)
        out: FloatArray = per_group.sum(axis=-1) + (w0 + self.w_rest) * total
        return out


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
        self.all = GroupView.of(self, np.ones(len(keys), dtype=np.bool_))
        # Models that may serve the same groups share a view; view_of[model id + 1] names it.
        seen: dict[bytes, int] = {}
        self.view_of: IntArray = np.array(
            [seen.setdefault(ok.tobytes(), len(seen)) for ok in self.model_ok], dtype=np.int64
        )
        self.views = [GroupView.of(self, np.frombuffer(ok, dtype=np.bool_)) for ok in seen]
        n = len(state.nodes)
        self.a: FloatArray = np.zeros((n, len(keys)))
        self.cnt: IntArray = np.zeros((n, len(keys)), dtype=np.int64)
        self.total: IntArray = np.zeros(n, dtype=np.int64)
        self.f: FloatArray = np.zeros(n)
        self.refresh(np.arange(n))

    def _per_model(self, model: IntArray) -> list[tuple[IntArray | slice, GroupView]]:
        """Positions in ``model`` (GPU model ids) grouped by the view of their model."""
        view = self.view_of[model + 1]
        if not len(view) or (view == view[0]).all():
            return [(slice(None), self.views[int(view[0]) if len(view) else 0])]
        return [(np.flatnonzero(view == v), self.views[int(v)]) for v in np.unique(view)]

    def evaluate(
        self, cpu: IntArray, mem: IntArray, model: IntArray, *, fc: IntArray, fm: IntArray, valid: BoolArray
    ) -> FloatArray:
        """[d]: F of arbitrary node states (free CPU, memory, per-GPU free compute and memory)."""
        out: FloatArray = np.empty(len(model))
        for rows, view in self._per_model(model):
            usable = view.usable(fc[rows], fm[rows]) & valid[rows][..., None]
            unusable_free = np.where(valid[rows][..., None] & ~usable, fc[rows][..., None], 0)
            a = unusable_free.sum(axis=1).astype(np.float64)
            cnt = usable.sum(axis=1)
            total = np.where(valid[rows], fc[rows], 0).sum(axis=1).astype(np.float64)
            p = view.host_weight(cpu[rows], mem[rows], model[rows])
            out[rows] = view.combine(p, a, cnt, total, w0=self.w0)
        return out

    # -- the tracked state ---------------------------------------------------------------------

    def refresh(self, nodes: IntArray) -> None:
        s, view = self.state, self.all
        valid = s.valid[nodes]
        fc, fm = s.free_c[nodes], s.free_m[nodes]
        usable = view.usable(fc, fm) & valid[..., None]
        self.a[nodes] = np.where(valid[..., None] & ~usable, fc[..., None], 0).sum(axis=1)
        self.cnt[nodes] = usable.sum(axis=1)
        self.total[nodes] = np.where(valid, fc, 0).sum(axis=1)
        p = view.host_weight(s.cpu_free[nodes], s.mem_free[nodes], s.model_id[nodes])
        self.f[nodes] = view.combine(
            p, self.a[nodes], self.cnt[nodes], self.total[nodes].astype(np.float64), w0=self.w0
        )

    @property
    def cluster_fragmentation(self) -> float:
        """Sum of F_n over the cluster, in milli-GPU."""
        return float(self.f.sum())

    # -- gradients ------------------------------------------------------------------------------

    def delta_one(self, nodes: IntArray, request_c: int, request_m: int, cpu: int, mem: int) -> FloatArray:
        """[d, G]: change of F_n when one vGPU (``request_c`` milli, ``request_m`` MiB, with
        ``cpu``/``mem`` of host) goes onto each GPU of ``nodes``. Slots that cannot take it hold
        garbage: the caller masks them."""
        out: FloatArray = np.empty((len(nodes), self.state.width))
        for rows, view in self._per_model(self.state.model_id[nodes]):
            out[rows] = self._delta_one(view, nodes[rows], request_c, request_m, cpu=cpu, mem=mem)
        return out

    def _delta_one(
        self, view: GroupView, nodes: IntArray, request_c: int, request_m: int, *, cpu: int, mem: int
    ) -> FloatArray:
        s = self.state
        fc, fm = s.free_c[nodes], s.free_m[nodes]
        before = view.usable(fc, fm)
        after = view.usable(fc - request_c, fm - request_m)
        a = (
            self.a[nodes][:, view.groups][:, None, :]
            - np.where(before, 0, fc[..., None])
            + np.where(after, 0, (fc - request_c)[..., None])
        )
        cnt = self.cnt[nodes][:, view.groups][:, None, :] - before + after
        total = np.broadcast_to((self.total[nodes] - request_c).astype(np.float64)[:, None], fc.shape)
        p = view.host_weight(s.cpu_free[nodes] - cpu, s.mem_free[nodes] - mem, s.model_id[nodes])
        f_after = view.combine(p[:, None, :], a, cnt, total, w0=self.w0)
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
