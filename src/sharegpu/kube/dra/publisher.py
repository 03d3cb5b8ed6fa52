"""Keeps the node's ResourceSlices (slices.py) in the API server: made when missing, replaced when
the GPUs changed, removed when no longer part of the pool (another mode, fewer GPUs), every
`check_s`.

They are checked and not only written once because others remove them too: the kubelet deletes
a driver's slices some time after the driver's plugin unregisters (a plugin restart), and an
operator may. The check lists the node's slices of this driver (one LIST) and writes only when
they differ from what the GPUs give, raising the pool's generation on every slice. They are
compared by a digest kept in an annotation: the API server writes quantities back in its own
form (8192Mi as 8Gi), so a slice it returns never equals the one sent. A failed read or write is
logged once per kind of failure and tried again at the next check: nothing is queued, so nothing
is lost. Stopping leaves the slices: the claims they placed stay valid while the plugin restarts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sharegpu.devices import Gpu, driver_version, list_gpus
from sharegpu.kube.apiclient import REQUEST_TIMEOUT_S, failure
from sharegpu.kube.dra.slices import DRIVER, node_slices

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

CHECK_S = 5.0
DIGEST = "sharegpu.io/slice-digest"
GROUP, VERSION, PLURAL = "resource.k8s.io", "v1", "resourceslices"


def slice_digest(body: dict[str, Any]) -> str:
    """Of what the plugin decides in a slice (its spec but the pool's generation)."""
    spec = {**body["spec"], "pool": {**body["spec"]["pool"], "generation": None}}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


class SlicePublisher:
    def __init__(
        self,
        node: str,
        api: ApiClient,
        list_gpus: Callable[[], list[Gpu]] = list_gpus,
        driver_version: Callable[[], str] = driver_version,
        *,
        partitions: Sequence[int] = (),
        check_s: float = CHECK_S,
    ):
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        self.node = node
        self.api = api
        self.objects = CustomObjectsApi(api)
        self.core = CoreV1Api(api)
        self.list_gpus = list_gpus
        self.driver_version = driver_version
        self.partitions = tuple(partitions)
        self.check_s = check_s
        self.writes = 0  # slices created, replaced or deleted
        self._said = ""
        self._stopping = threading.Event()

    def _current(self) -> dict[str, Any]:
        listed: Any = self.objects.list_cluster_custom_object(
            GROUP,
            VERSION,
            PLURAL,
            field_selector=f"spec.nodeName={self.node},spec.driver={DRIVER}",
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        return {s["metadata"]["name"]: s for s in listed["items"]}

    def sync(self) -> bool:
        """Make the slices what the GPUs are now; whether any was written."""
        gpus, version = self.list_gpus(), self.driver_version()
        current = self._current()
        wanted = node_slices(self.node, "", gpus, version, generation=0, partitions=self.partitions)
        digests = {s["metadata"]["name"]: slice_digest(s) for s in wanted}
        have = {n: s["metadata"].get("annotations", {}).get(DIGEST) for n, s in current.items()}
        if have == digests:
            return False
        node: Any = self.api.sanitize_for_serialization(
            self.core.read_node(self.node, _request_timeout=REQUEST_TIMEOUT_S)
        )
        generation = 1 + max(
            (int(s["spec"]["pool"].get("generation", 0)) for s in current.values()), default=0
        )
        for body in node_slices(
            self.node,
            str(node["metadata"]["uid"]),
            gpus,
            version,
            generation=generation,
            partitions=self.partitions,
        ):
            name = body["metadata"]["name"]
            body["metadata"]["annotations"] = {DIGEST: digests[name]}
            if name in current:
                body["metadata"]["resourceVersion"] = current[name]["metadata"]["resourceVersion"]
                self.objects.replace_cluster_custom_object(
                    GROUP, VERSION, PLURAL, name, body, _request_timeout=REQUEST_TIMEOUT_S
                )
            else:
                self.objects.create_cluster_custom_object(
                    GROUP, VERSION, PLURAL, body, _request_timeout=REQUEST_TIMEOUT_S
                )
            self.writes += 1
        for name in sorted(set(current) - set(digests)):
            self.objects.delete_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, _request_timeout=REQUEST_TIMEOUT_S
            )
            self.writes += 1
        log.info(
            "published node %s's ResourceSlices (generation %d): %s",
            self.node,
            generation,
            ", ".join(f"{g.index} {g.name}" for g in sorted(gpus, key=lambda g: g.index)) or "no GPU",
        )
        return True

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.sync()
                if self._said:
                    log.info("the ResourceSlices of node %s are published again", self.node)
                    self._said = ""
            except Exception as err:  # the API server's trouble, NVML's, or a bug: go on
                said = failure(err, self.api)
                if said != self._said:
                    log.warning(
                        "cannot publish node %s's ResourceSlices: %s (tried again every %gs)",
                        self.node,
                        said,
                        self.check_s,
                    )
                    self._said = said
            self._stopping.wait(self.check_s)

    def stop(self) -> None:
        self._stopping.set()
