"""sharegpu's DRA mode deployed from its own image on the real node (issue 38): the node
DaemonSet of `deploy/kubernetes/kind-dra` (the agent and the DRA kubelet plugin) runs as a pod
that the kubelet starts and probes, installed once by `kubectl apply -k` and once by `helm install
--set mode=dra` of the chart, each on a fresh node (`tests/e2e/kubedeployed.py` sets it up). The
plugin registers with the kubelet from its container and publishes the node's ResourceSlice; the
default kube-scheduler places a claim from it; the plugin prepares the claim's tenant; a rolling
update of the DaemonSet, as an upgrade makes, keeps the running claim, and the new plugin prepares
and unprepares claims after it.

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
from e2e.kubedeployed import INSTALLERS, PROJECT_IMAGE, Deployed, deployed_on_a_fresh_node
from e2e.kubesharegpu import (
    APP_NS,
    claim_pod,
    claim_template,
    pod_claim,
    wait_phase,
)
from sharegpu.kube.dra.claims import tenant_name
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import read_device_limits, tenants_dir

RUNTIME = Path("/run/sharegpu")  # the DaemonSet's hostPath
SLEEP = "exec sleep 600"
GPU_MEMORY = "16Gi"  # deploy/kubernetes/simulated-gpu: two GPUs of 16 GiB (as the API server writes it)


@pytest.fixture(scope="module", params=INSTALLERS)
def deployed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """A fresh node for each way of installing: `kubectl apply -k`, `helm install`."""
    root = Path(tmp_path_factory.mktemp(f"sharegpu-dra-{request.param}"))
    with deployed_on_a_fresh_node(root, request.param, mode="dra") as cluster:
        yield cluster


def run_claim_pod(deployed: Deployed, name: str, memory: str, compute: int, command: str) -> dict[str, Any]:
    """A pod with a claim for `memory` and `compute` percent, Running."""
    template = f"{name}-vgpu"
    claim = claim_template(template, {"memory": memory, "compute": str(compute)})
    for obj in (claim, claim_pod(name, template, command)):
        deployed.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
    running = wait_phase(deployed, name, ("Running", "Failed", "Succeeded"), timeout=120)
    assert running["status"]["phase"] == "Running", running["status"]
    return running


def tenant_of(deployed: Deployed, pod: dict[str, Any]) -> Path:
    return tenants_dir(RUNTIME) / tenant_name(pod_claim(deployed, pod))


def wait_gone(deployed: Deployed, path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while path.exists():
        assert time.monotonic() < deadline, f"{path.name} is still there:\n{deployed.tail()}"
        time.sleep(0.2)


def node_pod(deployed: Deployed) -> dict[str, Any]:
    (pod,) = [p for p in deployed.pods() if p["metadata"].get("deletionTimestamp") is None]
    return pod


def test_the_node_runs_from_the_image_alone_and_publishes_its_gpus(deployed: Deployed) -> None:
    pod = node_pod(deployed)  # no extender, no second scheduler: only the node DaemonSet
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "node"
    statuses = pod["status"]["containerStatuses"]
    assert sorted(s["name"] for s in statuses) == ["agent", "dra-plugin"]
    assert all(s["ready"] and s["restartCount"] == 0 for s in statuses), statuses
    assert {s["image"].rpartition(":")[0] for s in statuses} == {PROJECT_IMAGE}
    slices = deployed.get("resourceslices", "--field-selector", f"spec.nodeName={deployed.node.node}")
    (published,) = slices["items"]
    assert published["spec"]["driver"] == "sharegpu.io"
    devices = published["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    for device in devices:
        assert device["allowMultipleAllocations"] is True
        assert device["capacity"]["memory"]["value"] == GPU_MEMORY
    classes = deployed.get("deviceclasses")["items"]
    assert {c["metadata"]["name"] for c in classes} >= {"vgpu.sharegpu.io", "online.vgpu.sharegpu.io"}


def test_a_claim_for_4gib_and_30_percent_runs_through_the_deployed_plugin(deployed: Deployed) -> None:
    t0 = time.monotonic()
    command = f"sgprobe info && sgprobe alloc plain 3000M 2000M && {SLEEP}"
    running = run_claim_pod(deployed, "deployed-dra-4g", "4Gi", 30, command)
    took = time.monotonic() - t0
    tenant = tenant_of(deployed, running)
    (limit,) = read_device_limits(tenant)
    assert (limit.mem_cap_bytes, limit.share_permille, limit.priority) == (
        4096 * MIB,
        300,
        abi.PRIORITY_NORMAL,
    )
    ref = pod_claim(deployed, running)
    (status,) = deployed.get("resourceclaim", "-n", APP_NS, ref.name)["status"]["devices"]
    assert status["data"]["tenant"] == tenant.name
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "True")]
    deadline = time.monotonic() + 30
    while "alloc=" not in (log := deployed.kubectl("-n", APP_NS, "logs", "deployed-dra-4g").stdout):
        assert time.monotonic() < deadline, log
        time.sleep(0.2)
    values, lines = parse_kv(log)
    totals = sorted(int(values[f"dev{i}.total"]) for i in range(int(values["count"])))
    assert totals[-1] == 4096 * MIB, log  # its share, not the 16 GiB GPU
    assert [v for k, v in lines if k == "alloc"] == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"], log
    print(f"DRA claim pod created -> Running in {took:.1f} s through the deployed plugin")
    deployed.kubectl("-n", APP_NS, "delete", "pod", "deployed-dra-4g", "--wait", "--timeout", "60s")
    wait_gone(deployed, tenant)


def test_a_rolling_update_keeps_the_running_claim_and_the_new_plugin_serves_after_it(
    deployed: Deployed,
) -> None:
    """`kubectl rollout restart` of the DaemonSet, as an upgrade rolls it: the running claim's
    tenant keeps its limits; the new plugin, with the checkpoint on the node's state directory,
    prepares the next claim beside it and unprepares the first when its pod goes."""
    kept = run_claim_pod(deployed, "kept", "12Gi", 60, SLEEP)
    tenant = tenant_of(deployed, kept)
    limits = read_device_limits(tenant)
    rolled = deployed.roll_node()
    still = deployed.get("pod", "-n", APP_NS, "kept")
    assert still["status"]["phase"] == "Running"
    assert still["status"]["containerStatuses"][0]["restartCount"] == 0
    assert read_device_limits(tenant) == limits
    print(f"the node DaemonSet rolled in {rolled:.1f} s; the running claim's tenant kept")
    # 12 GiB taken on one GPU: an 8 GiB claim goes to the other.
    beside = tenant_of(deployed, run_claim_pod(deployed, "beside", "8Gi", 30, SLEEP))
    assert read_device_limits(beside)[0].uuid != limits[0].uuid
    deployed.kubectl("-n", APP_NS, "delete", "pod", "kept", "beside", "--wait", "--timeout", "60s")
    wait_gone(deployed, tenant)
    wait_gone(deployed, beside)
