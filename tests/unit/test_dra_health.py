"""The DRA devices' health (kube/dra/health.py): what each scan of the GPUs makes of every
published device, and the stream the kubelet reads, with a fake clock of scans."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sharegpu.devices import Gpu, GpuFault, GpuListing
from sharegpu.errors import DeviceError
from sharegpu.kube.dra import health_pb2 as pb
from sharegpu.kube.dra.health import RESEND_S, TIMEOUT_S, HealthService, device_health
from sharegpu.spec import GIB

LOST = GpuFault(1, "GPU is lost")


def gpu(index: int) -> Gpu:
    return Gpu(index, f"GPU-{index:08d}-0000-0000-0000-000000000000", "NVIDIA H100", 80 * GIB, 0, 0)


def test_answering_gpus_are_healthy_and_a_lost_one_unhealthy_with_nvmls_words() -> None:
    health = device_health(GpuListing([gpu(0)], [LOST]), (), {})
    assert health == {
        "gpu-0": (pb.HEALTHY, ""),
        "gpu-1": (pb.UNHEALTHY, "GPU 1: NVML cannot query it (GPU is lost)"),
    }


def test_in_partition_mode_every_part_of_a_gpu_has_its_health() -> None:
    health = device_health(GpuListing([gpu(0)], [LOST]), (1, 2), {})
    assert sorted(health) == [
        "gpu-0",
        "gpu-0-part0-of2",
        "gpu-0-part1-of2",
        "gpu-1",
        "gpu-1-part0-of2",
        "gpu-1-part1-of2",
    ]
    assert {name: status for name, (status, _) in health.items() if status != pb.HEALTHY} == {
        "gpu-1": pb.UNHEALTHY,
        "gpu-1-part0-of2": pb.UNHEALTHY,
        "gpu-1-part1-of2": pb.UNHEALTHY,
    }


def test_a_gpu_nvml_no_longer_counts_stays_unhealthy() -> None:
    before = device_health(GpuListing([gpu(0), gpu(1)], []), (), {})
    after = device_health(GpuListing([gpu(0)], []), (), before)
    assert after == {
        "gpu-0": (pb.HEALTHY, ""),
        "gpu-1": (pb.UNHEALTHY, "gpu-1: its GPU is no longer counted by NVML"),
    }
    assert device_health(GpuListing([gpu(0)], []), (), after) == after


def test_when_nvml_does_not_answer_every_device_reported_is_unknown() -> None:
    before = device_health(GpuListing([gpu(0), gpu(1)], []), (), {})
    health = device_health(DeviceError("NVML is not available: driver gone"), (), before)
    said = "NVML does not answer: NVML is not available: driver gone"
    assert health == {"gpu-0": (pb.UNKNOWN, said), "gpu-1": (pb.UNKNOWN, said)}
    assert device_health(DeviceError("gone"), (), {}) == {}  # nothing reported yet: nothing to say


class Stream:
    """The gRPC side of one NodeWatchResources call: its callbacks, and the end the kubelet or
    the server makes."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def add_callback(self, callback: Callable[[], None]) -> bool:
        self.callbacks.append(callback)
        return True

    def end(self) -> None:
        for callback in self.callbacks:
            callback()


def watch(scans: list[GpuListing | Exception], **kwargs: Any) -> list[dict[str, tuple[str, int]]]:
    """The reports a stream sends over `scans` (one per check), then the stream ended."""
    stream = Stream()
    left = list(scans)

    def scan() -> GpuListing:
        got = left.pop(0)
        if not left:
            stream.end()  # the kubelet goes after the last scan
        if isinstance(got, Exception):
            raise got
        return got

    service = HealthService("node-a", scan=scan, check_s=0, **kwargs)
    reports = []
    for response in service.NodeWatchResources(pb.NodeWatchResourcesRequest(), stream):
        reports.append(
            {
                f"{d.device.pool_name}/{d.device.device_name}": (
                    pb.HealthStatus.Name(d.health),
                    d.health_check_timeout_seconds,
                )
                for d in response.devices
            }
        )
    return reports


def test_the_stream_reports_at_once_then_only_changes_and_ends_with_its_call() -> None:
    both, one_lost = GpuListing([gpu(0), gpu(1)], []), GpuListing([gpu(0)], [LOST])
    reports = watch([both, both, one_lost, one_lost, both], resend_s=3600)
    healthy = {"node-a/gpu-0": ("HEALTHY", TIMEOUT_S), "node-a/gpu-1": ("HEALTHY", TIMEOUT_S)}
    assert reports == [
        healthy,
        {"node-a/gpu-0": ("HEALTHY", TIMEOUT_S), "node-a/gpu-1": ("UNHEALTHY", TIMEOUT_S)},
        healthy,
    ]


def test_the_stream_reports_again_before_the_kubelet_would_take_silence_for_unknown() -> None:
    both = GpuListing([gpu(0), gpu(1)], [])
    assert len(watch([both] * 4, resend_s=0)) == 4  # unchanged, yet sent at every check
    assert 3 * RESEND_S <= TIMEOUT_S  # three reports may be missed before the kubelet says unknown


def test_nvml_failing_in_the_middle_of_the_stream_is_reported_unknown_not_raised() -> None:
    both = GpuListing([gpu(0), gpu(1)], [])
    reports = watch([both, DeviceError("NVML is not available"), both], resend_s=3600)
    assert [sorted({s for s, _ in r.values()}) for r in reports] == [["HEALTHY"], ["UNKNOWN"], ["HEALTHY"]]
