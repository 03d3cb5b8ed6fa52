"""sharegpu deployed from its own image by its manifests on the real node (issue 37): the node
DaemonSet (agent and device plugin), the extender and the second kube-scheduler run as pods that
the kubelet starts, probes and restarts, installed once by `kubectl apply -k` and once by
`helm install` of the chart, each on a fresh node (`tests/e2e/kubedeployed.py` sets it up). A vGPU
pod goes through all of them; a rolling update of the DaemonSet, as an upgrade makes, keeps the
running pod and its tenant.

Part of `make test` (after `make kube`); needs root and debootstrap (the image); fails, never
skips, when a component is missing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import parse_kv
from e2e.kubedeployed import INSTALLERS, PROJECT_IMAGE, SCHEDULER_IMAGE, Deployed, deployed_on_a_fresh_node
from e2e.kubesharegpu import (
    APP_NS,
    failed_scheduling,
    lease_holder,
    tenant_limits,
    vgpu_pod,
    wait_phase,
)
from sharegpu.kube.deviceplugin.allocate import tenant_name
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import read_device_limits, tenant_path

RUNTIME = Path("/run/sharegpu")  # the DaemonSet's hostPath
SLEEP = "exec sleep 600"


@pytest.fixture(scope="module", params=INSTALLERS)
def deployed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """A fresh node for each way of installing: `kubectl apply -k`, `helm install`."""
    root = Path(tmp_path_factory.mktemp(f"sharegpu-{request.param}"))
    with deployed_on_a_fresh_node(root, request.param) as cluster:
        yield cluster


def tenant_of(pod: dict[str, Any]) -> Path:
    return tenant_path(tenant_name(pod["metadata"]["uid"], "main"), RUNTIME)


def run_vgpu_pod(cluster: Deployed, name: str, memory_mib: int, compute: int, command: str) -> dict[str, Any]:
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(vgpu_pod(name, memory_mib, compute, command)))
    return wait_phase(cluster, name, ("Running",), timeout=120)


def test_every_component_runs_from_the_project_image_and_the_node_shows_its_vgpus(deployed: Deployed) -> None:
    pods = deployed.pods()
    by_component = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in pods}
    assert set(by_component) == {"node", "extender", "scheduler"}, [p["metadata"]["name"] for p in pods]
    for component, pod in by_component.items():
        statuses = pod["status"]["containerStatuses"]
        assert all(s["ready"] and s["restartCount"] == 0 for s in statuses), (component, statuses)
        want = SCHEDULER_IMAGE if component == "scheduler" else PROJECT_IMAGE
        assert {s["image"].rpartition(":")[0] for s in statuses} == {want}, statuses
    # The init container copied the simulated driver onto the node; the agent wrote the tenants'
    # directory and its socket on the host path the manifests give.
    assert (RUNTIME / "agent.sock").is_socket()
    # The CDI spec the agent wrote in its container names the node's files: each mount's host
    # path is there, the shim's codecs among them as copies under the runtime directory.
    spec = json.loads((deployed.node.cdi / "sharegpu.json").read_text())
    edits = [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
    hosts = {m["hostPath"] for e in edits for m in e.get("mounts", [])}
    assert [h for h in sorted(hosts) if not Path(h).exists()] == []
    assert str(RUNTIME / "cdi" / "codecs" / "libzstd.so.1") in hosts
    node = deployed.get("node", deployed.node.node)
    # deploy/kubernetes/kind's simulated card: two GPUs of 16 GiB, 16 vGPU slots each.
    assert int(node["status"]["allocatable"]["sharegpu.io/vgpu"]) == 32
    assert node["metadata"]["labels"].get("sharegpu.io/gpu-count") == "2"
    # The extender in its pod took the lease through the real API server.
    assert lease_holder(deployed) == by_component["extender"]["metadata"]["name"]


def test_a_vgpu_pod_goes_through_the_deployed_scheduler_extender_device_plugin_and_agent(
    deployed: Deployed,
) -> None:
    name = "deployed-4g-30"
    t0 = time.monotonic()
    command = "sgprobe info && sgprobe alloc plain 3000M 2000M && " + SLEEP
    running = run_vgpu_pod(deployed, name, 4096, 30, command)
    took = time.monotonic() - t0
    events = deployed.get("events", "-n", APP_NS, "--field-selector", f"involvedObject.name={name}")["items"]
    assert [e.get("reportingComponent") for e in events if e["reason"] == "Scheduled"] == [
        "sharegpu-scheduler"
    ]
    assert "sharegpu.io/assignment" in running["metadata"]["annotations"], running["metadata"]
    tenant = tenant_of(running)
    assert tenant_limits(tenant) == (4096 * MIB, 300, abi.PRIORITY_NORMAL)
    deadline = time.monotonic() + 30
    while "alloc=" not in (log := deployed.kubectl("-n", APP_NS, "logs", name).stdout):
        assert time.monotonic() < deadline, log
        time.sleep(0.2)
    values, lines = parse_kv(log)
    assert values["dev0.total"] == str(4096 * MIB), log  # its vGPU, not the 16 GiB GPU
    assert [v for k, v in lines if k == "alloc"] == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"], log
    print(f"vGPU pod created -> Running in {took:.1f} s through the deployed components")
    deployed.kubectl("-n", APP_NS, "delete", "pod", name, "--wait", "--timeout", "60s")
    deadline = time.monotonic() + 30
    while tenant.exists():
        assert time.monotonic() < deadline, f"the deleted pod's tenant is still there:\n{deployed.tail()}"
        time.sleep(0.2)


def test_a_rolling_update_of_the_node_daemonset_keeps_the_running_pod_and_its_tenant(
    deployed: Deployed,
) -> None:
    """`kubectl rollout restart` of the DaemonSet, as an upgrade rolls it: the new pod's agent
    adopts the running pod's tenant, which keeps its limits; the new device plugin allocates the
    next pod beside it and the extender refuses one that does not fit the GPU that is left."""
    kept = run_vgpu_pod(deployed, "kept", 12288, 60, SLEEP)
    tenant = tenant_of(kept)
    limits = read_device_limits(tenant)
    tenants = sorted(p.name for p in tenant.parent.iterdir())
    rolled = deployed.roll_node()
    still = deployed.get("pod", "-n", APP_NS, "kept")
    assert still["status"]["phase"] == "Running"
    assert still["status"]["containerStatuses"][0]["restartCount"] == 0
    assert read_device_limits(tenant) == limits
    assert sorted(p.name for p in tenant.parent.iterdir()) == tenants  # none lost, none doubled
    print(f"the node DaemonSet rolled in {rolled:.1f} s; the running pod's tenant kept")
    # Placed beside it on the other GPU's room: 12 GiB taken on one card, 8 GiB fits on the other.
    beside = run_vgpu_pod(deployed, "beside", 8192, 30, SLEEP)
    assert read_device_limits(tenant_of(beside))[0].uuid != limits[0].uuid
    deployed.kubectl("apply", "-f", "-", stdin=json.dumps(vgpu_pod("over", 12288, 10, SLEEP)))
    deadline = time.monotonic() + 60
    while not (reasons := failed_scheduling(deployed, "over")):
        assert time.monotonic() < deadline, deployed.tail()
        time.sleep(0.3)
    assert deployed.get("pod", "-n", APP_NS, "over")["status"]["phase"] == "Pending", reasons
    deployed.kubectl("-n", APP_NS, "delete", "pod", "kept", "beside", "over", "--wait", "--timeout", "60s")
