"""The devices the plugin advertises, and their health.

A vGPU is not a fixed thing the kubelet could count, so each GPU is advertised as SLOTS_PER_GPU
device IDs `<GPU uuid>::<n>`: the kubelet's count of `sharegpu.io/vgpu` per node is then at most
that many containers' vGPUs per GPU. Which GPU a container really gets is the assignment's
choice (matching.py), not the ID the kubelet picked.

Health is NVML's word, polled: a GPU that NVML stops listing or cannot query (fallen off the
bus: `devices.list_gpus` leaves it out), or every GPU when NVML itself fails, has its devices
Unhealthy (the kubelet stops counting them); a GPU that comes back is Healthy again. A GPU once
seen stays listed, so the kubelet sees it go Unhealthy, not vanish.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sharegpu.devices import Gpu
from sharegpu.errors import DeviceError

SLOTS_PER_GPU = 16
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
_SEP = "::"

log = logging.getLogger(__name__)


def device_id(uuid: str, slot: int) -> str:
    return f"{uuid}{_SEP}{slot}"


def gpu_of(device: str) -> str:
    """The GPU uuid of a device ID; ValueError for an ID that is not one of ours."""
    uuid, sep, slot = device.rpartition(_SEP)
    if not sep or not uuid or not slot.isdigit():
        raise ValueError(f"{device!r} is not a sharegpu device ID (<GPU uuid>::<n>)")
    return uuid


@dataclass(frozen=True)
class DeviceState:
    id: str
    health: str


class Inventory:
    """The GPUs seen so far, in NVML order, and whether each is healthy now; `poll()` reads
    NVML through `list_gpus` (injectable) and says whether anything changed."""

    def __init__(self, list_gpus: Callable[[], list[Gpu]], slots_per_gpu: int = SLOTS_PER_GPU):
        if not 1 <= slots_per_gpu <= 1000:
            raise ValueError(f"slots per GPU must be 1 to 1000, not {slots_per_gpu}")
        self._list_gpus = list_gpus
        self.slots_per_gpu = slots_per_gpu
        self._lock = threading.Lock()
        self._order: list[str] = []  # uuids, first seen first
        self._index: dict[str, int] = {}  # the NVML index a GPU last had
        self._healthy: dict[str, bool] = {}
        self.version = 0  # bumped at every change

    def poll(self) -> bool:
        try:
            gpus: list[Gpu] | None = self._list_gpus()
        except DeviceError as err:
            gpus = None
            log.warning("NVML query failed, every GPU's devices are Unhealthy: %s", err)
        with self._lock:
            before = dict(self._healthy)
            if gpus is None:
                self._healthy = dict.fromkeys(self._healthy, False)
            else:
                seen = {g.uuid for g in gpus}
                for gpu in gpus:
                    if gpu.uuid not in self._index:
                        self._order.append(gpu.uuid)
                    self._index[gpu.uuid] = gpu.index
                self._healthy = {u: u in seen for u in self._order}
            changed = self._healthy != before
            if changed:
                self.version += 1
                for uuid in self._order:
                    if before.get(uuid) != self._healthy[uuid]:
                        log.info("GPU %s: %s", uuid, HEALTHY if self._healthy[uuid] else UNHEALTHY)
            return changed

    def devices(self) -> list[DeviceState]:
        with self._lock:
            order = sorted(self._order, key=lambda u: (self._index[u], u))
            return [
                DeviceState(device_id(u, n), HEALTHY if self._healthy[u] else UNHEALTHY)
                for u in order
                for n in range(self.slots_per_gpu)
            ]

    def gpu_index(self, uuid: str) -> int | None:
        with self._lock:
            return self._index.get(uuid)
