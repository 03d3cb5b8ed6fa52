"""Removing the tenants of pods that are gone.

`Allocate` makes each container's tenant before the container exists, so no process of it is
the tenant's supervisor and the agent's reaper cannot tell when it is done. The pods can: the
tenants the plugin made carry the label `pod_uid` (allocate.py), and a tenant whose pod is
deleted, or finished (phase Succeeded or Failed: its containers never run again), is removed
through the tenant service (`sharegpu.doors`). A tenant without the label was
not made by the plugin and is never touched.

- `PodReaper` (the API server): lists the node's pods (`spec.nodeName=<node>`), removes the
  tenants of pods not in the list or finished, then watches from the list's resourceVersion
  and removes a pod's tenants on DELETED or when it reaches Succeeded or Failed. A watch that
  ends at its timeout (`resync_s`) is resumed from the last resourceVersion seen (bookmarks
  keep it recent); one that fails (410 Gone: that resourceVersion is too old; a broken
  connection; an API error) is followed by a new list and reconcile, so a deletion missed
  meanwhile is found by the pod's absence. The pods are also listed again every `relist_s`,
  for whatever else a watch missed.
- `FilePodReaper` (`--pods-file`, no API server): reconciles with the file every `every_s`.

The node's tenants are read before its pods: a tenant that exists then was made for a pod that
existed then, so a pod missing from the later list is really gone, not yet to come.

A tenant that still has live processes is kept, said once in the log, and tried again at the
end of each watch (watches last `retry_s` while one is kept) and at each list; so is one whose
removal failed. The delete is not forced (the service refuses it while processes live, under
the node lock): processes outliving their pod (a pod deleted with --force, a container runtime
slow to kill them) would go on using GPU memory that admission would then count free.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharegpu.doors import tenant_service
from sharegpu.errors import SharegpuError, TenantBusy, TenantNotFound
from sharegpu.kube.apiclient import REQUEST_TIMEOUT_S, failure
from sharegpu.kube.deviceplugin.pods import FilePodSource, Pod
from sharegpu.kube.request import FINISHED_PHASES
from sharegpu.tenant import iter_tenants, read_meta, tenant_status

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

log = logging.getLogger(__name__)

LABEL_POD_UID = "pod_uid"
RESYNC_S = 300.0  # a watch's timeout: then it is resumed, and kept tenants are tried again
RELIST_S = 1800.0  # the pods are listed again at least this often
RETRY_S = 5.0  # after a failed list or watch, and between tries of a kept tenant
FILE_EVERY_S = 5.0


@dataclass(frozen=True)
class PodTenant:
    name: str
    path: Path
    pod_uid: str
    pod: str  # namespace/name, for the log


def pod_tenants(root: Path) -> list[PodTenant]:
    """The node's tenants made for a pod (those with a `pod_uid` label)."""
    found = []
    for path in iter_tenants(root):
        labels = read_meta(path).get("labels")
        if not isinstance(labels, dict):
            continue
        uid = labels.get(LABEL_POD_UID)
        if isinstance(uid, str) and uid:
            pod = f"{labels.get('namespace', '?')}/{labels.get('pod', '?')}"
            found.append(PodTenant(path.name, path, uid, pod))
    return found


def _uid(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _phase(pod: Pod) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


@dataclass
class TenantReaper:
    """The rule, on the tenants of `root`: what is removed, what is kept and said so."""

    root: Path
    removed: list[str] = field(default_factory=list)  # tenant names, oldest first (for tests, logs)
    kept: set[str] = field(default_factory=set)  # to be tried again (live processes, a failure)
    ended: dict[str, str] = field(default_factory=dict)  # pod uid -> why, seen since the last list

    def reconcile(self, found: Iterable[PodTenant], pods: Iterable[Pod]) -> None:
        """Remove each of `found` (read before `pods` were) whose pod is not in `pods`, or finished."""
        phases = {_uid(p): _phase(p) for p in pods}
        doomed = []
        self.ended = {}
        for tenant in found:
            phase = phases.get(tenant.pod_uid)
            if phase is None or phase in FINISHED_PHASES:
                self.ended[tenant.pod_uid] = phase or "gone"
                doomed.append(tenant)
        self._remove_all(doomed)

    def pod_ended(self, uid: str, why: str) -> None:
        """The pod `uid` was deleted or finished: remove its tenants."""
        self.ended[uid] = why
        for tenant in pod_tenants(self.root):
            if tenant.pod_uid == uid:
                self.remove(tenant, why)

    def retry(self) -> None:
        """Remove again the tenants of pods seen ending since the last list: those kept for
        their processes, and any made just as its pod went (an allocation racing a delete)."""
        self._remove_all([t for t in pod_tenants(self.root) if t.pod_uid in self.ended])

    def _remove_all(self, doomed: list[PodTenant]) -> None:
        self.kept &= {t.name for t in doomed}  # a kept tenant removed otherwise is kept no more
        for tenant in doomed:
            self.remove(tenant, self.ended[tenant.pod_uid])

    def remove(self, tenant: PodTenant, why: str) -> bool:
        """Remove `tenant`, whose pod is `why` (deleted, gone, Succeeded, Failed); False when it
        is kept (live processes, or the removal failed), to be tried again."""
        try:
            with tenant_service(self.root) as service:
                service.delete(tenant.name)
        except TenantNotFound:
            pass  # removed meanwhile (by hand, or the agent): what was wanted
        except TenantBusy:
            live = [p.host_pid or p.pid for p in tenant_status(tenant.path).processes if p.alive]
            self._keep(tenant, why, f"it still has live processes ({', '.join(map(str, live))})")
            return False
        except SharegpuError as err:
            self._keep(tenant, why, f"cannot remove it: {err}")
            return False
        self.kept.discard(tenant.name)
        self.removed.append(tenant.name)
        log.info("removed tenant %s: its pod %s is %s", tenant.name, tenant.pod, why)
        return True

    def _keep(self, tenant: PodTenant, why: str, because: str) -> None:
        if tenant.name not in self.kept:  # said once, not at every try
            log.warning(
                "tenant %s of pod %s (%s) is kept: %s; it is tried again",
                tenant.name,
                tenant.pod,
                why,
                because,
            )
            self.kept.add(tenant.name)


class PodReaper:
    """Lists and watches the node's pods on the API server (module docstring) until `stop()`;
    `run()` is the loop, for a thread of its own."""

    def __init__(
        self,
        node: str,
        pods_api: CoreV1Api,
        root: Path,
        *,
        resync_s: float = RESYNC_S,
        relist_s: float = RELIST_S,
        retry_s: float = RETRY_S,
    ):
        if resync_s < 1 or relist_s < resync_s or retry_s <= 0:
            raise ValueError(
                f"want 1 <= resync_s <= relist_s and retry_s > 0, not {resync_s}, {relist_s}, {retry_s}"
            )
        self.node = node
        self.api = pods_api
        self.reaper = TenantReaper(root)
        self.resync_s = resync_s
        self.relist_s = relist_s
        self.retry_s = retry_s
        self.lists = 0  # lists reconciled (these three counts for tests and logs)
        self.events = 0  # watch events acted on
        self.expired = 0  # watches ended by 410 Gone
        self._selector = f"spec.nodeName={node}"
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # orders stop() with the opening of a watch
        self._response: Any = None  # the open watch's, for stop() to cut
        self._said = ""

    def reconcile(self) -> str:
        """List the node's pods, remove the tenants of those gone or finished; the list's
        resourceVersion, to watch from."""
        found = pod_tenants(self.reaper.root)  # before the pods: see the module docstring
        listed = self.api.list_pod_for_all_namespaces(
            field_selector=self._selector, _request_timeout=REQUEST_TIMEOUT_S
        )
        pods = [self.api.api_client.sanitize_for_serialization(p) for p in listed.items]
        self.reaper.reconcile(found, pods)
        self.lists += 1
        return str((listed.metadata and listed.metadata.resource_version) or "")

    def run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        version: str | None = None  # None: list first
        listed_at = 0.0
        while not self._stopping.is_set():
            try:
                if version is None or time.monotonic() - listed_at >= self.relist_s:
                    version, listed_at = self.reconcile(), time.monotonic()
                    if self._said:
                        log.info("listed the pods of node %s again", self.node)
                        self._said = ""
                version = self._follow(version)
                self.reaper.retry()
            except Exception as err:
                version = None
                if self._stopping.is_set():
                    break
                if isinstance(err, ApiException) and err.status == 410:
                    self.expired += 1
                    log.info("the pod watch's resourceVersion is too old (410 Gone): listing again")
                    continue
                failed = failure(err, self.api.api_client)
                self._say(f"cannot list or watch the pods of node {self.node}: {failed}")
                self._stopping.wait(self.retry_s)

    def _follow(self, version: str) -> str:
        """Watch from resourceVersion `version` until the watch's timeout; the last one seen.
        The `kubernetes` client's errors for a watch that fails, ApiException 410 included."""
        from kubernetes import watch

        timeout = self.retry_s if self.reaper.kept else self.resync_s
        try:
            for event in watch.Watch().stream(
                self._open,
                field_selector=self._selector,
                resource_version=version,
                allow_watch_bookmarks=True,  # the version moves on while this node's pods do not
                timeout_seconds=max(1, round(timeout)),
                _request_timeout=(REQUEST_TIMEOUT_S, timeout + 30),  # a dead connection ends too
            ):
                if self._stopping.is_set():
                    break
                version = self._on(event) or version
                if self.reaper.kept and timeout > self.retry_s:
                    break  # a tenant kept: resume with watches of retry_s, to try it again soon
        finally:
            with self._lock:
                self._response = None
        return version

    def _open(self, **kwargs: Any) -> Any:
        """The watch request; its response is kept for stop() to cut. (A plain function, not the
        client's method, so the watch leaves the events' objects as the JSON they are.)"""
        response = self.api.list_pod_for_all_namespaces(**kwargs)
        with self._lock:
            self._response = response
            if self._stopping.is_set():
                _cut(response)
        return response

    def _on(self, event: dict[str, Any]) -> str:
        """Act on one watch event (a BOOKMARK only moves the version on); its object's
        resourceVersion."""
        self.events += 1
        pod = event.get("raw_object") or {}
        kind, phase, uid = event.get("type"), _phase(pod), _uid(pod)
        if kind == "DELETED":
            self.reaper.pod_ended(uid, "deleted")
        elif kind in ("ADDED", "MODIFIED") and phase in FINISHED_PHASES:
            self.reaper.pod_ended(uid, phase)
        return str((pod.get("metadata") or {}).get("resourceVersion") or "")

    def _say(self, said: str) -> None:
        """A failure, logged when it is news (not at every retry of one outage)."""
        if said != self._said:
            log.warning("%s (tried again every %gs)", said, self.retry_s)
            self._said = said

    def stop(self) -> None:
        """End `run()` at once: an open watch's connection is cut (the client's Watch.stop()
        cannot cut one whose answer has not begun)."""
        with self._lock:
            self._stopping.set()
            if self._response is not None:
                _cut(self._response)


def _cut(response: Any) -> None:
    """Shut down the socket of a streamed response, which wakes a thread blocked reading it."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


class FilePodReaper:
    """With `--pods-file`: reconcile with the file every `every_s`, until `stop()`."""

    def __init__(self, node: str, source: FilePodSource, root: Path, *, every_s: float = FILE_EVERY_S):
        self.node = node
        self.source = source
        self.reaper = TenantReaper(root)
        self.every_s = every_s
        self._stopping = threading.Event()
        self._said = ""

    def reconcile(self) -> None:
        found = pod_tenants(self.reaper.root)  # before the pods: see the module docstring
        self.reaper.reconcile(found, self.source.pods_on(self.node))

    def run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self.reconcile()
                self._said = ""
            except SharegpuError as err:  # an unreadable file is no pods' word: remove nothing
                if str(err) != self._said:
                    log.warning("cannot reconcile the tenants with the pod file: %s", err)
                    self._said = str(err)
            except Exception:  # a bug: the loop must go on
                log.exception("reconciling the tenants with the pod file failed")
            self._stopping.wait(max(0.0, self.every_s - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stopping.set()
