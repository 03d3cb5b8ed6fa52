"""The agent's event counters behind its Prometheus metrics (sharegpu.agent.metrics), in process.
A real agent on the simulated GPU, scraped over HTTP: tests/integration/test_metrics.py.
"""

from __future__ import annotations

from sharegpu.agent import metrics
from sharegpu.agent.events import Event


def test_event_counts() -> None:
    counts = metrics.EventCounts()
    counts.observe(
        [
            Event(kind="audit.bypass", message="x"),
            Event(kind="audit.bypass", message="x"),
            Event(kind="audit.bypass", message="x", data={"cleared": True}),  # not a finding
            Event(kind="audit.compute_uncharged", message="x"),
            Event(kind="qos.decision", message="x", data={"action": "lower"}),
            Event(kind="process.reaped", message="x", data={"region": "arbiter"}),
            Event(kind="tenant.reaped", message="x"),
            Event(kind="tenant.created", message="x"),
        ]
    )
    audit, qos, reaped, tenants = counts.snapshot()
    assert audit == {"untracked": 0, "bypass": 2, "killed": 0, "compute_uncharged": 1}
    assert qos == {"raise": 0, "lower": 1, "hold": 0}
    assert reaped == {"usage": 0, "arbiter": 1}
    assert tenants == 1
