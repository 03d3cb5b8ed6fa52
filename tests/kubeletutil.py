"""A fake kubelet for device plugin tests: the Registration service on `<dir>/kubelet.sock`,
recording each registration, and a client of the plugin's DevicePlugin service.

`restart()` does what a kubelet does when it starts again: every socket in the directory goes
(the plugin's too) and kubelet.sock is served anew (a new file).
"""

from __future__ import annotations

import queue
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from sharegpu.kube.deviceplugin import api_pb2 as api
from sharegpu.kube.deviceplugin import api_pb2_grpc as api_grpc


class FakeKubelet:
    def __init__(self, directory: Path):
        self.dir = directory
        self.registrations: queue.Queue[api.RegisterRequest] = queue.Queue()
        self._server: Any = None
        self.start()

    def Register(self, request: api.RegisterRequest, context: Any) -> api.Empty:
        self.registrations.put(request)
        return api.Empty()

    def start(self) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_grpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.dir / 'kubelet.sock'}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def restart(self) -> None:
        self.stop()
        for path in self.dir.iterdir():
            if path.is_socket():
                path.unlink()
        self.start()

    def registration(self, timeout: float = 30) -> api.RegisterRequest:
        return self.registrations.get(timeout=timeout)

    def plugin(self, request: api.RegisterRequest) -> PluginClient:
        return PluginClient(self.dir / request.endpoint)


class Watch:
    """A ListAndWatch stream read in a thread: each list the plugin sends, in order."""

    def __init__(self, stream: Any):
        self.stream = stream
        self.lists: queue.Queue[list[tuple[str, str]]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self.stream:
                self.lists.put([(d.ID, d.health) for d in response.devices])
        except grpc.RpcError:
            pass  # cancelled, or the plugin went

    def next(self, timeout: float = 30) -> list[tuple[str, str]]:
        return self.lists.get(timeout=timeout)

    def until(self, check: Any, timeout: float = 30) -> list[tuple[str, str]]:
        """The first list (from now on) that passes `check`."""
        while True:
            found = self.next(timeout)
            if check(found):
                return found

    def cancel(self) -> None:
        self.stream.cancel()


class PluginClient:
    def __init__(self, socket: Path):
        self.channel = grpc.insecure_channel(f"unix://{socket}")
        self.stub = api_grpc.DevicePluginStub(self.channel)

    def options(self) -> api.DevicePluginOptions:
        return self.stub.GetDevicePluginOptions(api.Empty(), timeout=10)

    def watch(self) -> Watch:
        return Watch(self.stub.ListAndWatch(api.Empty()))

    def preferred(self, available: list[str], size: int, must: list[str] | None = None) -> list[str]:
        request = api.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must or [], allocation_size=size
        )
        answer = self.stub.GetPreferredAllocation(
            api.PreferredAllocationRequest(container_requests=[request]), timeout=30
        )
        return list(answer.container_responses[0].deviceIDs)

    def allocate(self, *containers: list[str]) -> api.AllocateResponse:
        requests = [api.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
        return self.stub.Allocate(api.AllocateRequest(container_requests=requests), timeout=60)

    def close(self) -> None:
        self.channel.close()
