"""The extender's state kept in step with the API server: every node (its inventory) and every
pod that holds GPUs (its assignment), listed once and then watched.

After a start, a change of leader or a watch the API server ended with 410 Gone (the
resourceVersion it resumed from is too old), the kind is listed again and the extender's state
rebuilt from it (`Extender.resync`), so a restarted extender knows exactly what the pods on the
cluster hold. Until the first lists are in, `Extender.synced` is false and the replica is not
ready. With this running, the kube-scheduler need not send node objects: the extender is
node-cache capable (`nodeCacheCapable: true` sends names only, a far smaller request).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sharegpu.kube.apiclient import REQUEST_TIMEOUT_S
from sharegpu.kube.extender.core import Extender

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300  # the API server ends a watch after this; it is resumed where it was
RETRY_S = 2.0  # after an API server that could not be reached


class ClusterSync:
    def __init__(
        self, extender: Extender, api_client: Any, *, watch_timeout_s: int = WATCH_TIMEOUT_S
    ) -> None:
        from kubernetes import client

        self.extender = extender
        self._api = api_client
        self._core = client.CoreV1Api(api_client)
        self.watch_timeout_s = watch_timeout_s
        self._stop = threading.Event()
        self._watches: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []
        self.relists = {"nodes": 0, "pods": 0}  # how often each was listed whole (after 410s)

    # -- one kind each ---------------------------------------------------------------------

    def _list_nodes(self) -> str:
        found: Any = self._core.list_node()
        self.extender.resync(nodes=[self._api.sanitize_for_serialization(n) for n in found.items])
        self.relists["nodes"] += 1
        return str(found.metadata.resource_version)

    def _list_pods(self) -> str:
        found: Any = self._core.list_pod_for_all_namespaces()
        self.extender.resync(pods=[self._api.sanitize_for_serialization(p) for p in found.items])
        self.relists["pods"] += 1
        return str(found.metadata.resource_version)

    def _on_node(self, kind: str, node: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.extender.forget_node(str((node.get("metadata") or {}).get("name", "")))
        else:
            self.extender.learn([node])

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.extender.forget(str((pod.get("metadata") or {}).get("uid", "")))
        else:
            self.extender.observe(pod)  # also frees what a pod that finished held

    # -- the loops -----------------------------------------------------------------------------

    def start(self) -> None:
        """List both kinds (raising if the API server cannot be read), then watch each in a thread."""
        versions = {"nodes": self._list_nodes(), "pods": self._list_pods()}
        self.extender.synced = True
        for kind, lister, method, handle in (
            ("nodes", self._list_nodes, self._core.list_node, self._on_node),
            ("pods", self._list_pods, self._core.list_pod_for_all_namespaces, self._on_pod),
        ):
            thread = threading.Thread(
                target=self._follow,
                args=(versions[kind], lister, method, handle),
                name=f"watch-{kind}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def _follow(
        self,
        version: str,
        lister: Callable[[], str],
        method: Callable[..., Any],
        handle: Callable[[str, dict[str, Any]], None],
    ) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        while not self._stop.is_set():
            try:
                if not version:
                    version = lister()
                w = watch.Watch()
                self._watches[method.__name__] = w  # the current one of its kind, for stop()
                for event in w.stream(method, resource_version=version, timeout_seconds=self.watch_timeout_s):
                    raw = event.get("raw_object") or {}
                    if event.get("type") == "ERROR":
                        raise ApiException(status=int(raw.get("code") or 500), reason=str(raw.get("message")))
                    handle(str(event.get("type")), raw)
                    version = str((raw.get("metadata") or {}).get("resourceVersion") or version)
                    if self._stop.is_set():
                        break
            except Exception as err:
                if self._stop.is_set():
                    return  # stopped: the stream was cut on purpose
                if isinstance(err, ApiException) and err.status == 410:
                    log.info("watch expired (%s): listing again", err.reason)
                else:  # refused, a broken stream, an unreachable API server: list again soon
                    why = (
                        f"{err.status} {err.reason}"
                        if isinstance(err, ApiException)
                        else f"{type(err).__name__}: {err}"
                    )
                    log.warning("watch failed (%s): listing again in %.0f s", why, RETRY_S)
                    self._stop.wait(RETRY_S)
                version = ""  # list again: changes may have been missed

    def stop(self, timeout: float = REQUEST_TIMEOUT_S + 1) -> None:
        """End both watches (Watch.stop cuts the stream's socket) and wait for their threads: a
        thread still in a request when the interpreter finalizes can abort the process."""
        self._stop.set()
        for w in list(self._watches.values()):
            w.stop()
        for thread in self._threads:
            thread.join(timeout)
