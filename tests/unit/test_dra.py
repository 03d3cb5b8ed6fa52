"""sharegpu's DRA driver, its pure parts (kube/dra): the node's ResourceSlice built from its GPUs,
what an allocated ResourceClaim asks of the node (every way to write one wrong is a ClaimError in
one line that names the claim), the checkpoint of prepared claims, and the pod's user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.utils import parse_quantity

import sharegpu
from sharegpu.devices import Gpu
from sharegpu.errors import ConfigError, SharegpuError
from sharegpu.kube.dra.checkpoint import PREPARED, PREPARING, VERSION, Checkpoint, Entry
from sharegpu.kube.dra.claims import AllocatedDevice, ClaimError, ClaimPlan, ClaimRef, plan_claim
from sharegpu.kube.dra.prepare import pod_user
from sharegpu.kube.dra.slices import DRIVER, check_partitions, devices_of, node_slices, parts, resource_slice
from sharegpu.spec import GIB, MIB, ComputeSpec, validate_tenant_id

SERIALISE = client.ApiClient().sanitize_for_serialization

NODE = "node-a"
UID = "0f3c2a9e-1111-2222-3333-444455556666"
REF = ClaimRef("default", "serve-gpu", UID)
SHARE_0 = "5e0f9a7c-aaaa-bbbb-cccc-000000000000"
SHARE_1 = "5e0f9a7c-aaaa-bbbb-cccc-111111111111"


def gpu(index: int, memory: int = 80 * GIB) -> Gpu:
    return Gpu(index, f"GPU-{index:08d}-0000-0000-0000-000000000000", "NVIDIA H100", memory, 0, 0)


NODE_DEVICES = {p.name: p for p in parts([gpu(0), gpu(1)])}  # the shared mode's: two 80 GiB GPUs


# -- the ResourceSlice ---------------------------------------------------------------------------


def test_a_node_without_gpus_publishes_a_slice_with_no_devices_in_its_own_pool() -> None:
    assert devices_of([], "550.54.15") == []
    body = resource_slice(NODE, "node-uid-1", [], generation=1)
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["kind"] == "ResourceSlice"
    assert body["metadata"]["name"] == "node-a-sharegpu.io"
    assert body["spec"] == {
        "driver": "sharegpu.io",
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        "devices": [],
    }


def test_a_gpu_is_one_shareable_device_whose_memory_is_counted_in_whole_mebibytes() -> None:
    (device,) = devices_of([gpu(0, memory=80 * GIB + MIB // 2)], "550.54.15")
    assert device["name"] == "gpu-0"
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "memory": {
            "value": "81920Mi",
            "requestPolicy": {"default": "81920Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
        "compute": {
            "value": "100",
            "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
        },
    }
    # Each is a Kubernetes quantity, and a claim that names neither gets the whole GPU.
    memory, compute = device["capacity"]["memory"], device["capacity"]["compute"]
    assert parse_quantity(memory["value"]) == 80 * GIB
    assert memory["requestPolicy"]["default"] == memory["value"]
    assert compute["requestPolicy"]["default"] == compute["value"]
    assert device["attributes"] == {
        "model": {"string": "NVIDIA H100"},
        "uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"},
        "index": {"int": 0},
        "driverVersion": {"string": "550.54.15"},
        "sharegpuVersion": {"version": sharegpu.__version__},
        "parts": {"int": 1},
    }


def test_the_slice_lists_the_gpus_by_index_whatever_order_nvml_gave() -> None:
    devices = devices_of([gpu(1, memory=40 * GIB), gpu(0)], "550.54.15")
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    assert [d["attributes"]["uuid"]["string"] for d in devices] == [gpu(0).uuid, gpu(1).uuid]
    assert [d["capacity"]["memory"]["value"] for d in devices] == ["81920Mi", "40960Mi"]


def test_the_slice_is_owned_by_the_node_and_carries_the_pools_generation() -> None:
    devices = devices_of([gpu(0), gpu(1)], "550.54.15")
    body = resource_slice(NODE, "node-uid-1", devices, generation=7)
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1", "controller": True}
    ]
    assert body["spec"]["pool"] == {"name": NODE, "generation": 7, "resourceSliceCount": 1}
    assert body["spec"]["nodeName"] == NODE
    assert body["spec"]["driver"] == DRIVER
    assert body["spec"]["devices"] == devices


# -- the claim -----------------------------------------------------------------------------------


def result(
    device: str = "gpu-0",
    *,
    memory: str | None = "4Gi",
    compute: str | None = "30",
    request: str = "gpu",
    pool: str = NODE,
    driver: str = DRIVER,
    share: str | None = SHARE_0,
) -> client.V1DeviceRequestAllocationResult:
    consumed = {k: v for k, v in (("memory", memory), ("compute", compute)) if v is not None}
    return client.V1DeviceRequestAllocationResult(
        request=request,
        driver=driver,
        pool=pool,
        device=device,
        share_id=share,
        consumed_capacity=consumed or None,
    )


def config(
    source: str, requests: list[str] | None = None, driver: str = DRIVER, **parameters: Any
) -> client.V1DeviceAllocationConfiguration:
    params = {"apiVersion": "sharegpu.io/v1alpha1", "kind": "VgpuConfig", **parameters}
    return client.V1DeviceAllocationConfiguration(
        source=source,
        requests=requests,
        opaque=client.V1OpaqueDeviceConfiguration(driver=driver, parameters=params),
    )


def claim(
    *results: client.V1DeviceRequestAllocationResult,
    configs: tuple[client.V1DeviceAllocationConfiguration, ...] = (),
    pods: tuple[str, ...] = ("serve-0",),
    uid: str = UID,
) -> dict[str, Any]:
    """An allocated ResourceClaim as the API server sends it (one `results()` by default)."""
    body = client.ResourceV1ResourceClaim(
        api_version="resource.k8s.io/v1",
        kind="ResourceClaim",
        metadata=client.V1ObjectMeta(
            name=REF.name, namespace=REF.namespace, uid=uid, resource_version="4711"
        ),
        spec=client.V1ResourceClaimSpec(
            devices=client.V1DeviceClaim(
                requests=[
                    client.V1DeviceRequest(
                        name="gpu",
                        exactly=client.V1ExactDeviceRequest(
                            device_class_name="sharegpu.io",
                            capacity=client.V1CapacityRequirements(
                                requests={"memory": "4Gi", "compute": "30"}
                            ),
                        ),
                    )
                ]
            )
        ),
        status=client.V1ResourceClaimStatus(
            allocation=client.V1AllocationResult(
                devices=client.V1DeviceAllocationResult(
                    results=list(results or [result()]), config=list(configs) or None
                ),
                node_selector=client.V1NodeSelector(
                    node_selector_terms=[
                        client.V1NodeSelectorTerm(
                            match_fields=[
                                client.V1NodeSelectorRequirement(
                                    key="metadata.name", operator="In", values=[NODE]
                                )
                            ]
                        )
                    ]
                ),
            ),
            reserved_for=[
                client.V1ResourceClaimConsumerReference(resource="pods", name=pod, uid=f"pod-uid-{pod}")
                for pod in pods
            ]
            or None,
        ),
    )
    serialised: dict[str, Any] = SERIALISE(body)
    return serialised


def plan(body: dict[str, Any]) -> ClaimPlan:
    return plan_claim(body, REF, NODE, NODE_DEVICES)


def refused(body: dict[str, Any], *fragments: str) -> str:
    """The claim's ClaimError: one line that names the claim and says `fragments`."""
    with pytest.raises(ClaimError) as info:
        plan(body)
    message = str(info.value)
    assert isinstance(info.value, SharegpuError)
    assert "\n" not in message, message
    assert "default/serve-gpu" in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_an_allocated_claim_is_one_tenant_with_the_share_the_scheduler_gave_it() -> None:
    got = plan(claim())
    assert got.devices == (
        AllocatedDevice(
            request="gpu",
            pool=NODE,
            device="gpu-0",
            gpu_index=0,
            share_id=SHARE_0,
            memory_bytes=4 * GIB,
            compute_pct=30,
        ),
    )
    assert got.memory_bytes == 4 * GIB
    assert got.compute == ComputeSpec.parse(compute="30%")
    assert (got.compute.policy, got.compute.priority, got.compute.share_permille) == ("share", "normal", 300)
    assert got.pod == "serve-0"
    assert got.tenant == "claim-0f3c2a9e-serve-gpu"
    assert got.labels == {
        "namespace": "default",
        "claim": "serve-gpu",
        "claim_uid": UID,
        "pod": "serve-0",
    }


@pytest.mark.parametrize(
    ("memory", "compute", "memory_bytes", "share"),
    [
        (None, None, 80 * GIB, 1000),
        ("4Gi", None, 4 * GIB, 1000),
        (None, "30", 80 * GIB, 300),
    ],
    ids=["neither", "memory only", "compute only"],
)
def test_what_a_result_does_not_say_it_consumes_is_the_whole_gpu(
    memory: str | None, compute: str | None, memory_bytes: int, share: int
) -> None:
    body = claim(result(memory=memory, compute=compute))
    if memory is None and compute is None:
        assert "consumedCapacity" not in body["status"]["allocation"]["devices"]["results"][0]
    got = plan(body)
    assert got.memory_bytes == memory_bytes
    assert got.compute.share_permille == share


def test_a_claim_on_two_gpus_is_one_tenant_with_the_same_share_of_each() -> None:
    got = plan(claim(result("gpu-1", share=SHARE_1), result("gpu-0")))
    assert [(d.device, d.share_id, d.memory_bytes, d.compute_pct) for d in got.devices] == [
        ("gpu-1", SHARE_1, 4 * GIB, 30),
        ("gpu-0", SHARE_0, 4 * GIB, 30),
    ]
    assert got.memory_bytes == 4 * GIB


def test_only_this_drivers_results_are_the_tenants_gpus() -> None:
    got = plan(claim(result("nic-0", driver="nic.example.com", pool="fabric"), result("gpu-1")))
    assert [d.device for d in got.devices] == ["gpu-1"]


def test_a_result_without_a_share_id_is_answered_without_one() -> None:
    (device,) = plan(claim(result(share=None))).devices
    assert device.share_id is None


@pytest.mark.parametrize("pods", [(), ("serve-0", "serve-1")], ids=["reserved for none", "reserved for two"])
def test_a_claim_not_reserved_for_exactly_one_pod_has_no_pod_label(pods: tuple[str, ...]) -> None:
    got = plan(claim(pods=pods))
    assert got.pod is None
    assert "pod" not in got.labels


def test_a_claim_reserved_for_something_other_than_a_pod_has_no_pod_label() -> None:
    body = claim()
    body["status"]["reservedFor"] = [{"apiGroup": "batch", "resource": "jobs", "name": "train", "uid": "j1"}]
    assert plan(body).pod is None


def test_a_long_claim_name_with_dots_still_makes_a_valid_tenant_name() -> None:
    name = "serve.gpu." + "x" * 200
    ref = ClaimRef("default", name, UID)
    body = claim()
    body["metadata"]["name"] = name
    got = plan_claim(body, ref, NODE, NODE_DEVICES)
    assert len(got.tenant) <= 63
    assert got.tenant.startswith("claim-0f3c2a9e-serve.gpu.xxx")
    assert validate_tenant_id(got.tenant) == got.tenant


def test_a_claim_deleted_and_made_again_is_not_the_one_the_kubelet_asked_for() -> None:
    refused(claim(uid="99999999-0000-0000-0000-000000000000"), f"uid {UID}", "deleted and made again")


def test_a_claim_without_an_allocation_is_refused() -> None:
    body = claim()
    del body["status"]["allocation"]
    refused(body, "is not allocated")
    body["status"] = None
    refused(body, "is not allocated")


def test_a_claim_with_no_device_of_this_driver_is_refused() -> None:
    refused(claim(result(driver="gpu.nvidia.com")), "has no device of sharegpu.io")


def test_a_device_of_another_nodes_pool_is_refused() -> None:
    refused(claim(result(pool="node-b")), "device node-b/gpu-0 is not one of node node-a's", "gpu-0, gpu-1")


def test_a_device_this_node_does_not_have_is_refused() -> None:
    refused(claim(result("gpu-7")), "device node-a/gpu-7 is not one of node node-a's")
    with pytest.raises(ClaimError, match="it has no GPU"):
        plan_claim(claim(), REF, NODE, {})


@pytest.mark.parametrize(
    "memory", ["4097Ki", "1.5Mi", "81Gi", "0", "-1Gi"], ids=["KiB", "half MiB", "over", "zero", "negative"]
)
def test_memory_must_be_whole_mebibytes_within_the_gpu(memory: str) -> None:
    refused(claim(result(memory=memory)), f"memory {memory} on device gpu-0 must be whole MiB", "81920 MiB")


@pytest.mark.parametrize("compute", ["0", "101", "2.5", "500m"])
def test_compute_must_be_a_whole_percent_from_1_to_100(compute: str) -> None:
    refused(claim(result(compute=compute)), f"compute {compute} on device gpu-0 must be a whole percent")


@pytest.mark.parametrize(("key", "text"), [("memory", "lots"), ("compute", "30%")])
def test_a_consumed_capacity_that_is_no_quantity_is_refused(key: str, text: str) -> None:
    body = claim()
    body["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"][key] = text
    refused(body, f"its {key} {text!r} is not a quantity")


def test_a_consumed_capacity_this_driver_does_not_offer_is_refused() -> None:
    body = claim()
    body["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["bandwidth"] = "10"
    refused(body, "consumes bandwidth, which sharegpu.io does not offer")


def test_the_same_gpu_twice_in_one_claim_is_refused() -> None:
    refused(
        claim(result(request="a"), result(request="b", share=SHARE_1)),
        "has gpu-0, more than one share of one GPU",
        "distinctAttribute: sharegpu.io/uuid",
    )


def test_different_shares_of_two_gpus_are_refused() -> None:
    refused(
        claim(result("gpu-0"), result("gpu-1", memory="8Gi", share=SHARE_1)),
        "different shares (4096 MiB/30%, 8192 MiB/30%)",
    )
    refused(
        claim(result("gpu-0"), result("gpu-1", compute="50", share=SHARE_1)), "4096 MiB/30%, 4096 MiB/50%"
    )


def test_the_claims_configuration_wins_over_the_classes_key_by_key() -> None:
    configs = (  # the claim's first: the order of the list does not matter, the source does
        config("FromClaim", priority="online"),
        config("FromClass", priority="offline", policy="burst", ceiling=80),
    )
    got = plan(claim(configs=configs))
    assert (got.compute.priority, got.compute.policy) == ("online", "burst")
    assert (got.compute.share_permille, got.compute.ceiling_permille) == (300, 800)


def test_a_burst_claim_may_use_up_to_its_ceiling() -> None:
    got = plan(claim(configs=(config("FromClaim", policy="burst", ceiling="90"),)))
    assert got.compute == ComputeSpec.parse(compute="30%", policy="burst", ceiling="90%")
    assert got.compute.ceiling_permille == 900


def test_a_burst_claim_without_a_ceiling_may_use_the_whole_gpu() -> None:
    got = plan(claim(configs=(config("FromClass", policy="burst"),)))
    assert (got.compute.share_permille, got.compute.ceiling_permille) == (300, 1000)


def test_a_cap_claim_is_capped_at_its_share() -> None:
    got = plan(claim(configs=(config("FromClaim", requests=["gpu"], policy="cap", priority="online"),)))
    assert (got.compute.policy, got.compute.priority) == ("cap", "online")
    assert got.compute.ceiling_permille == 300


def test_configuration_for_other_requests_or_drivers_is_ignored() -> None:
    configs = (
        config("FromClaim", requests=["nic"], priority="nonsense", frobnicate=1),
        config("FromClass", driver="gpu.nvidia.com", sharing="time-slicing"),
        config("FromClaim", requests=["gpu", "nic"], priority="offline"),
    )
    got = plan(claim(configs=configs))
    assert got.compute.priority == "offline"


def test_configuration_for_a_main_request_applies_to_its_subrequests() -> None:
    got = plan(
        claim(
            result(request="gpu/small"), configs=(config("FromClaim", requests=["gpu"], priority="online"),)
        )
    )
    assert got.compute.priority == "online"


@pytest.mark.parametrize(
    ("parameters", "fragments"),
    [
        ({"apiVersion": "sharegpu.io/v1"}, ("must be apiVersion sharegpu.io/v1alpha1, kind VgpuConfig",)),
        ({"kind": "GpuConfig"}, ("not 'sharegpu.io/v1alpha1', 'GpuConfig'",)),
        ({"memory": "1Gi"}, ("unknown VgpuConfig key memory", "known: priority, policy, ceiling")),
        ({"priority": "urgent"}, ("invalid priority 'urgent'",)),
        ({"policy": "fair"}, ("policy 'fair' is not one a claim may have (share, cap, burst)",)),
        ({"ceiling": "80"}, ("burst only",)),
        ({"policy": "burst", "ceiling": 20}, ("below the guarantee",)),
        ({"policy": "burst", "ceiling": 120}, ("ceiling",)),
    ],
    ids=["apiVersion", "kind", "unknown key", "priority", "policy", "ceiling without burst", "low", "high"],
)
def test_a_wrong_configuration_is_refused(parameters: dict[str, Any], fragments: tuple[str, ...]) -> None:
    source = "FromClass" if "kind" in parameters else "FromClaim"
    entry = config(source)
    entry.opaque.parameters.update(parameters)
    refused(claim(configs=(entry,)), *fragments)


def test_a_configuration_without_parameters_is_refused() -> None:
    body = claim(configs=(config("FromClaim"),))
    body["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"] = "priority=online"
    refused(body, "has no parameters object")


def test_a_huge_memory_quantity_is_refused_as_over_the_gpu() -> None:
    refused(claim(result(memory="1e40")), "must be whole MiB")


# -- the checkpoint ------------------------------------------------------------------------------


def answer(device: str = "gpu-0") -> dict[str, Any]:
    return {
        "request_names": ["gpu"],
        "pool_name": NODE,
        "device_name": device,
        "cdi_device_ids": ["sharegpu.io/vgpu=claim-0f3c2a9e-serve-gpu"],
        "share_id": SHARE_0,
    }


def test_the_checkpoint_keeps_the_claims_across_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state" / "dra-checkpoint.json"
    first = Checkpoint(path)
    assert first.entries == {}
    assert not path.exists()  # nothing written until there is something to keep
    first.put(UID, Entry("default", "serve-gpu", "claim-0f3c2a9e-serve-gpu", PREPARING))
    first.put(UID, Entry("default", "serve-gpu", "claim-0f3c2a9e-serve-gpu", PREPARED, [answer()]))
    first.put("uid-2", Entry("team-b", "train", "claim-uid-2-train", PREPARING))
    first.put("uid-3", Entry("team-b", "eval", "claim-uid-3-eval", PREPARED, [answer("gpu-1")]))
    first.drop("uid-2")
    first.drop("never-there")

    again = Checkpoint(path)
    assert again.entries == {
        UID: Entry("default", "serve-gpu", "claim-0f3c2a9e-serve-gpu", PREPARED, [answer()]),
        "uid-3": Entry("team-b", "eval", "claim-uid-3-eval", PREPARED, [answer("gpu-1")]),
    }
    assert again.get(UID) == first.get(UID)
    assert again.get("uid-2") is None
    again.drop(UID)
    assert list(Checkpoint(path).entries) == ["uid-3"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["dra-checkpoint.json"]  # no temporary file


def test_the_checkpoint_file_is_json_of_version_1_keyed_by_claim_uid(tmp_path: Path) -> None:
    path = tmp_path / "dra-checkpoint.json"
    Checkpoint(path).put(UID, Entry("default", "serve-gpu", "claim-0f3c2a9e-serve-gpu", PREPARED, [answer()]))
    data = json.loads(path.read_text())
    assert VERSION == 1
    assert data == {
        "version": 1,
        "claims": {
            UID: {
                "namespace": "default",
                "name": "serve-gpu",
                "tenant": "claim-0f3c2a9e-serve-gpu",
                "state": "prepared",
                "devices": [answer()],
            }
        },
    }


@pytest.mark.parametrize(
    "text",
    [
        "",
        '{"version": 1, "claims": {',
        "[]",
        '{"version": 2, "claims": {}}',
        '{"claims": {}}',
        '{"version": 1}',
        '{"version": 1, "claims": []}',
        '{"version": 1, "claims": {"u": {"name": "x"}}}',
        '{"version": 1, "claims": {"u": {"namespace": "a", "name": "b", "tenant": "c", "state": "d", '
        '"x": 1}}}',
    ],
    ids=[
        "empty",
        "cut",
        "not an object",
        "version 2",
        "no version",
        "no claims",
        "claims a list",
        "entry lacks fields",
        "entry has unknown field",
    ],
)
def test_a_checkpoint_this_plugin_did_not_write_is_an_error_not_an_empty_one(
    tmp_path: Path, text: str
) -> None:
    path = tmp_path / "dra-checkpoint.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        Checkpoint(path)
    assert str(path) in str(info.value)
    assert "is not one this plugin wrote" in str(info.value)
    assert path.read_text() == text  # left as it was, for a person to look at


def test_a_checkpoint_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dra-checkpoint.json"
    path.mkdir()
    with pytest.raises(ConfigError, match="cannot read the DRA checkpoint"):
        Checkpoint(path)


def test_a_checkpoint_of_binary_garbage_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "dra-checkpoint.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError):
        Checkpoint(path)


# -- the pod's user ------------------------------------------------------------------------------


def pod(run_as: int | None = None, *containers: int | None) -> dict[str, Any]:
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name="serve-0", namespace="default"),
        spec=client.V1PodSpec(
            security_context=client.V1PodSecurityContext(run_as_user=run_as) if run_as is not None else None,
            containers=[
                client.V1Container(
                    name=f"c{i}",
                    image="serve:1",
                    security_context=client.V1SecurityContext(run_as_user=uid) if uid is not None else None,
                )
                for i, uid in enumerate(containers or (None,))
            ],
        ),
    )
    serialised: dict[str, Any] = SERIALISE(body)
    return serialised


@pytest.mark.parametrize(
    ("body", "user"),
    [
        (pod(1000), 1000),
        (pod(0), 0),
        (pod(1000, None, None), 1000),
        (pod(None, 2000, 2000), 2000),
        (pod(None, 2000, None), 2000),
        (pod(None, 2000, 3000), None),
        (pod(None), None),
        (pod(None, None, None), None),
        ({}, None),
    ],
    ids=[
        "pod level",
        "pod level root",
        "pod level, containers silent",
        "containers agree",
        "the only container that says",
        "containers disagree",
        "nobody says",
        "no container says",
        "no spec",
    ],
)
def test_the_pods_user_is_the_one_its_containers_run_as(body: dict[str, Any], user: int | None) -> None:
    assert pod_user(body) == user


def test_a_containers_own_user_overrides_the_pods() -> None:
    assert pod_user(pod(1000, 2000, 2000)) == 2000
    assert pod_user(pod(1000, 2000, None)) is None


def test_a_ceiling_may_be_written_with_its_percent_sign() -> None:
    got = plan(claim(configs=(config("FromClaim", policy="burst", ceiling="80%"),)))
    assert got.compute == ComputeSpec.parse(compute="30%", policy="burst", ceiling="80%")


def test_policy_native_is_refused_a_claims_compute_is_always_enforced() -> None:
    with pytest.raises(ClaimError, match=r"default/serve-gpu: policy 'native' is not one a claim may have"):
        plan(claim(configs=(config("FromClaim", policy="native"),)))


def test_a_ceiling_without_burst_is_refused_in_the_claims_words() -> None:
    with pytest.raises(ClaimError, match=r"ceiling applies to policy burst only \(this is cap\)"):
        plan(claim(configs=(config("FromClaim", policy="cap", ceiling="50"),)))


# -- the partition mode ----------------------------------------------------------------------------


def test_in_partition_mode_each_gpu_is_offered_whole_and_in_parts_that_consume_its_counters() -> None:
    slices = node_slices(
        NODE,
        "node-uid-1",
        [gpu(1), gpu(0, memory=80 * GIB + 3 * MIB)],
        "580.1",
        generation=4,
        partitions=(1, 2),
    )
    devices_slice, counters_slice = slices
    assert [s["metadata"]["name"] for s in slices] == [f"{NODE}-sharegpu.io", f"{NODE}-sharegpu.io-counters"]
    for s in slices:
        assert s["spec"]["pool"] == {"name": NODE, "generation": 4, "resourceSliceCount": 2}
        assert s["spec"]["nodeName"] == NODE
    assert "devices" not in counters_slice["spec"]
    assert "sharedCounters" not in devices_slice["spec"]
    assert counters_slice["spec"]["sharedCounters"] == [
        {"name": "gpu-0", "counters": {"memory": {"value": "81923Mi"}, "compute": {"value": "100"}}},
        {"name": "gpu-1", "counters": {"memory": {"value": "81920Mi"}, "compute": {"value": "100"}}},
    ]
    by_name = {d["name"]: d for d in devices_slice["spec"]["devices"]}
    assert list(by_name) == [
        "gpu-0",
        "gpu-0-part0-of2",
        "gpu-0-part1-of2",
        "gpu-1",
        "gpu-1-part0-of2",
        "gpu-1-part1-of2",
    ]
    half = by_name["gpu-0-part1-of2"]
    assert "allowMultipleAllocations" not in half  # a part is one claim's
    assert half["capacity"] == {"memory": {"value": "40961Mi"}, "compute": {"value": "50"}}
    assert half["consumesCounters"] == [{"counterSet": "gpu-0", "counters": half["capacity"]}]
    assert half["attributes"]["parts"] == {"int": 2}
    assert by_name["gpu-1"]["attributes"]["parts"] == {"int": 1}
    assert by_name["gpu-1"]["capacity"]["compute"] == {"value": "100"}


def test_partitions_beyond_a_slices_limits_are_spread_over_more_slices() -> None:
    gpus = [gpu(i) for i in range(9)]
    slices = node_slices(NODE, "u", gpus, "580.1", generation=1, partitions=(1, 2, 4, 8))
    devices = [s["spec"]["devices"] for s in slices if "devices" in s["spec"]]
    counters = [s["spec"]["sharedCounters"] for s in slices if "sharedCounters" in s["spec"]]
    assert [len(d) for d in devices] == [64, 64, 7]  # 9 GPUs x 15 devices; 64 a slice at most
    assert [len(c) for c in counters] == [8, 1]  # 8 counter sets a slice at most
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {5}
    assert len({s["metadata"]["name"] for s in slices}) == 5


@pytest.mark.parametrize("partitions", [(0,), (17,), (2, 2)])
def test_partitions_the_slices_cannot_carry_are_refused(partitions: tuple[int, ...]) -> None:
    with pytest.raises(SharegpuError, match="each a different number of parts from 1 to 16"):
        check_partitions(partitions)


PARTITIONED = {p.name: p for p in parts([gpu(0), gpu(1)], (1, 4))}


def test_a_claim_of_a_partition_is_its_whole_size() -> None:
    got = plan_claim(
        claim(result("gpu-1-part2-of4", memory=None, compute=None, share=None)), REF, NODE, PARTITIONED
    )
    (device,) = got.devices
    assert (device.gpu_index, device.memory_bytes, device.compute_pct) == (1, 20 * GIB, 25)
    assert got.compute.share_permille == 250


def test_two_parts_of_one_gpu_in_one_claim_are_refused() -> None:
    body = claim(
        result("gpu-0-part0-of4", memory=None, compute=None, share=None, request="a"),
        result("gpu-0-part1-of4", memory=None, compute=None, share=None, request="b"),
    )
    with pytest.raises(ClaimError, match="more than one share of one GPU"):
        plan_claim(body, REF, NODE, PARTITIONED)


def test_more_compute_than_the_partition_has_is_refused() -> None:
    with pytest.raises(ClaimError, match="must be a whole percent from 1 to 25"):
        plan_claim(
            claim(result("gpu-0-part0-of4", memory=None, compute="50", share=None)), REF, NODE, PARTITIONED
        )
