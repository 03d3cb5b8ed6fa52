"""The kube-scheduler extender: decisions (core.py), its HTTP API (http.py), its state kept in
step with the API server (sync.py) and its command (__main__.py)."""

from sharegpu.kube.extender.core import (
    MAX_SCORE,
    Binder,
    Extender,
    assignment_for,
    placement_request,
    read_workload,
    workload_json,
)
from sharegpu.kube.extender.http import serve

__all__ = [
    "MAX_SCORE",
    "Binder",
    "Extender",
    "assignment_for",
    "placement_request",
    "read_workload",
    "serve",
    "workload_json",
]
