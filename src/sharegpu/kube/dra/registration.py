"""Serving the DRA plugin and registering it with the kubelet's plugin watcher.

The kubelet watches `<kubelet dir>/plugins_registry` for sockets. The plugin serves
`Registration` on `sharegpu.io-reg.sock` there and `v1.DRAPlugin` (with `DRAResourceHealth`,
health.py) on `<kubelet dir>/plugins/sharegpu.io/dra.sock`, both from one gRPC server; the kubelet
asks the first for its PluginInfo (type DRAPlugin, the driver's name, the second socket, the
services it serves) and says whether it took it. A restarted kubelet finds the sockets again by
itself; a socket removed or replaced under the plugin (another copy of it, a cleanup) is found
every `check_s` and served again.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from sharegpu.kube.dra import dra_pb2_grpc as dra_grpc
from sharegpu.kube.dra import registration_pb2 as reg
from sharegpu.kube.dra import registration_pb2_grpc as reg_grpc
from sharegpu.kube.dra.health import SERVICES as HEALTH_SERVICES
from sharegpu.kube.dra.health import HealthService
from sharegpu.kube.dra.health import add_to_server as serve_health
from sharegpu.kube.dra.service import DraService
from sharegpu.kube.dra.slices import DRIVER
from sharegpu.kube.serving import inode

log = logging.getLogger(__name__)

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet")
PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICE = "v1.DRAPlugin"


class RegistrationService:
    def __init__(self, endpoint: Path, services: tuple[str, ...] = (DRA_SERVICE,)):
        self.endpoint = endpoint
        self.services = services
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.endpoint), supported_versions=self.services
        )

    def NotifyRegistrationStatus(
        self, status: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        if status.plugin_registered:
            log.info("the kubelet registered DRA driver %s (%s)", DRIVER, self.endpoint)
            self.error = ""
            self.registered.set()
        else:
            self.error = status.error
            self.registered.clear()
            log.error("the kubelet refused DRA driver %s: %s", DRIVER, status.error)
        return reg.RegistrationStatusResponse()


class PluginServer:
    def __init__(
        self,
        service: DraService,
        kubelet_dir: Path = DEFAULT_KUBELET_DIR,
        *,
        health: HealthService | None = None,
        check_s: float = 1.0,
    ):
        self.service = service
        self.health = health
        self.kubelet_dir = kubelet_dir
        self.check_s = check_s
        services = (DRA_SERVICE,) if health is None else (DRA_SERVICE, *HEALTH_SERVICES)
        self.registration = RegistrationService(self.dra_socket, services)
        self.stopping = threading.Event()
        self.serves = 0  # how many times the sockets were served

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.kubelet_dir / "plugins" / DRIVER / "dra.sock"

    def _serve(self) -> Any:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        dra_grpc.add_DRAPluginServicer_to_server(self.service, server)
        if self.health is not None:
            serve_health(self.health, server)
        reg_grpc.add_RegistrationServicer_to_server(self.registration, server)
        for socket in (self.dra_socket, self.registration_socket):
            socket.parent.mkdir(parents=True, exist_ok=True)
            socket.unlink(missing_ok=True)  # left by an earlier run
            server.add_insecure_port(f"unix://{socket}")
        server.start()
        self.serves += 1
        log.info(
            "serving DRA driver %s on %s (registration %s)", DRIVER, self.dra_socket, self.registration_socket
        )
        return server

    def run(self) -> None:
        """Serve until stop(), again whenever a socket is removed or replaced."""
        while not self.stopping.is_set():
            server = self._serve()
            inodes = (inode(self.dra_socket), inode(self.registration_socket))
            while not self.stopping.wait(self.check_s):
                if (inode(self.dra_socket), inode(self.registration_socket)) != inodes:
                    log.warning("a plugin socket was removed or replaced: serving again")
                    break
            server.stop(grace=2).wait()
        for socket in (self.dra_socket, self.registration_socket):
            socket.unlink(missing_ok=True)  # the kubelet unregisters a plugin whose socket goes

    def stop(self) -> None:
        self.stopping.set()
