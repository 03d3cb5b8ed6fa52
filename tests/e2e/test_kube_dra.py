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
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import parse_kv
from e2e.kubenode import running_kube_node
from e2e.kubesharegpu import (
    APP_NS,
    Sharegpu,
    audit_denials,
    claim_pod,
    claim_template,
    dra_on,
    failed_scheduling,
    pod_claim,
    wait_phase,
)
from sharegpu.kube.dra.checkpoint import FILE
from sharegpu.kube.dra.claims import ClaimRef, tenant_name
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import read_device_limits, read_limits, read_meta, tenants_dir


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sharegpu]:
    root = Path(tmp_path_factory.mktemp("sharegpu-dra"))
    with running_kube_node() as node, dra_on(node, root) as gpu:
        yield gpu
        denied = audit_denials(node.dir / "audit.log")
        assert not denied, "the API server refused sharegpu's components:\n" + "\n".join(denied)


def unschedulable(gpu: Sharegpu, name: str, timeout: float = 60) -> list[str]:
    """The scheduler's reasons for pod `name`, once it has given one."""
    deadline = time.monotonic() + timeout
    while not (reasons := failed_scheduling(gpu, name)):
        assert time.monotonic() < deadline, f"pod {name} has no FailedScheduling event:\n{gpu.tail()}"
        time.sleep(0.3)
    return reasons


def warning_with(gpu: Sharegpu, pod: str, fragment: str, timeout: float = 60) -> str:
    """The first Warning event of `pod` that says `fragment` (the kubelet's, with the plugin's
    reason), once there is one."""
    deadline = time.monotonic() + timeout
    while True:
        events = gpu.get("events", "-n", APP_NS, "--field-selector", f"involvedObject.name={pod}")["items"]
        messages = [e["message"] for e in events if e["type"] == "Warning"]
        found = [m for m in messages if fragment in m]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"pod {pod}: no event says {fragment!r}: {messages}\n{gpu.tail()}"
        time.sleep(0.3)


def apply(gpu: Sharegpu, *objects: dict[str, Any]) -> None:
    for obj in objects:
        gpu.kubectl("apply", "-f", "-", stdin=json.dumps(obj))


def totals_by_uuid(probe: dict[str, str]) -> dict[str, int]:
    """What `sgprobe info` printed: each GPU's total memory, by UUID."""
    return {probe[f"dev{i}.uuid"]: int(probe[f"dev{i}.total"]) for i in range(int(probe["count"]))}


def gpu_uuids(gpu: Sharegpu) -> list[str]:
    return [d["attributes"]["uuid"]["string"] for d in slice_devices(gpu).values()]


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
    assert published["spec"]["driver"] == "sharegpu.io"
    assert [d["name"] for d in published["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    device = published["spec"]["devices"][0]
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
    # What the tenant got, on the claim (written from the node the claim is prepared on).
    (status,) = cluster.get("resourceclaim", "-n", APP_NS, ref.name)["status"]["devices"]
    assert (status["driver"], status["pool"]) == ("sharegpu.io", cluster.node.node)
    assert slice_devices(cluster)[status["device"]]["attributes"]["uuid"]["string"] == limit.uuid
    assert status["data"] == {
        "tenant": tenant.name,
        "memoryMiB": 4096,
        "computePercent": 30,
        "policy": "share",
        "priority": "normal",
    }
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [("Ready", "True")]
    values, lines = parse_kv(logs_with(cluster, "dra-4g", "c0", "alloc="))
    assert totals_by_uuid(values) == {
        uuid: (4096 * MIB if uuid == limit.uuid else 0)  # its share; a GPU it was not given shows none
        for uuid in gpu_uuids(cluster)
    }
    assert [v for k, v in lines if k == "alloc"] == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    print(f"DRA claim pod created -> Running in {took:.1f} s; inside: total {values['dev0.total']}")
    delete_pod(cluster, "dra-4g")
    wait_gone(tenant, cluster)
    assert claim_tenants(cluster) == []


@pytest.mark.parametrize(
    ("memory", "compute"),
    [("5Gi", "20"), ("1Gi", "60")],
    ids=["beyond-memory", "beyond-compute"],
)
def test_claims_beyond_the_gpu_leave_the_last_pending_until_one_goes(
    cluster: Sharegpu, memory: str, compute: str
) -> None:
    # Two GPUs of 8 GiB and 100%: one claim of 5 GiB, or of 60%, fits on each, a third on neither.
    template = f"vgpu-{memory.lower()}-{compute}"
    apply(cluster, claim_template(template, {"memory": memory, "compute": compute}))
    for name in ("fit-a", "fit-b", "fit-c"):
        apply(cluster, claim_pod(name, template, "exec sleep 600"))
    running = [wait_phase(cluster, name, ("Running",)) for name in ("fit-a", "fit-b")]
    reasons = unschedulable(cluster, "fit-c")
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
    reason = warning_with(cluster, "bad", "invalid priority 'urgent'")
    assert cluster.get("pod", "-n", APP_NS, "bad")["status"]["phase"] == "Pending"
    assert claim_tenants(cluster) == []
    print(f"the bad claim's pod: {reason}")
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
        print(f"{name}: {unschedulable(cluster, name)[-1]}")
    assert claim_tenants(cluster) == []
    for name in ("huge", "over"):
        delete_pod(cluster, name)


def slice_devices(gpu: Sharegpu) -> dict[str, dict[str, Any]]:
    (published,) = gpu.get("resourceslices", "--field-selector", f"spec.nodeName={gpu.node.node}")["items"]
    return {d["name"]: d for d in published["spec"]["devices"]}


def tenant_uuids(gpu: Sharegpu, ref: ClaimRef) -> list[str]:
    return sorted(limit.uuid for limit in read_device_limits(tenants_dir(gpu.sim.runtime) / tenant_name(ref)))


def test_a_claim_for_two_gpus_is_one_tenant_with_its_share_of_each(cluster: Sharegpu) -> None:
    apply(cluster, claim_template("vgpu-2x2g", {"memory": "2Gi", "compute": "20"}, gpus=2))
    apply(cluster, claim_pod("both", "vgpu-2x2g", "sgprobe info && exec sleep 600"))
    ref = pod_claim(cluster, wait_phase(cluster, "both", ("Running",)))
    devices = slice_devices(cluster)
    assert tenant_uuids(cluster, ref) == sorted(d["attributes"]["uuid"]["string"] for d in devices.values())
    values, _ = parse_kv(logs_with(cluster, "both", "c0", "dev1.total"))
    assert (values["count"], values["dev0.total"], values["dev1.total"]) == (
        "2",
        str(2048 * MIB),
        str(2048 * MIB),
    )
    delete_pod(cluster, "both")
    wait_gone(tenants_dir(cluster.sim.runtime) / tenant_name(ref), cluster)


def test_a_cel_selector_on_the_published_attributes_chooses_the_gpu(cluster: Sharegpu) -> None:
    devices = slice_devices(cluster)
    model = devices["gpu-1"]["attributes"]["model"]["string"]
    selector = (
        f'device.attributes["sharegpu.io"].model == "{model}" && device.attributes["sharegpu.io"].index == 1'
    )
    apply(cluster, claim_template("vgpu-on-1", {"memory": "1Gi", "compute": "10"}, selector=selector))
    apply(cluster, claim_pod("on-1", "vgpu-on-1", "exec sleep 600"))
    ref = pod_claim(cluster, wait_phase(cluster, "on-1", ("Running",)))
    assert tenant_uuids(cluster, ref) == [devices["gpu-1"]["attributes"]["uuid"]["string"]]
    delete_pod(cluster, "on-1")


def test_a_selector_on_an_unknown_attribute_leaves_the_pod_pending_with_the_reason(cluster: Sharegpu) -> None:
    selector = 'device.attributes["sharegpu.io"].nosuch == "x"'
    apply(cluster, claim_template("vgpu-nosuch", {"memory": "1Gi"}, selector=selector))
    apply(cluster, claim_pod("nosuch", "vgpu-nosuch", "exec sleep 600"))
    reasons = unschedulable(cluster, "nosuch")
    assert "nosuch" in reasons[-1], reasons
    assert claim_tenants(cluster) == []
    print(f"nosuch: {reasons[-1]}")
    delete_pod(cluster, "nosuch")


def running_claim_pod(gpu: Sharegpu, name: str, template: str) -> ClaimRef:
    apply(gpu, claim_pod(name, template, "exec sleep 600"))
    return pod_claim(gpu, wait_phase(gpu, name, ("Running",)))


def restart_plugin(gpu: Sharegpu, *extra: str) -> None:
    """The DRA plugin stopped and started with its command and `extra`; back once registered."""
    assert gpu.stop("dra-plugin") == 0
    argv, env = gpu.commands["dra-plugin"]
    base = argv[: argv.index("--publish-interval") + 2]  # the command without an earlier `extra`
    start_plugin(gpu, [*base, *extra], env)


def start_plugin(gpu: Sharegpu, argv: list[str], env: dict[str, str]) -> None:
    """Start the DRA plugin (the previous one has exited); back once the kubelet registered it."""
    registrations = gpu.logs["dra-plugin"].read_text().count("registered DRA driver")
    gpu.start("dra-plugin", argv, env)
    deadline = time.monotonic() + 60
    while gpu.logs["dra-plugin"].read_text().count("registered DRA driver") == registrations:
        assert time.monotonic() < deadline, f"the restarted plugin is not registered:\n{gpu.tail()}"
        assert gpu.procs["dra-plugin"].poll() is None, f"the plugin exited:\n{gpu.tail()}"
        time.sleep(0.2)


def test_the_plugin_killed_and_started_again_keeps_its_claims_once(cluster: Sharegpu) -> None:
    apply(cluster, claim_template("vgpu-1g", {"memory": "1Gi", "compute": "10"}))
    before = running_claim_pod(cluster, "before-crash", "vgpu-1g")
    plugin = cluster.procs["dra-plugin"]
    plugin.kill()  # no clean-up of its sockets: as a crash or an OOM kill leaves them
    plugin.wait()
    start_plugin(cluster, *cluster.commands["dra-plugin"])
    assert claim_tenants(cluster) == [tenant_name(before)]
    after = running_claim_pod(cluster, "after-crash", "vgpu-1g")
    assert claim_tenants(cluster) == sorted([tenant_name(before), tenant_name(after)])
    for name, ref in (("before-crash", before), ("after-crash", after)):
        delete_pod(cluster, name)  # the restarted plugin unprepares both, from its checkpoint
        wait_gone(tenants_dir(cluster.sim.runtime) / tenant_name(ref), cluster)


# The plugin's own main, SIGKILLed when a prepare has made its claim's tenant and written the CDI
# spec but not yet recorded the claim prepared: the moment a crash leaves the most behind.
DIES_BEFORE_ITS_CHECKPOINT = """
import os, signal, sys
from sharegpu.kube.dra.__main__ import main
from sharegpu.kube.dra.checkpoint import PREPARED, Checkpoint
put = Checkpoint.put
def put_or_die(self, uid, entry):
    if entry.state == PREPARED:
        os.kill(os.getpid(), signal.SIGKILL)
    put(self, uid, entry)
Checkpoint.put = put_or_die
sys.exit(main(sys.argv[1:]))
"""


def test_the_plugin_killed_between_a_prepare_and_its_checkpoint_leaves_exactly_one_tenant(
    cluster: Sharegpu,
) -> None:
    apply(cluster, claim_template("vgpu-1g", {"memory": "1Gi", "compute": "10"}))
    argv, env = cluster.commands["dra-plugin"]
    assert argv[1:3] == ["-m", "sharegpu.kube.dra"], argv
    checkpoint_file = Path(argv[argv.index("--state-dir") + 1]) / FILE
    cluster.stop("dra-plugin")
    start_plugin(cluster, [sys.executable, "-c", DIES_BEFORE_ITS_CHECKPOINT, *argv[3:]], env)
    apply(cluster, claim_pod("mid-prepare", "vgpu-1g", "exec sleep 600"))
    died = cluster.procs["dra-plugin"]
    try:
        assert died.wait(timeout=120) == -9, cluster.tail()
        # It died with the tenant made and the claim still `preparing` in its checkpoint.
        (half_done,) = claim_tenants(cluster)
        checkpoint = json.loads(checkpoint_file.read_text())
        assert [e["state"] for e in checkpoint["claims"].values()] == ["preparing"], checkpoint
        made_first = read_limits(tenants_dir(cluster.sim.runtime) / half_done).incarnation
    finally:
        if cluster.procs["dra-plugin"].poll() is not None:
            start_plugin(cluster, argv, env)  # the real plugin, for this test and the next
    # The restarted plugin rolled the half-done prepare back, and the kubelet's retry prepared the
    # claim once: one tenant, made again, and the pod runs with it.
    ref = pod_claim(cluster, wait_phase(cluster, "mid-prepare", ("Running",), timeout=120))
    assert "rolled back the half-done prepare of claims" in cluster.logs["dra-plugin"].read_text()
    assert claim_tenants(cluster) == [tenant_name(ref)] == [half_done]
    assert read_limits(tenants_dir(cluster.sim.runtime) / half_done).incarnation != made_first
    checkpoint = json.loads(checkpoint_file.read_text())
    assert {uid: e["state"] for uid, e in checkpoint["claims"].items()} == {ref.uid: "prepared"}
    delete_pod(cluster, "mid-prepare")
    wait_gone(tenants_dir(cluster.sim.runtime) / half_done, cluster)


def test_a_kubelet_restart_keeps_the_running_claims_and_prepares_new_ones(cluster: Sharegpu) -> None:
    apply(cluster, claim_template("vgpu-1g", {"memory": "1Gi", "compute": "10"}))
    before = running_claim_pod(cluster, "before-kubelet", "vgpu-1g")
    took = cluster.node.restart_kubelet()
    assert cluster.get("pod", "-n", APP_NS, "before-kubelet")["status"]["phase"] == "Running"
    after = running_claim_pod(cluster, "after-kubelet", "vgpu-1g")
    assert claim_tenants(cluster) == sorted([tenant_name(before), tenant_name(after)])
    print(f"kubelet restarted in {took:.1f} s; the claims' tenants stayed")
    for name, ref in (("before-kubelet", before), ("after-kubelet", after)):
        delete_pod(cluster, name)
        wait_gone(tenants_dir(cluster.sim.runtime) / tenant_name(ref), cluster)


EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "examples" / "dra" / "claims.yaml"


def test_the_documented_examples_are_accepted_and_run_with_the_tenants_they_describe(
    cluster: Sharegpu,
) -> None:
    objs = [o for o in yaml.safe_load_all(EXAMPLES.read_text()) if o]
    templates = [o for o in objs if o["kind"] == "ResourceClaimTemplate"]
    for template in templates:
        apply(cluster, {**template, "metadata": {**template["metadata"], "namespace": APP_NS}})
    want = {
        "vgpu-4g-30": [(4096, 300, abi.PRIORITY_NORMAL)],
        "vgpu-online-2g-20": [(2048, 200, abi.PRIORITY_ONLINE)],
        "vgpu-offline-6g-50-cap": [(6144, 500, abi.PRIORITY_OFFLINE)],
        "vgpu-2x-2g-20": [(2048, 200, abi.PRIORITY_NORMAL)] * 2,
    }
    for template, limits in want.items():
        ref = running_claim_pod(cluster, f"example-{template}", template)
        got = read_device_limits(tenants_dir(cluster.sim.runtime) / tenant_name(ref))
        assert [(d.mem_cap_bytes // MIB, d.share_permille, d.priority) for d in got] == limits, template
        delete_pod(cluster, f"example-{template}")
        wait_gone(tenants_dir(cluster.sim.runtime) / tenant_name(ref), cluster)


def test_a_claim_whose_tenant_the_agent_refuses_fails_with_its_reason_and_leaves_nothing(
    cluster: Sharegpu,
) -> None:
    """The slice counts only claims: a tenant made on the node outside Kubernetes (`sharegpu
    create`) is not in it, so the scheduler may place a claim the agent's admission refuses. The
    pod shows the agent's reason and stays Pending; nothing is left prepared, and the claim runs
    once the room is there."""
    sharegpu = [sys.executable, "-m", "sharegpu.cli"]
    env = cluster.node_env
    subprocess.run(
        [*sharegpu, "create", "outside", "--memory", "7GiB", "--gpu", "0"],
        env=env,
        check=True,
        capture_output=True,
    )
    selector = 'device.attributes["sharegpu.io"].index == 0'
    apply(cluster, claim_template("vgpu-4g-on-0", {"memory": "4Gi", "compute": "10"}, selector=selector))
    apply(cluster, claim_pod("refused", "vgpu-4g-on-0", "exec sleep 600"))
    reason = warning_with(cluster, "refused", "would total")
    assert cluster.get("pod", "-n", APP_NS, "refused")["status"]["phase"] == "Pending"
    assert claim_tenants(cluster) == []
    checkpoint = json.loads(
        (cluster.logs["dra-plugin"].parent / "dra-state" / "dra-checkpoint.json").read_text()
    )
    assert checkpoint["claims"] == {}
    print(f"refused: {reason}")
    subprocess.run([*sharegpu, "delete", "outside"], env=env, check=True, capture_output=True)
    # The kubelet retries with a growing back-off (up to about a minute here).
    ref = pod_claim(cluster, wait_phase(cluster, "refused", ("Running",), timeout=180))
    assert claim_tenants(cluster) == [tenant_name(ref)]
    delete_pod(cluster, "refused")


@pytest.mark.parametrize(
    "resource",
    ["sharegpu.io/vgpu", "deviceclass.resource.kubernetes.io/vgpu.sharegpu.io"],
    ids=["device-plugin-spec", "implicit-name"],
)
def test_a_pod_asking_for_an_extended_resource_is_served_a_whole_gpu(
    cluster: Sharegpu, resource: str
) -> None:
    """`sharegpu.io/vgpu: 1` in a pod's limits, as a pod written for the device plugin asks (the
    DRA install maps it to the class), or the class's implicit extended-resource name; no claim,
    the default scheduler: the scheduler writes a claim of the class, prepared like any other. It
    names no capacity, so it has the whole GPU."""
    pod = claim_pod("mapped", "unused", "sgprobe info && exec sleep 600")
    del pod["spec"]["resourceClaims"]
    container = pod["spec"]["containers"][0]
    container["resources"] = {"limits": {resource: 1}}
    apply(cluster, pod)
    running = wait_phase(cluster, "mapped", ("Running",))
    ref = pod_claim(cluster, running)
    (limit,) = read_device_limits(tenants_dir(cluster.sim.runtime) / tenant_name(ref))
    assert (limit.mem_cap_bytes, limit.share_permille) == (8192 * MIB, 1000)
    values, _ = parse_kv(logs_with(cluster, "mapped", "c0", "dev1.total"))
    assert totals_by_uuid(values) == {
        uuid: (8192 * MIB if uuid == limit.uuid else 0) for uuid in gpu_uuids(cluster)
    }
    delete_pod(cluster, "mapped")
    wait_gone(tenants_dir(cluster.sim.runtime) / tenant_name(ref), cluster)


def resource_health(gpu: Sharegpu, pod: str) -> dict[str, tuple[str, str]]:
    """What the kubelet shows of the health of the pod's devices (KEP-4680, from the plugin's
    health stream), by resource ID (the device's CDI ID): (health, message)."""
    statuses = gpu.get("pod", "-n", APP_NS, pod)["status"].get("containerStatuses", [])
    return {
        r["resourceID"]: (r.get("health", ""), r.get("message", ""))
        for c in statuses
        for a in c.get("allocatedResourcesStatus") or []
        for r in a.get("resources") or []
    }


def test_a_gpu_that_falls_off_the_bus_leaves_the_slice_and_its_pods_show_it_unhealthy(
    cluster: Sharegpu,
) -> None:
    faults = cluster.logs["dra-plugin"].parent / "nvml-faults"
    node = cluster.node.node

    def published() -> tuple[list[str], int]:
        (s,) = cluster.get("resourceslices", "--field-selector", f"spec.nodeName={node}")["items"]
        return [d["name"] for d in s["spec"]["devices"]], s["spec"]["pool"]["generation"]

    def wait_for(devices: list[str], health: dict[str, str]) -> int:
        deadline = time.monotonic() + 60
        while (got := published())[0] != devices or {
            pod: [h for h, _ in resource_health(cluster, pod).values()] for pod in ("on-0", "on-1")
        } != health:
            assert time.monotonic() < deadline, (
                f"the slice lists {got[0]}, not {devices}; the pods show "
                f"{resource_health(cluster, 'on-0')}, {resource_health(cluster, 'on-1')}, not {health}:\n"
                + cluster.tail()
            )
            time.sleep(0.3)
        return got[1]

    for index in (0, 1):
        selector = f'device.attributes["sharegpu.io"].index == {index}'
        apply(cluster, claim_template(f"on-{index}", {"memory": "1Gi", "compute": "10"}, selector=selector))
        on_1 = running_claim_pod(cluster, f"on-{index}", f"on-{index}")
    healthy = {"on-0": ["Healthy"], "on-1": ["Healthy"]}
    before = wait_for(["gpu-0", "gpu-1"], healthy)
    faults.write_text("1:lost\n")
    try:
        lost = wait_for(["gpu-0"], {"on-0": ["Healthy"], "on-1": ["Unhealthy"]})
        (shown,) = resource_health(cluster, "on-1").items()
        print(f"the pod on the lost GPU shows: {shown}")
        assert shown[0] == f"sharegpu.io/vgpu={tenant_name(on_1)}"  # the claim's CDI device
        assert "GPU 1: NVML cannot query it" in shown[1][1], shown
    finally:
        faults.unlink()
    back = wait_for(["gpu-0", "gpu-1"], healthy)
    assert before < lost < back  # each change raises the pool's generation
    assert cluster.get("pod", "-n", APP_NS, "on-1")["status"]["phase"] == "Running"
    for name in ("on-0", "on-1"):
        delete_pod(cluster, name)


def node_slice_names(gpu: Sharegpu) -> list[str]:
    items = gpu.get("resourceslices", "--field-selector", f"spec.nodeName={gpu.node.node}")["items"]
    return sorted(s["metadata"]["name"] for s in items)


def test_in_partition_mode_claims_get_parts_and_the_counters_keep_a_gpu_from_oversubscription(
    cluster: Sharegpu,
) -> None:
    node = cluster.node.node
    restart_plugin(cluster, "--partitions", "1,2")
    deadline = time.monotonic() + 30
    while node_slice_names(cluster) != [f"{node}-sharegpu.io", f"{node}-sharegpu.io-counters"]:
        assert time.monotonic() < deadline, (
            f"no partition slices: {node_slice_names(cluster)}\n{cluster.tail()}"
        )
        time.sleep(0.2)
    try:
        on_0 = 'device.attributes["sharegpu.io"].index == 0'
        half = on_0 + ' && device.attributes["sharegpu.io"].parts == 2'
        whole = on_0 + ' && device.attributes["sharegpu.io"].parts == 1'
        apply(
            cluster,
            claim_template("half-of-0", {}, selector=half),
            claim_template("all-of-0", {}, selector=whole),
        )
        refs = [running_claim_pod(cluster, name, "half-of-0") for name in ("half-a", "half-b")]
        for ref in refs:
            (limit,) = read_device_limits(tenants_dir(cluster.sim.runtime) / tenant_name(ref))
            assert (limit.mem_cap_bytes, limit.share_permille) == (4096 * MIB, 500)
        # GPU 0's counters are spent: neither a third half nor the whole GPU fits.
        apply(
            cluster,
            claim_pod("half-c", "half-of-0", "exec sleep 600"),
            claim_pod("whole", "all-of-0", "exec sleep 600"),
        )
        for name in ("half-c", "whole"):
            reasons = unschedulable(cluster, name)
        assert len(claim_tenants(cluster)) == 2
        delete_pod(cluster, "half-a")
        wait_phase(cluster, "half-c", ("Running",))  # the freed half, not the whole
        assert cluster.get("pod", "-n", APP_NS, "whole")["status"]["phase"] == "Pending"
        print(f"partition mode: two halves of GPU 0 run, the whole waits: {reasons[-1]}")
    finally:
        for name in ("half-a", "half-b", "half-c", "whole"):
            cluster.kubectl(
                "-n", APP_NS, "delete", "pod", name, "--ignore-not-found", "--wait", "--timeout", "60s"
            )
        restart_plugin(cluster)  # shared mode again: the counters slice goes
        deadline = time.monotonic() + 30
        while node_slice_names(cluster) != [f"{node}-sharegpu.io"]:
            assert time.monotonic() < deadline, f"still {node_slice_names(cluster)}\n{cluster.tail()}"
            time.sleep(0.2)
    assert claim_tenants(cluster) == []
