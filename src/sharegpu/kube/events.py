"""Events on pods, for `kubectl describe pod`: why sharegpu could not place a pod.

The kube-scheduler's own FailedScheduling event lists each node's reason, counted ("0/40 nodes
are available: 38 no room now for ..., 2 GPU model ... is not one of ..."); sharegpu's
extender adds one Warning of its own that says it in the pod's terms: what the pod asks, and
what the cluster lacks for it. Events are posted from a thread of their own (the scheduler
never waits on them), at most one per pod and reason every `REPEAT_AFTER_S` (a pod retried
every few seconds would otherwise drown its own events), and a failure to post is logged, never
raised: events are advice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from sharegpu.kube.apiclient import REQUEST_TIMEOUT_S

log = logging.getLogger(__name__)

COMPONENT = "sharegpu-extender"
REPEAT_AFTER_S = 60.0
MAX_REMEMBERED = 10_000  # pods whose last event is remembered for the repeat limit
MAX_QUEUED = 1_000  # events waiting to be posted; past it, new ones are dropped (and logged)
MAX_MESSAGE = 1024  # the API server refuses longer event messages


class EventSink(Protocol):
    def warn(self, pod: Mapping[str, Any], reason: str, message: str) -> None: ...


class NoEvents:
    """Where events go without an API server (the dry run)."""

    def warn(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        pass


class EventRecorder:
    def __init__(
        self,
        api_client: Any,
        *,
        component: str = COMPONENT,
        repeat_after_s: float = REPEAT_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes import client

        self._client = client
        self._core = client.CoreV1Api(api_client)
        self.component = component
        self.repeat_after_s = repeat_after_s
        self.clock = clock
        self._last: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._queue: queue.Queue[Any] = queue.Queue(MAX_QUEUED)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._post_all, name="events", daemon=True)
        self._thread.start()
        self.posted = 0

    def warn(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        now = self.clock()
        with self._lock:
            last = self._last.get((uid, reason))
            if last is not None and last[0] == message and now - last[1] < self.repeat_after_s:
                return
            self._last[(uid, reason)] = (message, now)
            self._last.move_to_end((uid, reason))
            while len(self._last) > MAX_REMEMBERED:
                self._last.popitem(last=False)
        try:
            self._queue.put_nowait(self._event(meta, reason, message))
        except queue.Full:
            log.warning("event for pod %s dropped (%d waiting): %s", meta.get("name"), MAX_QUEUED, message)

    def _event(self, meta: Mapping[str, Any], reason: str, message: str) -> Any:
        c = self._client
        stamp = datetime.now(UTC)
        namespace = str(meta.get("namespace") or "default")
        return c.CoreV1Event(
            metadata=c.V1ObjectMeta(
                name=f"{meta.get('name', 'pod')}.{uuid.uuid4().hex[:16]}", namespace=namespace
            ),
            involved_object=c.V1ObjectReference(
                kind="Pod", api_version="v1", namespace=namespace, name=meta.get("name"), uid=meta.get("uid")
            ),
            reason=reason,
            message=message[:MAX_MESSAGE],
            type="Warning",
            source=c.V1EventSource(component=self.component),
            reporting_component=self.component,
            reporting_instance=self.component,
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=1,
        )

    def _post_all(self) -> None:
        while True:
            event = self._queue.get()
            try:
                if event is None:
                    return
                self._core.create_namespaced_event(event.metadata.namespace, event)
                self.posted += 1
            except Exception as err:  # advice only: the pod's scheduling goes on without it
                log.warning("could not post an event on pod %s: %s", event.involved_object.name, err)
            finally:
                self._queue.task_done()

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until the events queued so far are posted (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self, timeout: float = REQUEST_TIMEOUT_S + 1) -> None:
        """Post what is queued, then end the thread (waited for: a thread still in a request when
        the interpreter finalizes can abort the process)."""
        self._queue.put(None)
        self._thread.join(timeout)
