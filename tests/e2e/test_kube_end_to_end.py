"""What a Kubernetes user gets, end to end without a cluster: the node component (the device
plugin command, on the simulated GPU) publishes the node's GPUs to an API server (the local
stand-in, through the real `kubernetes` client); the extender follows it, places an online
inference pod and an offline training pod with sharegpu's placement and binds them; the kubelet
(the fake one, over the real gRPC API) allocates their containers; each gets the tenant of its
assignment on the shared card, and a program in it sees its vGPU; a deleted pod's tenant goes."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from apiserver_standin import ApiServerStandIn
from conftest import Sim, wait_for
from kubeletutil import FakeKubelet
from kubeobjects import pod
from sharegpu.kube.bindings import ApiBinder
from sharegpu.kube.deviceplugin.allocate import tenant_name
from sharegpu.kube.extender import Extender
from sharegpu.kube.extender.sync import ClusterSync
from sharegpu.kube.request import ANNOTATION_ALLOCATED
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import read_device_limits, tenant_path

NODE = "gpu-node-1"


@pytest.fixture
def cluster(sim_factory: Callable[..., Sim]) -> Iterator[tuple[Sim, ApiServerStandIn, FakeKubelet]]:
    """One GPU node: a simulated card of 8 GiB, its Node in the API server, its kubelet, and the
    device plugin command running against both."""
    sim = sim_factory(gpus=1, memory_mib=8192)
    kubelet_dir = Path(tempfile.mkdtemp(prefix="e2e-", dir="/tmp"))  # a short socket path
    kubelet = FakeKubelet(kubelet_dir)
    with ApiServerStandIn() as api:
        api.create(
            "nodes",
            {
                "metadata": {"name": NODE},
                "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}},
            },
        )
        env = sim.env(SHAREGPU_NO_AGENT="1", KUBECONFIG=str(api.kubeconfig(sim.root / "kubeconfig")))
        env.pop("KUBERNETES_SERVICE_HOST", None)
        args = ["--node", NODE, "--kubelet-dir", str(kubelet_dir), "--cdi-spec", "none"]
        args += ["--publish-interval", "0.5", "--check-interval", "0.2"]
        log = sim.root / "plugin.log"
        with log.open("w") as out:
            plugin = subprocess.Popen(
                [sys.executable, "-m", "sharegpu.kube.deviceplugin", *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            yield sim, api, kubelet
        finally:
            plugin.send_signal(signal.SIGTERM)
            try:
                plugin.wait(timeout=30)
            finally:
                plugin.kill()
                kubelet.stop()
                shutil.rmtree(kubelet_dir, ignore_errors=True)
        assert plugin.returncode == 0, log.read_text()


def schedule(extender: Extender, the_pod: dict[str, Any]) -> str:
    """The kube-scheduler's cycle for one pod (node names only: nodeCacheCapable)."""
    kept = extender.filter({"Pod": the_pod, "Nodes": None, "NodeNames": [NODE]})
    assert kept["NodeNames"] == [NODE], kept
    (score,) = extender.prioritize({"Pod": the_pod, "Nodes": None, "NodeNames": [NODE]})
    meta = the_pod["metadata"]
    args = {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": score["Host"],
    }
    return str(extender.bind(args)["Error"])


def test_an_online_and_an_offline_pod_share_one_card_each_with_its_vgpu(
    cluster: tuple[Sim, ApiServerStandIn, FakeKubelet],
) -> None:
    sim, api, kubelet = cluster
    with api.api_client() as api_client:
        extender = Extender(ApiBinder(api_client, "sharegpu-system", "e2e"), clock=time.time)
        sync = ClusterSync(extender, api_client)
        sync.start()
        try:
            # The node component's inventory reaches the extender through its watch.
            wait_for(lambda: extender.state is not None and NODE in extender.state.index, "the node's GPUs")
            inference = api.create("pods", pod("inference", memory=2048, compute=30, priority="online"))
            training = api.create("pods", pod("training", memory=4096, compute=60, priority="offline"))
            assert schedule(extender, inference) == ""
            assert schedule(extender, training) == ""
            # A third that does not fit what is left says why, and is not bound.
            big = api.create("pods", pod("big", memory=4096, compute=20))
            refused = extender.filter({"Pod": big, "Nodes": None, "NodeNames": [NODE]})
            assert "no room now" in refused["FailedNodes"][NODE]

            # The kubelet allocates each pod's container as it starts them, in bind order.
            plugin = kubelet.plugin(kubelet.registration())
            watch = plugin.watch()
            devices = [d for d, _ in watch.next()]
            watch.cancel()
            answers = [plugin.allocate([devices[k]]).container_responses[0] for k in range(2)]
            plugin.close()
            uuid = sim.uuids()[0]
            for the_pod, answer, (memory, share, priority) in (
                (inference, answers[0], (2048, 300, abi.PRIORITY_ONLINE)),
                (training, answers[1], (4096, 600, abi.PRIORITY_OFFLINE)),
            ):
                name = tenant_name(the_pod["metadata"]["uid"], "serve")
                assert [d.name for d in answer.cdi_devices] == [f"sharegpu.io/vgpu={name}"]
                path = tenant_path(name, sim.runtime)
                (limit,) = read_device_limits(path)
                assert (limit.uuid, limit.mem_cap_bytes, limit.share_permille, limit.priority) == (
                    uuid,
                    memory * MIB,
                    share,
                    priority,
                )
                stored = api.get("pods", "ml", the_pod["metadata"]["name"])
                assert stored is not None
                assert stored["spec"]["nodeName"] == NODE
                assert stored["metadata"]["annotations"][ANNOTATION_ALLOCATED] == "serve"
                # A CUDA program in the container sees its vGPU, not the card.
                seen = sim.probe("meminfo", env=sim.tenant_env(path))
                assert int(seen["total"]) == memory * MIB

            # The inference pod goes: its tenant goes, and the extender frees its room.
            inference_tenant = tenant_path(tenant_name(inference["metadata"]["uid"], "serve"), sim.runtime)
            client.CoreV1Api(api_client).delete_namespaced_pod("inference", "ml")
            wait_for(lambda: not inference_tenant.exists(), "the deleted pod's tenant removed")
            wait_for(
                lambda: (
                    extender.filter({"Pod": big, "Nodes": None, "NodeNames": [NODE]})["NodeNames"] == [NODE]
                ),
                "room for the third pod",
            )
        finally:
            sync.stop()
