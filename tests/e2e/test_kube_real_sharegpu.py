"""sharegpu on a real node (issue 37): `deploy/kubernetes` applied to the real API server, the
device plugin registered with the real kubelet, vGPU pods placed by a real kube-scheduler through
sharegpu's extender, admitted by the kubelet and started by containerd with their tenants
(`tests/e2e/kubesharegpu.py` sets it up; `tests/e2e/kubenode.py` runs the node).

Part of `make test` (after `make kube`); needs root; fails, never skips, when a component is
missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import vkutil
from conftest import parse_kv
from e2e.kubenode import running_kube_node
from e2e.kubesharegpu import (
    APP_NS,
    DEPLOY,
    PROBE_IMAGE,
    VULKAN_IMAGE,
    Sharegpu,
    audit_denials,
    failed_scheduling,
    import_vulkan_image,
    lease_holder,
    sharegpu_on,
    tenant_limits,
    vgpu_pod,
    wait_phase,
)
from metricsutil import free_port
from sharegpu.kube.deviceplugin.allocate import tenant_name
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import read_device_limits, tenant_path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sharegpu]:
    root = Path(tmp_path_factory.mktemp("sharegpu-kube"))
    # The simulated GPU carries lavapipe's deviceUUID, so a pod's vGPU is its Vulkan device too.
    uuid0 = vkutil.lavapipe_uuid(vkutil.build_vkprobe(tmp_path_factory.mktemp("vk")), root)
    with running_kube_node() as node, sharegpu_on(node, root, uuid0=uuid0) as gpu:
        yield gpu
        # What every component asked of the API server, judged by the server's own RBAC.
        denied = audit_denials(node.dir / "audit.log")
        assert not denied, "the API server refused sharegpu's components:\n" + "\n".join(denied)


def test_the_manifests_are_accepted_and_the_node_shows_its_vgpus(cluster: Sharegpu) -> None:
    kinds = {line.split("/", 1)[0].split(".", 1)[0] for line in cluster.applied}
    assert {
        "namespace",
        "serviceaccount",
        "clusterrole",
        "clusterrolebinding",
        "deployment",
        "daemonset",
    } <= kinds
    assert all(line.endswith(("created", "configured", "unchanged")) for line in cluster.applied), (
        cluster.applied
    )
    node = cluster.get("node", cluster.node.node)
    slots = int(node["status"]["allocatable"]["sharegpu.io/vgpu"])
    assert slots > 0
    # The device plugin published the GPU inventory the extender reads.
    labels = node["metadata"]["labels"]
    print(f"node allocatable sharegpu.io/vgpu={slots}; labels {sorted(k for k in labels if 'sharegpu' in k)}")


def test_a_vgpu_pod_is_placed_through_the_extender_and_started_with_its_tenant(cluster: Sharegpu) -> None:
    name = "vgpu-4g-30"
    # An unmodified CUDA program (the probe, on the simulated GPU): what it sees, then 3000 MiB
    # allocated and 2000 MiB more refused.
    pod = vgpu_pod(name, 4096, 30, "sgprobe info && sgprobe alloc plain 3000M 2000M && exec sleep 600")
    t0 = time.monotonic()
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    running = wait_phase(cluster, name, ("Running", "Succeeded", "Failed"))
    took = time.monotonic() - t0
    assert running["status"]["phase"] == "Running", running["status"]
    assert running["spec"]["nodeName"] == cluster.node.node
    # Placed by the sharegpu scheduler, through the extender's bind (its assignment annotation).
    events = cluster.get("events", "-n", APP_NS, "--field-selector", f"involvedObject.name={name}")["items"]
    assert [e.get("reportingComponent") for e in events if e["reason"] == "Scheduled"] == [
        "sharegpu-scheduler"
    ]
    assert any(key.startswith("sharegpu.io/") for key in running["metadata"]["annotations"]), running[
        "metadata"
    ]
    # Allocated by the kubelet through the device plugin: the container's tenant, 4 GiB and 30%.
    tenant = tenant_name(running["metadata"]["uid"], "main")
    path = tenant_path(tenant, cluster.sim.runtime)
    assert tenant_limits(path) == (4096 * MIB, 300, abi.PRIORITY_NORMAL)
    deadline = time.monotonic() + 30
    while (
        "alloc=" not in (log := cluster.kubectl("-n", APP_NS, "logs", name).stdout)
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    values, lines = parse_kv(log)
    assert values.get("dev0.total") == str(4096 * MIB), log  # its vGPU, not the 8 GiB card
    allocs = [v for k, v in lines if k == "alloc"]
    assert allocs == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"], log
    print(
        f"vGPU pod created -> Running in {took:.1f} s; inside: total {values['dev0.total']}, allocs {allocs}"
    )
    # Deleted, its tenant goes (the device plugin's pod reaper).
    cluster.kubectl("-n", APP_NS, "delete", "pod", name, "--wait", "--timeout", "60s")
    deadline = time.monotonic() + 30
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not path.exists(), f"the deleted pod's tenant {tenant} is still there:\n{cluster.tail()}"


def test_with_the_dra_driver_s_classes_installed_a_vgpu_pod_is_still_placed_through_the_extender(
    cluster: Sharegpu,
) -> None:
    """Both doors in one cluster (nodes moving from the device plugin to DRA): the DRA driver's
    DeviceClasses must leave device-plugin pods alone. A class mapping `sharegpu.io/vgpu` had the
    default DRA plugin judge the pod's vgpu-memory and -compute, which no node advertises, and
    every such pod stayed Pending ("cannot fit resource")."""
    classes = DEPLOY / "dra" / "deviceclasses.yaml"
    cluster.kubectl("apply", "-f", str(classes))
    name = "vgpu-beside-dra"
    try:
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(vgpu_pod(name, 1024, 10, "exec sleep 600")))
        running = wait_phase(cluster, name, ("Running", "Failed"), timeout=60)
        assert running["status"]["phase"] == "Running", running["status"]
        path = tenant_path(tenant_name(running["metadata"]["uid"], "main"), cluster.sim.runtime)
        assert tenant_limits(path) == (1024 * MIB, 100, abi.PRIORITY_NORMAL)
    finally:
        cluster.kubectl("-n", APP_NS, "delete", "pod", name, "--wait", "--timeout", "60s", check=False)
        cluster.kubectl("delete", "-f", str(classes), check=False)


def test_an_online_and_an_offline_pod_share_the_gpu_and_a_third_waits_for_room(cluster: Sharegpu) -> None:
    """Two pods on the one 8 GiB card, each with the priority its class gives; a third that does
    not fit what is left stays Pending with the extender's reason in its events, and runs once
    one of the two is deleted."""
    sleep = "exec sleep 600"
    online = vgpu_pod("serve", 4096, 30, sleep)
    online["spec"]["priorityClassName"] = "sharegpu-online"
    offline = vgpu_pod("train", 3072, 60, sleep)
    offline["spec"]["priorityClassName"] = "sharegpu-offline"
    waiting = vgpu_pod("later", 4096, 10, sleep)
    for pod in (online, offline):
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    pods = {
        p["metadata"]["name"]: wait_phase(cluster, p["metadata"]["name"], ("Running",))
        for p in (online, offline)
    }
    for name, priority, memory in (
        ("serve", abi.PRIORITY_ONLINE, 4096),
        ("train", abi.PRIORITY_OFFLINE, 3072),
    ):
        (limit,) = read_device_limits(
            tenant_path(tenant_name(pods[name]["metadata"]["uid"], "main"), cluster.sim.runtime)
        )
        assert (limit.priority, limit.mem_cap_bytes) == (priority, memory * MIB), name
    uuids = {
        read_device_limits(tenant_path(tenant_name(p["metadata"]["uid"], "main"), cluster.sim.runtime))[
            0
        ].uuid
        for p in pods.values()
    }
    assert len(uuids) == 1  # one card, shared

    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(waiting))
    deadline = time.monotonic() + 60
    while not (reasons := failed_scheduling(cluster, "later")) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert reasons, f"no FailedScheduling event for the pod that does not fit:\n{cluster.tail()}"
    assert cluster.get("pod", "-n", APP_NS, "later")["status"]["phase"] == "Pending"
    assert any("no room now" in r and "%!" not in r for r in reasons), reasons  # not mangled by Eventf
    print(f"the third pod waits: {reasons[-1]}")

    t0 = time.monotonic()
    cluster.kubectl("-n", APP_NS, "delete", "pod", "serve", "--wait", "--timeout", "60s")
    wait_phase(cluster, "later", ("Running",), timeout=120)
    print(f"deleting one let the third run {time.monotonic() - t0:.1f} s later")
    cluster.kubectl("-n", APP_NS, "delete", "pod", "train", "later", "--wait", "--timeout", "60s")


def tenant_of(gpu: Sharegpu, pod: dict[str, Any]) -> Path:
    return tenant_path(tenant_name(pod["metadata"]["uid"], "main"), gpu.sim.runtime)


def test_the_agent_device_plugin_extender_and_scheduler_restart_under_running_pods_and_lose_nothing(
    cluster: Sharegpu,
) -> None:
    """Each component stopped and started again (as a pod's container is) while a vGPU pod runs:
    its tenant stays, the node's vGPUs come back, and the extender, having read the running
    pod's assignment back from the API server, places the next pod beside it and refuses one
    that would oversubscribe the card."""
    sleep = "exec sleep 600"
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(vgpu_pod("before", 4096, 30, sleep)))
    before = wait_phase(cluster, "before", ("Running",))
    tenant = tenant_of(cluster, before)
    limits = read_device_limits(tenant)
    t0 = time.monotonic()
    for name in ("agent", "device-plugin", "extender", "scheduler"):
        cluster.restart(name)
    wait_until(cluster.extender_ready, "the extender ready again", cluster)
    # The next pod is sent once the node offers its vGPUs again: a vGPU pod the scheduler refused
    # for want of them would wait for its periodic retry, up to 5 minutes, not for the node
    # (docs/kubernetes.md, "A pod that finds no vGPU").
    wait_until(lambda: cluster.node_vgpus() > 0, "the node's vGPUs back", cluster)
    print(
        f"four components restarted; the extender ready, the vGPUs back {time.monotonic() - t0:.1f} s later"
    )
    assert read_device_limits(tenant) == limits  # the running pod's tenant, untouched

    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(vgpu_pod("after", 3072, 40, sleep)))
    after = wait_phase(cluster, "after", ("Running",))
    assert read_device_limits(tenant_of(cluster, after))[0].uuid == limits[0].uuid
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(vgpu_pod("over", 2048, 10, sleep)))
    deadline = time.monotonic() + 60
    while not (reasons := failed_scheduling(cluster, "over")) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert any("no room now" in r for r in reasons), f"{reasons}\n{cluster.tail()}"
    assert cluster.get("pod", "-n", APP_NS, "over")["status"]["phase"] == "Pending"
    assert read_device_limits(tenant) == limits
    cluster.kubectl("-n", APP_NS, "delete", "pod", "before", "after", "over", "--wait", "--timeout", "60s")


def wait_until(check: Callable[[], bool], what: str, gpu: Sharegpu, timeout: float = 60) -> float:
    """Seconds until `check` held; fails naming `what` with the components' logs."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"not within {timeout:.0f} s: {what}\n{gpu.tail()}")
        time.sleep(0.1)
    return time.monotonic() - t0


def test_two_extender_replicas_elect_one_leader_through_the_lease_and_hand_over_at_a_stop(
    cluster: Sharegpu,
) -> None:
    """A second replica (deploy/kubernetes runs two) waits while the first leads: only the
    leader is ready, so the Service sends the scheduler to it. Stopped, the leader hands the
    Lease back and the other leads at once; started again, the first waits its turn."""
    argv, env = cluster.commands["extender"]
    second_port = free_port()
    second = [*argv[: argv.index("--port")], "--port", str(second_port)]
    cluster.start("extender-b", second, dict(env, POD_NAME="extender-e2e-b"))
    wait_until(cluster.extender_ready, "the first replica ready", cluster)
    time.sleep(3)  # the second has had rounds of its own by now
    assert lease_holder(cluster) == "extender-e2e"
    assert not cluster.extender_ready(second_port)

    assert cluster.stop("extender") == 0
    took = wait_until(lambda: cluster.extender_ready(second_port), "the second replica leading", cluster)
    assert lease_holder(cluster) == "extender-e2e-b"
    cluster.start("extender", argv, env)
    time.sleep(3)
    assert not cluster.extender_ready(), "two leaders"
    # Back to the first (the scheduler's URL names its port) for the tests after this one.
    assert cluster.stop("extender-b") == 0
    back = wait_until(cluster.extender_ready, "the first replica leading again", cluster)
    assert lease_holder(cluster) == "extender-e2e"
    print(f"leader stopped: the other replica ready {took:.1f} s later; and back: {back:.1f} s")


def test_containerd_s_own_client_runs_a_container_with_the_cdi_device(cluster: Sharegpu) -> None:
    """containerd outside Kubernetes: `ctr run --device sharegpu.io/vgpu=NAME` (containerd 2's
    client injects CDI devices itself, from /etc/cdi and /var/run/cdi) with a tenant made by
    `sharegpu create` and the spec `sharegpu cdi generate` writes; the probe inside sees its
    512 MiB and is refused past it."""
    sim, node = cluster.sim, cluster.node
    name = f"ctr-e2e-{os.getpid()}"
    made = sim.cli("create", name, "--memory", "512MiB", "--gpu", "0")
    assert made.returncode == 0, made.stderr
    spec = Path("/var/run/cdi") / f"sharegpu-e2e-{os.getpid()}.json"  # where ctr looks
    made_dir = not spec.parent.exists()
    spec.parent.mkdir(parents=True, exist_ok=True)
    ctr = node.ctr("ctr-e2e")
    try:
        generated = sim.cli("cdi", "generate", "--shape", "none", "--output", str(spec))
        assert generated.returncode == 0, generated.stderr
        imported = subprocess.run(
            [*ctr, "images", "import", str(cluster.probe_tar)], check=False, capture_output=True, text=True
        )
        assert imported.returncode == 0, imported.stderr
        device = f"sharegpu.io/vgpu={name}"
        probe = ["sh", "-c", "sgprobe info; sgprobe alloc plain 400M 200M"]
        run = subprocess.run(
            [*ctr, "run", "--rm", "--device", device, PROBE_IMAGE, name, *probe],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        spec.unlink(missing_ok=True)
        spec.with_name(f".{spec.name}.owner").unlink(missing_ok=True)  # cdi generate's claim on it
        if made_dir:
            spec.parent.rmdir()
        subprocess.run([*ctr, "containers", "delete", name], capture_output=True, check=False)
        sim.cli("delete", name, "--force")
    assert run.returncode == 0, run.stderr
    values, lines = parse_kv(run.stdout)
    assert values["dev0.total"] == str(512 * MIB), run.stdout
    assert [v for k, v in lines if k == "alloc"] == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"], run.stdout
    print(f"ctr run with the CDI device: total {values['dev0.total']}, free after 400M {values.get('free')}")


def test_a_kubelet_restart_keeps_the_running_vgpu_pod_and_the_device_plugin_registers_again(
    cluster: Sharegpu,
) -> None:
    """The kubelet stopped and started again under a running vGPU pod: the pod keeps running
    with its tenant, the device plugin registers again (the kubelet empties its plugin directory
    at a start) so the node shows its vGPUs, and a new vGPU pod is admitted beside the first."""
    sleep = "exec sleep 600"
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(vgpu_pod("kept", 2048, 20, sleep)))
    kept = wait_phase(cluster, "kept", ("Running",))
    tenant = tenant_of(cluster, kept)
    limits = read_device_limits(tenant)
    took = cluster.node.restart_kubelet()
    registered = wait_until(
        lambda: cluster.node_vgpus() > 0, "the node's vGPUs back after the kubelet's restart", cluster
    )
    again = cluster.get("pod", "-n", APP_NS, "kept")
    assert again["status"]["phase"] == "Running"
    assert again["status"]["containerStatuses"][0]["restartCount"] == 0
    assert read_device_limits(tenant) == limits
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(vgpu_pod("beside", 2048, 20, sleep)))
    beside = wait_phase(cluster, "beside", ("Running",))
    assert tenant_of(cluster, beside) != tenant
    print(f"kubelet restarted in {took:.1f} s; its vGPUs back {registered:.1f} s later")
    cluster.kubectl("-n", APP_NS, "delete", "pod", "kept", "beside", "--wait", "--timeout", "60s")


def test_a_vulkan_pod_sees_its_vgpu_and_is_refused_past_its_cap(
    cluster: Sharegpu, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A rendering pod (a plain Vulkan program on lavapipe, no sharegpu file in its image) gets the
    Vulkan layer from its vGPU's CDI device like any other tenant."""
    import_vulkan_image(cluster.node, tmp_path_factory.mktemp("vkimage"))
    name = "vulkan-256m"
    script = "export XDG_RUNTIME_DIR=/tmp; vkprobe info 13 && vkprobe fill 64"
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(vgpu_pod(name, 256, 30, script, image=VULKAN_IMAGE)))
    done = wait_phase(cluster, name, ("Succeeded", "Failed"))
    log = cluster.kubectl("-n", APP_NS, "logs", name).stdout
    assert done["status"]["phase"] == "Succeeded", log
    values = parse_kv(log)[0]
    assert values["devices"] == "1", log
    assert values["heap2"] == str(256 * MIB), log  # the vGPU's heap, not lavapipe's
    assert (values["allocated"], values["refused"]) == ("4", "-2"), log  # VK_ERROR_OUT_OF_DEVICE_MEMORY
    cluster.kubectl("-n", APP_NS, "delete", "pod", name, "--wait", "--timeout", "60s")
