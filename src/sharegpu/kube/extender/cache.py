"""What the scheduler extender knows of the cluster: every node the scheduler or the API server
has shown, with its inventory, as a `ClusterState` (rebuilt when a node appears or its GPUs
change, the allocations re-applied), and the vGPUs of the pods bound so far, by this extender or
another replica (`observe`: from their assignment annotations).

Not thread-safe: the extender's lock guards it (core.py), and a bind's decision and its record
are made under that one lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sharegpu.errors import SpecError
from sharegpu.kube.assignment import read_assignment
from sharegpu.kube.bindings import holds
from sharegpu.kube.events import EventSink
from sharegpu.kube.extender.translate import placement_request
from sharegpu.kube.extender.wire import resource_version
from sharegpu.kube.inventory import Inventory, InventoryError, node_name, placement_node, read_inventory
from sharegpu.kube.request import PodRequestError, pod_finished, pod_request
from sharegpu.placement import ClusterState, Placement, Request, Workload
from sharegpu.placement.policies import Policy

NO_INVENTORY = "no sharegpu inventory on this node (is the sharegpu agent running on it?)"


@dataclass(frozen=True)
class Known:
    node: Mapping[str, Any]
    inventory: Inventory


class ClusterCache:
    def __init__(
        self, policy: Policy, workload: Workload, events: EventSink, clock: Callable[[], float]
    ) -> None:
        self.policy = policy  # warmed for the workload's shapes at every rebuild
        self.workload = workload  # the request shapes fragmentation is measured against
        self.events = events
        self.clock = clock
        self.state: ClusterState | None = None
        self.known: dict[str, Known] = {}
        self._layout: dict[str, tuple[object, ...]] = {}
        self.bound: dict[str, tuple[Placement, Request]] = {}  # pod uid -> where it went
        # pod uid -> the resourceVersion of this extender's write of its assignment: a watch
        # event older than that (the pod before the bind) must not undo the bind.
        self.written: dict[str, int] = {}
        self.binding: set[str] = set()  # pod uids whose bind is with the API server now
        self.published_at = np.zeros(0)  # per state index: when the node's inventory was published
        self._index_cache: list[tuple[list[str], np.ndarray[Any, np.dtype[np.int64]]]] = []

    def learn(self, nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
        unusable: dict[str, str] = {}
        changed = False
        for node in nodes:
            name = node_name(node)
            try:
                inventory = read_inventory(node)
                if inventory is None:
                    unusable[name] = NO_INVENTORY
                    changed |= self.drop(name)
                    continue
                layout = (placement_node(node, inventory), tuple(inventory.gpus))
            except InventoryError as err:
                unusable[name] = str(err)
                changed |= self.drop(name)
                continue
            self.known[name] = Known(node=node, inventory=inventory)
            if self.state is not None and name in self.state.index:
                self.published_at[self.state.index[name]] = inventory.published_at
            if self._layout.get(name) != layout:
                self._layout[name] = layout
                changed = True
        if changed or (self.state is None and self.known):
            self.rebuild()
        return unusable

    def drop(self, name: str) -> bool:
        """Forget a node (gone, or no longer publishing a usable inventory); whether it was known."""
        self._layout.pop(name, None)
        return self.known.pop(name, None) is not None

    def indexes(self, names: list[str]) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The state index of each name (-1: unknown). The scheduler sends the same names call
        after call (every node to filter, then what filter kept to prioritize), so the last few
        lists are kept, the most recently used first; filter adds the list it answers with."""
        for k, (known, index) in enumerate(self._index_cache):
            if known == names:
                if k:
                    self._index_cache.insert(0, self._index_cache.pop(k))
                return index
        state = self.state
        assert state is not None
        index = np.array([state.index.get(name, -1) for name in names], dtype=np.int64)
        self.remember(names, index)
        return index

    def remember(self, names: list[str], index: np.ndarray[Any, np.dtype[np.int64]]) -> None:
        self._index_cache = [(names, index), *self._index_cache[:2]]

    def rebuild(self) -> None:
        # In the order the nodes were first seen: ties between nodes go as in the simulator.
        nodes = [placement_node(k.node, k.inventory) for k in self.known.values()]
        self.state = ClusterState(nodes, self.workload)
        self._index_cache = []
        self.policy.warm(self.state, self.workload.shapes)
        self.published_at = np.array([k.inventory.published_at for k in self.known.values()])
        for uid, (placement, request) in list(self.bound.items()):
            index = self.state.index.get(placement.node)
            try:
                if index is None:
                    raise SpecError("its node is gone")
                self.state.allocate(Placement(placement.node, index, placement.gpus), request, alloc_id=uid)
            except SpecError:
                del self.bound[uid]  # its node went or changed: the pod is the API server's to judge

    def resync(
        self,
        nodes: Sequence[Mapping[str, Any]] | None = None,
        pods: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Start again from the API server's lists: all its nodes, or all the pods (those that
        hold GPUs are taken in); a kind not given is kept."""
        if nodes is not None:
            self.known.clear()
            self._layout.clear()
            self.state = None
            self.learn(nodes)
        if pods is not None:
            self.written.clear()
            for uid in list(self.bound):
                self.release(uid)
            for pod in pods:
                self.observe(pod)

    def observe(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if uid in self.binding:
            return  # being bound by this extender: its reservation stands until the bind ends
        version, written = resource_version(meta.get("resourceVersion")), self.written.get(uid)
        if written is not None and version is not None and version < written:
            return  # the pod as it was before this extender bound it
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        problem = ""
        try:
            assignment = read_assignment(meta.get("annotations"), key)
            request = pod_request(pod)
            wanted = placement_request(pod, request) if request is not None else None
        except PodRequestError as err:
            assignment, problem = None, str(err)  # not one of ours to count: the device plugin refuses it too
        previous = self.bound.get(uid)
        finished = pod_finished(pod)
        bound_to = (pod.get("spec") or {}).get("nodeName") or ""
        gpus = tuple(g.index for c in assignment.containers for g in c.gpus) if assignment else ()
        if previous is not None and not finished and bound_to == previous[0].node:
            # Bound, and its node made its tenant from the assignment it had then: an edit of
            # the annotation since changes nothing there, so it changes nothing here.
            if assignment is None or assignment.node != bound_to or gpus != previous[0].gpus:
                was = f"GPUs {list(previous[0].gpus)} of node {bound_to}"
                self.events.warn(
                    pod,
                    "AssignmentEdited",
                    f"{problem or 'its sharegpu.io/assignment changed'} after bind: {was} stay held",
                )
            return
        if assignment is None or wanted is None or not holds(dict(pod), assignment.node, self.clock()):
            self.release(uid)  # not (or no longer) holding GPUs; a pod filtered stays pending
            return
        if previous is not None and previous[0].node == assignment.node and previous[0].gpus == gpus:
            return  # known already (bound by this extender, or seen before)
        self.release(uid)
        index = self.state.index.get(assignment.node, -1) if self.state is not None else -1
        placement = Placement(assignment.node, index, gpus)
        self.bound[uid] = (placement, wanted)
        if index >= 0 and self.state is not None:
            try:
                self.state.allocate(placement, wanted, alloc_id=uid)
            except SpecError:
                del self.bound[uid]  # no longer fits what the node is: the API server's to judge

    def forget(self, uid: str) -> None:
        """A pod deleted or finished: what it held is free."""
        self.written.pop(uid, None)
        self.release(uid)

    def release(self, uid: str) -> None:
        if self.bound.pop(uid, None) is not None and self.state is not None and uid in self.state.allocations:
            self.state.release(uid)

    def reserve(self, uid: str, chosen: Placement, wanted: Request) -> None:
        """Record a bind the API server took (a resync meanwhile read the pod before it)."""
        index = self.state.index.get(chosen.node) if self.state is not None else None
        if self.state is None or index is None:
            return  # its node went meanwhile: the API server's to judge
        try:
            self.state.allocate(Placement(chosen.node, index, chosen.gpus), wanted, alloc_id=uid)
            self.bound[uid] = (chosen, wanted)
        except SpecError:
            pass  # what this extender knows says it does not fit; the API server's fence said it does
