"""Pods through a real Kubernetes node: plain, through sharegpu's extender, and with DRA claims
(issues 37 and 38).

    sudo .venv/bin/python bench/kube_node.py [--pods 16] [--rounds 3] [--json]

The node is `scripts/kube-node.sh` (real API server, kube-scheduler, kubelet, containerd 2) with
sharegpu set up as `tests/e2e/kubesharegpu.py` does for the end-to-end tests (deploy/kubernetes
applied; the agent, device plugin, extender and sharegpu-scheduler under their ServiceAccounts;
a simulated GPU of 8 GiB). Each round creates a batch of pods at once, of one kind at a time:

* plain:   busybox pods, no vGPU, the cluster's default kube-scheduler;
* plain-s: the same pods through `sharegpu-scheduler` (the same binary and profile, whose
           extender is not called for pods without sharegpu resources): the second scheduler's
           own cost;
* vgpu:    pods of 1 vGPU, 256 MiB and 5% each (16 fit the card), through `sharegpu-scheduler`
           and the extender (filter, prioritize, bind), allocated by the device plugin through
           the agent and given their device by containerd's CDI;
* dra:     pods of one DRA claim each (a ResourceClaimTemplate of 256 MiB and 5% of class
           vgpu.sharegpu.io), placed by the default kube-scheduler from the node's ResourceSlice,
           prepared by sharegpu's DRA plugin through the same agent, given their device by CDI.
           The plugin runs beside the device plugin (tests/e2e/kubesharegpu.py,
           start_dra_plugin), on the same card.

Printed per kind, over all rounds: pods per second from the batch's creation to its last pod
bound (`spec.nodeName`), and per pod p50 / p99 of created -> bound and bound -> Running, as a
watch of the API server sees them (client-side times, so the 1-second resolution of the
objects' own timestamps does not blur them). All figures: this machine, simulated GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the node and sharegpu harness of the e2e tests

import urllib3  # noqa: E402
from kubernetes import client, config, watch  # noqa: E402

from e2e.kubenode import running_kube_node  # noqa: E402
from e2e.kubesharegpu import DEPLOY, PROBE_IMAGE, sharegpu_on, start_dra_plugin  # noqa: E402

NAMESPACE = "bench"
KINDS = ("plain", "plain-s", "vgpu", "dra")
CLAIM_TEMPLATE = "bench-vgpu"


def claim_template() -> dict[str, Any]:
    request = {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "vgpu.sharegpu.io",
            "capacity": {"requests": {"memory": "256Mi", "compute": "5"}},
        },
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": CLAIM_TEMPLATE, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def pod(name: str, kind: str) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": PROBE_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "600"],
    }
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": 0, "containers": [container]}
    if kind in ("plain-s", "vgpu"):
        spec["schedulerName"] = "sharegpu-scheduler"
    if kind == "dra":
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": CLAIM_TEMPLATE}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    if kind == "vgpu":
        limits = {"sharegpu.io/vgpu": "1", "sharegpu.io/vgpu-memory": "256", "sharegpu.io/vgpu-compute": "5"}
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": kind}},
        "spec": spec,
    }


class Timeline:
    """When each pod was first seen bound and Running, by a watch started before the batch."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.bound: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.ready = threading.Event()
        self.watch = watch.Watch()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _follow(self) -> None:
        # The node may stop under a watch that was not stopped: its end is no error.
        with contextlib.suppress(urllib3.exceptions.HTTPError):
            self._stream()

    def _stream(self) -> None:
        version = self.core.list_namespaced_pod(NAMESPACE).metadata.resource_version
        self.ready.set()
        for event in self.watch.stream(self.core.list_namespaced_pod, NAMESPACE, resource_version=version):
            obj = event["object"]
            name, now = obj.metadata.name, time.monotonic()
            if obj.spec.node_name and name not in self.bound:
                self.bound[name] = now
            if obj.status.phase == "Running" and name not in self.running:
                self.running[name] = now

    def stop(self) -> None:
        self.watch.stop()


def why_stuck(core: client.CoreV1Api, names: list[str]) -> str:
    """The first stuck pod's phase and its latest event: what a failed batch is told with."""
    found = core.read_namespaced_pod(names[0], NAMESPACE)
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={names[0]}").items
    last = max(events, key=lambda e: e.last_timestamp or e.event_time or 0, default=None)
    said = f"{last.reason}: {last.message}" if last else "no event"
    return f"{names[0]} is {found.status.phase} on {found.spec.node_name or 'no node'}, last event {said}"


def batch(api: client.ApiClient, kind: str, count: int, round_no: int) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    names = [f"{kind}-{round_no}-{i}" for i in range(count)]
    timeline = Timeline(api)
    created: dict[str, float] = {}
    t0 = time.monotonic()
    for name in names:
        core.create_namespaced_pod(NAMESPACE, pod(name, kind))
        created[name] = time.monotonic()
    deadline = t0 + 180
    while (len(timeline.running) < count) and time.monotonic() < deadline:
        time.sleep(0.05)
    timeline.stop()
    if len(timeline.running) < count:
        stuck = [n for n in names if n not in timeline.running]
        raise SystemExit(
            f"{kind}: {len(timeline.running)} of {count} pods Running after 180 s "
            f"({len(timeline.bound)} bound); {why_stuck(core, stuck)}"
        )
    last_bound = max(timeline.bound[n] for n in names)
    result = {
        "pods_per_s": count / (last_bound - t0),
        "bind_ms": [1000 * (timeline.bound[n] - created[n]) for n in names],
        "run_ms": [1000 * (timeline.running[n] - timeline.bound[n]) for n in names],
    }
    core.delete_collection_namespaced_pod(NAMESPACE, label_selector=f"bench={kind}", grace_period_seconds=0)
    claims = client.CustomObjectsApi(api)
    # Gone, and their claims deallocated and deleted (the next batch needs the card's room).
    while (
        core.list_namespaced_pod(NAMESPACE).items
        or claims.list_namespaced_custom_object("resource.k8s.io", "v1", NAMESPACE, "resourceclaims")["items"]
    ):
        time.sleep(0.2)
    return result


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--pods", type=int, default=16, help="pods per batch (a vGPU batch must fit the card: 16)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not 1 <= args.pods <= 16:
        ap.error("--pods must be 1 to 16 (16 vGPUs of 256 MiB and 5% fit the simulated card)")
    root = Path(tempfile.mkdtemp(prefix="bench-kube-"))
    with running_kube_node() as node, sharegpu_on(node, root) as gpu:
        # The DRA driver beside the device plugin, as on a cluster moving its nodes to DRA: its
        # classes (no extended-resource mapping beside the device plugin) and the plugin's RBAC.
        dra = DEPLOY / "dra"
        node.kubectl("apply", "-f", str(dra / "deviceclasses.yaml"), "-f", str(dra / "rbac.yaml"))
        start_dra_plugin(gpu, root)
        api = config.new_client_from_config(str(node.kubeconfig))
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "resource.k8s.io", "v1", NAMESPACE, "resourceclaimtemplates", claim_template()
        )
        results: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        for r in range(args.rounds):
            for kind in KINDS:
                results[kind].append(batch(api, kind, args.pods, r))
        api.close()
    summary = {}
    for kind, runs in results.items():
        bind = [x for run in runs for x in run["bind_ms"]]
        run_ms = [x for run in runs for x in run["run_ms"]]
        summary[kind] = {
            "pods_per_s": statistics.median(run["pods_per_s"] for run in runs),
            "bind_p50_ms": percentile(bind, 0.5),
            "bind_p99_ms": percentile(bind, 0.99),
            "run_p50_ms": percentile(run_ms, 0.5),
            "run_p99_ms": percentile(run_ms, 0.99),
        }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"Pods through a real node, {args.pods} per batch, {args.rounds} rounds (simulated GPU, this machine)"
    )
    print(f"{'kind':8} {'pods/s':>8} {'created->bound p50/p99 ms':>27} {'bound->Running p50/p99 ms':>27}")
    for kind, s in summary.items():
        bind = f"{s['bind_p50_ms']:.0f} / {s['bind_p99_ms']:.0f}"
        run = f"{s['run_p50_ms']:.0f} / {s['run_p99_ms']:.0f}"
        print(f"{kind:8} {s['pods_per_s']:8.1f} {bind:>27} {run:>27}")
    for kind, against, what in (
        ("vgpu", "plain-s", "vGPU (extender) against plain pods, same scheduler"),
        ("dra", "plain", "DRA claims against plain pods, default scheduler"),
        ("dra", "vgpu", "DRA claims against vGPU pods through the extender"),
    ):
        a, b = summary[kind], summary[against]
        ratio = a["pods_per_s"] / b["pods_per_s"]
        slower = a["run_p50_ms"] - b["run_p50_ms"]
        print(f"{what}: {ratio:.2f}x pods/s, bound->Running p50 {slower:+.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
