"""Placement policies: each turns the candidates of a decision into keys, smallest first.

Baselines as the FGD paper (Weng et al., ATC'23, §6.1) describes them:

* ``random``: any node and GPU that fit.
* ``best-fit``: the node left with the least free resources (normalised CPU plus normalised GPU),
  then the GPU left with the least free compute.
* ``dot-product``: the node whose free resources align best with the request (the largest dot
  product of the normalised request and free vectors, as Tetris does), then best-fit GPU.
* ``gpu-packing``: a GPU already in use first, then an idle GPU of a node in use, then an idle
  node; best fit within each tier.
* ``gpu-clustering``: GPUs (then nodes) that already host tenants of the same GPU size first.
* ``fgd``: fragmentation gradient descent, the placement that increases the node's
  fragmentation (sharegpu.placement.fragmentation) the least.
* ``sharegpu`` (alias ``ours``): FGD's gradient plus the GPU that a node's host resources are
  expected to strand plus a reserve on scarce GPU models, then best fit (see ``SharegpuPolicy``).

Exact ties left after a policy's keys go to the first candidate in node order (as a scheduler
walking its node list does), except for ``random``, which draws from the seeded generator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from sharegpu.errors import SpecError
from sharegpu.placement.candidates import Candidates, Key, candidates, node_sets
from sharegpu.placement.model import FULL_GPU
from sharegpu.placement.stranding import StrandingModel

if TYPE_CHECKING:
    from sharegpu.placement.cluster import BoolArray, ClusterState, FloatArray, IntArray
    from sharegpu.placement.model import Request


class Policy:
    """Base of the policies. Subclasses set ``name`` and implement ``keys``."""

    name: ClassVar[str] = ""
    keep_groups_whole: ClassVar[bool] = True
    """Break ties towards keeping NVLink groups and PCIe switches whole (engine.tie_keys)."""
    random_ties: bool = False
    """Break the remaining exact ties at random (seeded) rather than by node order."""

    def keys(self, state: ClusterState, cand: Candidates) -> list[Key]:
        raise NotImplementedError

    def warm(self, state: ClusterState, requests: Iterable[Request]) -> None:
        """Fill per-shape caches ahead of the first decisions (a scheduler does it at start-up)."""


def _at(cand: Candidates, at: IntArray | None) -> tuple[IntArray, IntArray | None, BoolArray | None]:
    """Nodes, slots and sets of the candidates at positions ``at`` (all of them for None)."""
    if at is None:
        return cand.nodes, cand.slots, cand.sets
    slots = cand.slots[at] if cand.slots is not None else None
    sets = cand.sets[at] if cand.sets is not None else None
    return cand.nodes[at], slots, sets


def _gpu_after(state: ClusterState, cand: Candidates, at: IntArray | None = None) -> FloatArray:
    """Free compute of the chosen GPU after placement (mean over a set; 0 with no GPU), for the
    candidates at positions ``at`` (default: all)."""
    req = cand.request
    nodes, slots, sets = _at(cand, at)
    if slots is not None:
        out: FloatArray = (state.free_c[nodes, slots] - req.compute_milli).astype(np.float64)
        return out
    if sets is not None:
        free = (state.free_c[nodes] * sets).sum(axis=1) / max(1, req.count)
        return np.asarray(free - req.compute_milli, dtype=np.float64)
    return np.zeros(len(nodes))


def _memory_after(state: ClusterState, cand: Candidates, at: IntArray | None = None) -> FloatArray:
    """Free GPU memory of the chosen GPU after placement, as a share of its memory (mean over a
    set; 1 for a GPU of unknown memory and for no GPU): the second dimension of best fit."""
    req = cand.request
    nodes, slots, sets = _at(cand, at)
    if slots is not None:
        cap = state.cap_m[nodes, slots]
        free = state.free_m[nodes, slots] - req.memory_mib
    elif sets is not None:
        cap = (state.cap_m[nodes] * sets).sum(axis=1)
        free = (state.free_m[nodes] * sets).sum(axis=1) - req.count * req.memory_mib
    else:
        return np.ones(len(nodes))
    out: FloatArray = np.where(cap > 0, free / np.maximum(cap, 1), 1.0)
    return out


def _node_left(state: ClusterState, cand: Candidates, at: IntArray | None = None) -> FloatArray:
    """Normalised CPU plus normalised GPU left on each candidate node after placement."""
    req = cand.request
    n = _at(cand, at)[0]
    cpu = (state.cpu_free[n] - req.cpu_milli) / np.maximum(state.cpu_cap[n], 1)
    gcap = state.gpu_cap_node[n]
    gpu = np.where(gcap > 0, (state.frag.total[n] - req.gpu_milli) / np.maximum(gcap, 1), 0.0)
    return np.asarray(cpu + gpu, dtype=np.float64)


class RandomPolicy(Policy):
    name = "random"
    keep_groups_whole = False
    random_ties = True

    def keys(self, state: ClusterState, cand: Candidates) -> list[Key]:
        return []


class BestFitPolicy(Policy):
    name = "best-fit"

    def keys(self, state: ClusterState, cand: Candidates) -> list[Key]:
        left = _node_left(state, cand)
        gpu = _gpu_after(state, cand)
        return [lambda i: left[i], lambda i: gpu[i]]


class DotProductPolicy(Policy):
    name = "dot-product"

    def keys(self, state: ClusterState, cand: Candidates) -> list[Key]:
        req, n = cand.request, cand.nodes
        cpu_cap = np.maximum(state.cpu_cap[n], 1)
        gcap = np.maximum(state.gpu_cap_node[n], 1)
        align = (req.cpu_milli / cpu_cap) * (state.cpu_free[n] / cpu_cap) + (req.gpu_milli / gcap) * (
            state.frag.total[n] / gcap
        )
        gpu = _gpu_after(state, cand)
        return [lambda i: -align[i], lambda i: gpu[i]]


class GpuPackingPolicy(Policy):
    name = "gpu-packing"

    def keys(self, state: ClusterState, cand: Candidates) -> list[Key]:
        n = cand.nodes
        node_active = state.frag.total[n] < state.gpu_cap_node[n]
        if cand.slots is not None:
            gpu_used = state.tenants[n, cand.slots] > 0
            tier = np.where(gpu_used, 0, np.where(node_active, 1, 2))
        elif cand.sets is not None:
            all_used = ((state.tenants[n] > 0) & cand.sets).sum(axis=1) == cand.request.count
            tier = np.where(all_used, 0, np.where(node_active, 1, 2))
        else:
            tier = np.zeros(len(n), dtype=np.int64)
        gpu = _gpu_after(state, cand)
        left = _node_left(state, cand)
        return [lambda i: tier[i], lambda i: gpu[i], lambda i: left[i]]


class GpuClusteringPolicy(Policy):
    name = "gpu-clustering"

    def keys(self, state: ClusterState, cand: Candidates) -> list[Key]:
        req, n = cand.request, cand.nodes
        same = state.shape_count.get(req.compute_milli)
        if req.count == 0 or same is None:
            same_gpu: IntArray = np.zeros(len(n), dtype=np.int64)
            same_node: IntArray = np.zeros(len(n), dtype=np.int64)
        else:
            same_node = same[n].sum(axis=1)
            if cand.slots is not None:
                same_gpu = same[n, cand.slots]
            else:
                assert cand.sets is not None
                same_gpu = (same[n] * cand.sets).sum(axis=1)
        gpu = _gpu_after(state, cand)
        left = _node_left(state, cand)
        return [lambda i: -same_gpu[i], lambda i: -same_node[i], lambda i: gpu[i], lambda i: left[i]]


NodeTerm = Callable[["ClusterState", "Request", "IntArray"], "FloatArray"]
"""A policy's own per-node addition to the gradient of a request shape, for the given nodes."""


class _GradientCache:
    """Per request shape: the fragmentation gradient of every node (and GPU), plus the policy's
    per-node term, recomputed only for nodes whose version changed since it last looked."""

    def __init__(self, state: ClusterState, request: Request, node_term: NodeTerm | None = None) -> None:
        n = len(state.nodes)
        self.request = request
        self.node_term = node_term
        # Nodes that can never take the request (wrong model, too few or too small GPUs, too
        # little CPU) are never its candidates: their gradient is never computed. With pods
        # pinned to models that is most nodes for most shapes.
        self.eligible: BoolArray = state.could_ever_host(request)
        self.seen: IntArray = np.full(n, -1, dtype=np.int64)
        self.values: FloatArray = np.zeros((n, state.width) if request.count == 1 else n)
        self.fresh_at = 0  # the policy's decision count when no node was last stale

    def refresh(self, state: ClusterState, limit: int | None = None) -> bool:
        """Bring up to `limit` (default: all) stale nodes up to date; whether none is left."""
        req, frag = self.request, state.frag
        stale = np.flatnonzero((self.seen != state.version) & self.eligible)
        dirty = stale[:limit]
        if not len(dirty):
            return not len(stale)
        if req.count > 1:
            sets = node_sets(state, req.count, req.compute_milli, req.memory_mib)[dirty]
            self.values[dirty] = frag.delta_sets(
                dirty, sets, req.compute_milli, req.memory_mib, cpu=req.cpu_milli, mem=req.host_memory_mib
            )
        elif req.count == 1:
            self.values[dirty] = frag.delta_one(
                dirty, req.compute_milli, req.memory_mib, req.cpu_milli, req.host_memory_mib
            )
        else:
            empty = np.zeros((len(dirty), state.width), dtype=np.bool_)
            self.values[dirty] = frag.delta_sets(
                dirty, empty, 0, 0, cpu=req.cpu_milli, mem=req.host_memory_mib
            )
        if self.node_term is not None:
            term = self.node_term(state, req, dirty)
            self.values[dirty] = self.values[dirty] + (term[:, None] if self.values.ndim == 2 else term)
        self.seen[dirty] = state.version[dirty]
        return len(dirty) == len(stale)


TIDY_NODES = 64
"""Stale nodes of one other shape's gradient brought up to date per decision: of the shape
longest without a look. A shape that comes rarely otherwise finds hundreds of nodes changed
since it last came (600 in the slowest 1% of decisions on the full cluster), and that decision
pays for all of them at once; spreading the work over the decisions between keeps every one
short. The gradients, and so the decisions, are the same either way."""


class FgdPolicy(Policy):
    name = "fgd"

    def __init__(self) -> None:
        self._state: ClusterState | None = None
        self._caches: dict[tuple[object, ...], _GradientCache] = {}
        self._decisions = 0

    def gradient(self, state: ClusterState, cand: Candidates) -> FloatArray:
        """The fragmentation gradient (change of F_n) of each candidate."""
        req = cand.request
        if state is not self._state:
            self._state, self._caches, self._decisions = state, {}, 0
        self._decisions += 1
        cache = self._caches.get(req.shape)
        if cache is None:
            cache = self._caches[req.shape] = _GradientCache(state, req, self.node_term(req))
        cache.refresh(state)
        cache.fresh_at = self._decisions
        self._tidy_one(state, cache)
        if cand.slots is not None:
            out: FloatArray = cache.values[cand.nodes, cand.slots]
            return out
        return np.asarray(cache.values[cand.nodes], dtype=np.float64)

    def _tidy_one(self, state: ClusterState, current: _GradientCache) -> None:
        other = min(self._caches.values(), key=lambda c: c.fresh_at)
        if other is not current and other.refresh(state, TIDY_NODES):
            other.fresh_at = self._decisions

    def node_term(self, request: Request) -> NodeTerm | None:
        """What this policy adds to the gradient of ``request``'s shape per node (none for FGD)."""
        return None

    def keys(self, state: ClusterState, cand: Candidates) -> list[Key]:
        delta = self.gradient(state, cand)
        return [lambda i: delta[i]]

    def warm(self, state: ClusterState, requests: Iterable[Request]) -> None:
        seen: set[tuple[object, ...]] = set()
        for request in requests:
            if request.shape not in seen:
                seen.add(request.shape)
                self.gradient(state, candidates(state, request))


MODEL_RESERVE = 3.0
"""Weight, per milli-GPU asked, of the popularity of the shapes that may not use a node's GPU
model (SharegpuPolicy): 1 cancels FGD's reward for filling such GPUs, the rest sends flexible
pods to the models most shapes may use. Tuned on the pin10 and pin25 variants (1, 3, 6, 12)."""


SCARCITY_RESERVE = 0.3
"""Weight, per milli-GPU asked, of the scarcity of the node taken (StrandingModel.scarcity).
Chosen on multigpu50, whose one paired loss (-0.24, seed 51) was two 8-GPU, 120-core pods that
only the 39 G3 nodes hold, filled by pods that fit anywhere. Full cluster, 10 seeds, ours - FGD
(mean, worst seed): 0 +0.18 / -0.24, 0.3 +0.24 / +0.14, 1 +0.25 / +0.13; pin25 (quarter cluster)
0 +0.75 / -0.13, 0.3 +0.88 / +0.16, 1 +0.86 / -0.04. Off under CPU pressure, where the stranded
GPU decides (weight 1 cost cpu2+cpuonly2 0.09 point)."""


CPU_BOUND_STRANDING_WEIGHT = 100.0
"""Weight of the stranding term when the workload's CPU pressure is over 1 (StrandingModel): so
large that the expected stranded GPU decides and FGD's gradient only breaks near-ties. Measured
on the full cluster, 10 seeds, ours - FGD on cpu3 / cpu2: weight 1 -0.30 / +1.20, 5 +0.03 / +1.59,
20 +0.20 / +1.92, 100 +0.60 / +1.68, 1000 +0.59 / +1.65 (docs/placement.md)."""


class SharegpuPolicy(FgdPolicy):
    """sharegpu's own policy: FGD's gradient, plus the GPU the node's host resources will strand,
    plus a reserve on GPU models that few shapes may use and on nodes that few shapes fit; then
    best fit.

    * Stranding. FGD sees CPU only as a step: a node's free GPUs become fragments for a shape
      once its free CPU drops below that shape's CPU. Until then taking CPU looks free, so
      CPU-hungry pods (and pods without GPUs) land on GPU-dense nodes and leave their last GPUs
      with nothing to feed them. The key adds the change of the node's expected stranded GPU
      (sharegpu.placement.stranding: per node, from the CPU and host memory per GPU of the shapes
      that can use that node's model and size), in milli-GPU like the fragmentation. A pod
      without GPUs follows FGD's rule instead, nodes without GPUs first.
    * Model reserve. For a shape that may not use a node's model FGD counts all its free GPU as a
      fragment, so filling the GPUs of a model few shapes may use *lowers* F: FGD sends flexible
      pods to the small pools (T4, P100, V100 in the trace), and the pods pinned there fail
      later while the large pool (G2) keeps free GPUs. The key adds ``MODEL_RESERVE x
      (popularity of the shapes the model excludes) x milli-GPU asked``, which turns that reward
      into a cost: flexible pods go to the models most shapes may use. It counts shapes, not
      demand per GPU of the model: a model that few shapes may use and no pinned shape needs
      gets flexible pods only once the others are full.
    * Scarcity reserve. Host resources and GPU counts also confine shapes: only 39 of the
      trace's 1,523 nodes hold an 8-GPU pod asking 120 cores. The key adds ``SCARCITY_RESERVE x
      (scarcity of the node) x milli-GPU asked`` (StrandingModel.scarcity: the demand of the
      shapes that can use the node, each over the capacity they can use), so pods that fit
      anywhere take such nodes last. Not under CPU pressure (below).
    * CPU-bound workloads. When the workload asks more CPU per GPU than the GPU nodes have (CPU
      pressure over 1), CPU, not GPU fragmentation, bounds what can be allocated: the stranding
      term is weighted ``CPU_BOUND_STRANDING_WEIGHT`` and decides, FGD's gradient breaking
      near-ties, and the stranding model counts the CPU that pods without GPUs will take from GPU
      nodes (StrandingModel.spilled_cpu). Below 1 (every shipped pod list) the weight is 1.
    * Ties go to the GPU left with the least free compute plus memory (each as a share of the
      GPU: memory is the second dimension of a vGPU), then the node left with the least (best
      fit), not to node order.
    """

    name = "sharegpu"

    def __init__(self) -> None:
        super().__init__()
        self._stranding: StrandingModel | None = None

    def stranding(self, state: ClusterState) -> StrandingModel:
        if self._stranding is None or self._stranding.state is not state:
            self._stranding = StrandingModel(state)
        return self._stranding

    def node_term(self, request: Request) -> NodeTerm | None:
        # A pod without GPUs: FGD's rule (keys). Cached with the gradient, since it changes only
        # where a node changes: a decision then costs the same whatever the number of candidates.
        return self._stranding_and_reserve if request.count else None

    def _stranding_and_reserve(self, state: ClusterState, req: Request, n: IntArray) -> FloatArray:
        model = self.stranding(state)
        gpu = state.frag.total[n].astype(np.float64)
        cpu = state.cpu_free[n].astype(np.float64)
        mem = state.mem_free[n].astype(np.float64)
        before = model.host_stranded(n, gpu, cpu, mem)
        after = model.host_stranded(n, gpu - req.gpu_milli, cpu - req.cpu_milli, mem - req.host_memory_mib)
        cpu_bound = model.cpu_pressure > 1.0
        weight = CPU_BOUND_STRANDING_WEIGHT if cpu_bound else 1.0
        out: FloatArray = weight * (after - before) + MODEL_RESERVE * req.gpu_milli * model.model_excluded[n]
        if not cpu_bound:
            out = out + SCARCITY_RESERVE * req.gpu_milli * model.scarcity[n]
        return out

    def keys(self, state: ClusterState, cand: Candidates) -> list[Key]:
        delta = self.gradient(state, cand)
        if not cand.request.count:
            # A pod without GPUs: FGD's rule, nodes without GPUs first, then first fit. Charging
            # it the stranding and best fit measured worse (cpuonly3: -1.5 points).
            has_gpus = state.ngpu[cand.nodes] > 0
            return [lambda i: delta[i], lambda i: has_gpus[i]]
        # The tie keys look only at the candidates still tied (usually a few of thousands).
        return [
            lambda i: delta[i],
            # Best fit in both GPU dimensions: compute and memory left, each as a share of the GPU.
            lambda i: _gpu_after(state, cand, i) / FULL_GPU + _memory_after(state, cand, i),
            lambda i: _node_left(state, cand, i),
        ]


POLICIES: dict[str, type[Policy]] = {
    p.name: p
    for p in (
        RandomPolicy,
        BestFitPolicy,
        DotProductPolicy,
        GpuPackingPolicy,
        GpuClusteringPolicy,
        FgdPolicy,
        SharegpuPolicy,
    )
}
ALIASES = {
    "ours": "sharegpu",
    "bestfit": "best-fit",
    "dotprod": "dot-product",
    "packing": "gpu-packing",
    "clustering": "gpu-clustering",
}


def make_policy(name: str) -> Policy:
    """A fresh policy by name (or alias); SpecError naming the choices otherwise."""
    key = ALIASES.get(name.lower(), name.lower())
    cls = POLICIES.get(key)
    if cls is None:
        raise SpecError(f"unknown policy {name!r}: choose from {', '.join(POLICIES)} (or 'ours')")
    return cls()
