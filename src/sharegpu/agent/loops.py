"""The agent's periodic loops, built for the daemon.

The daemon runs each loop's ``tick()`` in a worker thread every ``interval_s`` seconds and
stores the events it returns (``sharegpu.agent.events``). docs/agent-loops.md explains each.
"""

from __future__ import annotations

from pathlib import Path

from sharegpu.agent.audit import DEFAULT_TOLERANCE, Auditor
from sharegpu.agent.events import Loop
from sharegpu.agent.qos import QosLoop
from sharegpu.agent.reaper import Reaper
from sharegpu.agent.reconcile import Reconciler
from sharegpu.agent.stalls import StallBreaker


def build_loops(
    root: Path,
    *,
    enforce: str,
    store: object | None = None,
    qos_target_wait_ms: float = 2.0,
    audit_tolerance_bytes: int = DEFAULT_TOLERANCE,
) -> list[Loop]:
    """The loops the daemon runs: reaper (every 1 s), stall breaker (0.5 s), reconciler (1 s),
    audit (2 s) and QoS (1 s).

    `enforce` is the audit's action on a bypass: "report" (events only) or "kill" (SIGKILL the
    offending processes too); anything else is a ValueError. `store` is accepted for the
    daemon's convenience and unused: the loops keep their own small state in memory (a restart
    re-reports open audit findings once) and report only through their events."""
    del store
    return [
        Reaper(root),
        StallBreaker(root),
        Reconciler(root),
        Auditor(root, enforce, audit_tolerance_bytes),
        QosLoop(root, qos_target_wait_ms),
    ]
