"""Preemption planning: which offline tenants to evict so that an online request fits.

For an online request that fits nowhere, the planner looks, node by node, for the smallest set
of offline allocations whose eviction makes room, and picks across nodes the plan with the
fewest victims, then the least fragmentation left on the node afterwards (measured against the
cluster's workload, sharegpu.placement.fragmentation), then node order. When evicting every
offline tenant of every node would still not make room, there is no plan: evicting would only
hurt. By default only ``offline`` allocations are victims; ``evictable`` widens that in order
(the trace's BE pods are offline, Burstable normal: ``(offline, normal)`` evicts BE before
Burstable): a plan that needs a later class is taken only when the earlier ones cannot make room.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sharegpu.errors import SpecError
from sharegpu.placement.candidates import candidates
from sharegpu.placement.cluster import Allocation, ClusterState
from sharegpu.placement.model import NoFit, NoFitReason, Placement, Priority, Request

MAX_SUBSETS_PER_NODE = 4096
"""Victim sets tried per node and size before falling back to largest-first."""


@dataclass(frozen=True)
class PreemptionPlan:
    """Evict ``victims`` (allocation ids), then place the request on ``placement``."""

    placement: Placement
    victims: tuple[str, ...]
    fragmentation: float
    """F of the node after the evictions and the placement, in milli-GPU."""


def _try_node(
    state: ClusterState, request: Request, n: int, victims: tuple[Allocation, ...]
) -> tuple[tuple[int, ...], float] | None:
    """GPUs for ``request`` on node ``n`` once ``victims`` are gone, and the F left, or None."""
    fc, fm = state.free_c[n].copy(), state.free_m[n].copy()
    cpu, mem = int(state.cpu_free[n]), int(state.mem_free[n])
    for v in victims:
        cpu += v.request.cpu_milli
        mem += v.request.host_memory_mib
        for g in v.gpus:
            fc[g] += v.request.compute_milli
            fm[g] += v.request.memory_mib
    cpu -= request.cpu_milli
    mem -= request.host_memory_mib
    if cpu < 0 or mem < 0:
        return None
    frag = state.frag
    model = state.model_id[n : n + 1]
    valid = state.valid[n : n + 1]

    def after(gpus: tuple[int, ...]) -> float:
        c, m = fc.copy(), fm.copy()
        for g in gpus:
            c[g] -= request.compute_milli
            m[g] -= request.memory_mib
        value = frag.evaluate(
            np.array([cpu]), np.array([mem]), model, fc=c[None, :], fm=m[None, :], valid=valid
        )
        return float(value[0])

    if request.count == 0:
        return (), after(())
    fits = state.valid[n] & (fc >= request.compute_milli) & (fm >= request.memory_mib)
    if fits.sum() < request.count:
        return None
    tables = state.topo_tables[int(state.topo_id[n])]
    if request.count == 1:
        options = [((int(g),), after((int(g),))) for g in np.flatnonzero(fits)]
        return min(options, key=lambda o: o[1])
    combos = tables.combos[request.count]
    ok = ~(combos & ~fits[None, :]).any(axis=1)
    best = tuple(int(g) for g in np.flatnonzero(combos[int(np.argmax(ok))]))
    return best, after(best)


EVICTION_ORDER = (Priority.offline, Priority.normal, Priority.online)
"""Who goes first when several classes may be evicted."""


def plan_preemption(
    state: ClusterState,
    request: Request,
    *,
    max_victims: int = 8,
    evictable: Sequence[Priority] = (Priority.offline,),
) -> PreemptionPlan | NoFit:
    """The fewest victims that make room for online ``request``, or why there is none: victims
    of the first class of ``evictable`` if that suffices, else of the first two, and so on.

    A request that fits already gets a plan without victims.
    """
    if request.priority is not Priority.online:
        raise SpecError(f"only online requests preempt; this one is {request.priority}")
    if Priority.online in evictable:
        raise SpecError("online tenants are never preempted")
    classes = list(dict.fromkeys(evictable))
    plan: PreemptionPlan | NoFit = NoFit(NoFitReason.gpu_resources, "no class of tenant may be evicted")
    for tier in range(1, len(classes) + 1):
        plan = _plan_for(state, request, frozenset(classes[:tier]), max_victims)
        if isinstance(plan, PreemptionPlan):
            return plan
    return plan


def _plan_for(
    state: ClusterState, request: Request, classes: frozenset[Priority], max_victims: int
) -> PreemptionPlan | NoFit:
    if len(candidates(state, request)):
        best_free: tuple[tuple[int, float, int], PreemptionPlan] | None = None
        for n in np.unique(candidates(state, request).nodes):
            got = _try_node(state, request, int(n), ())
            if got is not None and (best_free is None or (0, got[1], int(n)) < best_free[0]):
                plan = PreemptionPlan(Placement(state.nodes[n].name, int(n), got[0]), (), got[1])
                best_free = ((0, got[1], int(n)), plan)
        if best_free is not None:
            return best_free[1]
    best: PreemptionPlan | None = None
    helpful = False
    for n, allocs in enumerate(state.node_allocations):
        offline = [a for a in allocs.values() if a.request.priority in classes]
        if not offline or _try_node(state, request, n, tuple(offline)) is None:
            continue
        helpful = True
        limit = min(max_victims, len(best.victims) if best else max_victims)
        found = plan_on_node(state, request, n, offline, max_victims=limit)
        if found is not None and (best is None or _rank(found) < _rank(best)):
            best = found
    if best is not None:
        return best
    if helpful:
        return NoFit(
            NoFitReason.gpu_resources,
            f"making room for {request.describe()} takes more than {max_victims} evictions on every node",
        )
    who = " or ".join(sorted(c.value for c in classes))
    return NoFit(
        NoFitReason.gpu_resources,
        f"evicting every {who} tenant would still not make room for {request.describe()}",
    )


def _rank(plan: PreemptionPlan) -> tuple[int, float, int]:
    return (len(plan.victims), plan.fragmentation, plan.placement.node_index)


def plan_on_node(
    state: ClusterState, request: Request, n: int, allowed: Sequence[Allocation], *, max_victims: int = 8
) -> PreemptionPlan | None:
    """The fewest of `allowed` (allocations on node `n`) whose eviction makes room there for
    `request`, the least fragmentation left breaking ties; None when no set of at most
    `max_victims` does. Classes go in EVICTION_ORDER: offline victims only if they suffice,
    then offline and normal, and so on. Larger allocations are tried first."""
    free = _try_node(state, request, n, ())
    if free is not None:
        return PreemptionPlan(Placement(state.nodes[n].name, n, free[0]), (), free[1])
    rank = {c: i for i, c in enumerate(EVICTION_ORDER)}
    tiers = sorted({rank[a.request.priority] for a in allowed})
    for tier in tiers:
        found = _plan_among(
            state, request, n, [a for a in allowed if rank[a.request.priority] <= tier], max_victims
        )
        if found is not None:
            return found
    return None


def _plan_among(
    state: ClusterState, request: Request, n: int, allowed: Sequence[Allocation], max_victims: int
) -> PreemptionPlan | None:
    ordered = sorted(allowed, key=lambda a: (-a.request.gpu_milli, -a.request.cpu_milli, a.id))
    for k in range(1, min(len(ordered), max_victims) + 1):
        best: PreemptionPlan | None = None
        for subset in itertools.islice(itertools.combinations(ordered, k), MAX_SUBSETS_PER_NODE):
            got = _try_node(state, request, n, subset)
            if got is not None and (best is None or got[1] < best.fragmentation):
                best = PreemptionPlan(
                    Placement(state.nodes[n].name, n, got[0]), tuple(a.id for a in subset), got[1]
                )
        if best is not None:
            return best
    return None
