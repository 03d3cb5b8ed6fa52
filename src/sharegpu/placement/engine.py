"""One placement decision: candidates, keys in order, a seeded choice among exact ties.

A decision lists every candidate (a node, and for a GPU request the GPUs it would use), then
narrows them with keys, lexicographically, smallest first:

1. the priority class: an online request goes where the fewest online tenants already are (on its
   GPUs, then on the node); an offline request goes into gaps (GPUs already in use) first;
2. the policy's own keys (best fit, fragmentation gradient, ...);
3. for policies that want it, keeping NVLink groups and PCIe switches whole;
4. a seeded random choice among whatever ties remain.

A multi-GPU request is offered one GPU set per node: the best-connected set of fitting GPUs,
taken preferably from groups that are already broken.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sharegpu.placement.candidates import Candidates, Key, candidates
from sharegpu.placement.model import Decision, NoFit, NoFitReason, Placement, Priority, Request

if TYPE_CHECKING:
    from sharegpu.placement.cluster import BoolArray, ClusterState
    from sharegpu.placement.policies import Policy


def choose(n: int, keys: Sequence[Key], rng: np.random.Generator | None) -> int:
    """The position, among ``n`` candidates, that is smallest in ``keys`` in order; exact ties
    (within a relative 1e-9) go to a random one drawn from ``rng``, or with ``rng`` None to the
    first (candidates are in node order, then GPU order)."""
    idx = np.arange(n)
    for key in keys:
        if len(idx) == 1:
            break
        values = np.asarray(key(idx), dtype=np.float64)
        best = values.min()
        idx = idx[values <= best + 1e-9 * max(1.0, abs(best))]
    if len(idx) > 1 and rng is not None:
        return int(idx[rng.integers(len(idx))])
    return int(idx[0])


def priority_keys(state: ClusterState, cand: Candidates) -> list[Key]:
    req = cand.request
    if req.count == 0 or req.priority is Priority.normal:
        return []
    if cand.slots is not None:
        slots = cand.slots
        online_gpu = state.online[cand.nodes, slots]
        used_gpu = state.tenants[cand.nodes, slots] > 0
    else:
        assert cand.sets is not None
        online_gpu = (state.online[cand.nodes] * cand.sets).sum(axis=1)
        used_gpu = ((state.tenants[cand.nodes] > 0) & cand.sets).sum(axis=1) == req.count
    if req.priority is Priority.online:
        online_node = state.node_online[cand.nodes]
        return [lambda i: online_gpu[i], lambda i: online_node[i]]
    return [lambda i: ~used_gpu[i]]


def tie_keys(state: ClusterState, cand: Candidates) -> list[Key]:
    if cand.slots is None:
        return []
    nodes, slots = cand.nodes, cand.slots
    return [lambda i: state.group_pressure(nodes[i])[np.arange(len(i)), slots[i]]]


def decide(
    state: ClusterState,
    request: Request,
    policy: Policy,
    rng: np.random.Generator | None,
    allowed: BoolArray | None = None,
) -> Decision:
    """Place ``request`` with ``policy`` (does not change ``state``: call ``state.allocate``),
    on the nodes ``allowed`` ([N] mask; default all: the scheduler extender passes the nodes
    the kube-scheduler left). ``rng`` None breaks random ties by node order."""
    cand = candidates(state, request)
    if allowed is not None and len(cand):
        keep = allowed[cand.nodes]
        cand = Candidates(
            request,
            cand.nodes[keep],
            slots=cand.slots[keep] if cand.slots is not None else None,
            sets=cand.sets[keep] if cand.sets is not None else None,
        )
    if not len(cand):
        return explain(state, request)
    keys = [*priority_keys(state, cand), *policy.keys(state, cand)]
    if policy.keep_groups_whole:
        keys += tie_keys(state, cand)
    i = choose(len(cand), keys, rng if policy.random_ties else None)
    n = int(cand.nodes[i])
    return Placement(node=state.nodes[n].name, node_index=n, gpus=cand.gpus(i))


def explain(state: ClusterState, request: Request) -> NoFit:
    """Why ``request`` fits nowhere now, from the most permanent cause to the most transient."""
    what = request.describe()
    if request.count:
        model_ok = state.model_mask(request.models)
        if not model_ok.any():
            have = ", ".join(state.models) or "none"
            return NoFit(
                NoFitReason.no_such_model,
                f"no node has a GPU of model {'|'.join(sorted(request.models))} (the cluster has: {have})",
            )
        per_gpu = (state.cap_c >= request.compute_milli) & (state.cap_m >= request.memory_mib)
        static = model_ok & (per_gpu.sum(axis=1) >= request.count)
    else:
        static = np.ones(len(state.nodes), dtype=np.bool_)
    static &= (state.cpu_cap >= request.cpu_milli) & (state.mem_cap >= request.host_memory_mib)
    if not static.any():
        return NoFit(NoFitReason.too_large, f"no node could hold {what} even when empty")
    host = static & (state.cpu_free >= request.cpu_milli) & (state.mem_free >= request.host_memory_mib)
    if not host.any():
        return NoFit(
            NoFitReason.host_resources,
            f"{int(static.sum())} nodes could hold {what}, but none has the free CPU and host memory now",
        )
    return NoFit(
        NoFitReason.gpu_resources,
        f"{int(host.sum())} nodes have the host resources for {what}, but none has enough free GPU",
    )
