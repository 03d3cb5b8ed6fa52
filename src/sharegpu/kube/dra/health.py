"""The health of the node's DRA devices, streamed to the kubelet (health.proto,
`v1.DRAResourceHealth`), which shows it in the status of each pod whose claims use them
(`status.containerStatuses[].allocatedResourcesStatus`: `Healthy`, `Unhealthy`, `Unknown`).

Health is what NVML says of each GPU, for every device it is published as (slices.py): a GPU that
answers is healthy; one that NVML counts but cannot query (fallen off the bus, failing) is
unhealthy, with NVML's words; a GPU reported before that NVML no longer counts at all is
unhealthy too ("no longer counted"); and when NVML itself does not answer, every device reported
before is unknown, with the reason. The stream sends every device at once, again whenever that
changes, and at least every `resend_s` (the kubelet takes a device it has heard nothing of for
`timeout_s` as unknown).

It is served as `v1.DRAResourceHealth` (the kubelet of 1.37 asks for it) and as
`v1alpha1.DRAResourceHealth` (that of 1.36): the two versions' messages are the same on the
wire, so one handler serves both (`add_to_server`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from sharegpu.devices import GpuListing, scan_gpus
from sharegpu.errors import SharegpuError
from sharegpu.kube.dra import health_pb2 as pb
from sharegpu.kube.dra import health_pb2_grpc as pb_grpc
from sharegpu.kube.dra.slices import DRIVER, device_names

log = logging.getLogger(__name__)

CHECK_S = 5.0
RESEND_S = 10.0
TIMEOUT_S = 30  # health_check_timeout_seconds: three reports missed
MESSAGE_MAX = 1024  # the kubelet truncates longer messages
SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")  # as the kubelet names them

Status = pb.HealthStatus
Health = dict[str, tuple[Status, str]]  # device name: (its status, why)


def device_health(listing: GpuListing | SharegpuError, partitions: Sequence[int], before: Health) -> Health:
    """Each device's health, from one scan of the GPUs (or the error NVML gave instead), given
    what was reported `before`."""
    if isinstance(listing, SharegpuError):
        return dict.fromkeys(before, (pb.UNKNOWN, f"NVML does not answer: {listing}"[:MESSAGE_MAX]))
    health: Health = {}
    for gpu in listing.gpus:
        health.update((name, (pb.HEALTHY, "")) for name, _ in device_names(gpu.index, partitions))
    for fault in listing.faults:
        said = fault.describe()[:MESSAGE_MAX]
        health.update((name, (pb.UNHEALTHY, said)) for name, _ in device_names(fault.index, partitions))
    for name in before.keys() - health.keys():
        health[name] = (pb.UNHEALTHY, f"{name}: its GPU is no longer counted by NVML")
    return health


def response(pool: str, health: Health, now: float) -> pb.NodeWatchResourcesResponse:
    return pb.NodeWatchResourcesResponse(
        devices=[
            pb.DeviceHealth(
                device=pb.DeviceIdentifier(pool_name=pool, device_name=name),
                health=status,
                last_updated_time=int(now),
                health_check_timeout_seconds=TIMEOUT_S,
                message=message,
            )
            for name, (status, message) in sorted(health.items())
        ]
    )


class HealthService:
    """`v1.DRAResourceHealth` for the devices of pool `pool` (the node)."""

    def __init__(
        self,
        pool: str,
        partitions: Sequence[int] = (),
        scan: Callable[[], GpuListing] = scan_gpus,
        *,
        check_s: float = CHECK_S,
        resend_s: float = RESEND_S,
    ):
        self.pool = pool
        self.partitions = tuple(partitions)
        self.scan = scan
        self.check_s = check_s
        self.resend_s = resend_s

    def _health(self, before: Health) -> Health:
        try:
            listing: GpuListing | SharegpuError = self.scan()
        except SharegpuError as err:
            listing = err
        return device_health(listing, self.partitions, before)

    def NodeWatchResources(
        self, request: pb.NodeWatchResourcesRequest, context: Any
    ) -> Iterator[pb.NodeWatchResourcesResponse]:
        ended = threading.Event()
        context.add_callback(ended.set)  # the kubelet went, or the server stops
        last: Health = {}
        sent = float("-inf")
        log.info("the kubelet watches the health of %s's devices", DRIVER)
        while not ended.is_set():
            health = self._health(last)
            now = time.monotonic()
            if health != last or now - sent >= self.resend_s:
                if health != last:
                    changed = {n: h for n, h in health.items() if last.get(n) != h}
                    log.info(
                        "device health: %s", ", ".join(f"{n} {_word(h)}" for n, h in sorted(changed.items()))
                    )
                yield response(self.pool, health, time.time())
                last, sent = health, now
            ended.wait(self.check_s)


def _word(health: tuple[Status, str]) -> str:
    status, message = health
    word = pb.HealthStatus.Name(status).lower()
    return f"{word} ({message})" if message else word


def add_to_server(service: HealthService, server: Any) -> None:
    """Serve `service` as each version of SERVICES (its gRPC name is the version's)."""
    pb_grpc.add_DRAResourceHealthServicer_to_server(service, server)
    for name in SERVICES[1:]:
        handler = grpc.unary_stream_rpc_method_handler(
            service.NodeWatchResources,
            request_deserializer=pb.NodeWatchResourcesRequest.FromString,
            response_serializer=pb.NodeWatchResourcesResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(name, {"NodeWatchResources": handler}),)
        )
