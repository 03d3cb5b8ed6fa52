"""The scheduler extender in process, driven with kube-scheduler payloads (ExtenderArgs with
capitalised keys around pods and nodes serialised by the `kubernetes` client). Over HTTP and as
its command: tests/e2e/test_kube_extender.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kubernetes import client

from kubeobjects import H100, NOW, SERIALISE, RecordingBinder, args, kept, node, pod
from sharegpu.kube.assignment import Assignment
from sharegpu.kube.bindings import BindError, Fits, PodRef
from sharegpu.kube.extender import MAX_SCORE, Extender, placement_request
from sharegpu.kube.extender.wire import for_scheduler
from sharegpu.kube.request import ANNOTATION_ASSIGNMENT, pod_request
from sharegpu.placement import ClusterState, Placement, place


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
    assert "inventory older than 60 s" in result["FailedNodes"]["stale"]
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
    # The node's agent went down between filter and bind: its inventory is stale by then.
    late = Extender(RecordingBinder(), clock=lambda: NOW + 120)
    late.learn([SERIALISE(node("a"))])
    late.filter(args(pod("web"), [node("a")]))
    stale = late.bind({"PodName": "web", "PodNamespace": "ml", "PodUID": "uid-web", "Node": "a"})["Error"]
    assert "node a's sharegpu inventory is 120 s old (its agent is down or cut off)" in stale
    assert ext.state is not None
    assert ext.state.allocated_milli == 0  # nothing recorded for a bind that did not happen


def test_preempt_keeps_the_fewest_victims_whose_gpus_make_room() -> None:
    ext = Extender(RecordingBinder(), clock=lambda: NOW)
    nodes = [node("one", gpus=1), node("two", gpus=1)]
    for name, where, compute in (("o1", "one", 50), ("o2", "one", 40), ("o3", "two", 20)):
        p = pod(name, memory=10000, compute=compute, priority="offline")
        ext.filter(args(p, [n for n in nodes if n.metadata.name == where]))
        assert ext.bind({"PodName": name, "PodNamespace": "ml", "PodUID": f"uid-{name}", "Node": where}) == {
            "Error": ""
        }
    big = pod("big", memory=10000, compute=90, priority="online")
    assert kept(ext.filter(args(big, nodes))) == []
    victims = {
        "one": {"Pods": [{"UID": "uid-o1"}, {"UID": "uid-o2"}, {"UID": "uid-plain"}], "NumPDBViolations": 0},
        "two": {"Pods": [{"UID": "uid-plain-2"}], "NumPDBViolations": 1},  # o3 (20%) is not offered
    }
    result = ext.preempt({"Pod": big, "NodeNameToMetaVictims": victims})["NodeNameToMetaVictims"]
    # On one, evicting o1 (50%) leaves 40% + 10% free: not enough; both GPU pods go. The pod
    # without vGPUs the scheduler chose stays. On two, its offer frees no GPU: the node is out.
    assert set(result) == {"one"}
    assert sorted(v["UID"] for v in result["one"]["Pods"]) == ["uid-o1", "uid-o2", "uid-plain"]
    small = pod("small", memory=10000, compute=50, priority="online")
    trimmed = ext.preempt({"Pod": small, "NodeNameToMetaVictims": victims})["NodeNameToMetaVictims"]
    assert [v["UID"] for v in trimmed["one"]["Pods"]] == ["uid-o2", "uid-plain"]  # o2's 40% + 10% free
    plain = SERIALISE(
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="nginx", namespace="web", uid="u"),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="nginx")]),
        )
    )
    assert ext.preempt({"Pod": plain, "NodeNameToMetaVictims": victims})["NodeNameToMetaVictims"] == victims


def test_a_pod_of_several_vgpu_containers_gets_a_gpu_per_vgpu_or_a_reason() -> None:
    binder = RecordingBinder()
    ext = Extender(binder, clock=lambda: NOW)
    nodes = [node("four", gpus=4)]
    pair = pod("pair", memory=20000, compute=50, count=2, containers=2)
    assert kept(ext.filter(args(pair, nodes))) == ["four"]
    assert ext.bind({"PodName": "pair", "PodNamespace": "ml", "PodUID": "uid-pair", "Node": "four"}) == {
        "Error": ""
    }
    (_, _, assignment) = binder.bound[0]
    assert [(c.name, len(c.gpus)) for c in assignment.containers] == [("serve", 2), ("serve-1", 2)]
    assert len({g.index for c in assignment.containers for g in c.gpus}) == 4
    mixed = pod("mixed", memory=20000, compute=50, containers=2)
    mixed["spec"]["containers"][1]["resources"]["limits"]["sharegpu.io/vgpu-compute"] = "30"
    refused = ext.filter(args(mixed, nodes))["FailedAndUnresolvableNodes"]["four"]
    assert (
        "containers ask vGPUs of different sizes (serve: 20000 MiB / 50%, serve-1: 20000 MiB / 30%)"
        in refused
    )


@pytest.mark.timing
def test_a_slow_bind_holds_its_room_and_never_blocks_a_filter() -> None:
    """The API server is slow to answer a bind: the scheduler's next pods are filtered
    meanwhile, and the room being bound counts as taken; a bind that fails gives it back."""
    release = threading.Event()
    entered = threading.Event()

    class SlowBinder(RecordingBinder):
        def bind(self, pod: PodRef, assignment: Assignment, fits: Fits) -> str:
            entered.set()
            assert release.wait(30)
            if self.fail:
                raise BindError(self.fail)
            return super().bind(pod, assignment, fits)

    for fail in (None, "the API server said no"):
        binder = SlowBinder(fail=fail)
        ext = Extender(binder, clock=lambda: NOW)
        nodes = [node("one", gpus=1)]
        first, second = pod("first", memory=50000, compute=60), pod("second", memory=40000, compute=50)
        ext.filter(args(first, nodes))
        ext.prioritize(args(first, nodes))
        result: list[dict[str, Any]] = []
        entered.clear()
        release.clear()
        bind_args = {"PodName": "first", "PodNamespace": "ml", "PodUID": "uid-first", "Node": "one"}
        thread = threading.Thread(target=lambda: result.append(ext.bind(bind_args)))  # noqa: B023 (joined below)
        thread.start()
        assert entered.wait(30)
        began = time.monotonic()
        during = ext.filter(args(second, nodes))
        assert time.monotonic() - began < 5  # not held up by the bind in flight
        assert "no room now" in during["FailedNodes"]["one"]
        release.set()
        thread.join(30)
        after = ext.filter(args(second, nodes))
        if fail is None:
            assert result == [{"Error": ""}]
            assert "no room now" in after["FailedNodes"]["one"]
        else:
            assert "the API server said no" in result[0]["Error"]
            assert kept(after) == ["one"]  # the reservation was given back


def test_reasons_reach_the_scheduler_without_a_percent_sign() -> None:
    """The kube-scheduler formats the extender's reasons (Eventf), so a '%' must not reach it."""
    reply = {
        "NodeNames": ["a"],
        "FailedNodes": {"b": "no room now for 1 x 10% GPU / 4096 MiB"},
        "FailedAndUnresolvableNodes": {"c": "GPUs of 50% at most"},
        "Error": "",
    }
    out = for_scheduler(reply)
    assert out["FailedNodes"] == {"b": "no room now for 1 x 10 percent GPU / 4096 MiB"}
    assert out["FailedAndUnresolvableNodes"] == {"c": "GPUs of 50 percent at most"}
    assert out["NodeNames"] == ["a"]
    assert out["Error"] == ""
    assert for_scheduler({"Error": "no room for 30%"})["Error"] == "no room for 30 percent"
    assert for_scheduler([{"Host": "a", "Score": 10}]) == [{"Host": "a", "Score": 10}]  # prioritize
    assert reply["FailedNodes"]["b"].endswith("10% GPU / 4096 MiB")  # the caller's reply untouched
