"""The scheduler extender: the kube-scheduler asks it which nodes can take a pod's vGPUs
(`filter`), which it prefers (`prioritize`) and lets it `bind` the pod, choosing the GPUs.

Every decision is `sharegpu.placement` (engine.decide with the node mask the scheduler passes):
the same code as `sharegpu simulate`, not a copy. The state is a `ClusterState` of every node
the scheduler has shown, with a fresh inventory (inventory.py), and the vGPUs of the pods bound
so far (`observe` for pods bound before, or by another replica); it is rebuilt when a node
appears or its GPUs change, with the allocations re-applied.

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
  lock makes two binds at once decide one after the other, so they never share free room.

The HTTP server (`serve`) speaks the extender API's JSON (capitalised keys: `Pod`, `Nodes`,
`NodeNames`, `FailedNodes`, ...).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sharegpu.errors import SpecError
from sharegpu.kube.assignment import AssignedContainer, AssignedGpu, Assignment, read_assignment
from sharegpu.kube.inventory import (
    STALE_AFTER_S,
    Inventory,
    InventoryError,
    node_name,
    placement_node,
    quantity,
    read_inventory,
)
from sharegpu.kube.request import PodRequest, PodRequestError, pod_request
from sharegpu.placement import (
    DEFAULT_POLICY,
    ClusterState,
    Placement,
    Priority,
    Request,
    Workload,
    engine,
    make_policy,
)
from sharegpu.placement.engine import decide

MAX_SCORE = 10  # the extender API's MaxExtenderPriority
MAX_PENDING = 10_000  # pods filtered and not bound yet, remembered for their bind
_NO_INVENTORY = "no sharegpu inventory on this node (is the sharegpu agent running on it?)"


class Binder(Protocol):
    """Writes a decision to the API server: the assignment annotation and the binding."""

    def bind(self, namespace: str, name: str, uid: str, assignment: Assignment) -> None: ...


@dataclass
class _Pending:
    """A pod filtered and not bound yet: what it asks, and prioritize's decision for its bind."""

    request: PodRequest
    wanted: Request
    chosen: Placement | None = None


@dataclass(frozen=True)
class _Known:
    node: Mapping[str, Any]
    inventory: Inventory


def placement_request(pod: Mapping[str, Any], request: PodRequest) -> Request:
    """The placement request of a pod: its one vGPU container's vGPUs and the pod's CPU and memory."""
    if len(request.containers) != 1:
        raise PodRequestError(
            f"pod {request.key}: vGPUs in {len(request.containers)} containers; one container per pod "
            "may have vGPUs so far"
        )
    (container,) = request.containers
    cpu = memory = 0.0
    for spec in (pod.get("spec") or {}).get("containers") or []:
        asked = (spec.get("resources") or {}).get("requests") or {}
        try:
            cpu += quantity(asked.get("cpu", "0"))
            memory += quantity(asked.get("memory", "0"))
        except SpecError as err:
            raise PodRequestError(f"pod {request.key}: requests {err}") from err
    return Request(
        count=container.count,
        compute_milli=container.compute_pct * 10,
        memory_mib=container.memory_mib or 0,
        cpu_milli=round(cpu * 1000),
        host_memory_mib=int(memory // (1 << 20)),
        models=request.models,
        priority=Priority(request.priority),
        name=request.key,
    )


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
    ) -> None:
        self.binder = binder
        self.policy = make_policy(policy)
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.rng = np.random.default_rng(seed)
        # The request shapes fragmentation is measured against (the cluster's pod mix).
        self.workload = workload if workload is not None else Workload.default()
        self.state: ClusterState | None = None
        self._known: dict[str, _Known] = {}
        self._layout: dict[str, tuple[object, ...]] = {}
        self._bound: dict[str, tuple[Placement, Request]] = {}  # pod uid -> where it went
        self._pods: dict[str, _Pending] = {}  # pod uid -> filtered, not bound yet
        self._published_at = np.zeros(0)  # per state index: when the node's inventory was published
        self._lock = threading.Lock()

    # -- the state ---------------------------------------------------------------------------

    def _learn(self, nodes: list[Mapping[str, Any]]) -> dict[str, str]:
        """Take in the nodes the scheduler passed; {name: why it cannot be used, permanently}."""
        unusable: dict[str, str] = {}
        changed = False
        for node in nodes:
            name = node_name(node)
            try:
                inventory = read_inventory(node)
                if inventory is None:
                    unusable[name] = (
                        "no sharegpu inventory on this node (is the sharegpu agent running on it?)"
                    )
                    continue
                layout = (placement_node(node, inventory), tuple(inventory.gpus))
            except InventoryError as err:
                unusable[name] = str(err)
                continue
            self._known[name] = _Known(node=node, inventory=inventory)
            if self.state is not None and name in self.state.index:
                self._published_at[self.state.index[name]] = inventory.published_at
            if self._layout.get(name) != layout:
                self._layout[name] = layout
                changed = True
        if changed or (self.state is None and self._known):
            self._rebuild()
        return unusable

    def _rebuild(self) -> None:
        # In the order the scheduler first listed them: ties between nodes go as in the simulator.
        nodes = [placement_node(k.node, k.inventory) for k in self._known.values()]
        self.state = ClusterState(nodes, self.workload)
        self.policy.warm(self.state, self.workload.shapes)
        self._published_at = np.array([k.inventory.published_at for k in self._known.values()])
        for uid, (placement, request) in list(self._bound.items()):
            index = self.state.index.get(placement.node)
            try:
                if index is None:
                    raise SpecError("its node is gone")
                self.state.allocate(Placement(placement.node, index, placement.gpus), request, alloc_id=uid)
            except SpecError:
                del self._bound[uid]  # its node went or changed: the pod is the API server's to judge

    def observe(self, pod: Mapping[str, Any]) -> None:
        """Record a pod bound already (by an earlier run, or another replica) from its assignment."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        assignment = read_assignment(meta.get("annotations"), key)
        request = pod_request(pod)
        if assignment is None or request is None or uid in self._bound:
            return
        with self._lock:
            gpus = tuple(g.index for c in assignment.containers for g in c.gpus)
            wanted = placement_request(pod, request)
            placement = Placement(
                assignment.node, self.state.index.get(assignment.node, -1) if self.state else -1, gpus
            )
            self._bound[uid] = (placement, wanted)
            if placement.node_index >= 0 and self.state is not None:
                try:
                    self.state.allocate(placement, wanted, alloc_id=uid)
                except SpecError:
                    del self._bound[uid]  # no longer fits what the node is: the API server's to judge

    # -- the verbs -----------------------------------------------------------------------------

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        pod = args.get("Pod") or {}
        nodes = list((args.get("Nodes") or {}).get("items") or [])
        names = [node_name(n) for n in nodes] or list(args.get("NodeNames") or [])
        failed: dict[str, str] = {}
        final: dict[str, str] = {}
        try:
            request = pod_request(pod)
        except PodRequestError as err:
            return _filter_result(nodes, [], {}, {n: str(err) for n in names})
        if request is None:  # no vGPU: every node the scheduler chose will do
            return _filter_result(nodes, names, {}, {})
        try:
            wanted = placement_request(pod, request)
        except PodRequestError as err:
            return _filter_result(nodes, [], {}, {n: str(err) for n in names})
        with self._lock:
            uid = str((pod.get("metadata") or {}).get("uid", ""))
            if len(self._pods) >= MAX_PENDING:
                self._pods.pop(next(iter(self._pods)))  # the oldest: a pod that never came to bind
            self._pods[uid] = _Pending(request, wanted)
            final.update(self._learn(nodes))
            fits = self._sort_nodes([n for n in names if n not in final], wanted, failed, final)
        return _filter_result(nodes, fits, failed, final)

    def _sort_nodes(
        self, names: list[str], request: Request, failed: dict[str, str], final: dict[str, str]
    ) -> list[str]:
        """The nodes that can take the request now; the reason of each other one, in `failed`
        (may change) or `final` (will not). Vectorised: the kube-scheduler sends every node."""
        state = self.state
        if state is None:
            failed.update(dict.fromkeys(names, _NO_INVENTORY))
            return []
        index = np.array([state.index.get(name, -1) for name in names], dtype=np.int64)
        unknown = index < 0
        n = np.where(unknown, 0, index)
        fit = np.zeros(len(state.nodes), dtype=np.bool_)
        fit[engine.candidates(state, request).nodes] = True
        model_ok = state.model_mask(request.models) if request.count else np.ones(len(state.nodes), np.bool_)
        per_gpu = (state.cap_c >= request.compute_milli) & (state.cap_m >= request.memory_mib)
        holds = per_gpu.sum(axis=1) >= request.count
        age = self.clock() - self._published_at[n]
        stale = ~unknown & (age > self.stale_after_s)
        wrong_model = ~unknown & ~stale & ~model_ok[n]
        too_small = ~unknown & ~stale & ~wrong_model & ~holds[n]
        full = ~unknown & ~stale & ~wrong_model & ~too_small & ~fit[n]
        size = f"{request.count} vGPU(s) of {request.memory_mib} MiB / {request.compute_milli / 10:g}%"
        allowed = ", ".join(sorted(request.models))
        for k in np.flatnonzero(unknown):
            failed[names[k]] = _NO_INVENTORY
        for k in np.flatnonzero(stale):
            failed[names[k]] = f"sharegpu inventory is {age[k]:.0f} s old (its agent is down or cut off)"
        for k in np.flatnonzero(wrong_model):
            final[names[k]] = f"GPU model {state.nodes[n[k]].model} is not one of {allowed}"
        for k in np.flatnonzero(too_small):
            final[names[k]] = f"its GPUs cannot hold {size} even when empty"
        busy = f"no room now for {request.describe()}"
        for k in np.flatnonzero(full):
            failed[names[k]] = busy
        ok = ~(unknown | stale | wrong_model | too_small | full)
        return [names[k] for k in np.flatnonzero(ok)]

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        pod = args.get("Pod") or {}
        nodes = list((args.get("Nodes") or {}).get("items") or [])
        names = [node_name(n) for n in nodes] or list(args.get("NodeNames") or [])
        scores: list[dict[str, Any]] = []  # a node left out scores 0 (the scheduler adds nothing)
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        with self._lock:
            pending = self._pods.get(uid)  # None: a pod without vGPUs, or one filter refused
            self._learn(nodes)
            state = self.state
            if pending is not None and state is not None:
                allowed = np.zeros(len(state.nodes) + 1, dtype=np.bool_)  # the last: unknown names
                allowed[np.array([state.index.get(name, -1) for name in names], dtype=np.int64)] = True
                allowed = allowed[:-1]
                # The policy's decision, with its random tie-break as in the simulator; kept for
                # the bind. One decision only: the others score 0 (ranking more nodes would cost
                # a decision each, and the scheduler binds the best).
                got = decide(state, pending.wanted, self.policy, self.rng, allowed)
                if isinstance(got, Placement):
                    pending.chosen = got
                    scores.append({"Host": got.node, "Score": MAX_SCORE})
        return scores

    def bind(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """ExtenderBindingArgs (PodName, PodNamespace, PodUID, Node) -> {"Error": ""} or the reason."""
        name, namespace = str(args.get("PodName") or ""), str(args.get("PodNamespace") or "default")
        uid, node = str(args.get("PodUID") or ""), str(args.get("Node") or "")
        if not (name and uid and node):
            return {"Error": "malformed bind request: PodName, PodUID and Node are required"}
        with self._lock:
            seen = self._pods.get(uid)
            if seen is None:
                return {
                    "Error": f"pod {namespace}/{name} was not filtered by this extender: scheduling it again"
                }
            request, wanted = seen.request, seen.wanted
            state, known = self.state, self._known.get(node)
            if state is None or known is None or node not in state.index:
                return {
                    "Error": f"node {node} has no sharegpu inventory: scheduling {namespace}/{name} again"
                }
            chosen = seen.chosen
            if chosen is None or chosen.node != node:
                allowed = np.zeros(len(state.nodes), dtype=np.bool_)
                allowed[state.index[node]] = True
                got = decide(state, wanted, self.policy, None, allowed)
                if not isinstance(got, Placement):
                    return {"Error": f"no room on node {node} now for {wanted.describe()}: {got.message}"}
                chosen = got
            if self.binder is None:
                return {"Error": "this extender has no binder (it was started without an API server)"}
            assignment = assignment_for(known.inventory, node, chosen, request, self.clock())
            try:
                self.binder.bind(namespace, name, uid, assignment)
            except Exception as err:  # the API server's refusal, whatever its type: the pod is retried
                return {"Error": f"binding {namespace}/{name} to {node} failed: {err}"}
            state.allocate(chosen, wanted, alloc_id=uid)
            self._bound[uid] = (chosen, wanted)
            self._pods.pop(uid, None)
        return {"Error": ""}


def _filter_result(
    nodes: list[Mapping[str, Any]], fits: list[str], failed: dict[str, str], final: dict[str, str]
) -> dict[str, Any]:
    """ExtenderFilterResult: the nodes in the form they came (objects, or names when the
    extender is node-cache capable)."""
    keep = set(fits)
    return {
        "Nodes": {"items": [n for n in nodes if node_name(n) in keep]} if nodes else None,
        "NodeNames": None if nodes else fits,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": final,
        "Error": "",
    }


def assignment_for(
    known: Inventory, node: str, placement: Placement, request: PodRequest, bound_at: float
) -> Assignment:
    """The assignment of a placement on a node, its GPUs named by the node's inventory."""
    (container,) = request.containers
    by_index = {g.index: g for g in known.gpus}
    gpus = tuple(
        AssignedGpu(
            index=i,
            uuid=by_index[i].uuid,
            memory_mib=container.memory_mib or by_index[i].memory_mib,
            compute_pct=container.compute_pct,
        )
        for i in placement.gpus
    )
    return Assignment(
        node=node,
        priority=request.priority,  # type: ignore[arg-type]
        policy=request.policy,  # type: ignore[arg-type]
        containers=(AssignedContainer(name=container.name, gpus=gpus),),
        bound_at=bound_at,
    )


class _Handler(BaseHTTPRequestHandler):
    extender: Extender  # set on the subclass serve() makes

    def do_POST(self) -> None:
        verbs: dict[str, Callable[[Mapping[str, Any]], Any]] = {
            "/filter": self.extender.filter,
            "/prioritize": self.extender.prioritize,
            "/bind": self.extender.bind,
        }
        verb = verbs.get(self.path.rstrip("/") or "/")
        if verb is None:
            self._reply(404, {"Error": f"no extender verb {self.path}: use /filter, /prioritize or /bind"})
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            args = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(args, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as err:
            self._reply(400, {"Error": f"malformed extender request: {err}"})
            return
        self._reply(200, verb(args))

    def _reply(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scheduling cycle would drown the log


def serve(extender: Extender, host: str = "0.0.0.0", port: int = 8998) -> ThreadingHTTPServer:
    """An HTTP server of the extender API (not started: call serve_forever)."""
    handler = type("Handler", (_Handler,), {"extender": extender})
    return ThreadingHTTPServer((host, port), handler)


class DryRunBinder:
    """Decides and records, writes nothing: shadow scheduling next to another scheduler, and
    the benchmark. (Binding through the API server comes with the extender's next increment.)"""

    def __init__(self) -> None:
        self.bound = 0

    def bind(self, namespace: str, name: str, uid: str, assignment: Assignment) -> None:
        self.bound += 1


def workload_json(workload: Workload) -> str:
    return json.dumps(
        [
            {
                "shape": {**dataclasses.asdict(r), "models": sorted(r.models), "priority": str(r.priority)},
                "weight": w,
            }
            for r, w in zip(workload.shapes, workload.weights, strict=True)
        ]
    )


def read_workload(path: Path) -> Workload:
    rows = json.loads(path.read_text())
    shapes = tuple(
        Request(**{**row["shape"], "models": frozenset(row["shape"].get("models", ()))}) for row in rows
    )
    return Workload(shapes=shapes, weights=tuple(float(row["weight"]) for row in rows))


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m sharegpu.kube.extender", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8998)
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument(
        "--stale-after", type=float, default=STALE_AFTER_S, help="seconds an inventory stays fresh"
    )
    ap.add_argument("--dry-run", action="store_true", help="decide and record, bind nothing (shadow mode)")
    ap.add_argument("--seed", type=int, nargs="+", default=[0], help="of the policy's random tie-breaks")
    ap.add_argument(
        "--workload",
        type=Path,
        help="the cluster's pod mix fragmentation is measured against: JSON [{shape: {count, "
        "compute_milli, memory_mib, cpu_milli, host_memory_mib, models}, weight}] (default: a generic mix)",
    )
    args = ap.parse_args(argv)
    if not args.dry_run:
        print(
            "sharegpu: error: binding through the API server is not built yet: run with --dry-run",
            file=sys.stderr,
        )
        return 2
    try:
        workload = read_workload(args.workload) if args.workload else None
    except (OSError, ValueError, TypeError, KeyError, SpecError) as err:
        print(f"sharegpu: error: --workload {args.workload}: {err}", file=sys.stderr)
        return 2
    extender = Extender(
        DryRunBinder(), policy=args.policy, stale_after_s=args.stale_after, seed=args.seed, workload=workload
    )
    server = serve(extender, args.host, args.port)
    print(
        f"sharegpu extender on {args.host}:{server.server_address[1]} (dry run)", file=sys.stderr, flush=True
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
