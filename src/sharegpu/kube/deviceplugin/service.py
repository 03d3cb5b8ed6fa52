"""The DevicePlugin gRPC service the kubelet calls (api.proto), over Inventory and Allocator.

Every failure is one gRPC error whose message is the reason (the kubelet puts it in the pod's
events): FAILED_PRECONDITION for sharegpu's own errors (no pod to allocate for, a refused
tenant, an unreadable assignment), INTERNAL for anything else.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import grpc

from sharegpu.errors import SharegpuError
from sharegpu.kube.deviceplugin import api_pb2 as api
from sharegpu.kube.deviceplugin.allocate import Allocator
from sharegpu.kube.deviceplugin.slots import HEALTHY, Inventory, gpu_of

log = logging.getLogger(__name__)
WATCH_CHECK_S = 0.5  # how often a ListAndWatch stream checks that its kubelet is still there


def _fail(context: Any, err: BaseException) -> None:
    if isinstance(err, SharegpuError):
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"sharegpu: {err}")
    log.exception("unexpected failure")
    context.abort(grpc.StatusCode.INTERNAL, f"sharegpu: {type(err).__name__}: {err}")


class DevicePluginService:
    """The handlers of v1beta1.DevicePlugin; `poll_health` runs in a thread of its own."""

    def __init__(self, inventory: Inventory, allocator: Allocator, *, health_interval_s: float = 5.0):
        self.inventory = inventory
        self.allocator = allocator
        self.health_interval_s = health_interval_s
        self._changed = threading.Condition()
        self.stopping = threading.Event()

    def options(self) -> api.DevicePluginOptions:
        return api.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def poll_health(self) -> None:
        while not self.stopping.is_set():
            if self.inventory.poll():
                with self._changed:
                    self._changed.notify_all()
            self.stopping.wait(self.health_interval_s)

    def stop(self) -> None:
        self.stopping.set()
        with self._changed:
            self._changed.notify_all()

    # -- the RPCs (names as in api.proto) ------------------------------------------------------

    def GetDevicePluginOptions(self, request: api.Empty, context: Any) -> api.DevicePluginOptions:
        return self.options()

    def ListAndWatch(self, request: api.Empty, context: Any) -> Iterator[api.ListAndWatchResponse]:
        sent = -1
        while not self.stopping.is_set() and context.is_active():
            with self._changed:
                version = self.inventory.version
                if version == sent:
                    self._changed.wait(WATCH_CHECK_S)
                    continue
            devices = [api.Device(ID=d.id, health=d.health) for d in self.inventory.devices()]
            sent = version
            yield api.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(
        self, request: api.PreferredAllocationRequest, context: Any
    ) -> api.PreferredAllocationResponse:
        try:
            answers = [self._prefer(r) for r in request.container_requests]
        except Exception as err:
            _fail(context, err)
        return api.PreferredAllocationResponse(
            container_responses=[api.ContainerPreferredAllocationResponse(deviceIDs=a) for a in answers]
        )

    def Allocate(self, request: api.AllocateRequest, context: Any) -> api.AllocateResponse:
        try:
            for r in request.container_requests:
                for device in r.devices_ids:
                    gpu_of(device)  # an ID that is not ours is the kubelet's mistake: say so
        except ValueError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"sharegpu: {err}")
        try:
            responses = self.allocator.allocate([len(r.devices_ids) for r in request.container_requests])
        except Exception as err:
            _fail(context, err)
        return api.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: api.PreStartContainerRequest, context: Any
    ) -> api.PreStartContainerResponse:
        return api.PreStartContainerResponse()

    # -- preference -----------------------------------------------------------------------------

    def _prefer(self, request: api.ContainerPreferredAllocationRequest) -> list[str]:
        """The devices the kubelet must include, then one on each GPU the pending assignment
        names, then packed onto the fewest GPUs (the GPUs with the most available first)."""
        size = request.allocation_size
        chosen = list(request.must_include_deviceIDs)[:size]
        by_gpu: dict[str, list[str]] = defaultdict(list)
        healthy = {d.id for d in self.inventory.devices() if d.health == HEALTHY}
        for device in request.available_deviceIDs:
            if device not in chosen and device in healthy:
                by_gpu[gpu_of(device)].append(device)
        assigned = self.allocator.peek(size)
        for gpu in assigned.gpus if assigned is not None else ():
            if len(chosen) < size and by_gpu.get(gpu.uuid):
                chosen.append(by_gpu[gpu.uuid].pop(0))
        for uuid in sorted(by_gpu, key=lambda u: (-len(by_gpu[u]), self.inventory.gpu_index(u) or 0, u)):
            while len(chosen) < size and by_gpu[uuid]:
                chosen.append(by_gpu[uuid].pop(0))
        return chosen
