"""The kubelet device plugin (sharegpu.kube.deviceplugin), driven by a fake kubelet
(kubeletutil.py) over the real gRPC API.

The plugin runs as its own process on the simulated GPU (`python -m sharegpu.kube.deviceplugin`,
pods from a file), except for health: the simulated GPU has no way to make one GPU vanish or
NVML fail once a process has opened it, so that test runs the plugin in a thread with an NVML
stand-in (a list of GPUs the test edits).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from conftest import Sim, python
from kubeletutil import FakeKubelet, PluginClient
from sharegpu.devices import Gpu
from sharegpu.errors import DeviceError
from sharegpu.kube.assignment import AssignedContainer, AssignedGpu, Assignment
from sharegpu.kube.deviceplugin.allocate import Allocator, tenant_name
from sharegpu.kube.deviceplugin.registration import Registrar
from sharegpu.kube.deviceplugin.service import DevicePluginService
from sharegpu.kube.deviceplugin.slots import Inventory
from sharegpu.kube.request import ANNOTATION_ALLOCATED, ANNOTATION_ASSIGNMENT, run_as_user
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import iter_tenants, read_device_limits, read_meta, tenant_path

NODE = "n1"


# ---------------------------------------------------------------------------------------------
# pods and the plugin process


def pod(
    name: str,
    uid: str,
    gpus: list[tuple[int, str, int, int]],
    *,
    container: str = "main",
    policy: str = "share",
    priority: str = "normal",
    bound_at: float = 100.0,
    node: str = NODE,
) -> dict[str, Any]:
    """A pending pod bound to `node` with its assignment: gpus as (index, uuid, MiB, %)."""
    assignment = Assignment(
        node=node,
        priority=priority,  # type: ignore[arg-type]
        policy=policy,  # type: ignore[arg-type]
        containers=(
            AssignedContainer(
                name=container,
                gpus=tuple(AssignedGpu(index=i, uuid=u, memory_mib=m, compute_pct=c) for i, u, m, c in gpus),
            ),
        ),
        bound_at=bound_at,
    )
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": uid,
            "annotations": {ANNOTATION_ASSIGNMENT: assignment.to_annotation()},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": container, "resources": {"limits": {"sharegpu.io/vgpu": str(len(gpus))}}}
            ],
        },
        "status": {"phase": "Pending"},
    }


@dataclass
class Node:
    sim: Sim
    kubelet: FakeKubelet
    pods_file: Path
    cdi: Path
    proc: subprocess.Popen[str]
    client: PluginClient
    start: Any  # () -> a new plugin process, as the fixture started it

    def restart(self) -> None:
        """The plugin killed (no clean exit) and started again; a client of the new one."""
        self.client.close()
        self.proc.kill()
        self.proc.wait()
        self.proc = self.start()
        self.client = self.kubelet.plugin(self.kubelet.registration())

    def pods(self, *pods: dict[str, Any]) -> None:
        self.pods_file.write_text(json.dumps(list(pods)))

    def read_pods(self) -> dict[str, dict[str, Any]]:
        return {p["metadata"]["name"]: p for p in json.loads(self.pods_file.read_text())}

    def devices(self) -> list[str]:
        watch = self.client.watch()
        try:
            return [d for d, _ in watch.next()]
        finally:
            watch.cancel()


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    # Unix socket paths are short (108 bytes): not under pytest's tmp_path.
    path = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(sim: Sim, kubelet_dir: Path) -> Iterator[Node]:
    kubelet = FakeKubelet(kubelet_dir)
    pods_file = sim.root / "pods.json"
    pods_file.write_text("[]")
    cdi = sim.root / "cdi" / "sharegpu.json"
    log = open(sim.root / "plugin.log", "w")  # noqa: SIM115 (closed below)
    args = ["--node", NODE, "--kubelet-dir", str(kubelet_dir), "--pods-file", str(pods_file)]
    args += ["--cdi-spec", str(cdi), "--health-interval", "0.2", "--check-interval", "0.2"]

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "sharegpu.kube.deviceplugin", *args],
            env=sim.env(SHAREGPU_NO_AGENT="1"),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    node = Node(sim, kubelet, pods_file, cdi, start(), None, start)  # type: ignore[arg-type]
    try:
        node.client = kubelet.plugin(kubelet.registration())
        yield node
    finally:
        node.proc.send_signal(signal.SIGTERM)
        try:
            assert node.proc.wait(timeout=30) == 0, (sim.root / "plugin.log").read_text()
        finally:
            node.proc.kill()
            log.close()
            kubelet.stop()


def error_of(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


# ---------------------------------------------------------------------------------------------
# registration and the device list


def test_registers_and_lists_sixteen_healthy_devices_per_gpu(sim: Sim, kubelet_dir: Path) -> None:
    kubelet = FakeKubelet(kubelet_dir)
    args = ["--node", NODE, "--kubelet-dir", str(kubelet_dir), "--pods-file", "/nonexistent"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharegpu.kube.deviceplugin", *args, "--check-interval", "0.2"],
        env=sim.env(SHAREGPU_NO_AGENT="1"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        request = kubelet.registration()
        assert (request.version, request.endpoint, request.resource_name) == (
            "v1beta1",
            "sharegpu.sock",
            "sharegpu.io/vgpu",
        )
        assert request.options.get_preferred_allocation_available
        assert not request.options.pre_start_required
        client = kubelet.plugin(request)
        options = client.options()
        assert options.get_preferred_allocation_available
        assert not options.pre_start_required
        watch = client.watch()
        devices = watch.next()
        uuids = sim.uuids()
        assert devices == [(f"{u}::{n}", "Healthy") for u in uuids for n in range(16)]
        assert len(devices) == 16 * 2

        # The kubelet restarts: it removes every socket and serves kubelet.sock anew.
        kubelet.restart()
        again = kubelet.registration()
        assert again.endpoint == "sharegpu.sock"
        fresh = kubelet.plugin(again)
        assert len(fresh.watch().next()) == 32  # the new socket serves
        watch.cancel()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        kubelet.stop()
    assert proc.returncode == 0, err
    assert err.count("registered sharegpu.io/vgpu") == 2, err
    assert not (kubelet_dir / "sharegpu.sock").exists()  # removed at exit


def test_one_lost_gpu_is_unhealthy_and_the_others_stay_healthy(sim: Sim) -> None:
    """The real listing on the simulated NVML, with GPU 1 falling off the bus and coming back
    (SIMGPU_NVML_FAULTS, read at every NVML session): only GPU 1's devices change."""
    values, proc = python(
        sim.env(),
        """
        import os
        from sharegpu.devices import list_gpus
        from sharegpu.kube.deviceplugin.slots import Inventory
        inventory = Inventory(list_gpus, 2)
        def health(step):
            states = {}
            for device in inventory.devices():
                states.setdefault(device.id.split("::")[0], set()).add(device.health)
            print(step + "=" + ";".join(f"{u}:{'/'.join(sorted(h))}" for u, h in states.items()))
        inventory.poll(); health("start")
        os.environ["SIMGPU_NVML_FAULTS"] = "1:lost"
        print("changed=" + str(inventory.poll())); health("lost")
        del os.environ["SIMGPU_NVML_FAULTS"]
        print("back=" + str(inventory.poll())); health("again")
        """,
    )
    assert proc.returncode == 0, proc.stderr
    first, second = sim.uuids()
    assert values["start"] == f"{first}:Healthy;{second}:Healthy"
    assert values["changed"] == "True"
    assert values["lost"] == f"{first}:Healthy;{second}:Unhealthy"
    assert values["back"] == "True"
    assert values["again"] == values["start"]


def test_health_follows_nvml(kubelet_dir: Path) -> None:
    """In a thread, through the kubelet's watch, with an NVML stand-in (the listing fails as a
    whole, which the simulated NVML cannot be made to do)."""
    gpus = [Gpu(i, f"GPU-{i}0000000-0000-0000-0000-000000000000", "sim", 1 << 30, 0, 0) for i in range(2)]
    listed: list[Gpu] | None = list(gpus)

    def list_gpus() -> list[Gpu]:
        if listed is None:
            raise DeviceError("NVML query failed: Unknown Error")
        return list(listed)

    kubelet = FakeKubelet(kubelet_dir)
    allocator = Allocator(node=NODE, pods=_NoPods(), root=kubelet_dir, cdi_spec=None, list_gpus=list_gpus)
    service = DevicePluginService(Inventory(list_gpus, 4), allocator, health_interval_s=0.05)
    registrar = Registrar(service, "sharegpu.io/vgpu", kubelet_dir, check_s=0.1)
    runner = threading.Thread(target=registrar.run)
    runner.start()
    try:
        client = kubelet.plugin(kubelet.registration())
        watch = client.watch()

        def health(devices: list[tuple[str, str]]) -> dict[str, set[str]]:
            found: dict[str, set[str]] = {}
            for device, state in devices:
                found.setdefault(device.split("::")[0], set()).add(state)
            return found

        first = watch.next()
        assert len(first) == 8
        assert health(first) == {g.uuid: {"Healthy"} for g in gpus}
        listed = [gpus[0]]  # GPU 1 falls off the bus
        gone = watch.next()
        assert health(gone) == {gpus[0].uuid: {"Healthy"}, gpus[1].uuid: {"Unhealthy"}}
        listed = None  # NVML itself fails
        assert health(watch.next()) == {g.uuid: {"Unhealthy"} for g in gpus}
        listed = list(gpus)  # both back
        assert health(watch.next()) == {g.uuid: {"Healthy"} for g in gpus}
        # With no pod to follow, the preferred allocation packs onto the GPU with most free.
        available = [d for d, _ in first if d.endswith(("::0", "::1"))] + [d for d, _ in first[4:]]
        chosen = client.preferred(available, 3)
        assert [c.split("::")[0] for c in chosen] == [gpus[1].uuid] * 3
        assert client.preferred(available, 2, must=[first[0][0]])[0] == first[0][0]
        watch.cancel()
    finally:
        registrar.stop()
        runner.join(30)
        kubelet.stop()


class _NoPods:
    def pending_pods(self, node: str) -> list[dict[str, Any]]:
        return []

    def mark_allocated(self, pod: dict[str, Any], container: str) -> None:
        raise AssertionError("nothing to allocate")


# ---------------------------------------------------------------------------------------------
# Allocate


def test_allocate_makes_the_tenant_of_the_assignment(node: Node) -> None:
    sim, uuids = node.sim, node.sim.uuids()
    node.pods(pod("web-0", "6f1c2b3a-aaaa", [(1, uuids[1], 256, 30)], policy="cap", priority="online"))
    devices = node.devices()
    # The preferred allocation follows the pending pod's assignment: GPU 1.
    assert node.client.preferred(devices, 1)[0].startswith(uuids[1] + "::")

    answer = node.client.allocate([devices[0]]).container_responses  # the kubelet's pick: GPU 0's
    assert len(answer) == 1
    name = tenant_name("6f1c2b3a-aaaa", "main")
    assert name == "pod-6f1c2b3a-main"
    assert [d.name for d in answer[0].cdi_devices] == [f"sharegpu.io/vgpu={name}"]
    assert answer[0].envs["SHAREGPU_TENANT"] == "/run/sharegpu/tenant"
    assert "SIMGPU_STATE" in answer[0].envs
    mounts = {m.container_path: m for m in answer[0].mounts}
    assert mounts["/run/sharegpu/tenant/limits"].read_only
    assert not mounts["/run/sharegpu/tenant/usage"].read_only
    assert mounts["/etc/ld.so.preload"].read_only
    assert f"/run/sharegpu/tenant/gpus/{uuids[1]}" in mounts
    path = tenant_path(name, sim.runtime)
    assert mounts["/run/sharegpu/tenant/limits"].host_path == str(path / "limits")

    (limit,) = read_device_limits(path)
    assert (limit.uuid, limit.mem_cap_bytes) == (uuids[1], 256 * MIB)
    assert (limit.policy, limit.priority, limit.share_permille) == (abi.POLICY_CAP, abi.PRIORITY_ONLINE, 300)
    labels = read_meta(path)["labels"]
    assert labels == {"namespace": "ml", "pod": "web-0", "container": "main", "pod_uid": "6f1c2b3a-aaaa"}
    assert node.read_pods()["web-0"]["metadata"]["annotations"][ANNOTATION_ALLOCATED] == "main"
    spec = json.loads(node.cdi.read_text())
    assert name in [d["name"] for d in spec["devices"]]  # listed before the container is created

    # Allocated: a second container of one vGPU finds no pod.
    err = error_of(lambda: node.client.allocate([devices[1]]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"no pod pending on node {NODE} has a sharegpu assignment with a container of 1 vGPUs" in (
        err.details() or ""
    )


def test_a_pod_that_runs_as_a_user_gets_a_tenant_that_user_can_use(node: Node) -> None:
    """Issue 36: a pod of `runAsUser: 1000` (runAsNonRoot, Pod Security `restricted`) got a
    tenant whose usage file was root's alone: its processes failed at cuInit.  The container's
    securityContext wins over the pod's."""
    uuids = node.sim.uuids()
    web = pod("web-0", "7a2d3c4b-bbbb", [(0, uuids[0], 128, 30)])
    web["spec"]["securityContext"] = {"runAsUser": 2000, "runAsNonRoot": True}
    web["spec"]["containers"][0]["securityContext"] = {"runAsUser": 1000}
    node.pods(web)
    devices = node.devices()
    node.client.allocate([devices[0]])
    path = tenant_path(tenant_name("7a2d3c4b-bbbb", "main"), node.sim.runtime)
    assert (path / "usage").stat().st_uid == 1000
    assert (
        run_as_user({"spec": {"securityContext": {"runAsUser": 2000}, "containers": [{"name": "x"}]}}, "x")
        == 2000
    )
    assert run_as_user({"spec": {"containers": [{"name": "x"}]}}, "x") is None


def test_two_allocations_at_once_get_a_pod_each(node: Node) -> None:
    uuids = node.sim.uuids()
    node.pods(
        pod("a", "aaaaaaaa-1", [(0, uuids[0], 128, 20)], bound_at=1.0),
        pod("b", "bbbbbbbb-2", [(1, uuids[1], 384, 60)], bound_at=2.0, policy="burst"),
    )
    devices = node.devices()
    answers: list[Any] = [None, None]
    start = threading.Barrier(2)

    def allocate(i: int) -> None:
        start.wait()
        answers[i] = node.client.allocate([devices[i]]).container_responses[0]

    threads = [threading.Thread(target=allocate, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    names = sorted(a.cdi_devices[0].name.split("=")[1] for a in answers)
    assert names == ["pod-aaaaaaaa-main", "pod-bbbbbbbb-main"]
    (a,) = read_device_limits(tenant_path("pod-aaaaaaaa-main", node.sim.runtime))
    (b,) = read_device_limits(tenant_path("pod-bbbbbbbb-main", node.sim.runtime))
    assert (a.uuid, a.mem_cap_bytes, a.share_permille, a.policy) == (
        uuids[0],
        128 * MIB,
        200,
        abi.POLICY_SHARE,
    )
    assert (b.uuid, b.mem_cap_bytes, b.share_permille, b.policy) == (
        uuids[1],
        384 * MIB,
        600,
        abi.POLICY_BURST,
    )
    pods = node.read_pods()
    assert [pods[p]["metadata"]["annotations"][ANNOTATION_ALLOCATED] for p in "ab"] == ["main", "main"]


def test_failures_are_one_clear_error_and_leave_nothing(node: Node) -> None:
    uuids = node.sim.uuids()
    devices = node.devices()

    err = error_of(lambda: node.client.allocate([devices[0]]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pod pending on node n1" in (err.details() or "")

    # More memory than the card has: admission refuses it, nothing stays, the pod is not marked.
    node.pods(pod("big", "b19b19b1-0", [(0, uuids[0], 4096, 50)]))
    err = error_of(lambda: node.client.allocate([devices[0]]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.details() or ""
    assert details.startswith("sharegpu: pod ml/big container main: "), details
    assert list(iter_tenants(node.sim.runtime)) == []
    assert ANNOTATION_ALLOCATED not in node.read_pods()["big"]["metadata"]["annotations"]

    # A hand-edited assignment: the error names the pod.
    broken = pod("broken", "0b0b0b0b-0", [(0, uuids[0], 128, 10)])
    broken["metadata"]["annotations"][ANNOTATION_ASSIGNMENT] = '{"version": 1, "node": "n1"}'
    node.pods(broken)
    err = error_of(lambda: node.client.allocate([devices[0]]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "pod ml/broken: sharegpu.io/assignment is not what sharegpu writes" in (err.details() or "")

    # The assignment names a GPU this node does not have (the node changed since).
    node.pods(pod("moved", "30000000-0", [(0, "GPU-00000000-dead-beef-0000-000000000000", 128, 10)]))
    err = error_of(lambda: node.client.allocate([devices[0]]))
    assert "pod ml/moved: its assignment names GPU 0 as GPU-00000000-dead" in (err.details() or "")

    # A device ID that is not one of ours.
    err = error_of(lambda: node.client.allocate(["nvidia0"]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert list(iter_tenants(node.sim.runtime)) == []


def test_a_plugin_restarted_mid_allocation_answers_with_the_tenant_it_made(node: Node) -> None:
    """The plugin made the tenant and died before the kubelet had its answer (and before it
    marked the pod): the kubelet asks again, and gets the same tenant, not a second one or an
    error. A tenant of that name that is another container's is refused, not reused."""
    uuids = node.sim.uuids()
    web = pod("web-0", "7a7a7a7a-0", [(0, uuids[0], 256, 30)])
    node.pods(web)
    devices = node.devices()
    first = node.client.allocate([devices[0]]).container_responses[0]
    name = tenant_name("7a7a7a7a-0", "main")
    made = tenant_path(name, node.sim.runtime)
    inode = made.stat().st_ino
    node.pods(web)  # the mark never reached the API server
    node.restart()
    again = node.client.allocate([node.devices()[0]]).container_responses[0]
    assert [d.name for d in again.cdi_devices] == [d.name for d in first.cdi_devices]
    assert [p.name for p in iter_tenants(node.sim.runtime)] == [name]
    assert made.stat().st_ino == inode  # the same tenant, not made again
    assert node.read_pods()["web-0"]["metadata"]["annotations"][ANNOTATION_ALLOCATED] == "main"

    # Same name, other limits (an assignment of 512 MiB): not this allocation's tenant.
    other = pod("web-0", "7a7a7a7a-0", [(0, uuids[0], 512, 30)])
    node.pods(other)
    node.restart()
    err = error_of(lambda: node.client.allocate([node.devices()[0]]))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"a tenant {name} exists that is not this container's" in (err.details() or "")
    assert made.stat().st_ino == inode  # left as it was
