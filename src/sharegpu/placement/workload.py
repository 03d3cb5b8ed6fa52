"""The target workload: the mix of request shapes a cluster expects, with their popularity.

Fragmentation is only defined with respect to a workload (Weng et al., ATC'23): GPU capacity is
a fragment for a task when that task could not use it. The fragmentation-aware policies measure
it against the workload given here: the replayed trace in the simulator, the recent pods of a
cluster in the scheduler extender, or ``Workload.default()``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from sharegpu.errors import SpecError
from sharegpu.placement.model import Request


@dataclass(frozen=True)
class Workload:
    """Request shapes and their popularity (weights sum to 1)."""

    shapes: tuple[Request, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.shapes:
            raise SpecError("a workload needs at least one request shape")
        if len(self.shapes) != len(self.weights):
            raise SpecError("a workload needs one weight per request shape")
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise SpecError("workload weights must be non-negative and not all zero")

    @classmethod
    def from_requests(cls, requests: Iterable[Request]) -> Workload:
        """The empirical mix of ``requests``: one shape per distinct ``Request.shape``."""
        counts: Counter[tuple[int, int, int, int, int, frozenset[str]]] = Counter(r.shape for r in requests)
        if not counts:
            raise SpecError("cannot build a workload from no requests")
        total = sum(counts.values())
        shapes = tuple(
            Request(
                count=s[0],
                compute_milli=s[1] or 1000,
                memory_mib=s[2],
                cpu_milli=s[3],
                host_memory_mib=s[4],
                models=s[5],
            )
            for s in counts
        )
        return cls(shapes=shapes, weights=tuple(c / total for c in counts.values()))

    @classmethod
    def default(cls) -> Workload:
        """A generic mix when nothing better is known: whole GPUs dominate, with common fractions
        and some multi-GPU jobs (roughly the shape of public production traces)."""
        mix = [
            (Request(count=1, compute_milli=1000), 0.45),
            (Request(count=1, compute_milli=500), 0.15),
            (Request(count=1, compute_milli=250), 0.15),
            (Request(count=1, compute_milli=750), 0.1),
            (Request(count=2, compute_milli=1000), 0.05),
            (Request(count=4, compute_milli=1000), 0.05),
            (Request(count=8, compute_milli=1000), 0.05),
        ]
        return cls(shapes=tuple(r for r, _ in mix), weights=tuple(w for _, w in mix))

    def normalised(self) -> tuple[float, ...]:
        total = sum(self.weights)
        return tuple(w / total for w in self.weights)
