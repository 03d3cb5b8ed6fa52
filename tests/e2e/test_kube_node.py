"""The node component's jobs beside Allocate: publishing the node's GPUs on its Node object
(kube/publisher.py) and removing the tenants of pods that are gone (deviceplugin/podwatch.py).

Both talk to a real API server (etcd and kube-apiserver of `make kube`, started by
`kube-node.sh --api-only`) through the real `kubernetes` client. The publisher's GPUs come from a
list the test edits (the simulated GPU cannot lose a GPU); the reaper's tenants are made by a real
Allocate (the plugin's Allocator in a process of its own on the simulated GPU) and its loop runs
in a thread. The plugin command's tests run it whole: it publishes the simulated GPU and reaps
through the API server. Every wait is a poll with a deadline, not a sleep.

Three tests keep the API-server stand-in (tests/apiserver_standin.py), for failures a real server
does not give on demand: an outage of node writes (500s), a failed watch and list (500s), and a
watch resumed after the history it needs is gone (410 Expired, which a real server gives only
after an etcd compaction). The plugin's kubelet side is the fake kubelet of tests/kubeletutil.py
here (test_kube_deviceplugin.py says why); test_kube_real_sharegpu.py runs it under the real one.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client

from apiserver_standin import ApiServerStandIn
from conftest import Sim, wait_for
from e2e.kubenode import ApiObjects, ApiServer, running_api_server
from kubeletutil import FakeKubelet
from sharegpu.devices import Gpu
from sharegpu.errors import DeviceError
from sharegpu.kube.apiclient import failure
from sharegpu.kube.assignment import AssignedContainer, AssignedGpu, Assignment
from sharegpu.kube.deviceplugin.allocate import tenant_name
from sharegpu.kube.deviceplugin.pods import FilePodSource
from sharegpu.kube.deviceplugin.podwatch import FilePodReaper, PodReaper, pod_tenants
from sharegpu.kube.inventory import STALE_AFTER_S, Inventory, read_inventory
from sharegpu.kube.publisher import (
    LABEL_GPU_COUNT,
    LABEL_GPU_MODEL,
    InventoryPublisher,
    NodeNotFound,
)
from sharegpu.kube.request import ANNOTATION_ALLOCATED, ANNOTATION_ASSIGNMENT
from sharegpu.spec import MIB
from sharegpu.tenant import DeviceLimit, create_tenant, tenant_path

NODE = "n1"
GIB = 1 << 30


# Either server: the real one for all but the three tests the module's docstring names.
Api = ApiObjects | ApiServerStandIn
THE_NODE = {"metadata": {"name": NODE, "labels": {"zone": "a"}, "annotations": {"x": "y"}}}


@pytest.fixture(scope="module")
def server() -> Iterator[ApiServer]:
    with running_api_server() as started:
        objects = ApiObjects(started)
        objects.create("namespaces", {"metadata": {"name": "ml"}})
        # Pods in "ml" run as its default ServiceAccount, which the controller manager would make.
        objects.create("serviceaccounts", {"metadata": {"name": "default", "namespace": "ml"}})
        objects.close()
        yield started


@pytest.fixture
def api(server: ApiServer) -> Iterator[ApiObjects]:
    """The real API server with the node NODE (and no pod), emptied again when the test ends."""
    objects = ApiObjects(server)
    objects.create("nodes", THE_NODE)
    objects.mark()
    yield objects
    objects.delete_all("pods", "ml")
    objects.delete_all("nodes")
    objects.close()


@pytest.fixture
def faulty() -> Iterator[ApiServerStandIn]:
    """The stand-in, for the failures it makes on demand (fail_next, a short history)."""
    with ApiServerStandIn() as standin:
        standin.create("nodes", THE_NODE)
        yield standin


@pytest.fixture
def core(api: ApiObjects) -> Iterator[client.CoreV1Api]:
    with api.api_client() as api_client:
        yield client.CoreV1Api(api_client)


def start(loop: InventoryPublisher | PodReaper | FilePodReaper) -> threading.Thread:
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    return thread


def stop(loop: InventoryPublisher | PodReaper | FilePodReaper, thread: threading.Thread) -> None:
    loop.stop()
    thread.join(10)
    assert not thread.is_alive(), f"{type(loop).__name__} did not stop within 10 s"


def gpu(index: int, name: str = "NVIDIA H100 80GB HBM3", memory: int = 80 * GIB) -> Gpu:
    return Gpu(index, f"GPU-{index}0000000-0000-0000-0000-000000000000", name, memory, 0, 0)


# ---------------------------------------------------------------------------------------------
# the publisher against the API server


class Nvml:
    """NVML as the publisher sees it: the GPUs it lists, and the lost ones (their own queries
    fail, and so does the listing as a whole, as devices.list_gpus does)."""

    def __init__(self, *gpus: Gpu):
        self.gpus = list(gpus)
        self.lost: set[str] = set()

    def list_gpus(self) -> list[Gpu]:
        if self.lost:
            raise DeviceError("NVML query failed: GPU is lost")
        return list(self.gpus)

    def probe(self, uuid: str) -> None:
        if uuid in self.lost:
            raise DeviceError("NVML query failed: GPU is lost")


def publisher(core: client.CoreV1Api, nvml: Nvml, **kwargs: Any) -> InventoryPublisher:
    return InventoryPublisher(NODE, core, nvml.list_gpus, probe=nvml.probe, **kwargs)


def published(server: Api) -> Inventory | None:
    node = server.get("nodes", None, NODE)
    assert node is not None
    return read_inventory(node)


def published_with(server: Api, check: Callable[[Inventory], bool]) -> Callable[[], Any]:
    def poll() -> Inventory | None:
        found = published(server)
        return found if found is not None and check(found) else None

    return poll


@pytest.mark.timing
def test_the_inventory_appears_on_the_node_and_is_refreshed_though_nothing_changes(
    api: ApiObjects, core: client.CoreV1Api
) -> None:
    nvml = Nvml(gpu(0), gpu(1))
    pub = publisher(core, nvml, interval_s=0.2, check_s=0.05)
    thread = start(pub)
    try:
        first = wait_for(lambda: published(api), "the inventory on the node")
        assert [(g.index, g.uuid, g.model, g.memory_mib) for g in first.gpus] == [
            (0, gpu(0).uuid, "NVIDIA H100 80GB HBM3", 80 * 1024),
            (1, gpu(1).uuid, "NVIDIA H100 80GB HBM3", 80 * 1024),
        ]
        assert abs(first.published_at - time.time()) < STALE_AFTER_S
        meta = api.get("nodes", None, NODE)["metadata"]  # type: ignore[index]
        assert meta["annotations"]["x"] == "y"  # a merge patch: the others are left as they are
        assert meta["labels"] == {"zone": "a", LABEL_GPU_MODEL: "NVIDIA-H100-80GB-HBM3", LABEL_GPU_COUNT: "2"}
        # published_at is the extender's sign of life: written again though nothing changed.
        later = wait_for(
            published_with(api, lambda i: i.published_at > first.published_at), "a refreshed inventory"
        )
        assert later.gpus == first.gpus
    finally:
        stop(pub, thread)
    assert all(r == ("PATCH", f"/api/v1/nodes/{NODE}") for r in api.writes())
    assert len(api.writes()) >= 2


def test_stop_is_prompt_and_leaves_the_inventory(api: ApiObjects, core: client.CoreV1Api) -> None:
    pub = publisher(core, Nvml(gpu(0)), interval_s=3600, check_s=3600)
    thread = start(pub)
    wait_for(lambda: published(api), "the inventory on the node")
    stop(pub, thread)  # within 10 s, while its next check is an hour away
    # A restarting component must not make the node unschedulable: staleness tells a dead one.
    assert published(api) is not None


def test_a_gpu_that_falls_off_is_dropped_at_once_and_the_others_stay(
    api: ApiObjects, core: client.CoreV1Api, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    nvml = Nvml(gpu(0), gpu(1))
    pub = publisher(core, nvml, interval_s=3600, check_s=0.02)  # no refresh due: only a change
    thread = start(pub)
    try:
        wait_for(published_with(api, lambda i: len(i.gpus) == 2), "two GPUs published")
        nvml.lost.add(gpu(1).uuid)  # falls off the bus: the listing fails, GPU 0 still answers
        left = wait_for(published_with(api, lambda i: len(i.gpus) == 1), "GPU 1 dropped")
        assert [g.uuid for g in left.gpus] == [gpu(0).uuid]
        labels = api.get("nodes", None, NODE)["metadata"]["labels"]  # type: ignore[index]
        assert labels[LABEL_GPU_COUNT] == "1"
        nvml.lost.clear()
        wait_for(published_with(api, lambda i: len(i.gpus) == 2), "GPU 1 back")
    finally:
        stop(pub, thread)
    said = [r.getMessage() for r in caplog.records if "NVML's listing failed" in r.getMessage()]
    assert said == [
        "NVML's listing failed (NVML query failed: GPU is lost): publishing the GPUs that "
        "answer on their own: 0 of 0, 1"
    ]  # once, not at every check


def test_an_api_outage_loses_nothing_and_recovers(
    faulty: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    standin = faulty
    caplog.set_level(logging.INFO)
    nvml = Nvml(gpu(0), gpu(1))
    standin.fail_next("PATCH", f"/nodes/{NODE}$", status=500, times=3)
    api_client = standin.api_client()
    pub = publisher(client.CoreV1Api(api_client), nvml, interval_s=0.1, check_s=0.02)
    thread = start(pub)
    try:
        wait_for(lambda: pub.failures >= 1, "a failed publication")
        nvml.gpus = [gpu(0)]  # what changes during the outage is published after it
        found = wait_for(
            published_with(standin, lambda i: len(i.gpus) == 1), "the inventory after the outage"
        )
        assert [g.index for g in found.gpus] == [0]
        wait_for(lambda: pub.failures == 0, "the failure count reset")
    finally:
        stop(pub, thread)
        api_client.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        warned[0]
        == f"cannot publish the GPU inventory of node {NODE}: 500 injected failure (tried again in 0.1s)"
    )
    assert len(warned) == 3
    assert any("again, after 3 failed tries" in r.getMessage() for r in caplog.records)


def test_a_node_the_api_server_lacks_is_named(
    core: client.CoreV1Api, caplog: pytest.LogCaptureFixture
) -> None:
    pub = InventoryPublisher("nope", core, lambda: [gpu(0)], interval_s=0.1, check_s=0.02)
    with pytest.raises(NodeNotFound, match=r"^node nope not found in the API server: is --node right\?$"):
        pub.publish([gpu(0)])
    thread = start(pub)
    try:
        wait_for(lambda: "is --node right?" in caplog.text, "the error in the log")
    finally:
        stop(pub, thread)


def test_an_api_server_that_does_not_answer_is_said_so() -> None:
    with ApiServerStandIn() as gone:
        api = gone.api_client()
    with api:
        pub = InventoryPublisher(NODE, client.CoreV1Api(api), lambda: [gpu(0)])
        with pytest.raises(urllib3.exceptions.MaxRetryError) as info:
            pub.publish([gpu(0)])
        assert failure(info.value, api).startswith(f"{gone.url} does not answer (")


# ---------------------------------------------------------------------------------------------
# the reaper: tenants made by a real Allocate, pods on the API server


@pytest.fixture
def node_env(sim: Sim, monkeypatch: pytest.MonkeyPatch) -> Sim:
    """This process sees the simulated node's runtime directory, and no agent on it."""
    monkeypatch.setenv("SHAREGPU_RUNTIME_DIR", str(sim.runtime))
    monkeypatch.setenv("SHAREGPU_NO_AGENT", "1")
    return sim


def pod_body(name: str, gpu_index: int, uuid: str, *, bound_at: float = 100.0) -> dict[str, Any]:
    """A pod bound to NODE whose one container `main` is assigned 128 MiB and 20% of a GPU."""
    assignment = Assignment(
        node=NODE,
        priority="normal",
        policy="share",
        containers=(
            AssignedContainer(
                name="main", gpus=(AssignedGpu(index=gpu_index, uuid=uuid, memory_mib=128, compute_pct=20),)
            ),
        ),
        bound_at=bound_at,
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "annotations": {ANNOTATION_ASSIGNMENT: assignment.to_annotation()},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "main", "image": "serve:1", "resources": {"limits": {"sharegpu.io/vgpu": "1"}}}
            ],
        },
    }


def bound_pods(server: Api, sim: Sim, *names: str) -> list[dict[str, Any]]:
    """Pods in the API server, bound to NODE, on the simulated GPUs in turn."""
    uuids = sim.uuids()
    return [
        server.create("pods", pod_body(name, i % 2, uuids[i % 2], bound_at=100.0 + i))
        for i, name in enumerate(names)
    ]


def allocate(sim: Sim, *pods: dict[str, Any]) -> list[Path]:
    """A real Allocate of each pod's container, in order: the plugin's Allocator in a process of
    its own on the simulated GPU, the pods read from a file of them. Their tenants' directories."""
    file = sim.root / "allocate.json"
    file.write_text(json.dumps(list(pods)))
    code = "\n".join(
        [
            "import sys",
            "from pathlib import Path",
            "from sharegpu.kube.deviceplugin.allocate import Allocator",
            "from sharegpu.kube.deviceplugin.pods import FilePodSource",
            "from sharegpu.tenant import runtime_dir",
            "pods = FilePodSource(Path(sys.argv[1]))",
            f"a = Allocator(node={NODE!r}, pods=pods, root=runtime_dir(), cdi_spec=None)",
            "for _ in range(int(sys.argv[2])):",
            "    a.allocate([1])",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(file), str(len(pods))],
        env=sim.env(SHAREGPU_NO_AGENT="1"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    paths = [tenant_path(tenant_name(p["metadata"]["uid"], "main"), sim.runtime) for p in pods]
    for path, p in zip(paths, pods, strict=True):
        assert {t.pod_uid for t in pod_tenants(sim.runtime) if t.path == path} == {p["metadata"]["uid"]}
    return paths


def other_tenants(sim: Sim) -> list[Path]:
    """Tenants the plugin did not make: one without labels, one with labels but no pod_uid."""
    limits = [DeviceLimit(uuid=sim.uuids()[0], mem_cap_bytes=64 * MIB)]
    return [
        create_tenant("batch", limits, root=sim.runtime),
        create_tenant(
            "team-job", limits, meta={"labels": {"pod": "web-0", "namespace": "ml"}}, root=sim.runtime
        ),
    ]


def delete_pod(core: client.CoreV1Api, pod: dict[str, Any]) -> None:
    """Deleted and gone at once, as when its kubelet has stopped it (none runs here)."""
    core.delete_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"], grace_period_seconds=0)


def set_phase(api: ApiObjects, pod: dict[str, Any], phase: str) -> None:
    """The pod's phase, as its kubelet writes it (the status subresource)."""

    def finish(obj: dict[str, Any]) -> None:
        obj["status"]["phase"] = phase

    api.edit("pods", pod["metadata"]["namespace"], pod["metadata"]["name"], finish, status=True)


def reaper(core: client.CoreV1Api, sim: Sim, **kwargs: Any) -> PodReaper:
    return PodReaper(NODE, core, sim.runtime, retry_s=0.1, **kwargs)


def test_a_pods_tenant_goes_when_the_pod_is_deleted_or_finishes(
    node_env: Sim, api: ApiObjects, core: client.CoreV1Api
) -> None:
    sim = node_env
    a, b, c, d = bound_pods(api, sim, "a", "b", "c", "d")
    ta, tb, tc, td = allocate(sim, a, b, c, d)
    others = other_tenants(sim)
    reap = reaper(core, sim)
    thread = start(reap)
    try:
        wait_for(lambda: reap.lists == 1, "the first list")
        assert all(p.is_dir() for p in (ta, tb, tc, td, *others))  # every pod is there, running or not
        delete_pod(core, a)
        wait_for(lambda: not ta.exists(), "pod a's tenant removed")
        set_phase(api, b, "Succeeded")
        wait_for(lambda: not tb.exists(), "pod b's tenant removed")
        set_phase(api, c, "Failed")
        wait_for(lambda: not tc.exists(), "pod c's tenant removed")
        set_phase(api, d, "Running")  # an event for a live pod: nothing goes
        wait_for(lambda: reap.events >= 4, "the watch's fourth event")
    finally:
        stop(reap, thread)
    assert td.is_dir()
    assert all(p.is_dir() for p in others)
    assert reap.reaper.removed == [ta.name, tb.name, tc.name]
    assert reap.lists == 1  # the watch saw each change: no list again


def test_at_start_the_tenants_of_pods_gone_meanwhile_are_removed(
    node_env: Sim, api: ApiObjects, core: client.CoreV1Api
) -> None:
    sim = node_env
    a, b, c = bound_pods(api, sim, "a", "b", "c")
    ta, tb, tc = allocate(sim, a, b, c)
    others = other_tenants(sim)
    # The plugin was down: pod a was deleted and pod b finished meanwhile.
    delete_pod(core, a)
    set_phase(api, b, "Succeeded")
    reap = reaper(core, sim)
    thread = start(reap)
    try:
        wait_for(lambda: reap.lists == 1, "the first list")
    finally:
        stop(reap, thread)
    assert not ta.exists()
    assert not tb.exists()
    assert tc.is_dir()
    assert all(p.is_dir() for p in others)


class AfterFirstList(client.CoreV1Api):
    """A CoreV1Api that runs `then` after its first list of pods returns, before the watch that
    follows it starts: what happens in that window the watch cannot see."""

    def __init__(self, api_client: client.ApiClient, then: Callable[[], None]):
        super().__init__(api_client)
        self.then: Callable[[], None] | None = then

    def list_pod_for_all_namespaces(self, *args: Any, **kwargs: Any) -> Any:
        found = super().list_pod_for_all_namespaces(*args, **kwargs)
        if not kwargs.get("watch") and self.then is not None:
            then, self.then = self.then, None
            then()
        return found


def test_a_watch_too_old_lists_again_and_loses_no_deletion(node_env: Sim) -> None:
    sim = node_env
    with ApiServerStandIn(history=1) as standin, standin.api_client() as api:  # one change kept
        standin.create("nodes", {"metadata": {"name": NODE}})
        core = client.CoreV1Api(api)
        a, b = bound_pods(standin, sim, "a", "b")
        ta, tb = allocate(sim, a, b)

        def meanwhile() -> None:
            delete_pod(core, a)  # the change after the list...
            standin.bump("nodes", None, NODE)  # ...and one more: the list's version is out of the history

        reap = reaper(AfterFirstList(api, meanwhile), sim)
        thread = start(reap)
        try:
            wait_for(lambda: not ta.exists(), "pod a's tenant removed")
        finally:
            stop(reap, thread)
        assert (reap.expired, reap.lists) == (1, 2)  # the watch got 410 Gone; the second list found a gone
        assert tb.is_dir()


def test_a_failed_watch_or_list_is_retried_and_loses_no_deletion(
    node_env: Sim, faulty: ApiServerStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    sim, standin = node_env, faulty
    a, b = bound_pods(standin, sim, "a", "b")
    ta, tb = allocate(sim, a, b)
    with standin.api_client() as api:

        def meanwhile() -> None:
            delete_pod(client.CoreV1Api(api), a)
            standin.fail_next("GET", "^/api/v1/pods$", status=500, times=2)  # the watch, and the next list

        reap = reaper(AfterFirstList(api, meanwhile), sim)
        thread = start(reap)
        try:
            wait_for(lambda: not ta.exists(), "pod a's tenant removed")
        finally:
            stop(reap, thread)
    assert reap.lists == 2
    assert reap.expired == 0
    assert tb.is_dir()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        f"cannot list or watch the pods of node {NODE}: 500 injected failure (tried again every 0.1s)"
    ]


def test_a_tenant_with_live_processes_is_kept_until_they_exit(
    node_env: Sim, api: ApiObjects, core: client.CoreV1Api, caplog: pytest.LogCaptureFixture
) -> None:
    sim = node_env
    (a,) = bound_pods(api, sim, "a")
    (ta,) = allocate(sim, a)
    holder = sim.spawn_probe("hold", "plain", str(MIB), "120", env=sim.tenant_env(ta))
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready=1"
        reap = reaper(core, sim)
        thread = start(reap)
        try:
            wait_for(lambda: reap.lists == 1, "the first list")
            delete_pod(core, a)  # deleted with --force, say: its container is still running
            wait_for(lambda: ta.name in reap.reaper.kept, "the tenant kept")
            assert ta.is_dir()
            holder.kill()
            holder.wait(30)
            wait_for(lambda: not ta.exists(), "the tenant removed once its process is gone")
        finally:
            stop(reap, thread)
    finally:
        holder.kill()
        holder.communicate(timeout=30)
    kept = [r.getMessage() for r in caplog.records if "is kept" in r.getMessage()]
    assert len(kept) == 1, kept  # said once, tried many times
    assert kept[0].startswith(
        f"tenant {ta.name} of pod ml/a (deleted) is kept: it still has live processes ("
    )
    assert reap.reaper.kept == set()


def test_with_a_pod_file_the_reaper_reconciles_with_the_file(node_env: Sim, api: ApiObjects) -> None:
    sim = node_env
    a, b, c = bound_pods(api, sim, "a", "b", "c")  # the API server only gives them uids
    ta, tb, tc = allocate(sim, a, b, c)
    others = other_tenants(sim)
    file = sim.root / "pods.json"
    file.write_text(json.dumps([a, b, c]))
    reap = FilePodReaper(NODE, FilePodSource(file), sim.runtime, every_s=0.05)
    thread = start(reap)
    try:
        b["status"]["phase"] = "Succeeded"
        file.write_text(json.dumps([b, c]))  # a is gone, b finished
        wait_for(lambda: not ta.exists() and not tb.exists(), "pods a's and b's tenants removed")
        file.write_text("{not json")  # an unreadable file is not "no pods"
        wait_for(lambda: reap._said, "the unreadable file said")
        assert tc.is_dir()
    finally:
        stop(reap, thread)
    assert tc.is_dir()
    assert all(p.is_dir() for p in others)


# ---------------------------------------------------------------------------------------------
# the plugin command: both jobs through the API server


def test_the_plugin_publishes_the_simulated_gpus_and_reaps_through_the_api_server(
    sim: Sim, api: ApiObjects, core: client.CoreV1Api
) -> None:
    kubelet_dir = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # a short socket path
    kubelet = FakeKubelet(kubelet_dir)
    env = sim.env(SHAREGPU_NO_AGENT="1", KUBECONFIG=str(api.kubeconfig(sim.root / "kubeconfig")))
    for var in (
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
    ):  # not the cluster these tests may run in
        env.pop(var, None)
    args = ["--node", NODE, "--kubelet-dir", str(kubelet_dir), "--cdi-spec", "none"]
    args += ["--publish-interval", "0.3", "--health-interval", "0.2", "--check-interval", "0.2"]
    logs = sim.root / "plugin.log"

    def plugin() -> subprocess.Popen[str]:
        with open(logs, "a") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "sharegpu.kube.deviceplugin", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
            )

    def end(proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0, logs.read_text()
        finally:
            proc.kill()
            proc.wait()

    a, b = bound_pods(api, sim, "a", "b")
    proc = plugin()
    try:
        first = wait_for(lambda: published(api), "the inventory on the node")
        uuids = sim.uuids()
        assert [(g.index, g.uuid, g.model, g.memory_mib) for g in first.gpus] == [
            (0, uuids[0], "sharegpu simulated H100", sim.memory_mib),
            (1, uuids[1], "sharegpu simulated H100", sim.memory_mib),
        ]
        labels = api.get("nodes", None, NODE)["metadata"]["labels"]  # type: ignore[index]
        assert labels == {"zone": "a", LABEL_GPU_MODEL: "sharegpu-simulated-H100", LABEL_GPU_COUNT: "2"}
        wait_for(published_with(api, lambda i: i.published_at > first.published_at), "a refresh")

        # Allocate through the kubelet's API: the plugin finds the pods on the API server.
        plugin_client = kubelet.plugin(kubelet.registration())
        watch = plugin_client.watch()
        devices = [d for d, _ in watch.next()]
        watch.cancel()
        for _ in (a, b):
            plugin_client.allocate([devices[0]])
        plugin_client.close()
        ta, tb = (tenant_path(tenant_name(p["metadata"]["uid"], "main"), sim.runtime) for p in (a, b))
        for p in (a, b):
            marked = api.get("pods", "ml", p["metadata"]["name"])["metadata"]["annotations"]  # type: ignore[index]
            assert marked[ANNOTATION_ALLOCATED] == "main"

        delete_pod(core, a)
        wait_for(lambda: not ta.exists(), "pod a's tenant removed")
        assert tb.is_dir()
    finally:
        end(proc)
    # Stopped: the inventory stays (a restart must not make the node unschedulable).
    assert published(api) is not None

    delete_pod(core, b)  # while the plugin is down
    proc = plugin()
    try:
        wait_for(lambda: not tb.exists(), "pod b's tenant removed at start")
    finally:
        end(proc)
        kubelet.stop()
        shutil.rmtree(kubelet_dir, ignore_errors=True)
    text = logs.read_text()
    assert f"removed tenant {ta.name}: its pod ml/a is deleted" in text
    assert f"removed tenant {tb.name}: its pod ml/b is gone" in text


def test_the_plugin_without_publishing_or_reaping_asks_the_api_server_for_pending_pods_only(
    sim: Sim, api: ApiObjects
) -> None:
    kubelet_dir = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    kubelet = FakeKubelet(kubelet_dir)
    env = sim.env(SHAREGPU_NO_AGENT="1", KUBECONFIG=str(api.kubeconfig(sim.root / "kubeconfig")))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    args = [
        "--node",
        NODE,
        "--kubelet-dir",
        str(kubelet_dir),
        "--cdi-spec",
        "none",
        "--no-publish",
        "--no-reap",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharegpu.kube.deviceplugin", *args],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        plugin_client = kubelet.plugin(kubelet.registration())
        (_a,) = bound_pods(api, sim, "a")
        api.mark()  # what the plugin asks from here on
        plugin_client.allocate([f"{sim.uuids()[0]}::0"])
        plugin_client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        kubelet.stop()
        shutil.rmtree(kubelet_dir, ignore_errors=True)
    assert proc.returncode == 0, err
    # Named by its User-Agent, as the API server's audit log names it.
    asked = api.requests(agent=("sharegpu-deviceplugin/",))
    assert asked == [("GET", "/api/v1/pods"), ("PATCH", "/api/v1/namespaces/ml/pods/a")]


def test_the_plugin_without_an_api_server_says_so(sim: Sim) -> None:
    env = sim.env(KUBECONFIG=str(sim.root / "no-such-kubeconfig"))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    done = subprocess.run(
        [sys.executable, "-m", "sharegpu.kube.deviceplugin", "--node", NODE],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("sharegpu: error: no Kubernetes API server to talk to: not in a pod ("), (
        done.stderr
    )
    assert done.stderr.rstrip().endswith("set KUBECONFIG, or run without the API server (--pods-file)")


def test_a_publish_interval_the_extender_would_call_stale_is_refused(sim: Sim) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sharegpu.kube.deviceplugin", "--node", NODE, "--publish-interval", "60"],
        env=sim.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "sharegpu: error: --publish-interval must be above 0 and below 60 s, when the extender takes "
        "a node's inventory for stale; not 60\n"
    )
