"""sharegpu as a DRA driver on a real node (issue 38): `deploy/kubernetes/dra` applied to the real
API server; the agent and the DRA kubelet plugin as host processes under the node's
ServiceAccount (`tests/e2e/kubesharegpu.py`, `dra_on`); claims placed by the real default
kube-scheduler from the plugin's ResourceSlice, prepared by the plugin at the real kubelet's
request, and their pods started by containerd 2 through CDI.

Part of `make test` (after `make kube`); needs root; fails, never skips, when a component is
missing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import parse_kv
from e2e.kubenode import running_kube_node
from e2e.kubesharegpu import (
    APP_NS,
    PROBE_IMAGE,
    Sharegpu,
    audit_denials,
    dra_on,
    failed_scheduling,
    wait_phase,
)
from sharegpu.kube.dra.claims import ClaimRef, tenant_name
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import read_device_limits, read_meta, tenants_dir


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sharegpu]:
    root = Path(tmp_path_factory.mktemp("sharegpu-dra"))
    with running_kube_node() as node, dra_on(node, root) as gpu:
        yield gpu
        denied = audit_denials(node.dir / "audit.log")
        assert not denied, "the API server refused sharegpu's components:\n" + "\n".join(denied)


def claim_template(
    name: str,
    capacity: dict[str, str],
    device_class: str = "vgpu.sharegpu.io",
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ResourceClaimTemplate for one share of a GPU, as docs/kubernetes.md writes one."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if config:
        spec["devices"]["config"] = [
            {
                "opaque": {
                    "driver": "sharegpu.io",
                    "parameters": {"apiVersion": "sharegpu.io/v1alpha1", "kind": "VgpuConfig", **config},
                }
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": APP_NS},
        "spec": {"spec": spec},
    }


def claim_pod(name: str, template: str, command: str, containers: int = 1) -> dict[str, Any]:
    """A pod whose containers use one claim made from `template` (the default scheduler)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": APP_NS},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": f"c{i}",
                    "image": PROBE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
                for i in range(containers)
            ],
        },
    }


def apply(gpu: Sharegpu, *objects: dict[str, Any]) -> None:
    for obj in objects:
        gpu.kubectl("apply", "-f", "-", stdin=json.dumps(obj))


def pod_claim(gpu: Sharegpu, pod: dict[str, Any]) -> ClaimRef:
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = gpu.get("resourceclaim", "-n", APP_NS, status["resourceClaimName"])
    return ClaimRef(APP_NS, claim["metadata"]["name"], claim["metadata"]["uid"])


def claim_tenants(gpu: Sharegpu) -> list[str]:
    return sorted(
        p.name
        for p in tenants_dir(gpu.sim.runtime).iterdir()
        if "claim_uid" in (read_meta(p).get("labels") or {})
    )


def logs_with(gpu: Sharegpu, pod: str, container: str, marker: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while marker not in (log := gpu.kubectl("-n", APP_NS, "logs", pod, "-c", container).stdout):
        if time.monotonic() > deadline:
            pytest.fail(f"pod {pod} container {container} did not log {marker!r}:\n{log}")
        time.sleep(0.2)
    return log


def delete_pod(gpu: Sharegpu, name: str) -> None:
    gpu.kubectl("-n", APP_NS, "delete", "pod", name, "--wait", "--timeout", "60s")


def wait_gone(path: Path, gpu: Sharegpu, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not path.exists(), f"{path.name} is still there:\n{gpu.tail()}"


def test_the_node_publishes_one_shared_device_per_gpu(cluster: Sharegpu) -> None:
    slices = cluster.get("resourceslices", "--field-selector", f"spec.nodeName={cluster.node.node}")["items"]
    (published,) = slices
    (device,) = published["spec"]["devices"]
    assert published["spec"]["driver"] == "sharegpu.io"
    assert device["name"] == "gpu-0"
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"]["memory"]["value"] == "8Gi"
    assert device["capacity"]["compute"]["value"] == "100"
    assert device["attributes"]["index"] == {"int": 0}
    assert device["attributes"]["model"]["string"]
    print(f"ResourceSlice {published['metadata']['name']}: {json.dumps(device['capacity'])}")


def test_a_claim_for_4gib_and_30_percent_runs_with_its_tenant_and_frees_it(cluster: Sharegpu) -> None:
    apply(cluster, claim_template("vgpu-4g-30", {"memory": "4Gi", "compute": "30"}))
    pod = claim_pod(
        "dra-4g", "vgpu-4g-30", "sgprobe info && sgprobe alloc plain 3000M 2000M && exec sleep 600"
    )
    t0 = time.monotonic()
    apply(cluster, pod)
    running = wait_phase(cluster, "dra-4g", ("Running", "Failed", "Succeeded"))
    took = time.monotonic() - t0
    assert running["status"]["phase"] == "Running", running["status"]
    ref = pod_claim(cluster, running)
    tenant = tenants_dir(cluster.sim.runtime) / tenant_name(ref)
    (limit,) = read_device_limits(tenant)
    assert (limit.mem_cap_bytes, limit.share_permille, limit.priority) == (
        4096 * MIB,
        300,
        abi.PRIORITY_NORMAL,
    )
    labels = read_meta(tenant)["labels"]
    assert labels == {"namespace": APP_NS, "claim": ref.name, "claim_uid": ref.uid, "pod": "dra-4g"}
    values, lines = parse_kv(logs_with(cluster, "dra-4g", "c0", "alloc="))
    assert values.get("dev0.total") == str(4096 * MIB)  # its share, not the 8 GiB card
    assert [v for k, v in lines if k == "alloc"] == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    print(f"DRA claim pod created -> Running in {took:.1f} s; inside: total {values['dev0.total']}")
    delete_pod(cluster, "dra-4g")
    wait_gone(tenant, cluster)
    assert claim_tenants(cluster) == []


def test_claims_beyond_the_gpu_leave_the_last_pending_until_one_goes(cluster: Sharegpu) -> None:
    apply(cluster, claim_template("vgpu-3g", {"memory": "3Gi", "compute": "20"}))
    for name in ("fit-a", "fit-b", "fit-c"):
        apply(cluster, claim_pod(name, "vgpu-3g", "exec sleep 600"))
    running = [wait_phase(cluster, name, ("Running",)) for name in ("fit-a", "fit-b")]
    deadline = time.monotonic() + 60
    while not (reasons := failed_scheduling(cluster, "fit-c")) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert reasons, f"no FailedScheduling for the claim that does not fit:\n{cluster.tail()}"
    assert cluster.get("pod", "-n", APP_NS, "fit-c")["status"]["phase"] == "Pending"
    assert len(claim_tenants(cluster)) == 2
    print(f"the third claim waits: {reasons[-1]}")
    delete_pod(cluster, running[0]["metadata"]["name"])
    wait_phase(cluster, "fit-c", ("Running",))
    assert len(claim_tenants(cluster)) == 2
    for name in ("fit-b", "fit-c"):
        delete_pod(cluster, name)


def test_a_claim_shared_by_two_containers_is_one_tenant(cluster: Sharegpu) -> None:
    apply(
        cluster,
        claim_template(
            "vgpu-2g-online", {"memory": "2Gi", "compute": "40"}, device_class="online.vgpu.sharegpu.io"
        ),
    )
    apply(cluster, claim_pod("two", "vgpu-2g-online", "sgprobe info && exec sleep 600", containers=2))
    running = wait_phase(cluster, "two", ("Running",))
    ref = pod_claim(cluster, running)
    assert claim_tenants(cluster) == [tenant_name(ref)]
    (limit,) = read_device_limits(tenants_dir(cluster.sim.runtime) / tenant_name(ref))
    assert (limit.mem_cap_bytes, limit.share_permille, limit.priority) == (
        2048 * MIB,
        400,
        abi.PRIORITY_ONLINE,
    )
    for container in ("c0", "c1"):
        values, _ = parse_kv(logs_with(cluster, "two", container, "dev0.total"))
        assert values["dev0.total"] == str(2048 * MIB)
    delete_pod(cluster, "two")
    wait_gone(tenants_dir(cluster.sim.runtime) / tenant_name(ref), cluster)


def test_a_bad_configuration_fails_the_pod_with_the_reason_and_prepares_nothing(cluster: Sharegpu) -> None:
    apply(
        cluster, claim_template("vgpu-bad", {"memory": "1Gi", "compute": "10"}, config={"priority": "urgent"})
    )
    apply(cluster, claim_pod("bad", "vgpu-bad", "exec sleep 600"))
    deadline = time.monotonic() + 60
    messages: list[str] = []
    while time.monotonic() < deadline:
        events = cluster.get("events", "-n", APP_NS, "--field-selector", "involvedObject.name=bad")["items"]
        messages = [e["message"] for e in events if e["type"] == "Warning"]
        if any("invalid priority 'urgent'" in m for m in messages):
            break
        time.sleep(0.3)
    else:
        pytest.fail(f"no event with the plugin's reason: {messages}\n{cluster.tail()}")
    assert cluster.get("pod", "-n", APP_NS, "bad")["status"]["phase"] == "Pending"
    assert claim_tenants(cluster) == []
    print(f"the bad claim's pod: {next(m for m in messages if 'urgent' in m)}")
    delete_pod(cluster, "bad")


def test_a_claim_for_more_than_any_gpu_is_unschedulable(cluster: Sharegpu) -> None:
    apply(cluster, claim_template("vgpu-huge", {"memory": "64Gi"}))
    apply(cluster, claim_template("vgpu-over", {"memory": "1Gi", "compute": "150"}))
    apply(
        cluster,
        claim_pod("huge", "vgpu-huge", "exec sleep 600"),
        claim_pod("over", "vgpu-over", "exec sleep 600"),
    )
    for name in ("huge", "over"):
        deadline = time.monotonic() + 60
        while not (reasons := failed_scheduling(cluster, name)) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert reasons, f"pod {name} has no FailedScheduling event:\n{cluster.tail()}"
        print(f"{name}: {reasons[-1]}")
    assert claim_tenants(cluster) == []
    for name in ("huge", "over"):
        delete_pod(cluster, name)
