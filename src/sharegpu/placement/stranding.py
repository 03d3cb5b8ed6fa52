"""Expected stranded GPU: free GPU compute of a node that its host resources will not feed.

FGD (sharegpu.placement.fragmentation) sees a node's CPU only as a step per task shape. The GPU
a node will strand is estimated here per node, from the shapes of the workload that can *use*
that node at all:

* a shape can use node n when n has a GPU of a model it accepts, at least as many GPUs as it
  asks, and (empty) the CPU, host memory and per-GPU compute and memory it needs;
* W_n is the popularity of those shapes (0 for a node whose model no shape accepts), and rho_n
  (mu_n) their CPU (host memory) per milli-GPU, popularity-weighted;
* the free GPU the node can still feed is ``min(free_cpu / rho_n, free_mem / mu_n)``, and

      stranded_n = (1 - W_n) T_n + W_n max(0, T_n - feedable_n)

  with T_n the node's free milli-GPU: the GPU no shape may use, plus, for the shapes that may,
  the GPU the host resources left will not feed. SharegpuPolicy minimises the change of the second
  part (the first is already in FGD's fragmentation, which it adds).

A node's *scarcity* is what the shapes that can use it need of the few nodes they can use:

    scarcity_n = sum over shapes j that can use n of  share_j x C / supply_j

with share_j the shape's part of the expected GPU demand, supply_j the GPU capacity of the nodes
j can use and C the cluster's: a shape every node can hold adds its share, one that fits only a
twentieth of the capacity (the 8-GPU, 120-core pods, on the 39 G3 nodes of the trace) twenty
times its share. SharegpuPolicy charges a GPU pod for the scarcity of the node it takes, so
flexible pods leave such nodes to the shapes that have nowhere else to go.

The workload's *CPU pressure* is its CPU per milli-GPU (popularity-weighted over the shapes that
ask GPUs) over the GPU nodes' CPU per milli-GPU: over 1, the cluster runs out of CPU before GPU
and stranded GPU is what bounds allocation (SharegpuPolicy then ranks by it first).

Pods without GPUs fill the nodes without GPUs, then take CPU on GPU nodes. Per milli-GPU of
demand, the CPU they ask beyond what the nodes without GPUs hold (``spilled_cpu``) is CPU that
every GPU node must also find; under CPU pressure it is added to rho_n, so that a node is seen to
feed fewer GPUs than the GPU shapes' CPU alone would say. (The trace's `cpu2` variant: 3.7
milli-cores per milli-GPU on top of rho's ~21; `cpu2+cpuonly2`, with twice the pods without
GPUs, 10.3.)

Per-node figures depend only on the nodes' capacities and the workload: computed once per state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sharegpu.placement.cluster import ClusterState, FloatArray, IntArray


class StrandingModel:
    """W_n, rho_n, mu_n and the scarcity of every node of ``state`` against its workload."""

    def __init__(self, state: ClusterState) -> None:
        wl = state.workload
        weights = wl.normalised()
        shapes = [(sh, w) for sh, w in zip(wl.shapes, weights, strict=True) if sh.count]
        n = len(state.nodes)
        self.state = state
        self.cpu_pressure = 0.0
        self.spilled_cpu = 0.0
        if not shapes:
            self.weight: FloatArray = np.zeros(n)
            self.model_excluded: FloatArray = np.zeros(n)
            self.rho: FloatArray = np.zeros(n)
            self.mu: FloatArray = np.zeros(n)
            self.scarcity: FloatArray = np.zeros(n)
            return
        p = np.array([w for _, w in shapes])
        count = np.array([sh.count for sh, _ in shapes], dtype=np.int64)
        compute = np.array([sh.compute_milli for sh, _ in shapes], dtype=np.int64)
        memory = np.array([sh.memory_mib for sh, _ in shapes], dtype=np.int64)
        cpu = np.array([sh.cpu_milli for sh, _ in shapes], dtype=np.float64)
        mem = np.array([sh.host_memory_mib for sh, _ in shapes], dtype=np.float64)
        gpu = (count * compute).astype(np.float64)
        # model_ok[model id + 1, shape], row 0 for nodes without GPUs.
        model_ok = np.zeros((len(state.models) + 1, len(shapes)), dtype=np.bool_)
        for j, (sh, _) in enumerate(shapes):
            for i, model in enumerate(state.models):
                model_ok[i + 1, j] = not sh.models or model in sh.models
        per_gpu_c = state.cap_c.max(axis=1)
        per_gpu_m = state.cap_m.max(axis=1)
        usable = (
            model_ok[state.model_id + 1]
            & (state.ngpu[:, None] >= count[None, :])
            & (state.cpu_cap[:, None] >= cpu[None, :])
            & (state.mem_cap[:, None] >= mem[None, :])
            & (per_gpu_c[:, None] >= compute[None, :])
            & (per_gpu_m[:, None] >= memory[None, :])
        )
        pu = usable * p[None, :]
        # The popularity of the GPU shapes that may not use the node's model (SharegpuPolicy).
        self.model_excluded = (~model_ok[state.model_id + 1] * p[None, :]).sum(axis=1)
        self.weight = pu.sum(axis=1)
        demand = pu @ gpu
        supply = (usable * state.gpu_cap_node[:, None]).sum(axis=0).astype(np.float64)
        share = p * gpu / max(float(p @ gpu), 1e-12)
        need = np.where(supply > 0, share * state.capacity_milli / np.maximum(supply, 1.0), 0.0)
        self.scarcity = usable @ need
        has_gpus = state.ngpu > 0
        node_ratio = state.cpu_cap[has_gpus].sum() / max(1, state.gpu_cap_node[has_gpus].sum())
        self.cpu_pressure = float(p @ cpu / max(float(p @ gpu), 1e-12) / max(node_ratio, 1e-12))
        without_gpus = sum(w * sh.cpu_milli for sh, w in zip(wl.shapes, weights, strict=True) if not sh.count)
        held = float(state.cpu_cap[~has_gpus].sum()) / max(1.0, float(state.capacity_milli))
        self.spilled_cpu = max(0.0, without_gpus / max(float(p @ gpu), 1e-12) - held)
        # Where CPU is the bound, the CPU that pods without GPUs will take from GPU nodes is CPU
        # their GPUs cannot have (module docstring). Where GPU is the bound it cost cpuonly3 0.4
        # point (ours - FGD +1.95 -> +1.53) and left cpuonly2 as it was.
        spilled = self.spilled_cpu if self.cpu_pressure > 1.0 else 0.0
        with np.errstate(divide="ignore", invalid="ignore"):
            self.rho = np.where(demand > 0, (pu @ cpu) / np.maximum(demand, 1e-12) + spilled, 0.0)
            self.mu = np.where(demand > 0, (pu @ mem) / np.maximum(demand, 1e-12), 0.0)

    def feedable(self, nodes: IntArray, cpu_free: FloatArray, mem_free: FloatArray) -> FloatArray:
        """[d]: milli-GPU the given free host resources of ``nodes`` can still feed (inf: no limit)."""
        rho, mu = self.rho[nodes], self.mu[nodes]
        by_cpu = np.where(rho > 0, np.maximum(cpu_free, 0.0) / np.where(rho > 0, rho, 1.0), np.inf)
        by_mem = np.where(mu > 0, np.maximum(mem_free, 0.0) / np.where(mu > 0, mu, 1.0), np.inf)
        out: FloatArray = np.minimum(by_cpu, by_mem)
        return out

    def host_stranded(
        self, nodes: IntArray, gpu_free: FloatArray, cpu_free: FloatArray, mem_free: FloatArray
    ) -> FloatArray:
        """[d]: W_n max(0, T_n - feedable_n), the part of stranding that FGD does not see."""
        lack = np.maximum(0.0, gpu_free - self.feedable(nodes, cpu_free, mem_free))
        out: FloatArray = self.weight[nodes] * lack
        return out

    def stranded(self) -> FloatArray:
        """[N]: stranded_n of every node now (module docstring), in milli-GPU."""
        s = self.state
        nodes = np.arange(len(s.nodes))
        total = s.frag.total.astype(np.float64)
        cpu, mem = s.cpu_free.astype(np.float64), s.mem_free.astype(np.float64)
        out: FloatArray = (1.0 - self.weight) * total + self.host_stranded(nodes, total, cpu, mem)
        return out
