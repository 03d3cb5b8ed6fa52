"""The DRA plugin's health stream as the kubelet reaches it (kube/dra/health.py): the plugin's own
gRPC server on its sockets, the versions it names at registration, and the stream under each
version's name (the kubelet of 1.37 asks for v1, that of 1.36 for v1alpha1), with the messages
each version's kubelet decodes."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sharegpu.devices import Gpu, GpuFault, GpuListing
from sharegpu.kube.dra import health_pb2 as pb
from sharegpu.kube.dra import registration_pb2 as reg
from sharegpu.kube.dra import registration_pb2_grpc as reg_grpc
from sharegpu.kube.dra.health import HealthService
from sharegpu.kube.dra.registration import PluginServer
from sharegpu.kube.dra.service import DraService
from sharegpu.spec import GIB


def gpu(index: int) -> Gpu:
    return Gpu(index, f"GPU-{index:08d}-0000-0000-0000-000000000000", "NVIDIA H100", 80 * GIB, 0, 0)


@pytest.fixture
def plugin() -> Iterator[PluginServer]:
    """The plugin's server on a kubelet directory of its own; GPU 1 lost."""
    kubelet = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # a short socket path
    health = HealthService("node-a", scan=lambda: GpuListing([gpu(0)], [GpuFault(1, "GPU is lost")]))
    no_claims = DraService(None)  # type: ignore[arg-type]  # (nothing is prepared here)
    server = PluginServer(no_claims, kubelet, health=health, check_s=0.1)
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        # Both sockets: gRPC binds them one after the other, and a test may dial either first.
        while not (server.dra_socket.is_socket() and server.registration_socket.is_socket()):
            assert thread.is_alive()
            threading.Event().wait(0.05)
        yield server
    finally:
        server.stop()
        thread.join(10)
        shutil.rmtree(kubelet)
    assert not thread.is_alive()


def test_registration_names_the_health_service_in_both_versions(plugin: PluginServer) -> None:
    with grpc.insecure_channel(f"unix://{plugin.registration_socket}") as channel:
        info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=5)
    assert list(info.supported_versions) == [
        "v1.DRAPlugin",
        "v1.DRAResourceHealth",
        "v1alpha1.DRAResourceHealth",
    ]


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_the_stream_answers_under_each_versions_name_with_every_device(
    plugin: PluginServer, version: str
) -> None:
    with grpc.insecure_channel(f"unix://{plugin.dra_socket}") as channel:
        watch = channel.unary_stream(
            f"/{version}.DRAResourceHealth/NodeWatchResources",
            request_serializer=pb.NodeWatchResourcesRequest.SerializeToString,
            response_deserializer=pb.NodeWatchResourcesResponse.FromString,
        )
        stream = watch(pb.NodeWatchResourcesRequest(), timeout=10)
        first = next(stream)
        stream.cancel()  # as the kubelet's context ends: the server's side ends with it
    got = {(d.device.pool_name, d.device.device_name): (d.health, d.message) for d in first.devices}
    assert got == {
        ("node-a", "gpu-0"): (pb.HEALTHY, ""),
        ("node-a", "gpu-1"): (pb.UNHEALTHY, "GPU 1: NVML cannot query it (GPU is lost)"),
    }
    assert all(d.last_updated_time > 0 and d.health_check_timeout_seconds == 30 for d in first.devices)
