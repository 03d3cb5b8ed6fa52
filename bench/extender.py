"""The scheduler extender on the Alibaba cluster, through its HTTP API, against the simulator.

    python bench/extender.py [--policy sharegpu] [--seed 42] [--json]

The 1,523 nodes of openb_node_list_all_node.csv publish their inventories; the GPU pods of
openb_pod_list_default.csv arrive as `sharegpu simulate` draws them (resampled with replacement
until GPU demand reaches 100% of capacity, shuffled, seeded). Each pod goes through the
extender's HTTP API as the kube-scheduler sends it (a pod serialised by the `kubernetes`
client; nodeCacheCapable, so node names after the first request): `filter`, `prioritize` over
the nodes left, `bind` on the best-scored one. Printed side by side with `simulate()` of the same
pods, policy and seed: the GPU allocation ratio at 100% arrived demand (they must agree within
0.1 point: the extender is the simulator's placement, not a copy), the pods left pending, and
the extender's latency per pod (filter + prioritize + bind, p50 / p99, as a kept-alive client sees
it), pods per second, and the extender process's CPU time per pod (its cost, which other load
on the machine does not inflate as it does the latency tail).
Goal: p99 under 10 ms per pod.

Two adjustments make the trace expressible as pods, and both runs use them: a vGPU's compute is
a whole percent (gpu_milli rounded to 10), and a shared vGPU must state its memory (1 MiB here,
which never binds: the trace gives none); G1-G3, whose memory is undisclosed, get 16 GiB. Pods
without GPUs are left out: the kube-scheduler calls an extender only for pods with its resources.
All figures: this machine, no GPU (placement only).
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from sharegpu.kube.extender import workload_json
from sharegpu.kube.inventory import ANNOTATION_INVENTORY, Inventory, InventoryGpu
from sharegpu.placement import Request, Workload
from sharegpu.placement.model import FULL_GPU, Node
from sharegpu.sim import load_nodes, load_pods, simulate
from sharegpu.sim.engine import sample

DATA = Path(__file__).resolve().parent.parent / "data" / "alibaba-gpu-v2023"
UNDISCLOSED_GPU_MEMORY_MIB = 16 * 1024
SERIALISE = client.ApiClient().sanitize_for_serialization
PUBLISHED_AT = time.time()


def expressible(pod: Request) -> Request:
    compute = min(FULL_GPU, max(10, round(pod.compute_milli / 10) * 10))
    return dataclasses.replace(pod, compute_milli=compute, memory_mib=1 if compute < FULL_GPU else 0)


def with_memory(node: Node) -> Node:
    if node.gpus and not node.gpu_memory_mib:
        return dataclasses.replace(node, gpu_memory_mib=UNDISCLOSED_GPU_MEMORY_MIB)
    return node


def node_object(node: Node) -> dict[str, Any]:
    gpus = tuple(
        InventoryGpu(index=i, uuid=f"GPU-{node.name}-{i}", model=node.model, memory_mib=node.gpu_memory_mib)
        for i in range(node.gpus)
    )
    inventory = Inventory(gpus=gpus, published_at=PUBLISHED_AT)
    body = client.V1Node(
        metadata=client.V1ObjectMeta(
            name=node.name, annotations={ANNOTATION_INVENTORY: inventory.to_annotation()}
        ),
        status=client.V1NodeStatus(
            allocatable={"cpu": f"{node.cpu_milli}m", "memory": f"{node.memory_mib}Mi"}
        ),
    )
    serialised: dict[str, Any] = SERIALISE(body)
    return serialised


def pod_object(request: Request, i: int) -> dict[str, Any]:
    limits = {
        "sharegpu.io/vgpu": str(request.count),
        "sharegpu.io/vgpu-compute": str(request.compute_milli // 10),
    }
    if request.memory_mib:
        limits["sharegpu.io/vgpu-memory"] = str(request.memory_mib)
    annotations = {"sharegpu.io/gpu-model": ",".join(sorted(request.models))} if request.models else None
    requests = {"cpu": f"{request.cpu_milli}m", "memory": f"{request.host_memory_mib}Mi"}
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=f"pod-{i}", namespace="bench", uid=f"uid-{i}", annotations=annotations
        ),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    image="x",
                    resources=client.V1ResourceRequirements(limits=limits, requests=requests),
                )
            ]
        ),
    )
    serialised: dict[str, Any] = SERIALISE(body)
    return serialised


class Scheduler:
    """The kube-scheduler's side of the extender API: one kept-alive connection, JSON bodies.
    http.client rather than httpx: the scheduler is Go, and httpx's own cost per request
    (about 0.4 ms here) would be counted as the extender's."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=60)

    def post(self, path: str, body: object) -> Any:
        self.connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        answer = self.connection.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{path}: {answer.status} {data[:200]!r}")
        return json.loads(data)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.connection.close()


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used (user + system), from /proc: the extender's own cost, which
    other work on the machine does not inflate as it does the wall-clock tail."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(policy: str, seed: int) -> dict[str, float]:
    nodes, _ = load_nodes(DATA / "openb_node_list_all_node.csv")
    nodes = [with_memory(n) for n in nodes]
    pods, _ = load_pods(DATA / "openb_pod_list_default.csv", nodes)
    pods = [expressible(p) for p in pods if p.count]
    workload = Workload.from_requests(pods)
    simulated = simulate(nodes, pods, policy, seed, target=1.0, workload=workload)

    # The extender in a process of its own, as deployed (its HTTP server and this client
    # would otherwise share one interpreter's lock).
    spec = Path(tempfile.mkdtemp(prefix="sharegpu-bench-")) / "workload.json"
    spec.write_text(workload_json(workload))
    # Inventories published once: the replay outlasts their freshness (STALE_AFTER_S), which
    # agents keep by publishing every few seconds.
    cmd = [sys.executable, "-m", "sharegpu.kube.extender", "--dry-run", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--policy", policy, "--seed", str(seed), "1", "--workload", str(spec), "--stale-after", "3600"]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert server.stderr is not None
    started = server.stderr.readline()
    if " on 127.0.0.1:" not in started:
        raise RuntimeError(f"the extender did not start: {started}{server.stderr.read()}")
    url = "http://" + started.split(" on ", 1)[1].split()[0]
    names = [n.name for n in nodes]
    capacity = sum(n.gpus * n.gpu_compute_milli for n in nodes)
    arrivals = sample(pods, capacity, 1.0, seed)
    took: list[float] = []
    placed: list[int] = []
    pending = 0
    try:
        with Scheduler(url) as http:
            every = SERIALISE(client.V1NodeList(items=[]))
            every["items"] = [node_object(n) for n in nodes]
            # The first request carries the node objects (the extender learns them, as from its watch).
            http.post("/filter", {"Pod": pod_object(arrivals[0], -1), "Nodes": every, "NodeNames": None})
            began, cpu_before = time.perf_counter(), cpu_seconds(server.pid)
            for i, request in enumerate(arrivals):
                body = pod_object(request, i)
                t0 = time.perf_counter()
                kept = http.post("/filter", {"Pod": body, "Nodes": None, "NodeNames": names})["NodeNames"]
                if kept:
                    scores = http.post("/prioritize", {"Pod": body, "Nodes": None, "NodeNames": kept})
                    best = max(scores, key=lambda s: s["Score"])["Host"]
                    meta = body["metadata"]
                    args = {
                        "PodName": meta["name"],
                        "PodNamespace": "bench",
                        "PodUID": meta["uid"],
                        "Node": best,
                    }
                    bound = http.post("/bind", args)
                    if bound["Error"]:
                        raise RuntimeError(bound["Error"])
                    placed.append(request.gpu_milli)
                else:
                    pending += 1
                took.append((time.perf_counter() - t0) * 1000)
            elapsed = time.perf_counter() - began
            cpu = cpu_seconds(server.pid) - cpu_before
            allocated = sum(placed)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return {
        "simulator_allocation_pct": simulated.at(1.0).allocation_ratio * 100,
        "extender_allocation_pct": allocated / capacity * 100,
        "simulator_pending": simulated.at(1.0).failed_pods,
        "extender_pending": pending,
        "pods": len(arrivals),
        "p50_ms": statistics.median(took),
        "p99_ms": pct(took, 0.99),
        "pods_per_s": len(arrivals) / elapsed,
        "cpu_ms_per_pod": cpu / len(arrivals) * 1000,
        "load_average": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="sharegpu")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    got = run(args.policy, args.seed)
    if args.json:
        print(json.dumps(got))
        return 0
    gap = got["extender_allocation_pct"] - got["simulator_allocation_pct"]
    print(
        f"Scheduler extender vs simulator, {args.policy}, seed {args.seed}, {got['pods']:.0f} pods (no GPU)"
    )
    print(f"{'':<34}{'simulator':>11}{'extender':>11}{'goal':>10}{'met':>5}")
    sim, ext = got["simulator_allocation_pct"], got["extender_allocation_pct"]
    agree = "yes" if abs(gap) <= 0.1 else "NO"
    print(f"{'GPU allocation at 100% demand, %':<34}{sim:>11.2f}{ext:>11.2f}{'|d|<=0.1':>10}{agree:>5}")
    print(f"{'pods left pending':<34}{got['simulator_pending']:>11.0f}{got['extender_pending']:>11.0f}")
    met = "yes" if got["p99_ms"] < 10 else "NO"
    latency = f"{got['p50_ms']:>8.2f} ms p50, {got['p99_ms']:.2f} ms p99 (goal < 10: {met})"
    print(f"{'per pod (filter+prioritize+bind)':<34}{'':>11}{latency}")
    print(f"{'pods per second':<34}{'':>11}{got['pods_per_s']:>11.0f}")
    print(f"{'extender CPU per pod, ms':<34}{'':>11}{got['cpu_ms_per_pod']:>11.2f}")
    print(f"(load average {got['load_average']:.1f} at the end: the tail grows with other work on the cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
