"""Who shares a GPU with whom: the colocation figures of the QoS replay.

sharegpu's point is to run offline work in the gaps next to online (latency-sensitive) pods and
to keep online pods apart; these count how far a placement gets there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from sharegpu.placement.cluster import ClusterState
from sharegpu.placement.model import Priority


@dataclass(frozen=True)
class Colocation:
    gpus_in_use: int
    online_gpus: int
    """GPUs with at least one online tenant."""
    mixed_gpus: int
    """GPUs where an online tenant sits next to offline work."""
    online_pods: int
    online_pods_sharing: int
    """Online pods on a GPU that hosts another online pod."""

    @property
    def mixed_share(self) -> float:
        """Share of the GPUs hosting an online pod that also host offline work."""
        return self.mixed_gpus / self.online_gpus if self.online_gpus else 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self) | {"mixed_share": self.mixed_share}


def colocation(state: ClusterState) -> Colocation:
    offline = np.zeros_like(state.tenants)
    online_pods = sharing = 0
    for alloc in state.allocations.values():
        if not alloc.gpus:
            continue
        gpus = list(alloc.gpus)
        if alloc.request.priority is Priority.offline:
            offline[alloc.node, gpus] += 1
        elif alloc.request.priority is Priority.online:
            online_pods += 1
            sharing += bool((state.online[alloc.node, gpus] > 1).any())
    online = state.online > 0
    return Colocation(
        gpus_in_use=int((state.tenants > 0).sum()),
        online_gpus=int(online.sum()),
        mixed_gpus=int((online & (offline > 0)).sum()),
        online_pods=online_pods,
        online_pods_sharing=sharing,
    )
