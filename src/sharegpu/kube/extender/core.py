"""The scheduler extender: the kube-scheduler asks it which nodes can take a pod's vGPUs
(`filter`), which it prefers (`prioritize`) and lets it `bind` the pod, choosing the GPUs.

Every decision is `sharegpu.placement` (engine.decide with the node mask the scheduler passes):
the same code as `sharegpu simulate`, not a copy. What it knows of the cluster is its
`ClusterCache` (cache.py): a `ClusterState` of every node the scheduler has shown, with a fresh
inventory (inventory.py), and the vGPUs of the pods bound so far (`observe` for pods bound
before, or by another replica); it is rebuilt when a node appears or its GPUs change, with the
allocations re-applied. This module holds the verbs, and the one lock under which they read and
change the cache.

- `filter` keeps the nodes where the pod fits now. The others carry the reason the scheduler
  shows in the pod's events: `FailedNodes` for what may change (no room now, a stale
  inventory), `FailedAndUnresolvableNodes` for what will not (no inventory, a model the pod
  does not allow, vGPUs larger than the node's GPUs). A pod whose request is malformed fails
  on every node with the reason (request.PodRequestError).
- `prioritize` scores 10 the node of the policy's decision among those passed and leaves the
  rest out (0: the extender's weight in the scheduler's configuration makes it decisive); the decision
  is kept for the bind, so a bind on that node is the simulator's decision.
- `bind` places the pod on the chosen node (that placement, or the policy's best on the node),
  writes the assignment (assignment.py) through the `Binder`, and records the allocation; the
  lock makes two binds at once decide one after the other, so they never share free room. The
  API binder (bindings.py) checks the assignment against what the API server says the node's
  GPUs hold (`fits`), so binds by another replica cannot oversubscribe a GPU either; what it
  finds there that this extender did not know is taken in.

The state follows the API server when a `ClusterSync` (sync.py) feeds it (`resync` after a
start or a broken watch, `learn`/`observe`/`forget` for each change); without one it learns the
nodes the scheduler passes.

The HTTP server (http.py) speaks the extender API's JSON (capitalised keys: `Pod`, `Nodes`,
`NodeNames`, `FailedNodes`, ...).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from sharegpu.errors import SpecError
from sharegpu.kube.assignment import Assignment
from sharegpu.kube.bindings import BindError, Fits, PodRef
from sharegpu.kube.events import EventSink, NoEvents
from sharegpu.kube.extender.cache import NO_INVENTORY, ClusterCache
from sharegpu.kube.extender.translate import assignment_for, oversubscribed, placement_request
from sharegpu.kube.extender.wire import filter_result, meta_victims, resource_version, unschedulable, victims
from sharegpu.kube.inventory import (
    STALE_AFTER_S,
    node_name,
)
from sharegpu.kube.request import PodRequest, PodRequestError, pod_request
from sharegpu.placement import (
    DEFAULT_POLICY,
    ClusterState,
    Placement,
    Request,
    Workload,
    make_policy,
)
from sharegpu.placement.candidates import candidates
from sharegpu.placement.engine import decide
from sharegpu.placement.preempt import plan_on_node

MAX_SCORE = 10  # the extender API's MaxExtenderPriority
MAX_PENDING = 10_000  # pods filtered and not bound yet, remembered for their bind


class Binder(Protocol):
    """Writes a decision to the API server: the assignment annotation and the binding, if
    `fits` finds no reason against it beside what the node's GPUs hold; BindError if not."""

    def bind(self, pod: PodRef, assignment: Assignment, fits: Fits) -> str:
        """The pod's resourceVersion once its assignment is written ("" when not known)."""
        ...


@dataclass
class _Pending:
    """A pod filtered and not bound yet: what it asks, and prioritize's decision for its bind."""

    request: PodRequest
    wanted: Request
    resource_version: str  # of the pod filtered: a pod edited since is not bound on it
    chosen: Placement | None = None


class Extender:
    def __init__(
        self,
        binder: Binder | None = None,
        *,
        policy: str = DEFAULT_POLICY,
        stale_after_s: float = STALE_AFTER_S,
        clock: Callable[[], float] = time.time,
        seed: int | Sequence[int] = 0,
        workload: Workload | None = None,
        leader: Callable[[], bool] | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.binder = binder
        self.policy = make_policy(policy)
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.rng = np.random.default_rng(seed)
        # The request shapes fragmentation is measured against (the cluster's pod mix).
        self.workload = workload if workload is not None else Workload.default()
        self.leader = leader  # None: a single extender, always the leader
        self.events = events if events is not None else NoEvents()
        self.synced = True  # False while a ClusterSync has not read the API server yet
        self.cache = ClusterCache(self.policy, self.workload, self.events, clock)
        self._pods: dict[str, _Pending] = {}  # pod uid -> filtered, not bound yet
        self._lock = threading.Lock()  # the cache's, and the pending pods'

    @property
    def state(self) -> ClusterState | None:
        return self.cache.state

    # -- what the cluster holds (ClusterSync feeds these) ----------------------------------------

    def learn(self, nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
        """Take in nodes (new, or changed); {name: why it cannot be used, permanently}."""
        with self._lock:
            return self.cache.learn(nodes)

    def forget_node(self, name: str) -> None:
        with self._lock:
            if self.cache.drop(name):
                self.cache.rebuild()

    def resync(
        self,
        nodes: Sequence[Mapping[str, Any]] | None = None,
        pods: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Start again from the API server's lists (ClusterCache.resync)."""
        with self._lock:
            self.cache.resync(nodes, pods)

    def observe(self, pod: Mapping[str, Any]) -> None:
        """Record a pod bound already (by an earlier run, or another replica) from its assignment;
        a pod that finished or lost its assignment frees what it held."""
        with self._lock:
            self.cache.observe(pod)

    def forget(self, uid: str) -> None:
        """A pod deleted or finished: what it held is free."""
        with self._lock:
            self._pods.pop(uid, None)
            self.cache.forget(uid)

    @property
    def is_leader(self) -> bool:
        return self.leader is None or self.leader()

    # -- the verbs -----------------------------------------------------------------------------

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        nodes = list((args.get("Nodes") or {}).get("items") or [])
        names = [node_name(n) for n in nodes] or list(args.get("NodeNames") or [])
        failed: dict[str, str] = {}
        final: dict[str, str] = {}
        try:
            request = pod_request(pod)
            if request is None:  # no vGPU: every node the scheduler chose will do
                return filter_result(nodes, names, {}, {})
            wanted = placement_request(pod, request)
        except PodRequestError as err:
            self.events.warn(pod, "InvalidVGPURequest", str(err))
            return filter_result(nodes, [], {}, {n: str(err) for n in names})
        meta = pod.get("metadata") or {}
        with self._lock:
            uid = str(meta.get("uid", ""))
            if len(self._pods) >= MAX_PENDING:
                self._pods.pop(next(iter(self._pods)))  # the oldest: a pod that never came to bind
            self._pods[uid] = _Pending(request, wanted, str(meta.get("resourceVersion") or ""))
            final.update(self.cache.learn(nodes))
            fits = self._sort_nodes([n for n in names if n not in final], wanted, failed, final)
        if not fits:
            self.events.warn(pod, "VGPUUnschedulable", unschedulable(wanted, failed, final))
        return filter_result(nodes, fits, failed, final)

    def _sort_nodes(
        self, names: list[str], request: Request, failed: dict[str, str], final: dict[str, str]
    ) -> list[str]:
        """The nodes that can take the request now; the reason of each other one, in `failed`
        (may change) or `final` (will not). Vectorised: the kube-scheduler sends every node."""
        state = self.cache.state
        if state is None:
            failed.update(dict.fromkeys(names, NO_INVENTORY))
            return []
        index = self.cache.indexes(names)
        unknown = index < 0
        n = np.where(unknown, 0, index)
        fit = np.zeros(len(state.nodes), dtype=np.bool_)
        fit[candidates(state, request).nodes] = True
        model_ok = state.model_mask(request.models) if request.count else np.ones(len(state.nodes), np.bool_)
        per_gpu = (state.cap_c >= request.compute_milli) & (state.cap_m >= request.memory_mib)
        holds = per_gpu.sum(axis=1) >= request.count
        age = self.clock() - self.cache.published_at[n]
        stale = ~unknown & (age > self.stale_after_s)
        wrong_model = ~unknown & ~stale & ~model_ok[n]
        too_small = ~unknown & ~stale & ~wrong_model & ~holds[n]
        full = ~unknown & ~stale & ~wrong_model & ~too_small & ~fit[n]
        size = f"{request.count} vGPU(s) of {request.memory_mib} MiB / {request.compute_milli / 10:g}%"
        allowed = ", ".join(sorted(request.models))
        # Reasons that read the same on every node they apply to: the scheduler counts them.
        stale_why = f"sharegpu inventory older than {self.stale_after_s:.0f} s (its agent is down or cut off)"
        for k in np.flatnonzero(unknown):
            failed[names[k]] = NO_INVENTORY
        for k in np.flatnonzero(stale):
            failed[names[k]] = stale_why
        for k in np.flatnonzero(wrong_model):
            final[names[k]] = f"GPU model {state.nodes[n[k]].model} is not one of {allowed}"
        for k in np.flatnonzero(too_small):
            final[names[k]] = f"its GPUs cannot hold {size} even when empty"
        busy = f"no room now for {request.describe()}"
        for k in np.flatnonzero(full):
            failed[names[k]] = busy
        ok = np.flatnonzero(~(unknown | stale | wrong_model | too_small | full))
        fits = [names[k] for k in ok]
        self.cache.remember(fits, index[ok])  # the names prioritize will be sent
        return fits

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        pod = args.get("Pod") or {}
        nodes = list((args.get("Nodes") or {}).get("items") or [])
        names = [node_name(n) for n in nodes] or list(args.get("NodeNames") or [])
        scores: list[dict[str, Any]] = []  # a node left out scores 0 (the scheduler adds nothing)
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        with self._lock:
            pending = self._pods.get(uid)  # None: a pod without vGPUs, or one filter refused
            self.cache.learn(nodes)
            state = self.cache.state
            if pending is not None and state is not None:
                allowed = np.zeros(len(state.nodes) + 1, dtype=np.bool_)  # the last: unknown names
                allowed[self.cache.indexes(names)] = True
                allowed = allowed[:-1]
                # The policy's decision, with its random tie-break as in the simulator; kept for
                # the bind. One decision only: the others score 0 (ranking more nodes would cost
                # a decision each, and the scheduler binds the best).
                got = decide(state, pending.wanted, self.policy, self.rng, allowed)
                if isinstance(got, Placement):
                    pending.chosen = got
                    scores.append({"Host": got.node, "Score": MAX_SCORE})
        return scores

    def preempt(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """ExtenderPreemptionArgs -> ExtenderPreemptionResult. For each node where the scheduler
        would preempt, its victims that hold no vGPU stay (the scheduler chose them for what it
        judges: CPU, memory, pods) and of those that do, the fewest whose eviction makes room for
        the pod's vGPUs (sharegpu.placement.preempt); a node where evicting all of them would
        not is left out. A pod without vGPUs keeps the scheduler's choice."""
        pod = args.get("Pod") or {}
        proposed = victims(args)
        try:
            request = pod_request(pod)
            wanted = placement_request(pod, request) if request is not None else None
        except PodRequestError:
            return {"NodeNameToMetaVictims": {}}  # filter told the pod why already
        if wanted is None:
            return {"NodeNameToMetaVictims": {n: meta_victims(u, pdb) for n, (u, pdb) in proposed.items()}}
        result: dict[str, Any] = {}
        with self._lock:
            state = self.cache.state
            if state is None:
                return {"NodeNameToMetaVictims": {}}
            now = self.clock()
            for node, (uids, pdb) in proposed.items():
                n = state.index.get(node)
                if n is None or now - self.cache.published_at[n] > self.stale_after_s:
                    continue  # no usable inventory: nothing may be placed there, evicted or not
                on_gpus = [state.allocations[u] for u in uids if u in state.node_allocations[n]]
                plan = plan_on_node(state, wanted, n, on_gpus)
                if plan is None:
                    continue
                chosen = set(plan.victims)
                keep = [u for u in uids if u not in state.node_allocations[n] or u in chosen]
                result[node] = meta_victims(keep, pdb)
        return {"NodeNameToMetaVictims": result}

    def bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """ExtenderBindingArgs (PodName, PodNamespace, PodUID, Node) -> {"Error": ""} or the reason."""
        name, namespace = str(args.get("PodName") or ""), str(args.get("PodNamespace") or "default")
        uid, node = str(args.get("PodUID") or ""), str(args.get("Node") or "")
        if not (name and uid and node):
            return {"Error": "malformed bind request: PodName, PodUID and Node are required"}
        if not self.is_leader:
            return {"Error": f"this extender replica is not the leader: scheduling {namespace}/{name} again"}
        with self._lock:
            seen = self._pods.get(uid)
            if seen is None:
                return {
                    "Error": f"pod {namespace}/{name} was not filtered by this extender: scheduling it again"
                }
            request, wanted = seen.request, seen.wanted
            state, known = self.cache.state, self.cache.known.get(node)
            if state is None or known is None or node not in state.index:
                return {
                    "Error": f"node {node} has no sharegpu inventory: scheduling {namespace}/{name} again"
                }
            age = self.clock() - known.inventory.published_at
            if age > self.stale_after_s:  # its agent went down since the pod was filtered
                return {
                    "Error": f"node {node}'s sharegpu inventory is {age:.0f} s old (its agent is down or cut "
                    f"off): scheduling {namespace}/{name} again"
                }
            chosen = seen.chosen
            if self.binder is None:
                return {"Error": "this extender has no binder (it was started without an API server)"}
            # Reserved in the state before the API server is asked, as the kube-scheduler assumes
            # a pod before binding it: the lock is not held through the API round trips, and no
            # other decision meanwhile counts this room as free.
            self.cache.release(uid)  # anything a watch event recorded of it
            try:
                if chosen is None or chosen.node != node:
                    raise SpecError("not decided for this node")
                state.allocate(chosen, wanted, alloc_id=uid)
            except SpecError:  # decided elsewhere, or its room was taken since: decide on this node
                allowed = np.zeros(len(state.nodes), dtype=np.bool_)
                allowed[state.index[node]] = True
                got = decide(state, wanted, self.policy, None, allowed)
                if not isinstance(got, Placement):
                    return {"Error": f"no room on node {node} now for {wanted.describe()}: {got.message}"}
                chosen = got
                state.allocate(chosen, wanted, alloc_id=uid)
            self.cache.bound[uid] = (chosen, wanted)
            self.cache.binding.add(uid)
            assignment = assignment_for(known.inventory, node, chosen, request, self.clock())
            ref = PodRef(namespace, name, uid, seen.resource_version)

        def fits(
            others: Sequence[tuple[Mapping[str, Any], Assignment]], *, listed: bool = True
        ) -> str | None:
            if listed:
                with self._lock:
                    for pod, _ in others:
                        self.cache.observe(pod)  # bound by another replica, or before a restart: now known
            return oversubscribed(known.inventory, assignment, others)

        error, written = "", None
        try:
            written = resource_version(self.binder.bind(ref, assignment, fits))
        except BindError as err:
            error = f"binding {ref.key} to {node} failed: {err}"
        except Exception as err:  # the API server's refusal, whatever its type: the pod is retried
            error = f"binding {ref.key} to {node} failed: {type(err).__name__}: {err}"
        with self._lock:
            self.cache.binding.discard(uid)
            if error:
                self.cache.release(uid)  # the reservation
                return {"Error": error}
            if uid not in self.cache.bound:  # a resync meanwhile read the pod before its bind
                self.cache.reserve(uid, chosen, wanted)
            if written is not None:
                self.cache.written[uid] = written
            self._pods.pop(uid, None)
        return {"Error": ""}
