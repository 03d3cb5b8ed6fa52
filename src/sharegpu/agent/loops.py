"""The agent's periodic loops, built for the daemon.

The daemon runs each loop's ``tick()`` in a worker thread every ``interval_s`` seconds and
stores the events it returns (``sharegpu.agent.events``); the loops that read the tenants' and
GPUs' regions run inside one of them, the sweep (``sharegpu.agent.sweep``), on one read of the
node. docs/agent-loops.md explains each.
"""

from __future__ import annotations

from pathlib import Path

from sharegpu.agent.audit import DEFAULT_TOLERANCE, Auditor
from sharegpu.agent.events import Loop
from sharegpu.agent.qos import QosLoop
from sharegpu.agent.reaper import Reaper
from sharegpu.agent.reconcile import Reconciler
from sharegpu.agent.stalls import StallBreaker
from sharegpu.agent.sweep import Sweep


def build_loops(
    root: Path,
    *,
    enforce: str,
    store: object | None = None,
    qos_target_wait_ms: float = 2.0,
    audit_tolerance_bytes: int = DEFAULT_TOLERANCE,
) -> list[Loop]:
    """The loops the daemon runs: the sweep (every 1 s: the reaper, the reconciler, the audit
    every 2 s and QoS, on one snapshot of the node; the daemon adds the GPU-time loop and the
    online-wait sampler to it) and the stall breaker (0.5 s, on the locks alone).

    `enforce` is the audit's action on a bypass: "report" (events only) or "kill" (SIGKILL the
    offending processes too); anything else is a ValueError. `store` is accepted for the
    daemon's convenience and unused: the loops keep their own small state in memory (a restart
    re-reports open audit findings once) and report only through their events."""
    del store
    sweep = Sweep(
        root,
        [
            Reaper(root),
            Reconciler(root),
            Auditor(root, enforce, audit_tolerance_bytes),
            QosLoop(root, qos_target_wait_ms),
        ],
    )
    return [sweep, StallBreaker(root)]
