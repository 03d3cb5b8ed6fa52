"""Does Kubernetes' own DRA allocator fragment a GPU cluster? The Alibaba trace placed by the real
kube-scheduler from sharegpu's ResourceSlices, beside FGD and sharegpu's placement (issue 38).

    sudo .venv/bin/python bench/dra_trace.py [--nodes 40] [--seeds 42,43] [--json]

The cluster: `--nodes` GPU nodes drawn (per seed) from the trace's node list
(data/alibaba-gpu-v2023), made as Node objects in a real API server (`scripts/kube-node.sh`:
scheduling needs no kubelet; the bench renews their Leases so the node controller keeps them
Ready), each with the ResourceSlice sharegpu's DRA plugin would publish for its GPUs
(kube/dra/slices.py, shared mode: consumable memory and compute). The pods: the default pod list,
drawn with replacement until their GPU demand reaches 100% of the drawn nodes' GPUs, in the
order and with the seed `sharegpu.sim.sample` gives, so all three placements see the same
arrivals:

* **DRA (kube-scheduler):** each pod gets a ResourceClaim (one request per vGPU: its compute in
  percent, 1 MiB of memory since the trace names none, distinct GPUs for several) and its CPU and
  memory requests, and is created once the one before it is bound or found unschedulable (then
  deleted, as the simulator drops a pod that fits nowhere): the default scheduler's profile and
  its DRA allocator decide;
* **FGD** and **sharegpu** (`ours`): the simulator of bench/placement.py on the same nodes.

Printed per seed and placement: the allocation ratio (allocated GPU / the nodes' GPUs) once
100% of it has arrived, and the pods that fit nowhere. Simulated placements and API objects: no
GPU is involved.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the node harness of the e2e tests

import urllib3  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from e2e.kubenode import running_kube_node  # noqa: E402
from sharegpu.devices import Gpu  # noqa: E402
from sharegpu.kube.dra.slices import DRIVER, node_slices  # noqa: E402
from sharegpu.placement.model import Node, Request  # noqa: E402
from sharegpu.sim import load_nodes, load_pods, simulate  # noqa: E402
from sharegpu.sim.engine import sample  # noqa: E402
from sharegpu.sim.trace import LoadReport, screen_pods  # noqa: E402
from sharegpu.spec import MIB  # noqa: E402

DATA = ROOT / "data" / "alibaba-gpu-v2023"
NAMESPACE = "trace"
LABEL = "sharegpu.io/bench-trace"
UNKNOWN_GPU_MEMORY_MIB = 16384  # the trace's G2/G3 name no memory; its pods ask for none
RESOURCE = ("resource.k8s.io", "v1")
SETTLE_S = 5.0


def gpu_objects(node: Node, i: int) -> list[Gpu]:
    memory = (node.gpu_memory_mib or UNKNOWN_GPU_MEMORY_MIB) * MIB
    return [
        Gpu(g, f"GPU-{i:08x}-{g:04x}-0000-0000-000000000000", node.model, memory, 0, 0)
        for g in range(node.gpus)
    ]


class FakeNodes:
    """Node objects without kubelets, kept Ready by renewing their Leases as a kubelet does."""

    def __init__(self, api: client.ApiClient, nodes: list[Node], prefix: str) -> None:
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.objects = client.CustomObjectsApi(api)
        # Names of this round's own: a scheduler that still holds a deleted node of an earlier
        # round under the same name refuses pods it should place (seen: 30 points lost).
        self.names = [f"{prefix}-{i}" for i in range(len(nodes))]
        self.stopping = threading.Event()
        for i, (name, node) in enumerate(zip(self.names, nodes, strict=True)):
            capacity = {"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi", "pods": "1000"}
            made = self.core.create_node({"metadata": {"name": name, "labels": {LABEL: "true"}}, "spec": {}})
            now = datetime.now(UTC)
            ready = {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "lastHeartbeatTime": now.isoformat(),
                "lastTransitionTime": now.isoformat(),
            }
            self.core.patch_node_status(
                name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}}
            )
            for body in node_slices(name, made.metadata.uid, gpu_objects(node, i), "bench", generation=1):
                self.objects.create_cluster_custom_object(*RESOURCE, "resourceslices", body)
        for name in self.names:
            self.coord.create_namespaced_lease(
                "kube-node-lease",
                {
                    "metadata": {"name": name},
                    "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": self._now()},
                },
            )
        self.thread = threading.Thread(target=self._keep, daemon=True)
        self.thread.start()

    @staticmethod
    def _now() -> str:
        return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def renew(self) -> None:
        for name in self.names:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": {"renewTime": self._now()}})

    def _keep(self) -> None:
        while not self.stopping.wait(5):
            with contextlib.suppress(ApiException, urllib3.exceptions.HTTPError):
                self.renew()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        for name in self.names:
            self.coord.delete_namespaced_lease(name, "kube-node-lease")


def claim_body(name: str, pod: Request) -> dict[str, Any]:
    """One request per vGPU: its compute in percent, 1 MiB (the trace names no GPU memory), the
    pod's GPU models, on distinct GPUs."""
    exactly: dict[str, Any] = {
        "deviceClassName": "vgpu.sharegpu.io",
        "capacity": {
            "requests": {"memory": f"{max(pod.memory_mib, 1)}Mi", "compute": str(pod.compute_milli // 10)}
        },
    }
    if pod.models:
        models = json.dumps(sorted(pod.models))
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].model in {models}'}}]
    requests = [{"name": f"gpu{i}", "exactly": exactly} for i in range(pod.count)]
    devices: dict[str, Any] = {"requests": requests}
    if pod.count > 1:
        devices["constraints"] = [
            {"requests": [r["name"] for r in requests], "distinctAttribute": f"{DRIVER}/uuid"}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": devices},
    }


def pod_body(name: str, pod: Request) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "unused",
        "resources": {"requests": {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.host_memory_mib}Mi"}},
    }
    spec: dict[str, Any] = {
        "nodeSelector": {LABEL: "true"},
        "tolerations": [{"operator": "Exists"}],
        "containers": [container],
    }
    if pod.count:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def place_with_dra(api: client.ApiClient, arrivals: list[Request], seed: int) -> dict[str, Any]:
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    allocated = failed = 0
    t0 = time.monotonic()
    for n, pod in enumerate(arrivals):
        name = f"s{seed}-{n}"
        if pod.count:
            objects.create_namespaced_custom_object(
                *RESOURCE, NAMESPACE, "resourceclaims", claim_body(name, pod)
            )
        core.create_namespaced_pod(NAMESPACE, pod_body(name, pod))
        while True:
            got = core.read_namespaced_pod(name, NAMESPACE)
            if got.spec.node_name:
                allocated += pod.gpu_milli
                break
            scheduled = [c for c in got.status.conditions or [] if c.type == "PodScheduled"]
            if scheduled and scheduled[0].status == "False" and scheduled[0].reason == "Unschedulable":
                failed += 1
                core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
                if pod.count:
                    objects.delete_namespaced_custom_object(*RESOURCE, NAMESPACE, "resourceclaims", name)
                break
            time.sleep(0.01)
    return {"allocated_milli": allocated, "failed_pods": failed, "seconds": time.monotonic() - t0}


def clear(api: client.ApiClient) -> None:
    core, objects = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    objects.delete_collection_namespaced_custom_object(*RESOURCE, NAMESPACE, "resourceclaims")
    for node in core.list_node(label_selector=LABEL).items:
        core.delete_node(node.metadata.name)
    objects.delete_collection_cluster_custom_object(*RESOURCE, "resourceslices")  # (the nodes' only)
    while core.list_namespaced_pod(NAMESPACE).items or core.list_node(label_selector=LABEL).items:
        time.sleep(0.2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=40, help="GPU nodes drawn from the trace's list")
    ap.add_argument(
        "--seeds", default="42", help="comma-separated seeds (one cluster and arrival order each)"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    all_nodes, _ = load_nodes(DATA / "openb_node_list_all_node.csv")
    gpu_nodes = [n for n in all_nodes if n.gpus]
    rows = []
    with running_kube_node() as kube:
        api = config.new_client_from_config(str(kube.kubeconfig))
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        kube.kubectl("apply", "-f", str(ROOT / "deploy" / "kubernetes" / "dra" / "deviceclasses.yaml"))
        for seed in seeds:
            rng = np.random.default_rng(seed)
            nodes = [gpu_nodes[i] for i in sorted(rng.choice(len(gpu_nodes), size=args.nodes, replace=False))]
            raw, _ = load_pods(DATA / "openb_pod_list_default.csv", all_nodes)
            pods = screen_pods(enumerate(raw), nodes, LoadReport("screen"))
            capacity = sum(n.gpus for n in nodes) * 1000
            arrivals = sample(pods, capacity, 1.0, seed)
            fake = FakeNodes(api, nodes, f"s{seed}")
            time.sleep(SETTLE_S)  # the scheduler's informers see the nodes and their slices
            try:
                dra = place_with_dra(api, arrivals, seed)
            finally:
                fake.stop()
                clear(api)
            row = {"seed": seed, "nodes": len(nodes), "gpus": capacity // 1000, "pods": len(arrivals)}
            row["dra"] = {
                "ratio": dra["allocated_milli"] / capacity,
                "failed": dra["failed_pods"],
                "seconds": dra["seconds"],
            }
            for policy in ("fgd", "ours"):
                result = simulate(nodes, pods, policy, seed, target=1.0)
                point = result.at(1.0)
                row[policy] = {"ratio": point.allocation_ratio, "failed": point.failed_pods}
            rows.append(row)
        api.close()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"The Alibaba trace (default pod list) on {args.nodes} of its GPU nodes, 100% of their GPUs arrived "
        "(simulated: API objects and the simulator, no GPU)"
    )
    print(f"{'seed':>5} {'GPUs':>5} {'pods':>5}   {'DRA (kube-scheduler)':>22} {'FGD':>16} {'sharegpu':>16}")
    for r in rows:
        cells = [f"{r[k]['ratio'] * 100:6.2f}% ({r[k]['failed']:3d} failed)" for k in ("dra", "fgd", "ours")]
        print(f"{r['seed']:>5} {r['gpus']:>5} {r['pods']:>5}   {cells[0]:>22} {cells[1]:>16} {cells[2]:>16}")
    for key, label in (("dra", "DRA"), ("fgd", "FGD"), ("ours", "sharegpu")):
        values = [r[key]["ratio"] * 100 for r in rows]
        print(f"{label}: mean allocation {statistics.mean(values):.2f}%")
    gap = statistics.mean((r["ours"]["ratio"] - r["dra"]["ratio"]) * 100 for r in rows)
    print(f"sharegpu's placement minus the DRA allocator: {gap:+.2f} points of the cluster's GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
