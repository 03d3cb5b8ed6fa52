"""The kube-scheduler extender: its decisions (core.py), between pods and placement
(translate.py), the extender API's JSON (wire.py), its HTTP server (http.py), its state kept in
step with the API server (sync.py) and its command (__main__.py)."""

from sharegpu.kube.extender.core import MAX_SCORE, Binder, Extender
from sharegpu.kube.extender.http import serve
from sharegpu.kube.extender.translate import assignment_for, placement_request, read_workload, workload_json

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
