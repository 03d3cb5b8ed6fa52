"""Trace-driven cluster simulator: replays a pod list on a node list with a placement policy.

Reads the Alibaba cluster-trace-gpu-v2023 ("openb") CSV format (sharegpu.sim.trace) and follows
the method of Weng et al., ATC'23 (sharegpu.sim.engine). Used by `sharegpu simulate` and
bench/placement.py; it builds on sharegpu.placement and never imports the node agent.
"""

from __future__ import annotations

from sharegpu.sim.engine import Point, SimResult, sample, simulate
from sharegpu.sim.trace import LoadReport, load_nodes, load_pods

__all__ = ["LoadReport", "Point", "SimResult", "load_nodes", "load_pods", "sample", "simulate"]
