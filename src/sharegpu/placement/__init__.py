"""Placement and preemption: where a vGPU request goes in a cluster of GPU nodes.

Used by the scheduler extender and by the simulator (sharegpu.sim); it never imports the node
agent or the runtime. Build a ``ClusterState`` from ``Node``s (and ``allocate`` what already
runs), then ask ``place`` for a ``Placement`` or a ``NoFit`` that says why, and
``plan_preemption`` for the offline tenants an online request would evict. Policies:
``random``, ``best-fit``, ``dot-product``, ``gpu-packing``, ``gpu-clustering``, ``fgd`` and
``sharegpu`` (alias ``ours``); see docs/placement.md.
"""

from __future__ import annotations

import numpy as np

from sharegpu.placement.cluster import Allocation, ClusterState
from sharegpu.placement.engine import decide
from sharegpu.placement.model import (
    Decision,
    Node,
    NoFit,
    NoFitReason,
    Placement,
    Priority,
    Request,
    Topology,
)
from sharegpu.placement.policies import POLICIES, Policy, make_policy
from sharegpu.placement.preempt import PreemptionPlan, plan_preemption
from sharegpu.placement.workload import Workload

DEFAULT_POLICY = "sharegpu"


def place(
    state: ClusterState, request: Request, policy: str | Policy = DEFAULT_POLICY, seed: int = 0
) -> Decision:
    """Where ``request`` goes now (``state`` is not changed: call ``state.allocate`` to commit).

    For repeated decisions keep one ``Policy`` object (``make_policy``): the fragmentation-aware
    policies cache per-node figures between decisions.
    """
    chooser = make_policy(policy) if isinstance(policy, str) else policy
    return decide(state, request, chooser, np.random.default_rng(seed))


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Allocation",
    "ClusterState",
    "Decision",
    "NoFit",
    "NoFitReason",
    "Node",
    "Placement",
    "Policy",
    "PreemptionPlan",
    "Priority",
    "Request",
    "Topology",
    "Workload",
    "make_policy",
    "place",
    "plan_preemption",
]
