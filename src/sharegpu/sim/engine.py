"""The paper's replay: resample pods until demand reaches a multiple of capacity, place them one
at a time with no departures, and record the GPU allocation ratio against the arrived demand.

Method (Weng et al., ATC'23, §6.1): pods are drawn from the pod list with replacement (seeded)
until their total GPU request reaches ``target`` (1.3) times the cluster's GPU capacity, shuffled,
and placed one by one; a pod that fits nowhere stays pending and the replay goes on. The
workload that the fragmentation-aware policies measure against is the pod list itself.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from sharegpu.errors import SpecError
from sharegpu.placement.cluster import ClusterState
from sharegpu.placement.engine import decide
from sharegpu.placement.model import Node, Placement, Request
from sharegpu.placement.policies import make_policy
from sharegpu.placement.workload import Workload
from sharegpu.sim.colocation import Colocation, colocation

DEFAULT_TARGET = 1.3
DEFAULT_STEP = 0.01


@dataclass(frozen=True)
class Point:
    """The cluster when arrived GPU demand first reaches ``demand`` x capacity."""

    demand: float
    allocation_ratio: float
    """Allocated milli-GPU / capacity."""
    fragmentation_ratio: float
    """Sum over nodes of the fragmentation F_n / capacity."""
    failed_pods: int
    """Pods that arrived so far and fit nowhere."""
    failed_gpu_milli: int
    arrived_pods: int


@dataclass
class SimResult:
    policy: str
    seed: int
    nodes: int
    gpus: int
    capacity_milli: int
    points: list[Point]
    arrived_pods: int = 0
    failed_pods: int = 0
    decision_ns: list[int] = field(default_factory=list)
    colocation: Colocation | None = None
    """Who shares GPUs with whom when arrived demand first reaches 100% (sim.colocation)."""

    def at(self, demand: float) -> Point:
        """The recorded point at ``demand`` (or the last one before it)."""
        best = self.points[0]
        for p in self.points:
            if p.demand <= demand + 1e-9:
                best = p
        return best

    def as_dict(self) -> dict[str, object]:
        out = asdict(self)
        out.pop("decision_ns")
        out["colocation"] = self.colocation.as_dict() if self.colocation else None
        return out


def sample(pods: list[Request], capacity_milli: int, target: float, seed: int) -> list[Request]:
    """Pods drawn with replacement until their GPU demand reaches ``target`` x capacity, shuffled."""
    if not pods:
        raise SpecError("no pods to replay")
    demand = np.array([p.gpu_milli for p in pods], dtype=np.int64)
    if not demand.any():
        raise SpecError("no pod of the trace asks for a GPU: there is no GPU demand to replay")
    rng = np.random.default_rng(seed)
    goal = target * capacity_milli
    chosen: list[np.ndarray] = []
    total = 0
    batch = max(64, int(goal / max(1.0, float(demand.mean())) * 1.05))
    while total < goal:
        draw = rng.integers(len(pods), size=batch)
        cum = total + np.cumsum(demand[draw])
        stop = int(np.searchsorted(cum, goal))
        if stop < batch:
            chosen.append(draw[: stop + 1])
            total = int(cum[stop])
            break
        chosen.append(draw)
        total = int(cum[-1])
    order = np.concatenate(chosen)
    order = order[rng.permutation(len(order))]
    return [pods[i] for i in order]


def simulate(
    nodes: list[Node],
    pods: list[Request],
    policy: str,
    seed: int,
    *,
    target: float = DEFAULT_TARGET,
    step: float = DEFAULT_STEP,
    workload: Workload | None = None,
    time_decisions: bool = False,
) -> SimResult:
    """Replay ``pods`` on ``nodes`` with ``policy``; deterministic for a given ``seed``."""
    if target <= 0 or step <= 0:
        raise SpecError("the target demand and the step must be positive")
    chooser = make_policy(policy)
    state = ClusterState(nodes, workload if workload is not None else Workload.from_requests(pods))
    arrivals = sample(pods, state.capacity_milli, target, seed)
    chooser.warm(state, pods)
    rng = np.random.default_rng([seed, 1])
    result = SimResult(
        policy=chooser.name,
        seed=seed,
        nodes=len(nodes),
        gpus=int(state.ngpu.sum()),
        capacity_milli=state.capacity_milli,
        points=[],
    )
    levels = np.round(np.arange(0, target + step / 2, step), 6)
    level = 1  # level 0 is the empty cluster
    result.points.append(Point(0.0, 0.0, state.frag.cluster_fragmentation / state.capacity_milli, 0, 0, 0))
    arrived = failed = failed_milli = 0
    clock = time.perf_counter_ns
    for pod in arrivals:
        t0 = clock() if time_decisions else 0
        decision = decide(state, pod, chooser, rng)
        if isinstance(decision, Placement):
            state.allocate(decision, pod)
        else:
            failed += 1
            failed_milli += pod.gpu_milli
        if time_decisions:
            result.decision_ns.append(clock() - t0)
        arrived += pod.gpu_milli
        result.arrived_pods += 1
        while level < len(levels) and arrived >= levels[level] * state.capacity_milli - 1e-6:
            if result.colocation is None and levels[level] >= 1.0:
                result.colocation = colocation(state)
            result.points.append(
                Point(
                    demand=float(levels[level]),
                    allocation_ratio=state.allocation_ratio,
                    fragmentation_ratio=state.frag.cluster_fragmentation / state.capacity_milli,
                    failed_pods=failed,
                    failed_gpu_milli=failed_milli,
                    arrived_pods=result.arrived_pods,
                )
            )
            level += 1
    result.failed_pods = failed
    return result
