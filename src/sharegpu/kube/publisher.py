"""The node's GPUs on its Node object, for the scheduler extender and for operators.

`InventoryPublisher` writes, with one JSON merge patch of the Node's metadata:

- the annotation `sharegpu.io/inventory` (kube/inventory.py: each GPU's index, UUID, model and
  memory, and `published_at`), which the extender places pods by. `published_at` is also the
  extender's sign that this node's component is alive, so it is written again every interval
  even when nothing changed; an inventory older than STALE_AFTER_S stops placements here;
- the labels `sharegpu.io/gpu-model` (NVML's model name made a label value: characters other
  than letters, digits, `-`, `_` and `.` become `-`, at most 63; several models joined by `_`;
  no label without a GPU) and `sharegpu.io/gpu-count`, for node selectors and `kubectl get -L`.

The patch has no resourceVersion precondition: the component owns these keys, and a merge patch
leaves every other annotation and label as it is.

NVML is read every `check_s`: a change of the GPUs is published at once, not at the next
interval. A GPU that NVML cannot query (fallen off the bus) is left out of `devices.list_gpus`
and so of the inventory. When the listing fails as a whole (NVML's count or a session itself
fails), each GPU of the last good listing is asked on its own (`probe`, a query of that GPU
only) and the ones that answer are published, as last listed.

A failed patch (API server down, 5xx, RBAC) is logged and tried again at the next interval,
with the GPUs of then: nothing is queued, so nothing is lost. Stopping leaves the annotation:
a component that restarts should not make the node's pods unschedulable meanwhile, and one that
is gone for good is found out by the inventory's age.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sharegpu.devices import Gpu, gpu_processes, list_gpus
from sharegpu.errors import DeviceError
from sharegpu.kube.apiclient import REQUEST_TIMEOUT_S, failure
from sharegpu.kube.inventory import ANNOTATION_INVENTORY, PUBLISH_INTERVAL_S, Inventory, InventoryGpu
from sharegpu.kube.request import PREFIX
from sharegpu.spec import MIB

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

log = logging.getLogger(__name__)

LABEL_GPU_MODEL = PREFIX + "gpu-model"
LABEL_GPU_COUNT = PREFIX + "gpu-count"
CHECK_S = 5.0  # how often NVML is read between publications (the device plugin's health poll)
MERGE_PATCH = "application/merge-patch+json"

_NOT_IN_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")
_UNTRIMMED = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_MAX_LABEL = 63


class NodeNotFound(Exception):
    """The API server has no Node of the name given (a wrong --node)."""


def label_value(text: str) -> str:
    """`text` as a Kubernetes label value: letters, digits, `-`, `_`, `.`, at most 63, beginning
    and ending with a letter or digit ("" when nothing is left)."""
    return _UNTRIMMED.sub("", _NOT_IN_LABEL.sub("-", text)[:_MAX_LABEL])


def inventory_gpus(gpus: Sequence[Gpu]) -> tuple[InventoryGpu, ...]:
    return tuple(
        InventoryGpu(index=g.index, uuid=g.uuid, model=g.name, memory_mib=g.memory_total // MIB)
        for g in sorted(gpus, key=lambda g: g.index)
    )


def node_patch(inventory: Inventory) -> dict[str, Any]:
    """The merge patch of the Node's metadata that publishes `inventory` (a null label is
    removed)."""
    model = label_value("_".join(sorted({g.model for g in inventory.gpus})))
    return {
        "metadata": {
            "annotations": {ANNOTATION_INVENTORY: inventory.to_annotation()},
            "labels": {LABEL_GPU_MODEL: model or None, LABEL_GPU_COUNT: str(len(inventory.gpus))},
        }
    }


class InventoryPublisher:
    """Publishes the node's GPUs until `stop()`; `run()` is the loop, for a thread of its own."""

    def __init__(
        self,
        node: str,
        api: CoreV1Api,
        list_gpus: Callable[[], list[Gpu]] = list_gpus,
        clock: Callable[[], float] = time.time,
        interval_s: float = PUBLISH_INTERVAL_S,
        *,
        check_s: float = CHECK_S,
        probe: Callable[[str], object] = gpu_processes,
    ):
        if interval_s <= 0 or check_s <= 0:
            raise ValueError(
                f"the publish interval and NVML check must be positive ({interval_s}, {check_s})"
            )
        self.node = node
        self.api = api
        self.list_gpus = list_gpus
        self.clock = clock
        self.interval_s = interval_s
        self.check_s = min(check_s, interval_s)
        self.probe = probe
        self.published: Inventory | None = None  # the last inventory the API server took
        self.failures = 0  # publications failed in a row
        self._listed: list[Gpu] = []  # the last full listing: the GPUs a failed one is checked for
        self._said = ""  # the last NVML failure logged (said once, not at every check)
        self._stopping = threading.Event()

    def gpus(self) -> list[Gpu]:
        """The GPUs that answer NVML now."""
        try:
            self._listed = self.list_gpus()
        except DeviceError as err:
            answering = [g for g in self._listed if self._answers(g)]
            said = (
                f"NVML's listing failed ({err}): publishing the GPUs that answer on their own: "
                f"{', '.join(str(g.index) for g in answering) or 'none'} of "
                f"{', '.join(str(g.index) for g in self._listed) or 'none known'}"
            )
            if said != self._said:
                log.warning("%s", said)
                self._said = said
            return answering
        if self._said:
            log.info("NVML lists the GPUs again")
            self._said = ""
        return list(self._listed)

    def _answers(self, gpu: Gpu) -> bool:
        try:
            self.probe(gpu.uuid)
        except DeviceError:
            return False
        return True

    def publish(self, gpus: Sequence[Gpu]) -> Inventory:
        """Write the inventory of `gpus` now. NodeNotFound for a node the API server does not
        have; the `kubernetes` client's errors otherwise."""
        from kubernetes.client.exceptions import ApiException

        inventory = Inventory(gpus=inventory_gpus(gpus), published_at=self.clock())
        try:
            self.api.patch_node(
                self.node,
                node_patch(inventory),
                _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as err:
            if err.status == 404:
                raise NodeNotFound(f"node {self.node} not found in the API server: is --node right?") from err
            raise
        self.published = inventory
        return inventory

    def run(self) -> None:
        tried: tuple[InventoryGpu, ...] | None = None  # the GPUs of the last attempt
        due = 0.0  # time.monotonic() of the next publication whatever happens
        while not self._stopping.is_set():
            try:
                gpus = self.gpus()
                now = time.monotonic()
                if inventory_gpus(gpus) != tried or now >= due:
                    tried, due = inventory_gpus(gpus), now + self.interval_s
                    self._attempt(gpus)
            except Exception:  # a bug, or a GPU NVML describes oddly: the loop must go on
                log.exception("publishing the GPU inventory of node %s failed", self.node)
                due = time.monotonic() + self.interval_s
            self._stopping.wait(max(0.0, min(self.check_s, due - time.monotonic())))

    def _attempt(self, gpus: Sequence[Gpu]) -> None:
        before = self.published
        try:
            inventory = self.publish(gpus)
        except NodeNotFound as err:
            self.failures += 1
            log.error("cannot publish the GPU inventory: %s (tried again in %gs)", err, self.interval_s)
            return
        except Exception as err:  # the API server's trouble: the next interval tries again
            self.failures += 1
            log.warning(
                "cannot publish the GPU inventory of node %s: %s (tried again in %gs)",
                self.node,
                failure(err, self.api.api_client),
                self.interval_s,
            )
            return
        if self.failures:
            log.info(
                "published node %s's GPU inventory again, after %d failed tries", self.node, self.failures
            )
            self.failures = 0
        if before is None or before.gpus != inventory.gpus:
            log.info(
                "published node %s's GPUs: %s",
                self.node,
                ", ".join(f"{g.index} {g.model} {g.memory_mib} MiB" for g in inventory.gpus) or "none",
            )

    def stop(self) -> None:
        """End `run()` at once (the annotation stays: see the module's docstring)."""
        self._stopping.set()
