"""The extender against a real API server (etcd and kube-apiserver of `make kube`, started by
`kube-node.sh --api-only`): binding with the fence (bindings.py), its state rebuilt and followed
(sync.py), leader election (leader.py) and the command, through the `kubernetes` client.

Two tests keep the API-server stand-in (tests/apiserver_standin.py), for what a real server does
not do on demand: a watch resumed after its history is gone (410 Expired, which a real server
gives only after an etcd compaction) and a Binding it refuses with a 500."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from apiserver_standin import ApiServerStandIn
from e2e.kubenode import ApiObjects, ApiServer, running_api_server
from kubeobjects import SERIALISE, node, pod
from sharegpu.kube.assignment import read_assignment
from sharegpu.kube.bindings import ApiBinder, fence_name
from sharegpu.kube.events import EventRecorder
from sharegpu.kube.extender import Extender
from sharegpu.kube.extender.sync import ClusterSync
from sharegpu.kube.leader import LeaderElector
from sharegpu.kube.request import ANNOTATION_ASSIGNMENT

NS = "sharegpu-system"
# Either server: the real one for all but the two tests the module's docstring names.
Api = ApiObjects | ApiServerStandIn


@pytest.fixture(scope="module")
def server() -> Iterator[ApiServer]:
    with running_api_server() as started:
        objects = ApiObjects(started)
        for namespace in ("ml", NS):
            objects.create("namespaces", {"metadata": {"name": namespace}})
        # Pods in "ml" run as its default ServiceAccount, which the controller manager would make.
        objects.create("serviceaccounts", {"metadata": {"name": "default", "namespace": "ml"}})
        objects.close()
        print(f"API server up in {started.start_s:.1f} s")
        yield started


@pytest.fixture
def api(server: ApiServer) -> Iterator[ApiObjects]:
    """The real API server, emptied of what the test made when it ends."""
    objects = ApiObjects(server)
    objects.mark()
    yield objects
    for resource, namespace in (("pods", "ml"), ("events", "ml"), ("leases", NS), ("nodes", None)):
        objects.delete_all(resource, namespace)
    objects.close()


def wait_until(check: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.02)


class Replica:
    """One extender, as deployed: following the API server, binding through it."""

    def __init__(self, api: Api, identity: str = "a", watch_timeout_s: int = 300) -> None:
        self.client = api.api_client()
        self.events = EventRecorder(self.client)
        self.extender = Extender(ApiBinder(self.client, NS, identity), clock=time.time, events=self.events)
        self.sync = ClusterSync(self.extender, self.client, watch_timeout_s=watch_timeout_s)
        self.sync.start()

    def schedule(self, the_pod: dict[str, Any], names: list[str]) -> str:
        """filter, prioritize and bind as the kube-scheduler does (node names only); the bind's
        Error, or the filter's reasons when no node passed."""
        meta = the_pod["metadata"]
        kept = self.extender.filter({"Pod": the_pod, "Nodes": None, "NodeNames": names})
        if not kept["NodeNames"]:
            return "filtered out: " + json.dumps(
                {**kept["FailedNodes"], **kept["FailedAndUnresolvableNodes"]}
            )
        scores = self.extender.prioritize({"Pod": the_pod, "Nodes": None, "NodeNames": kept["NodeNames"]})
        best = max(scores, key=lambda s: s["Score"])["Host"] if scores else kept["NodeNames"][0]
        args = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": best,
        }
        return str(self.extender.bind(args)["Error"])

    def close(self) -> None:
        self.sync.stop()
        self.events.stop()
        self.client.close()


@pytest.fixture
def replicas(api: Api) -> Iterator[Callable[..., Replica]]:
    made: list[Replica] = []

    def make(identity: str = "a", **kw: Any) -> Replica:
        made.append(Replica(api, identity, **kw))
        return made[-1]

    yield make
    for r in made:
        r.close()


def add_node(api: Api, name: str, gpus: int = 1) -> None:
    api.create("nodes", SERIALISE(node(name, gpus, now=time.time())))


def add_pod(api: Api, name: str, **kw: Any) -> dict[str, Any]:
    return api.create("pods", pod(name, **kw))


def stored(api: Api, name: str) -> dict[str, Any]:
    found = api.get("pods", "ml", name)
    assert found is not None
    return found


def assignment_of(api: Api, name: str) -> Any:
    return read_assignment(stored(api, name)["metadata"].get("annotations"), f"ml/{name}")


def test_bind_writes_the_assignment_and_the_binding_through_the_api_server(
    api: Api, replicas: Callable[..., Replica]
) -> None:
    add_node(api, "gpu-1", gpus=2)
    web = add_pod(api, "web", memory=4096, compute=30, priority="online")
    r = replicas()
    assert r.schedule(web, ["gpu-1"]) == ""
    got = stored(api, "web")
    assert got["spec"]["nodeName"] == "gpu-1"
    assignment = assignment_of(api, "web")
    assert (assignment.node, assignment.priority) == ("gpu-1", "online")
    (container,) = assignment.containers
    assert [(g.memory_mib, g.compute_pct) for g in container.gpus] == [(4096, 30)]
    assert container.gpus[0].uuid.startswith("GPU-gpu-1-")
    # The node's fence advanced once, by this replica.
    fence = api.get("leases", NS, fence_name("gpu-1"))
    assert fence is not None
    assert fence["spec"]["holderIdentity"] == "a"
    # The order of writes: the assignment before the fence, the fence before the binding.
    writes = [(m, p) for m, p in api.writes() if m in ("PATCH", "PUT", "POST")]
    kinds = [p.rsplit("/", 2)[-2] for _, p in writes]
    assert kinds.index("pods") < kinds.index("leases") < len(kinds) - 1
    assert writes[-1][1].endswith("/pods/web/binding")


def test_a_pod_another_replica_binds_while_the_binder_lists_is_counted_once(
    api: Api, replicas: Callable[..., Replica]
) -> None:
    """The binder lists a node's pods in two queries (on their way, and bound). Another
    replica's Binding landing between them must not hide its pod: it is counted, once. (Listed
    bound-first it was in neither, and two replicas put 4 x 30% on one GPU.)"""
    add_node(api, "one", gpus=1)
    p2 = add_pod(api, "p2", memory=8000, compute=30)
    other = replicas("b")
    binder = other.extender.binder
    assert isinstance(binder, ApiBinder)
    deferred: list[tuple[Any, str]] = []
    real_bind = binder._bind
    binder._bind = lambda ref, name: deferred.append((ref, name))  # type: ignore[method-assign]
    assert other.schedule(p2, ["one"]) == ""  # assigned and fenced; its Binding held back
    assert not stored(api, "p2")["spec"].get("nodeName")
    ((ref, name),) = deferred
    mine = ApiBinder(api.api_client(), NS, "a")
    lists = mine._core.list_pod_for_all_namespaces
    selectors: list[str] = []

    def listing(**kw: Any) -> Any:
        got = lists(**kw)
        selectors.append(kw["field_selector"])
        if len(selectors) == 1:
            real_bind(ref, name)  # the other replica's Binding lands between the two lists
        return got

    mine._core.list_pod_for_all_namespaces = listing  # type: ignore[method-assign]
    held = mine._held("one")
    assert stored(api, "p2")["spec"]["nodeName"] == "one"
    assert len(selectors) == 2
    assert [p["metadata"]["name"] for p, _ in held] == ["p2"]


def test_two_replicas_binding_at_once_never_oversubscribe_a_gpu(
    api: Api, replicas: Callable[..., Replica]
) -> None:
    """Two leaders at once (a partition, a paused process): each decides on its own state; the
    fence on the node orders their binds, and what the API server says is held decides."""
    add_node(api, "one", gpus=1)
    pods = [add_pod(api, f"p{i}", memory=8000, compute=30) for i in range(8)]
    a, b = replicas("a"), replicas("b")
    barrier = threading.Barrier(2)
    errors: dict[str, str] = {}

    def run(replica: Replica, mine: list[dict[str, Any]]) -> None:
        barrier.wait()
        for p in mine:
            errors[p["metadata"]["name"]] = replica.schedule(p, ["one"])

    threads = [
        threading.Thread(target=run, args=(a, pods[0::2])),
        threading.Thread(target=run, args=(b, pods[1::2])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bound = [p for p in api.objects("pods") if p["spec"].get("nodeName") == "one"]
    compute = sum(
        g.compute_pct
        for p in bound
        for c in assignment_of(api, p["metadata"]["name"]).containers
        for g in c.gpus
    )
    assert (len(bound), compute) == (3, 90), errors  # 3 x 30% fit one GPU; a fourth never does
    for p in api.objects("pods"):
        if not p["spec"].get("nodeName"):
            # A refused pod keeps no assignment, and says why.
            assert ANNOTATION_ASSIGNMENT not in (p["metadata"].get("annotations") or {})
            assert errors[p["metadata"]["name"]], p["metadata"]["name"]


def test_a_replica_s_next_bind_on_a_node_is_three_calls_and_still_sees_another_replica_s_bind(
    api: Api, replicas: Callable[..., Replica]
) -> None:
    """After its own commit on a node, a binder binds there again with the fence it wrote and
    what it knew the node held: the assignment, the fence's advance, the Binding. A bind by
    another replica meanwhile moves the fence, and the remembered one is refused."""
    assert isinstance(api, ApiObjects)
    add_node(api, "one", gpus=1)
    a, b = replicas("a"), replicas("b")
    assert a.schedule(add_pod(api, "p1", memory=20000, compute=30), ["one"]) == ""
    p2 = add_pod(api, "p2", memory=20000, compute=30)
    api.mark()
    assert a.schedule(p2, ["one"]) == ""
    calls = [(m, path) for m, path in api.requests() if "/events" not in path]
    assert calls == [
        ("PATCH", "/api/v1/namespaces/ml/pods/p2"),
        ("PUT", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{fence_name('one')}"),
        ("POST", "/api/v1/namespaces/ml/pods/p2/binding"),
    ]
    # a decides on p4 while the GPU holds 60%; b binds p3 (90%) before a binds p4.
    p4 = add_pod(api, "p4", memory=20000, compute=30)
    a.extender.filter({"Pod": p4, "Nodes": None, "NodeNames": ["one"]})
    a.extender.prioritize({"Pod": p4, "Nodes": None, "NodeNames": ["one"]})
    assert b.schedule(add_pod(api, "p3", memory=20000, compute=30), ["one"]) == ""
    bind = {"PodName": "p4", "PodNamespace": "ml", "PodUID": p4["metadata"]["uid"], "Node": "one"}
    refused = a.extender.bind(bind)["Error"]
    assert "bound meanwhile" in refused or "no room" in refused, refused
    bound = [p["metadata"]["name"] for p in api.objects("pods") if p["spec"].get("nodeName") == "one"]
    assert sorted(bound) == ["p1", "p2", "p3"]


def test_one_replica_binding_many_pods_at_once_on_one_node_binds_them_all(
    api: Api, replicas: Callable[..., Replica]
) -> None:
    """The kube-scheduler binds in parallel: 16 pods at once on one node. Their binds take turns
    in the replica (a lock per node); racing on the node's fence instead, most of them ran out of
    tries ("kept conflicting") and went back to the scheduler's back-off: 1.9 pods/s on the real
    node (bench/kube_node.py)."""
    add_node(api, "one", gpus=1)
    pods = [add_pod(api, f"p{i}", memory=1000, compute=5) for i in range(16)]
    replica = replicas("a")
    barrier = threading.Barrier(len(pods))
    errors: dict[str, str] = {}

    def run(p: dict[str, Any]) -> None:
        barrier.wait()
        errors[p["metadata"]["name"]] = replica.schedule(p, ["one"])

    threads = [threading.Thread(target=run, args=(p,)) for p in pods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {name: why for name, why in errors.items() if why} == {}
    assert sum(1 for p in api.objects("pods") if p["spec"].get("nodeName") == "one") == 16


def test_a_restarted_extender_reads_what_is_bound_from_the_api_server(
    api: Api, replicas: Callable[..., Replica]
) -> None:
    add_node(api, "one", gpus=1)
    first = replicas("a")
    assert first.schedule(add_pod(api, "held", memory=60000, compute=70), ["one"]) == ""
    first.close()
    again = replicas("a")
    refused = again.schedule(add_pod(api, "newcomer", memory=30000, compute=40), ["one"])
    assert "no room now" in refused
    assert again.schedule(add_pod(api, "small", memory=10000, compute=30), ["one"]) == ""


def test_a_pod_edited_after_it_was_filtered_is_not_bound_on_what_it_no_longer_says(
    api: Api, replicas: Callable[..., Replica]
) -> None:
    add_node(api, "one", gpus=1)
    web = add_pod(api, "web", memory=4096, compute=30)
    r = replicas()
    r.extender.filter({"Pod": web, "Nodes": None, "NodeNames": ["one"]})
    r.extender.prioritize({"Pod": web, "Nodes": None, "NodeNames": ["one"]})

    def edit(obj: dict[str, Any]) -> None:
        obj["metadata"].setdefault("annotations", {})["sharegpu.io/priority"] = "offline"

    api.edit("pods", "ml", "web", edit)
    uid = web["metadata"]["uid"]
    result = r.extender.bind({"PodName": "web", "PodNamespace": "ml", "PodUID": uid, "Node": "one"})
    assert "changed since it was filtered" in result["Error"]
    got = stored(api, "web")
    assert not got["spec"].get("nodeName")
    assert ANNOTATION_ASSIGNMENT not in got["metadata"]["annotations"]
    assert r.extender.state is not None
    assert r.extender.state.allocated_milli == 0


def test_deleted_and_finished_pods_free_their_gpus(api: Api, replicas: Callable[..., Replica]) -> None:
    add_node(api, "one", gpus=1)
    r = replicas()
    assert r.schedule(add_pod(api, "a", memory=40000, compute=60), ["one"]) == ""
    assert "no room now" in r.schedule(add_pod(api, "b", memory=40000, compute=60), ["one"])
    core = client.CoreV1Api(r.client)
    # Deleted, it terminates first: its containers still run (and hold the GPU's memory) until
    # the kubelet stops them, so its GPU stays held; gone (no kubelet here: forced), it is free.
    core.delete_namespaced_pod("a", "ml")
    wait_until(lambda: stored(api, "a")["metadata"].get("deletionTimestamp") is not None, what="terminating")
    assert "no room now" in r.schedule(stored(api, "b"), ["one"])
    core.delete_namespaced_pod("a", "ml", grace_period_seconds=0)
    wait_until(
        lambda: r.extender.state is not None and r.extender.state.allocated_milli == 0, what="the delete"
    )
    assert r.schedule(stored(api, "b"), ["one"]) == ""
    core.patch_namespaced_pod_status("b", "ml", {"status": {"phase": "Succeeded"}})
    wait_until(
        lambda: r.extender.state is not None and r.extender.state.allocated_milli == 0, what="Succeeded"
    )
    assert r.schedule(add_pod(api, "c", memory=40000, compute=60), ["one"]) == ""


def test_a_watch_resumed_too_late_is_listed_again_and_nothing_is_missed() -> None:
    with ApiServerStandIn(history=5) as api:
        add_node(api, "one", gpus=1)
        r = Replica(api, "a", watch_timeout_s=1)
        try:
            assert r.schedule(add_pod(api, "a", memory=40000, compute=60), ["one"]) == ""
            client.CoreV1Api(r.client).delete_namespaced_pod("a", "ml")
            for _ in range(12):  # more changes than the history keeps, while the pod watch reconnects
                api.bump("nodes", None, "one")
            wait_until(lambda: r.sync.relists["pods"] >= 2, what="a relist after 410 Gone")
            wait_until(lambda: r.extender.state is not None and r.extender.state.allocated_milli == 0)
            assert r.schedule(add_pod(api, "b", memory=40000, compute=60), ["one"]) == ""
        finally:
            r.close()


def test_a_binding_the_api_server_refuses_leaves_nothing_held() -> None:
    with ApiServerStandIn() as api:
        add_node(api, "one", gpus=1)
        r = Replica(api)
        try:
            api.fail_next("POST", r"/binding$", status=500, reason="InternalError")
            error = r.schedule(add_pod(api, "web", memory=4096, compute=30), ["one"])
            assert "500" in error
            got = stored(api, "web")
            assert not got["spec"].get("nodeName")
            assert ANNOTATION_ASSIGNMENT not in got["metadata"]["annotations"]
            assert r.extender.state is not None
            assert r.extender.state.allocated_milli == 0
            assert r.schedule(got, ["one"]) == ""  # the scheduler's retry binds it
        finally:
            r.close()


def test_multi_container_pods_get_a_gpu_per_vgpu_through_the_api_server(
    api: Api, replicas: Callable[..., Replica]
) -> None:
    add_node(api, "four", gpus=4)
    r = replicas()
    assert r.schedule(add_pod(api, "pair", memory=20000, compute=50, containers=2), ["four"]) == ""
    assignment = assignment_of(api, "pair")
    assert [c.name for c in assignment.containers] == ["serve", "serve-1"]
    gpus = [g.index for c in assignment.containers for g in c.gpus]
    assert len(set(gpus)) == 2


def test_an_assignment_edited_after_bind_changes_nothing_held(
    api: Api, replicas: Callable[..., Replica]
) -> None:
    add_node(api, "one", gpus=1)
    r = replicas()
    assert r.schedule(add_pod(api, "web", memory=60000, compute=70), ["one"]) == ""

    def edit(obj: dict[str, Any]) -> None:
        obj["metadata"]["annotations"][ANNOTATION_ASSIGNMENT] = '{"version": 1, "node": "one"'  # cut short

    api.edit("pods", "ml", "web", edit)
    r.events.flush()
    wait_until(
        lambda: any(e["reason"] == "AssignmentEdited" for e in api.objects("events")), what="the event"
    )
    (event,) = [e for e in api.objects("events") if e["reason"] == "AssignmentEdited"]
    assert "after bind: GPUs [0] of node one stay held" in event["message"]
    assert "no room now" in r.schedule(add_pod(api, "next", memory=30000, compute=40), ["one"])


def test_an_unschedulable_pod_says_why_in_its_events(api: Api, replicas: Callable[..., Replica]) -> None:
    add_node(api, "one", gpus=1)
    api.create("nodes", SERIALISE(node("old", 1, now=time.time() - 600)))
    r = replicas()
    huge = add_pod(api, "huge", memory=90000, compute=30)
    for _ in range(3):  # the scheduler retries; one event says it
        assert r.schedule(huge, ["one", "old"]).startswith("filtered out")
    bad = add_pod(api, "bad", compute=150)
    r.schedule(bad, ["one"])
    r.events.flush()
    events = {e["involvedObject"]["name"]: e for e in api.objects("events")}
    assert len(api.objects("events")) == 2
    assert events["huge"]["reason"] == "VGPUUnschedulable"
    assert events["huge"]["type"] == "Warning"
    assert events["huge"]["involvedObject"]["uid"] == huge["metadata"]["uid"]
    message = events["huge"]["message"]
    assert message.startswith("no node can take 1 x 30% GPU / 90000 MiB")
    assert "1 node(s): its GPUs cannot hold 1 vGPU(s) of 90000 MiB / 30% even when empty" in message
    assert "1 node(s): sharegpu inventory older than 60 s (its agent is down or cut off)" in message
    assert events["bad"]["reason"] == "InvalidVGPURequest"
    assert "must be 1 to 100" in events["bad"]["message"]


# -- leader election ----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_leader_takes_over_when_the_other_stops_renewing(api: Api) -> None:
    clock = Clock()
    api_client = api.api_client()
    led: list[str] = []
    a = LeaderElector(api_client, NS, "ext", "a", lease_s=15, clock=clock, on_lead=lambda: led.append("a"))
    b = LeaderElector(api_client, NS, "ext", "b", lease_s=15, clock=clock, on_lead=lambda: led.append("b"))
    assert a.try_once()
    assert not b.try_once()
    clock.now = 9
    assert a.try_once()
    assert not b.try_once()
    clock.now = 20  # a stopped renewing at 9; b has seen the same record since 9, for 11 s < 15
    assert not a.is_leader  # a stepped down by itself (renewed 11 s ago, over two thirds of 15)
    assert not b.try_once()
    clock.now = 25
    assert b.try_once()
    assert not a.try_once()
    lease = api.get("leases", NS, "ext")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    b.release()  # a clean shutdown hands it over at once
    assert a.try_once()
    assert led == ["a", "b", "a"]
    api_client.close()


def test_of_two_replicas_taking_over_at_once_one_wins(api: Api, monkeypatch: Any) -> None:
    api_client = api.api_client()
    a = LeaderElector(api_client, NS, "ext", "a")
    assert a.try_once()
    a.release()
    b = LeaderElector(api_client, NS, "ext", "b")
    real = b._leases.replace_namespaced_lease

    def written_between(lease: dict[str, Any]) -> None:
        # Any write moves the Lease's resourceVersion (one that changes nothing does not); this
        # one leaves it free, so b's next try may take it.
        lease["metadata"].setdefault("annotations", {})["sharegpu.io/test-write"] = "1"

    def raced(name: str, namespace: str, body: Any) -> Any:
        api.edit("leases", NS, "ext", written_between)  # another replica wrote between b's read and its write
        return real(name, namespace, body)

    monkeypatch.setattr(b._leases, "replace_namespaced_lease", raced)
    assert not b.try_once()
    monkeypatch.setattr(b._leases, "replace_namespaced_lease", real)
    assert b.try_once()
    api_client.close()


# -- the command --------------------------------------------------------------------------


def start(tmp_path: Path, api: Api, identity: str) -> tuple[subprocess.Popen[bytes], str]:
    """The extender command as deployed; its log in a file (a pipe left unread would fill)."""
    config = api.kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "KUBECONFIG": str(config), "KUBERNETES_SERVICE_HOST": ""}
    cmd = [sys.executable, "-m", "sharegpu.kube.extender", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--identity", identity, "--namespace", NS, "--lease-seconds", "3", "--renew-seconds", "0.3"]
    log = tmp_path / f"{identity}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stderr=out)
    started: list[str] = []

    def up() -> bool:
        started.extend(line for line in log.read_text().splitlines() if "sharegpu extender on " in line)
        if proc.poll() is not None:
            raise AssertionError(f"the extender exited {proc.returncode}: {log.read_text()}")
        return bool(started)

    wait_until(up, timeout=30, what=f"the extender {identity} to start")
    return proc, "http://" + started[0].split(" on ", 1)[1].split()[0]


def test_the_command_leads_binds_and_hands_over(api: Api, tmp_path: Path) -> None:
    add_node(api, "one", gpus=1)
    first, url1 = start(tmp_path, api, "first")
    procs = [first]
    try:
        with httpx.Client(base_url=url1, timeout=10) as h1:
            wait_until(lambda: h1.get("/readyz").status_code == 200, what="the first replica ready")
            web = add_pod(api, "web", memory=4096, compute=30)
            assert h1.post("/filter", json={"Pod": web, "NodeNames": ["one"]}).json()["NodeNames"] == ["one"]
            h1.post("/prioritize", json={"Pod": web, "NodeNames": ["one"]})
            args = {"PodName": "web", "PodNamespace": "ml", "PodUID": web["metadata"]["uid"], "Node": "one"}
            assert h1.post("/bind", json=args).json() == {"Error": ""}
            assert stored(api, "web")["spec"]["nodeName"] == "one"
            second, url2 = start(tmp_path, api, "second")
            procs.append(second)
            with httpx.Client(base_url=url2, timeout=10) as h2:
                wait_until(lambda: h2.get("/healthz").status_code == 200)
                ready = h2.get("/readyz")
                assert ready.status_code == 503
                assert ready.json()["why"] == "not the leader"
                other = add_pod(api, "other", memory=4096, compute=30)
                h2.post("/filter", json={"Pod": other, "NodeNames": ["one"]})
                refused = h2.post(
                    "/bind", json={**args, "PodName": "other", "PodUID": other["metadata"]["uid"]}
                ).json()
                assert "not the leader" in refused["Error"]
                first.send_signal(signal.SIGKILL)  # no hand-over: the second waits out the Lease
                wait_until(lambda: h2.get("/readyz").status_code == 200, timeout=20, what="the take-over")
                h2.post("/filter", json={"Pod": other, "NodeNames": ["one"]})
                assert h2.post(
                    "/bind", json={**args, "PodName": "other", "PodUID": other["metadata"]["uid"]}
                ).json() == {"Error": ""}
                # It knew what the first had bound: the GPU holds 60%, not 30.
                big = add_pod(api, "big", memory=4096, compute=50)
                kept = h2.post("/filter", json={"Pod": big, "NodeNames": ["one"]}).json()
                assert "no room now" in kept["FailedNodes"]["one"]
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
