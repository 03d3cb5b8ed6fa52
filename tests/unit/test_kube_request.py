"""What a pod asks of sharegpu, read from pods built and serialised by the `kubernetes` client
(the JSON an API server and the kube-scheduler send), and every way to write it wrong."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from sharegpu.kube.request import ContainerRequest, PodRequestError, pod_request

SERIALISE = client.ApiClient().sanitize_for_serialization


def pod(
    *containers: dict[str, Any],
    annotations: dict[str, str] | None = None,
    priority_class: str | None = None,
    init: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod as the API server sends it: each container given as {name: limits}."""
    specs = [
        client.V1Container(
            name=name, image="serve:1", resources=client.V1ResourceRequirements(limits=limits or None)
        )
        for c in containers
        for name, limits in c.items()
    ]
    inits = [
        client.V1Container(name=n, image="i:1", resources=client.V1ResourceRequirements(limits=lim))
        for n, lim in (init or {}).items()
    ]
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name="web-0", namespace="ml", uid="6f1c", annotations=annotations),
        spec=client.V1PodSpec(
            containers=specs, init_containers=inits or None, priority_class_name=priority_class
        ),
    )
    serialised: dict[str, Any] = SERIALISE(body)
    return serialised


def test_a_pod_asking_for_a_vgpu_reads_as_its_containers_requests() -> None:
    got = pod_request(
        pod(
            {
                "serve": {
                    "sharegpu.io/vgpu": "1",
                    "sharegpu.io/vgpu-memory": "4096",
                    "sharegpu.io/vgpu-compute": "30",
                }
            },
            {"sidecar": {"cpu": "100m"}},
            annotations={
                "sharegpu.io/priority": "online",
                "sharegpu.io/gpu-model": "NVIDIA H200, NVIDIA A100-SXM4-80GB",
            },
        )
    )
    assert got is not None
    assert got.key == "ml/web-0"
    assert got.containers == (ContainerRequest(name="serve", count=1, memory_mib=4096, compute_pct=30),)
    assert (got.priority, got.policy, got.vgpus) == ("online", "share", 1)
    assert got.models == {"NVIDIA H200", "NVIDIA A100-SXM4-80GB"}


@pytest.mark.parametrize(
    ("memory", "compute", "mib", "pct"),
    [("8k", "30", 8000, 30), ("16k", "1e1", 16000, 10), ("1e3", "100", 1000, 100), ("2000m", "50", 2, 50)],
)
def test_quantities_read_in_the_canonical_forms_the_api_server_gives_back(
    memory: str, compute: str, mib: int, pct: int
) -> None:
    """The API server keeps a user's `vgpu-memory: 8000` as "8k" (found against the real one:
    the extender refused it as not a whole number)."""
    got = pod_request(
        pod(
            {
                "s": {
                    "sharegpu.io/vgpu": "1",
                    "sharegpu.io/vgpu-memory": memory,
                    "sharegpu.io/vgpu-compute": compute,
                }
            }
        )
    )
    assert got is not None
    assert got.containers == (ContainerRequest(name="s", count=1, memory_mib=mib, compute_pct=pct),)


def test_defaults_are_a_whole_gpu_at_normal_priority() -> None:
    got = pod_request(pod({"train": {"sharegpu.io/vgpu": "2"}}))
    assert got is not None
    assert got.containers == (ContainerRequest(name="train", count=2, memory_mib=None, compute_pct=100),)
    assert (got.priority, got.policy, got.models) == ("normal", "share", frozenset())


def test_a_pod_without_vgpus_is_none_of_sharegpus_business() -> None:
    assert pod_request(pod({"web": {"cpu": "1", "nvidia.com/gpu": "1"}})) is None


def test_sharegpus_priority_classes_set_the_priority() -> None:
    got = pod_request(pod({"t": {"sharegpu.io/vgpu": "1"}}, priority_class="sharegpu-offline"))
    assert got is not None
    assert got.priority == "offline"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (
            pod({"s": {"sharegpu.io/vgpu": "1", "sharegpu.io/vgpu-compute": "150"}}),
            "must be 1 to 100 (percent of a GPU), not 150",
        ),
        (pod({"s": {"sharegpu.io/vgpu": "1", "sharegpu.io/vgpu-compute": "0"}}), "must be 1 to 100"),
        (
            pod({"s": {"sharegpu.io/vgpu": "1", "sharegpu.io/vgpu-memory": "4Gi"}}),
            "must be a whole number of MiB (4096 for 4 GiB), not '4Gi'",
        ),
        (
            pod({"s": {"sharegpu.io/vgpu": "1", "sharegpu.io/vgpu-memory": "1500m"}}),
            "must be a whole number of MiB (4096 for 4 GiB), not '1500m'",
        ),
        (pod({"s": {"sharegpu.io/vgpu": "1.5"}}), "sharegpu.io/vgpu must be a whole number, not '1.5'"),
        (pod({"s": {"sharegpu.io/vgpu": "0"}}), "sharegpu.io/vgpu must be 1 to 16, not 0"),
        (
            pod({"s": {"sharegpu.io/vgpu": "1", "sharegpu.io/vgpu-compute": "30"}}),
            "a shared vGPU needs its memory in MiB",
        ),
        (pod({"s": {"sharegpu.io/vgpu-memory": "4096"}}), "without sharegpu.io/vgpu (how many vGPUs)"),
        (pod({"s": {"sharegpu.io/vgpus": "1"}}), "unknown resource sharegpu.io/vgpus"),
        (
            pod({"s": {"sharegpu.io/vgpu": "1"}}, annotations={"sharegpu.io/priorty": "online"}),
            "unknown annotation sharegpu.io/priorty",
        ),
        (
            pod({"s": {"sharegpu.io/vgpu": "1"}}, annotations={"sharegpu.io/priority": "urgent"}),
            "must be one of online, normal, offline, not 'urgent'",
        ),
        (
            pod({"s": {"sharegpu.io/vgpu": "1"}}, annotations={"sharegpu.io/policy": "greedy"}),
            "must be one of share, cap, burst",
        ),
        (
            pod({"s": {"sharegpu.io/vgpu": "1"}}, annotations={"sharegpu.io/gpu-model": " , "}),
            "names no model",
        ),
        (
            pod(
                {"s": {"sharegpu.io/vgpu": "1"}},
                annotations={"sharegpu.io/priority": "online"},
                priority_class="sharegpu-offline",
            ),
            "online contradicts the pod's priority class sharegpu-offline (offline)",
        ),
        (
            pod({"s": {"cpu": "1"}}, annotations={"sharegpu.io/priority": "online"}),
            "asks for no sharegpu.io/vgpu",
        ),
        (
            pod({"s": {"sharegpu.io/vgpu": "1"}}, init={"setup": {"sharegpu.io/vgpu": "1"}}),
            "init containers cannot have vGPUs: setup",
        ),
    ],
)
def test_a_bad_request_is_refused_naming_the_pod_and_the_reason(body: dict[str, Any], reason: str) -> None:
    with pytest.raises(PodRequestError) as caught:
        pod_request(body)
    assert str(caught.value).startswith("pod ml/web-0: ")
    assert reason in str(caught.value)


def test_a_memory_quantity_in_kubernetes_units_is_one_problem_named_once() -> None:
    """Issue 36: `vgpu-memory: 4Gi` next to a compute share got two messages, the second saying
    the memory was missing."""
    body = pod(
        {"s": {"sharegpu.io/vgpu": "1", "sharegpu.io/vgpu-memory": "4Gi", "sharegpu.io/vgpu-compute": "30"}}
    )
    with pytest.raises(PodRequestError) as caught:
        pod_request(body)
    assert str(caught.value) == (
        "pod ml/web-0: container s: sharegpu.io/vgpu-memory must be a whole number of MiB (4096 for 4 GiB), "
        "not '4Gi'"
    )


def test_limits_and_requests_must_agree_and_every_problem_is_named_at_once() -> None:
    body = pod({"s": {"sharegpu.io/vgpu": "1", "sharegpu.io/vgpu-compute": "300"}})
    body["spec"]["containers"][0]["resources"]["requests"] = {"sharegpu.io/vgpu": "2"}
    body["metadata"]["annotations"] = {"sharegpu.io/policy": "fast"}
    with pytest.raises(PodRequestError) as caught:
        pod_request(body)
    message = str(caught.value)
    assert "sharegpu.io/vgpu differs between limits and requests" in message
    assert "must be 1 to 100" in message
    assert "sharegpu.io/policy must be one of" in message
