"""deploy/kubernetes/: the example pods are an online and an offline pod sharegpu reads. The
rendered manifests, their schemas and a real agent: tests/e2e/test_kube_manifests.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sharegpu.kube.request import pod_request

REPO = Path(__file__).parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
EXAMPLES = KUBERNETES / "examples"
SCHEDULER_NAME = "sharegpu-scheduler"

Obj = dict[str, Any]


def examples() -> list[Obj]:
    return [d for f in sorted(EXAMPLES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


# ---------------------------------------------------------------------------------------------
# The examples.


def test_the_examples_are_an_online_and_an_offline_pod_sharegpu_reads() -> None:
    pods = examples()
    assert [p["kind"] for p in pods] == ["Pod", "Pod"]
    requests = {p["metadata"]["name"]: pod_request(p) for p in pods}
    inference, training = requests["inference"], requests["training"]
    assert inference is not None
    assert training is not None
    assert (inference.priority, training.priority) == ("online", "offline")
    assert (inference.policy, training.policy) == ("burst", "cap")
    # One card can hold both: memory on a 40 GiB card, guarantees within 100%.
    memory = sum(c.memory_mib or 0 for r in (inference, training) for c in r.containers)
    assert memory <= 40 * 1024
    assert sum(c.compute_pct for r in (inference, training) for c in r.containers) <= 100
    for p in pods:
        assert p["spec"]["schedulerName"] == SCHEDULER_NAME
