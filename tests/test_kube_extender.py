"""The scheduler extender, driven with kube-scheduler payloads (ExtenderArgs with capitalised
keys around pods and nodes serialised by the `kubernetes` client), in process and over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from sharegpu.kube.assignment import Assignment
from sharegpu.kube.extender import MAX_SCORE, Extender, placement_request, serve
from sharegpu.kube.inventory import ANNOTATION_INVENTORY, Inventory, InventoryGpu
from sharegpu.kube.request import ANNOTATION_ASSIGNMENT, pod_request
from sharegpu.placement import ClusterState, Placement, place

SERIALISE = client.ApiClient().sanitize_for_serialization
NOW = 1_000_000.0
H100 = "NVIDIA H100 80GB HBM3"


def node(name: str, gpus: int = 2, model: str = H100, *, age_s: float = 0.0, inventory: bool = True) -> Any:
    annotations = {}
    if inventory:
        inv = Inventory(
            gpus=tuple(
                InventoryGpu(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=81559)
                for i in range(gpus)
            ),
            published_at=NOW - age_s,
        )
        annotations[ANNOTATION_INVENTORY] = inv.to_annotation()
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, annotations=annotations),
        status=client.V1NodeStatus(allocatable={"cpu": "32", "memory": "256Gi", "pods": "110"}),
    )


def pod(
    name: str, memory: int | None = 4096, compute: int = 30, count: int = 1, **annotations: str
) -> dict[str, Any]:
    limits = {"sharegpu.io/vgpu": str(count), "sharegpu.io/vgpu-compute": str(compute)}
    if memory is not None:
        limits["sharegpu.io/vgpu-memory"] = str(memory)
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=name,
            namespace="ml",
            uid=f"uid-{name}",
            annotations={f"sharegpu.io/{k.replace('_', '-')}": v for k, v in annotations.items()} or None,
        ),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="serve",
                    image="serve:1",
                    resources=client.V1ResourceRequirements(
                        limits=limits, requests={"cpu": "2", "memory": "8Gi"}
                    ),
                )
            ]
        ),
    )
    serialised: dict[str, Any] = SERIALISE(body)
    return serialised


def args(the_pod: dict[str, Any], nodes: list[Any]) -> dict[str, Any]:
    """ExtenderArgs as the kube-scheduler sends them to an extender that is not node-cache capable."""
    return {"Pod": the_pod, "Nodes": SERIALISE(client.V1NodeList(items=nodes)), "NodeNames": None}


class RecordingBinder:
    def __init__(self, fail: str | None = None) -> None:
        self.bound: list[tuple[str, str, Assignment]] = []
        self.fail = fail
        self.lock = threading.Lock()

    def bind(self, namespace: str, name: str, uid: str, assignment: Assignment) -> None:
        if self.fail:
            raise RuntimeError(self.fail)
        with self.lock:
            self.bound.append((f"{namespace}/{name}", uid, assignment))


def kept(result: dict[str, Any]) -> list[str]:
    return [n["metadata"]["name"] for n in result["Nodes"]["items"]]


def test_filter_keeps_the_nodes_with_room_and_says_why_of_the_others() -> None:
    ext = Extender(clock=lambda: NOW)
    nodes = [
        node("a"),
        node("stale", age_s=600),
        node("bare", inventory=False),
        node("t4", model="Tesla T4"),
    ]
    result = ext.filter(args(pod("web", gpu_model=H100), nodes))
    assert kept(result) == ["a"]
    assert "inventory is 600 s old" in result["FailedNodes"]["stale"]
    final = result["FailedAndUnresolvableNodes"]
    assert "no sharegpu inventory" in final["bare"]
    assert f"GPU model Tesla T4 is not one of {H100}" in final["t4"]
    too_big = ext.filter(args(pod("big", memory=90000), [node("a")]))
    assert "cannot hold 1 vGPU(s) of 90000 MiB" in too_big["FailedAndUnresolvableNodes"]["a"]


def test_a_malformed_pod_fails_on_every_node_with_its_reason() -> None:
    ext = Extender(clock=lambda: NOW)
    result = ext.filter(args(pod("web", compute=150), [node("a"), node("b")]))
    assert kept(result) == []
    assert set(result["FailedAndUnresolvableNodes"]) == {"a", "b"}
    assert "must be 1 to 100" in result["FailedAndUnresolvableNodes"]["a"]


def test_a_pod_without_vgpus_passes_every_node() -> None:
    plain = SERIALISE(
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="nginx", namespace="web", uid="u"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="nginx")]),
        )
    )
    assert kept(Extender(clock=lambda: NOW).filter(args(plain, [node("a"), node("b")]))) == ["a", "b"]


def test_prioritize_ranks_by_the_placement_policy_and_bind_writes_its_decision() -> None:
    binder = RecordingBinder()
    ext = Extender(binder, clock=lambda: NOW)
    nodes = [node("a"), node("b"), node("c")]
    first = pod("first", memory=40000, compute=50)
    ext.filter(args(first, nodes))
    ext.prioritize(args(first, nodes))
    assert ext.bind({"PodName": "first", "PodNamespace": "ml", "PodUID": "uid-first", "Node": "b"}) == {
        "Error": ""
    }
    second = pod("second", memory=20000, compute=30, priority="online")
    assert kept(ext.filter(args(second, nodes))) == ["a", "b", "c"]
    scores = {s["Host"]: s["Score"] for s in ext.prioritize(args(second, nodes))}
    # The policy's own decision on the same state gets the top score.
    state = ClusterState([ext.state.nodes[i] for i in range(3)]) if ext.state else None
    assert state is not None
    request = placement_request(second, pod_request(second))  # type: ignore[arg-type]
    state.allocate(Placement("b", 1, (0,)), placement_request(first, pod_request(first)))  # type: ignore[arg-type]
    best = place(state, request)
    assert isinstance(best, Placement)
    assert scores[best.node] == MAX_SCORE
    assert list(scores.values()) == [MAX_SCORE]  # the decision is decisive; the others score 0
    assert ext.bind(
        {"PodName": "second", "PodNamespace": "ml", "PodUID": "uid-second", "Node": best.node}
    ) == {"Error": ""}
    (_, _, a1), (key, uid, a2) = binder.bound
    assert (a1.node, a1.containers[0].gpus[0].memory_mib, a1.containers[0].gpus[0].compute_pct) == (
        "b",
        40000,
        50,
    )
    assert (key, uid, a2.node, a2.priority, a2.policy) == (
        "ml/second",
        "uid-second",
        best.node,
        "online",
        "share",
    )
    assert a2.containers[0].gpus[0].uuid == f"GPU-{best.node}-{best.gpus[0]}"


def test_two_binds_at_once_never_share_the_room_one_gpu_has() -> None:
    binder = RecordingBinder()
    ext = Extender(binder, clock=lambda: NOW)
    nodes = [node("one", gpus=1)]
    pods = [pod(f"p{i}", memory=50000, compute=60) for i in range(2)]
    for p in pods:
        assert kept(ext.filter(args(p, nodes))) == ["one"]  # each fits alone
    results: list[dict[str, Any]] = []
    barrier = threading.Barrier(2)

    def bind(name: str) -> None:
        barrier.wait()
        results.append(
            ext.bind({"PodName": name, "PodNamespace": "ml", "PodUID": f"uid-{name}", "Node": "one"})
        )

    threads = [threading.Thread(target=bind, args=(f"p{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = sorted(r["Error"] for r in results)
    assert errors[0] == ""
    assert "no room on node one now" in errors[1]
    assert len(binder.bound) == 1


def test_a_restarted_extender_rebuilds_its_state_from_the_bound_pods() -> None:
    binder = RecordingBinder()
    ext = Extender(binder, clock=lambda: NOW)
    nodes = [node("one", gpus=1)]
    held = pod("held", memory=60000, compute=70)
    ext.filter(args(held, nodes))
    assert (
        ext.bind({"PodName": "held", "PodNamespace": "ml", "PodUID": "uid-held", "Node": "one"})["Error"]
        == ""
    )
    (_, _, assignment) = binder.bound[0]
    held["metadata"]["annotations"] = {ANNOTATION_ASSIGNMENT: assignment.to_annotation()}
    again = Extender(binder, clock=lambda: NOW)
    newcomer = pod("new", memory=30000, compute=40)
    assert kept(again.filter(args(newcomer, nodes))) == ["one"]  # it has not seen the bound pod yet
    again.observe(held)
    result = again.filter(args(newcomer, nodes))
    assert kept(result) == []
    assert "no room now" in result["FailedNodes"]["one"]


def test_bind_refuses_what_it_cannot_do_with_a_reason() -> None:
    ext = Extender(RecordingBinder(fail="the API server said 409 Conflict"), clock=lambda: NOW)
    nodes = [node("a")]
    assert "PodUID and Node are required" in ext.bind({"PodName": "x"})["Error"]
    assert (
        "was not filtered by this extender"
        in ext.bind({"PodName": "x", "PodNamespace": "ml", "PodUID": "u", "Node": "a"})["Error"]
    )
    ext.filter(args(pod("web"), nodes))
    assert (
        "no sharegpu inventory"
        in ext.bind({"PodName": "web", "PodNamespace": "ml", "PodUID": "uid-web", "Node": "elsewhere"})[
            "Error"
        ]
    )
    failed = ext.bind({"PodName": "web", "PodNamespace": "ml", "PodUID": "uid-web", "Node": "a"})["Error"]
    assert "409 Conflict" in failed
    assert ext.state is not None
    assert ext.state.allocated_milli == 0  # nothing recorded for a bind that did not happen


@pytest.fixture
def http() -> Iterator[tuple[httpx.Client, RecordingBinder]]:
    binder = RecordingBinder()
    server = serve(Extender(binder, clock=lambda: NOW), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}", timeout=10) as c:
            yield c, binder
    finally:
        server.shutdown()
        server.server_close()


def test_the_http_api_speaks_the_extender_json(http: tuple[httpx.Client, RecordingBinder]) -> None:
    c, binder = http
    payload = args(pod("web"), [node("a"), node("b", age_s=600)])
    started = time.perf_counter()
    filtered = c.post("/filter", json=payload)
    assert filtered.status_code == 200
    assert kept(filtered.json()) == ["a"]
    scores = c.post("/prioritize", json=args(pod("web"), [node("a")])).json()
    assert scores == [{"Host": "a", "Score": MAX_SCORE}]
    bound = c.post("/bind", json={"PodName": "web", "PodNamespace": "ml", "PodUID": "uid-web", "Node": "a"})
    assert bound.json() == {"Error": ""}
    assert time.perf_counter() - started < 5
    assert binder.bound[0][2].node == "a"
    bad = c.post("/filter", content=b"{not json")
    assert bad.status_code == 400
    assert "malformed extender request" in bad.json()["Error"]
    assert c.post("/preempt", json={}).status_code == 404


def test_the_command_refuses_to_bind_for_real_and_a_bad_workload_file(tmp_path: Any) -> None:
    import subprocess
    import sys

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "sharegpu.kube.extender", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)

    real = run("--port", "0")
    assert real.returncode == 2
    assert "binding through the API server is not built yet: run with --dry-run" in real.stderr
    bad = tmp_path / "workload.json"
    bad.write_text('[{"shape": {"count": -1}, "weight": 1}]')
    refused = run("--dry-run", "--port", "0", "--workload", str(bad))
    assert refused.returncode == 2
    assert f"--workload {bad}" in refused.stderr
    assert "GPU count must not be negative" in refused.stderr
