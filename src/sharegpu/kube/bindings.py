"""Binding a pod through the API server so that no GPU is ever oversubscribed, whatever else
binds at the same time: another extender replica during a change of leader, or an extender that
died mid-bind and was restarted.

The protocol (optimistic concurrency on what is written):

1. read the node's bind fence, the Lease `sharegpu-bind.<node>` in the extender's namespace
   (made on first use): its resourceVersion versions everything bound to the node so far;
2. list what the API server says the node's GPUs hold: the assignment of every pod bound to the
   node or on its way there (not bound yet, its assignment naming the node and younger than
   `ABANDONED_AFTER_S`), unless it has finished; the unbound ones are listed first, so that a
   pod another bind binds meanwhile is seen in one list or the other;
3. ask the caller whether the pod's assignment fits beside those (`fits`);
4. write the assignment on the pod, with the pod's resourceVersion from the scheduling cycle as a
   precondition: a pod edited since it was filtered (its annotations changed) is refused and
   scheduled again, rather than bound on what it no longer says;
5. advance the fence: replace the Lease, with the resourceVersion read in 1 as precondition. A
   conflict means another bind committed on the node since 1: back to 1 (the pod's own
   assignment, written in 4, is told apart from the others by the pod's uid);
6. create the Binding, with the pod's uid as precondition.

A bind that fails after 4 removes the assignment again (best effort: one left behind on an
unbound pod counts as held for `ABANDONED_AFTER_S`, which makes a GPU look fuller, never emptier).

Why it is safe: binds on one node commit one at a time (a Lease's resourceVersion admits one
writer), and each wrote its assignment before it committed, so a bind that read the fence after
an earlier commit lists (2, after 1) that earlier assignment. Lists are the API server's
consistent reads (no resourceVersion given), not a cache.

Within one binder, binds on one node take turns (a lock per node), so the fence only arbitrates
between replicas. The kube-scheduler binds in parallel: 16 pods bound at once on one node raced
on the fence, one commit per round, and most ran out of tries into the scheduler's back-off
(1.9 pods/s through the real scheduler, bench/kube_node.py).

The binder that committed last on a node remembers that node: the fence as its advance left it,
and what the node held then (the list of 2, with its own pods since). Its next bind there skips 1
and 2 and checks 3 against that memory: 5's precondition is then the remembered fence, which
fails if any other bind committed on the node since (back to 1, with fresh reads); if none did,
the node holds at most what is remembered (pods only leave meanwhile), so the check is safe, if
conservative: a pod it refuses is checked again against fresh reads before it is refused. Three
API calls a bind instead of six while one leader binds alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson

from sharegpu.errors import SharegpuError
from sharegpu.kube.apiclient import failure
from sharegpu.kube.assignment import Assignment, read_assignment
from sharegpu.kube.request import ANNOTATION_ASSIGNMENT, PodRequestError, pod_finished

log = logging.getLogger(__name__)

FENCE_PREFIX = "sharegpu-bind."
ABANDONED_AFTER_S = 120.0  # an assignment on a pod that was never bound stops counting after this
MAX_ATTEMPTS = 5  # fence conflicts in a row before the bind is given back to the scheduler

Pod = dict[str, Any]


class Fits(Protocol):
    def __call__(self, others: Sequence[tuple[Pod, Assignment]], *, listed: bool = True) -> str | None:
        """Why the pod's assignment does not fit beside `others`, or None. listed: `others` were
        just read from the API server (news to the caller); False: the binder's memory of them,
        which may hold pods gone since, and must not be taken as news."""
        ...


@dataclass
class _NodeMemory:
    """What a binder knows of a node after its own commit there (see the protocol above)."""

    fence: Any  # the Lease as the API server answered the advance: its resourceVersion current
    held: list[tuple[Pod, Assignment]]


class BindError(SharegpuError):
    """The bind did not happen; the message says why, for the pod's events. Nothing is held."""


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    resource_version: str = ""  # of the pod the scheduler filtered; "" skips the precondition

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def fence_name(node: str) -> str:
    return FENCE_PREFIX + node


def held(pods: Sequence[Pod], node: str, now: float) -> list[tuple[Pod, Assignment]]:
    """The pods whose assignment holds GPUs of `node`: bound there, or on their way."""
    out: list[tuple[Pod, Assignment]] = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if pod_finished(pod):
            continue
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        try:
            assignment = read_assignment(meta.get("annotations"), key)
        except PodRequestError as err:
            log.warning("%s (not counted on node %s)", err, node)
            continue
        if assignment is None or assignment.node != node:
            continue
        bound_to = spec.get("nodeName") or ""
        if bound_to == node or (not bound_to and now - assignment.bound_at < ABANDONED_AFTER_S):
            out.append((pod, assignment))
    return out


def holds(pod: Pod, node: str, now: float) -> bool:
    """Whether this one pod's assignment holds GPUs of `node` (held, for one pod)."""
    return bool(held([pod], node, now))


class ApiBinder:
    """The protocol above through the `kubernetes` client (an `ApiClient`)."""

    def __init__(
        self, api_client: Any, namespace: str, identity: str, clock: Callable[[], float] = time.time
    ) -> None:
        from kubernetes import client

        self._client = client
        self._api = api_client
        self._core = client.CoreV1Api(api_client)
        self._leases = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.identity = identity
        self.clock = clock
        self._node_locks: dict[str, threading.Lock] = {}
        self._node_locks_lock = threading.Lock()
        self._memory: dict[str, _NodeMemory] = {}  # node -> after this binder's last commit there

    def _turn(self, node: str) -> threading.Lock:
        with self._node_locks_lock:
            return self._node_locks.setdefault(node, threading.Lock())

    def bind(self, pod: PodRef, assignment: Assignment, fits: Fits) -> str:
        """The pod's resourceVersion after its assignment was written; BindError if not bound."""
        with self._turn(assignment.node):
            return self._bind_in_turn(pod, assignment, fits)

    def _bind_in_turn(self, pod: PodRef, assignment: Assignment, fits: Fits) -> str:
        from kubernetes.client.exceptions import ApiException

        node = assignment.node
        written = False
        version = pod.resource_version
        memory = self._memory.pop(node, None)  # (gone while this bind runs: a failure forgets it)
        try:
            for _ in range(MAX_ATTEMPTS):
                if memory is not None:
                    fence, held_now = memory.fence, memory.held
                else:
                    fence, held_now = self._fence(node), self._held(node)
                others = [(p, a) for p, a in held_now if _uid(p) != pod.uid]
                why = fits(others, listed=memory is None)
                if why is not None:
                    if memory is not None:
                        memory = None  # it may count pods gone since: read the node afresh
                        continue
                    raise BindError(why)
                if not written:
                    version = self._annotate(pod, assignment.to_annotation(), version)
                    written = True
                try:
                    advanced = self._advance(fence)
                except ApiException as err:
                    if err.status == 409:
                        memory = None
                        continue  # another bind committed on this node: list again
                    raise
                self._bind(pod, node)
                mine = {"metadata": {"uid": pod.uid, "name": pod.name, "namespace": pod.namespace}}
                self._memory[node] = _NodeMemory(advanced, [*others, (mine, assignment)])
                return version
            raise BindError(f"binds on node {node} kept conflicting ({MAX_ATTEMPTS} tries): scheduling again")
        except BindError:
            if written:
                self._retract(pod)
            raise
        except Exception as err:  # the API server refused, or did not answer
            if written:
                self._retract(pod)
            raise BindError(failure(err, self._api)) from err

    # -- the steps -----------------------------------------------------------------------------

    def _fence(self, node: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        name = fence_name(node)
        try:
            return self._leases.read_namespaced_lease(name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
        body = self._client.V1Lease(
            metadata=self._client.V1ObjectMeta(
                name=name, namespace=self.namespace, labels={"app.kubernetes.io/name": "sharegpu"}
            ),
            spec=self._client.V1LeaseSpec(holder_identity=self.identity),
        )
        try:
            return self._leases.create_namespaced_lease(self.namespace, body)
        except ApiException as err:
            if err.status != 409:  # made by another bind in between: read it
                raise
        return self._leases.read_namespaced_lease(name, self.namespace)

    def _held(self, node: str) -> list[tuple[Pod, Assignment]]:
        # Two lists, unbound pods first: a pod only goes from unbound to bound, so one bound
        # between the lists is in the second. Bound first, a pod bound by another replica in
        # between was in neither, and a fourth 30% pod went onto a GPU holding 90%. A pod in
        # both counts once, as the later list saw it.
        # The answers are read as JSON, not as the client's models: turning every pod into a
        # V1Pod and back into a dict was most of a bind's time (two lists per bind).
        pods: dict[str, Pod] = {}
        for selector in ("spec.nodeName=", f"spec.nodeName={node}"):
            answer: Any = self._core.list_pod_for_all_namespaces(
                field_selector=selector, _preload_content=False
            )
            try:
                items = orjson.loads(answer.data).get("items") or []
            finally:
                answer.release_conn()
            for pod in items:
                meta = pod.get("metadata") or {}
                pods[_uid(pod) or f"{meta.get('namespace')}/{meta.get('name')}"] = pod
        return held(list(pods.values()), node, self.clock())

    def _annotate(self, pod: PodRef, text: str, version: str) -> str:
        from kubernetes.client.exceptions import ApiException

        meta: dict[str, Any] = {"uid": pod.uid, "annotations": {ANNOTATION_ASSIGNMENT: text}}
        if version:
            meta["resourceVersion"] = version
        try:
            got: Any = self._core.patch_namespaced_pod(pod.name, pod.namespace, {"metadata": meta})
        except ApiException as err:
            if err.status == 409:
                raise BindError(
                    f"pod {pod.key} changed since it was filtered (were its annotations edited?): "
                    "scheduling it again"
                ) from err
            if err.status == 404:
                raise BindError(f"pod {pod.key} is gone") from err
            raise
        return str(got.metadata.resource_version or "")

    def _advance(self, fence: Any) -> Any:
        """The fence replaced (its resourceVersion the precondition), as the API server answered."""
        fence.spec.holder_identity = self.identity
        fence.spec.renew_time = datetime.fromtimestamp(self.clock(), UTC)
        return self._leases.replace_namespaced_lease(fence.metadata.name, self.namespace, fence)

    def _bind(self, pod: PodRef, node: str) -> None:
        from kubernetes.client.exceptions import ApiException

        body = self._client.V1Binding(
            metadata=self._client.V1ObjectMeta(name=pod.name, namespace=pod.namespace, uid=pod.uid),
            target=self._client.V1ObjectReference(kind="Node", api_version="v1", name=node),
        )
        try:
            # Not preloaded: the API server answers a Status, which the client cannot read as
            # the V1Binding it expects (kubernetes-client/python#825; a pydantic ValidationError
            # in client 37, raised after the pod is bound).
            answer: Any = self._core.create_namespaced_pod_binding(
                pod.name, pod.namespace, body, _preload_content=False
            )
            # Read to the end, then given back: unread, the body would be taken for the status
            # line of the next answer on the same connection.
            answer.read()
            answer.release_conn()
        except ApiException as err:
            if err.status == 409:
                raise BindError(
                    f"pod {pod.key} is bound already, or is another pod now: {failure(err, self._api)}"
                ) from err
            if err.status == 404:
                raise BindError(f"pod {pod.key} is gone") from err
            raise

    def _retract(self, pod: PodRef) -> None:
        from kubernetes.client.exceptions import ApiException

        body = {"metadata": {"annotations": {ANNOTATION_ASSIGNMENT: None}}}
        try:
            self._core.patch_namespaced_pod(pod.name, pod.namespace, body)
        except Exception as err:
            if not (isinstance(err, ApiException) and err.status == 404):
                log.warning(
                    "pod %s: could not remove its assignment after a failed bind: %s",
                    pod.key,
                    failure(err, self._api),
                )


def _uid(pod: Pod) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))
