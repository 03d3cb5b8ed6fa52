"""Serving the plugin's socket and registering it with the kubelet, again after every kubelet
restart.

The kubelet serves Registration on `<dir>/kubelet.sock` (dir: /var/lib/kubelet/device-plugins)
and, when it starts, deletes every other socket in that directory: a plugin must then serve a
new socket and register again. `Registrar.run()` serves `<dir>/sharegpu.sock`, registers, and
every `check_s` looks whether its socket is gone or kubelet.sock is a new file (another inode);
either way it stops serving and starts again. A kubelet that does not answer yet is asked again
every `check_s`.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from sharegpu.kube.deviceplugin import api_pb2 as api
from sharegpu.kube.deviceplugin import api_pb2_grpc as api_grpc
from sharegpu.kube.deviceplugin.service import DevicePluginService
from sharegpu.kube.serving import inode

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEFAULT_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"
ENDPOINT = "sharegpu.sock"
REGISTER_TIMEOUT_S = 5.0


def register(kubelet_dir: Path, endpoint: str, resource: str, options: api.DevicePluginOptions) -> None:
    """One Register call; grpc.RpcError when the kubelet refuses or does not answer."""
    request = api.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource, options=options
    )
    with grpc.insecure_channel(f"unix://{kubelet_dir / KUBELET_SOCKET}") as channel:
        api_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)


class Registrar:
    def __init__(
        self,
        service: DevicePluginService,
        resource: str,
        kubelet_dir: Path = DEFAULT_DIR,
        *,
        endpoint: str = ENDPOINT,
        check_s: float = 1.0,
    ):
        self.service = service
        self.resource = resource
        self.kubelet_dir = kubelet_dir
        self.endpoint = endpoint
        self.check_s = check_s
        self.stopping = threading.Event()
        self.registrations = 0

    @property
    def socket(self) -> Path:
        return self.kubelet_dir / self.endpoint

    def _serve(self) -> Any:
        self.socket.unlink(missing_ok=True)  # a socket left by an earlier run
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        return server

    def _session(self) -> None:
        """Serve and register until the kubelet restarts (or stop())."""
        kubelet_inode = inode(self.kubelet_dir / KUBELET_SOCKET)
        server = self._serve()
        try:
            register(self.kubelet_dir, self.endpoint, self.resource, self.service.options())
            self.registrations += 1
            log.info("registered %s with the kubelet at %s", self.resource, self.kubelet_dir / KUBELET_SOCKET)
            while not self.stopping.wait(self.check_s):
                if not self.socket.exists():
                    log.info("the kubelet removed %s: it restarted; registering again", self.socket)
                    return
                if inode(self.kubelet_dir / KUBELET_SOCKET) != kubelet_inode:
                    log.info("%s is a new socket: the kubelet restarted; registering again", KUBELET_SOCKET)
                    return
        except grpc.RpcError as err:
            log.warning("cannot register with the kubelet (%s): %s", err.code(), err.details())
            self.stopping.wait(self.check_s)
        finally:
            server.stop(grace=None)

    def run(self) -> None:
        health = threading.Thread(target=self.service.poll_health, name="health", daemon=True)
        self.service.inventory.poll()
        health.start()
        try:
            while not self.stopping.is_set():
                self._session()
        finally:
            self.service.stop()
            self.socket.unlink(missing_ok=True)

    def stop(self) -> None:
        self.stopping.set()
