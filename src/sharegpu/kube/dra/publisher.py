"""Keeps the node's ResourceSlice (slices.py) in the API server: made when missing, replaced when
the GPUs changed, every `check_s`.

It is checked and not only written once because others remove it too: the kubelet deletes a
driver's slices some time after the driver's plugin unregisters (a plugin restart), and an
operator may. The check reads the slice (one GET) and writes only when the devices differ,
raising the pool's generation. The devices are compared by a digest kept in an annotation: the
API server writes quantities back in its own form (8192Mi as 8Gi), so the slice it returns never
equals the one sent. A failed read or write is logged once per kind of failure and tried again at
the next check: nothing is queued, so nothing is lost. Stopping leaves the slice: the claims it
placed stay valid while the plugin restarts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sharegpu.devices import Gpu, driver_version, list_gpus
from sharegpu.kube.apiclient import REQUEST_TIMEOUT_S, failure
from sharegpu.kube.dra.slices import devices_of, resource_slice, slice_name

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

CHECK_S = 5.0
DIGEST = "sharegpu.io/devices-digest"
GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceslices"


def devices_digest(devices: list[dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(devices, sort_keys=True).encode()).hexdigest()[:16]


class SlicePublisher:
    def __init__(
        self,
        node: str,
        api: ApiClient,
        list_gpus: Callable[[], list[Gpu]] = list_gpus,
        driver_version: Callable[[], str] = driver_version,
        *,
        check_s: float = CHECK_S,
    ):
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        self.node = node
        self.api = api
        self.objects = CustomObjectsApi(api)
        self.core = CoreV1Api(api)
        self.list_gpus = list_gpus
        self.driver_version = driver_version
        self.check_s = check_s
        self.writes = 0  # slices created or replaced
        self._said = ""
        self._stopping = threading.Event()

    def sync(self) -> bool:
        """Make the slice what the GPUs are now; whether it was written."""
        from kubernetes.client.exceptions import ApiException

        devices = devices_of(self.list_gpus(), self.driver_version())
        name = slice_name(self.node)
        try:
            current: Any = self.objects.get_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as err:
            if err.status != 404:
                raise
            current = None
        digest = devices_digest(devices)
        if current is not None and current["metadata"].get("annotations", {}).get(DIGEST) == digest:
            return False
        node = self.api.sanitize_for_serialization(
            self.core.read_node(self.node, _request_timeout=REQUEST_TIMEOUT_S)
        )
        node_uid = str(node["metadata"]["uid"])
        generation = 1 if current is None else int(current["spec"].get("pool", {}).get("generation", 0)) + 1
        body = resource_slice(self.node, node_uid, devices, generation=generation)
        body["metadata"]["annotations"] = {DIGEST: digest}
        if current is None:
            self.objects.create_cluster_custom_object(
                GROUP, VERSION, PLURAL, body, _request_timeout=REQUEST_TIMEOUT_S
            )
        else:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            self.objects.replace_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, body, _request_timeout=REQUEST_TIMEOUT_S
            )
        self.writes += 1
        log.info(
            "published ResourceSlice %s: %s",
            name,
            ", ".join(f"{d['name']} {d['capacity']['memory']['value']}" for d in devices) or "no GPU",
        )
        return True

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.sync()
                if self._said:
                    log.info("the ResourceSlice of node %s is published again", self.node)
                    self._said = ""
            except Exception as err:  # the API server's trouble, NVML's, or a bug: go on
                said = failure(err, self.api)
                if said != self._said:
                    log.warning(
                        "cannot publish node %s's ResourceSlice: %s (tried again every %gs)",
                        self.node,
                        said,
                        self.check_s,
                    )
                    self._said = said
            self._stopping.wait(self.check_s)

    def stop(self) -> None:
        self._stopping.set()
