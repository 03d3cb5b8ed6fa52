"""The API-server stand-in (tests/apiserver_standin.py) driven by the real `kubernetes` client, so
that what tests of the extender and the node component learn from it holds for the client too."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from apiserver_standin import ApiServerStandIn


@pytest.fixture
def core(api: ApiServerStandIn) -> Iterator[client.CoreV1Api]:
    with api.api_client() as api_client:
        yield client.CoreV1Api(api_client)


def pod(name: str, node: str = "", phase: str = "", labels: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name="c", image="busybox")], node_name=node or None
        ),
        status=client.V1PodStatus(phase=phase) if phase else None,
    )


def status_of(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body)
    return body


def raw(api: ApiServerStandIn, method: str, path: str, body: object = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(api.url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def test_nodes_and_pods_are_created_read_and_listed(api: ApiServerStandIn, core: client.CoreV1Api) -> None:
    node = core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n1", labels={"gpu": "yes"})))
    assert node.metadata.uid
    assert node.metadata.creation_timestamp is not None
    assert node.metadata.namespace is None
    created = core.create_namespaced_pod("team", pod("p1"))
    assert created.metadata.namespace == "team"
    assert created.status.phase == "Pending"  # defaulted
    assert int(created.metadata.resource_version) > int(node.metadata.resource_version)

    assert core.read_node("n1").metadata.labels == {"gpu": "yes"}
    assert core.read_namespaced_pod("p1", "team").metadata.uid == created.metadata.uid
    assert [n.metadata.name for n in core.list_node().items] == ["n1"]
    listed = core.list_pod_for_all_namespaces()
    assert [p.metadata.name for p in listed.items] == ["p1"]
    assert listed.metadata.resource_version == api.resource_version
    assert core.list_namespaced_pod("other").items == []
    assert api.get("pods", "team", "p1")["kind"] == "Pod"  # type: ignore[index]
    assert api.get("nodes", None, "n1") is not None
    assert ("POST", "/api/v1/namespaces/team/pods") in api.requests

    core.delete_namespaced_pod("p1", "team")
    assert api.objects("pods") == []


def test_merge_patch_sets_annotations_and_null_deletes_one(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p", labels={"app": "a"}))
    # A dict body goes out as a strategic merge patch, applied here as a JSON merge patch.
    patched = core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "1", "b": "2"}}})
    assert patched.metadata.annotations == {"a": "1", "b": "2"}
    patched = core.patch_namespaced_pod(
        "p",
        "default",
        {"metadata": {"annotations": {"a": None, "c": "3"}}},
        _content_type="application/merge-patch+json",
    )
    assert patched.metadata.annotations == {"b": "2", "c": "3"}
    assert patched.metadata.labels == {"app": "a"}
    # A patch that changes nothing is no write: the resourceVersion stays.
    again = core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"b": "2"}}})
    assert again.metadata.resource_version == patched.metadata.resource_version


def test_json_patch_operations_and_a_failed_test(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p", labels={"app": "a"}))
    ops = [
        {"op": "add", "path": "/metadata/annotations", "value": {"x/y": "1"}},
        {"op": "replace", "path": "/metadata/annotations/x~1y", "value": "2"},
        {"op": "test", "path": "/metadata/labels/app", "value": "a"},
        {"op": "remove", "path": "/metadata/labels/app"},
    ]
    patched = core.patch_namespaced_pod("p", "default", ops)  # a list goes out as json-patch+json
    assert patched.metadata.annotations == {"x/y": "2"}
    assert not patched.metadata.labels
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("p", "default", [{"op": "test", "path": "/metadata/name", "value": "q"}])
    assert err.value.status == 422


def test_stale_resource_version_conflicts_on_put_and_patch(
    api: ApiServerStandIn, core: client.CoreV1Api
) -> None:
    core.create_namespaced_pod("default", pod("p"))
    read = core.read_namespaced_pod("p", "default")
    api.bump("pods", "default", "p")  # a kubelet's status update, say, in between
    read.metadata.annotations = {"mine": "1"}
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_pod("p", "default", read)
    assert err.value.status == 409
    assert status_of(err.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on pods "p": the object has been modified; '
        "please apply your changes to the latest version and try again",
        "reason": "Conflict",
        "details": {"name": "p", "kind": "pods"},
        "code": 409,
    }
    stale = {"metadata": {"resourceVersion": read.metadata.resource_version, "annotations": {"mine": "1"}}}
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("p", "default", stale)
    assert err.value.status == 409
    # A patch naming the current resourceVersion, and a PUT naming none, go through.
    current = core.read_namespaced_pod("p", "default").metadata.resource_version
    stale["metadata"]["resourceVersion"] = current
    assert core.patch_namespaced_pod("p", "default", stale).metadata.annotations == {"mine": "1"}
    read.metadata.resource_version = None
    read.metadata.annotations = {"theirs": "2"}
    assert core.replace_namespaced_pod("p", "default", read).metadata.annotations == {"theirs": "2"}
    # A uid in a patch is immutable, not a precondition (422); in a PUT it is one (409).
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_pod("p", "default", {"metadata": {"uid": "another"}})
    assert err.value.status == 422
    read.metadata.uid = "another"
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_pod("p", "default", read)
    assert err.value.status == 409
    assert "Precondition failed: UID in precondition: another" in status_of(err.value)["message"]


def test_already_exists_not_found_and_bad_paths(api: ApiServerStandIn, core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", pod("p"))
    assert err.value.status == 409
    assert status_of(err.value)["reason"] == "AlreadyExists"
    assert status_of(err.value)["message"] == 'pods "p" already exists'
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("q", "default")
    assert err.value.status == 404
    assert status_of(err.value)["details"] == {"name": "q", "kind": "pods"}
    with pytest.raises(ApiException) as err:
        client.CoordinationV1Api(core.api_client).read_namespaced_lease("l", "default")
    assert status_of(err.value)["message"] == 'leases.coordination.k8s.io "l" not found'
    assert raw(api, "GET", "/api/v1/widgets")[0] == 404
    assert raw(api, "GET", "/api/v1/namespaces/default/nodes")[0] == 404
    code, body = raw(api, "POST", "/api/v1/pods", {"metadata": {"name": "x"}})
    assert (code, body["reason"]) == (405, "MethodNotAllowed")
    code, body = raw(api, "POST", "/api/v1/namespaces/default/pods", {"metadata": {}})
    assert (code, body["reason"]) == (422, "Invalid")


def test_binding_sets_node_name_once_and_checks_the_uid(
    api: ApiServerStandIn, core: client.CoreV1Api
) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    uid = created.metadata.uid

    def binding(name: str, node: str, uid: str | None = None) -> client.V1Binding:
        return client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, uid=uid),
            target=client.V1ObjectReference(kind="Node", api_version="v1", name=node),
        )

    with pytest.raises(ApiException) as err:
        core.create_namespaced_binding("default", binding("p", "n1", "not-the-uid"), _preload_content=False)
    assert err.value.status == 409
    assert "Precondition failed: UID in precondition: not-the-uid" in status_of(err.value)["message"]
    # The server answers a Status, not a Binding: read it raw (kubernetes-client/python#825).
    resp = core.create_namespaced_binding("default", binding("p", "n1", uid), _preload_content=False)
    assert resp.status == 201
    assert json.loads(resp.data) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    bound = core.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "n1"
    assert int(bound.metadata.resource_version) > int(created.metadata.resource_version)
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_binding("default", binding("p", "n2"), _preload_content=False)
    assert err.value.status == 409
    assert status_of(err.value)["message"] == (
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n1"'
    )
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_binding("gone", "default", binding("gone", "n1"), _preload_content=False)
    assert err.value.status == 404
    assert ("POST", "/api/v1/namespaces/default/pods/gone/binding") in api.requests

    # Preloaded, the client fails to read that Status as a V1Binding, after the bind is done.
    core.create_namespaced_pod("default", pod("q"))
    with pytest.raises(ValueError, match="target"):
        core.create_namespaced_pod_binding("q", "default", binding("q", "n2"))
    assert core.read_namespaced_pod("q", "default").spec.node_name == "n2"


def test_field_and_label_selectors(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(
        "a", pod("on-n1", node="n1", phase="Running", labels={"app": "x", "tier": "1"})
    )
    core.create_namespaced_pod("a", pod("done-n1", node="n1", phase="Succeeded", labels={"app": "y"}))
    core.create_namespaced_pod("b", pod("pending", labels={"app": "z"}))

    def names(**kwargs: str) -> list[str]:
        return [p.metadata.name for p in core.list_pod_for_all_namespaces(**kwargs).items]  # type: ignore[arg-type]

    assert names(field_selector="spec.nodeName=n1") == ["done-n1", "on-n1"]
    assert names(field_selector="spec.nodeName=") == ["pending"]
    assert names(field_selector="status.phase!=Succeeded") == ["on-n1", "pending"]
    assert names(field_selector="spec.nodeName==n1,status.phase!=Succeeded") == ["on-n1"]
    assert names(field_selector="metadata.namespace=b") == ["pending"]
    assert names(label_selector="app=x") == ["on-n1"]
    assert names(label_selector="app!=x") == ["done-n1", "pending"]
    assert names(label_selector="tier") == ["on-n1"]
    assert names(label_selector="!tier,app in (x,y,z)") == ["done-n1", "pending"]
    assert [p.metadata.name for p in core.list_namespaced_pod("a", label_selector="app notin (x)").items] == [
        "done-n1"
    ]
    with pytest.raises(ApiException) as err:
        core.list_pod_for_all_namespaces(field_selector="spec.restartPolicy=Always")
    assert err.value.status == 400
    assert status_of(err.value)["message"] == "field label not supported: spec.restartPolicy"


def test_watch_from_a_resource_version_sees_changes_in_order(
    api: ApiServerStandIn, core: client.CoreV1Api
) -> None:
    since = core.list_pod_for_all_namespaces().metadata.resource_version
    core.create_namespaced_pod("default", pod("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "1"}}})
    deleted = core.delete_namespaced_pod("p", "default")
    assert deleted.metadata.name == "p"  # DELETE answers the object, gone at once

    def later() -> None:
        time.sleep(0.2)
        api.create("pods", {"metadata": {"name": "late"}})

    threading.Thread(target=later, daemon=True).start()
    w = watch.Watch()
    seen = []
    for event in w.stream(core.list_pod_for_all_namespaces, resource_version=since, timeout_seconds=10):
        seen.append((event["type"], event["object"].metadata.name, event["object"].metadata.resource_version))
        if len(seen) == 4:
            w.stop()
    assert [s[:2] for s in seen] == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p"), ("ADDED", "late")]
    versions = [int(s[2]) for s in seen]
    assert versions == sorted(versions)
    assert versions[0] > int(since)


def test_watch_without_version_starts_with_the_current_objects(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("a"))
    core.create_namespaced_pod("default", pod("b", node="n1"))
    w = watch.Watch()
    events = list(
        w.stream(core.list_pod_for_all_namespaces, field_selector="spec.nodeName=", timeout_seconds=1)
    )
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "a")]


def test_watch_sends_deleted_when_an_object_leaves_the_selection(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p", phase="Running"))
    since = core.read_namespaced_pod("p", "default").metadata.resource_version
    done = core.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Succeeded"}})
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        "default",
        field_selector="status.phase!=Succeeded",
        resource_version=since,
        timeout_seconds=10,
    )
    event = next(stream)
    w.stop()
    stream.close()
    assert event["type"] == "DELETED"
    # The content it last matched with, at the version of the change that took it out.
    assert event["object"].status.phase == "Running"
    assert event["object"].metadata.resource_version == done.metadata.resource_version


def test_watch_from_before_the_history_is_410_expired() -> None:
    with ApiServerStandIn(history=3) as small, small.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        versions = [
            core.create_namespaced_pod("default", pod(f"p{i}")).metadata.resource_version for i in range(6)
        ]
        old, oldest_kept = versions[0], versions[3]  # the last 3 changes are kept: p3, p4, p5
        message = f"too old resource version: {old} ({versions[2]})"
        resp = core.list_pod_for_all_namespaces(watch=True, resource_version=old, _preload_content=False)
        error = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        error.update(message=message, reason="Expired", code=410)
        assert [json.loads(line) for line in resp.data.decode().splitlines()] == [
            {"type": "ERROR", "object": error}
        ]
        # With timeout_seconds the client does not retry: the 410 is raised at once.
        with pytest.raises(ApiException) as err:
            list(
                watch.Watch().stream(
                    core.list_pod_for_all_namespaces, resource_version=old, timeout_seconds=5
                )
            )
        assert err.value.status == 410
        assert err.value.reason == f"Expired: {message}"
        # Without, it retries once from the same version, then raises: the caller must list again.
        before = len(small.requests)
        with pytest.raises(ApiException) as err:
            list(watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=old))
        assert err.value.status == 410
        assert len(small.requests) - before == 2
        # From a version whose successors are all kept, the watch goes on.
        w = watch.Watch()
        events = list(
            w.stream(core.list_pod_for_all_namespaces, resource_version=oldest_kept, timeout_seconds=1)
        )
        assert [e["object"].metadata.name for e in events] == ["p4", "p5"]


@pytest.mark.timing
def test_watch_ends_at_timeout_seconds_and_on_close() -> None:
    api = ApiServerStandIn()
    with api.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        start = time.monotonic()
        assert list(watch.Watch().stream(core.list_node, timeout_seconds=1)) == []
        assert 0.9 <= time.monotonic() - start < 5

        ended = threading.Event()

        def watching() -> None:
            for _ in watch.Watch().stream(core.list_node, timeout_seconds=60):
                pass
            ended.set()

        thread = threading.Thread(target=watching, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while api.requests.count(("GET", "/api/v1/nodes")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the second watch is open
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n1")))  # not blocked by it
        api.close()
        assert ended.wait(10)


def test_leases_conflict_on_a_stale_replace(api: ApiServerStandIn) -> None:
    with api.api_client() as first_client, api.api_client() as second_client:
        first, second = client.CoordinationV1Api(first_client), client.CoordinationV1Api(second_client)
        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name="leader"), spec=client.V1LeaseSpec(holder_identity="a")
        )
        first.create_namespaced_lease("sharegpu", lease)
        mine, theirs = (
            first.read_namespaced_lease("leader", "sharegpu"),
            second.read_namespaced_lease("leader", "sharegpu"),
        )
        mine.spec.holder_identity = "a"
        mine.spec.lease_duration_seconds = 15
        first.replace_namespaced_lease("leader", "sharegpu", mine)
        theirs.spec.holder_identity = "b"
        with pytest.raises(ApiException) as err:
            second.replace_namespaced_lease("leader", "sharegpu", theirs)
        assert err.value.status == 409
        assert status_of(err.value)["details"] == {
            "name": "leader",
            "group": "coordination.k8s.io",
            "kind": "leases",
        }
        assert first.read_namespaced_lease("leader", "sharegpu").spec.holder_identity == "a"
        assert [item.metadata.name for item in second.list_namespaced_lease("sharegpu").items] == ["leader"]


def test_events_are_created_and_listed(core: client.CoreV1Api) -> None:
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="p."),
        involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace="default"),
        reason="FailedBinding",
        message="no GPU fits",
        type="Warning",
    )
    created = core.create_namespaced_event("default", event)
    assert created.metadata.name.startswith("p.")
    assert [e.message for e in core.list_namespaced_event("default").items] == ["no GPU fits"]
    found = core.list_event_for_all_namespaces(field_selector="involvedObject.name=p,reason=FailedBinding")
    assert [e.metadata.name for e in found.items] == [created.metadata.name]


def test_configmaps_and_delete_preconditions(api: ApiServerStandIn, core: client.CoreV1Api) -> None:
    made = core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm"), data={"k": "v"})
    )
    stale = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="other"))
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_config_map("cm", "default", body=stale)
    assert err.value.status == 409
    fresh = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=made.metadata.uid))
    core.delete_namespaced_config_map("cm", "default", body=fresh)
    assert api.get("configmaps", "default", "cm") is None


def test_fail_next_injects_a_status(api: ApiServerStandIn, core: client.CoreV1Api) -> None:
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="n1")))
    api.fail_next("GET", r"/nodes/n1$", status=503, reason="ServiceUnavailable", times=2)
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            core.read_node("n1")
        assert err.value.status == 503
        assert status_of(err.value)["reason"] == "ServiceUnavailable"
    assert core.read_node("n1").metadata.name == "n1"
    assert api.requests.count(("GET", "/api/v1/nodes/n1")) == 3


def test_concurrent_read_modify_writes_lose_no_update(api: ApiServerStandIn) -> None:
    api.create("pods", {"metadata": {"name": "counter", "annotations": {"n": "0"}}})
    writers, increments = 4, 15

    def write() -> None:
        with api.api_client() as api_client:
            core = client.CoreV1Api(api_client)
            done = 0
            while done < increments:
                current = core.read_namespaced_pod("counter", "default")
                current.metadata.annotations["n"] = str(int(current.metadata.annotations["n"]) + 1)
                try:
                    core.replace_namespaced_pod("counter", "default", current)
                    done += 1
                except ApiException as err:
                    if err.status != 409:
                        raise

    threads = [threading.Thread(target=write) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for _ in range(20):  # a racing writer of its own, outside the counter
        api.bump("pods", "default", "counter")
        time.sleep(0.005)
    for thread in threads:
        thread.join(60)
    final = api.get("pods", "default", "counter")
    assert final is not None
    assert final["metadata"]["annotations"]["n"] == str(writers * increments)
