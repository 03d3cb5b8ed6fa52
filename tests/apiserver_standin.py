"""A stand-in for the few Kubernetes API-server endpoints that sharegpu uses, for tests that drive
the real `kubernetes` client against it (no kube-apiserver can be installed where the tests run).
Written from the API conventions (api-concepts: resourceVersion, watch, Status, patches), not from
the server's code; it models what sharegpu's binder, leader election and node component rely on.

What it implements:
- nodes (cluster-scoped), pods, events and configmaps in core/v1, leases in coordination.k8s.io/v1
  (the table `RESOURCES`, one line a resource): list, create, get, replace (PUT), patch, delete;
  `pods/{name}/status` and `nodes/{name}/status`; pod bindings, at `pods/{name}/binding` and at the
  namespace's `bindings` (where `CoreV1Api.create_namespaced_binding` posts), answered as the server
  does with a Status of Success (201); a binding's annotations are copied onto the pod;
- one resourceVersion counter for the whole store, bumped by every write: an object's
  `metadata.resourceVersion` is the counter at its last write, a list's is the counter now;
- optimistic concurrency: a PUT, or a patch whose result carries a resourceVersion, other than the
  stored one is a 409 Conflict; without one the write is unconditional. A uid in a PUT, a Binding or
  DeleteOptions.preconditions is a precondition too (409); in a patch it is immutable (422). A
  write that changes nothing is no write (no new resourceVersion, no event), as on the server;
- errors as the server's `Status` objects (reasons, codes, message styles);
- patches: merge-patch+json and strategic-merge-patch+json both as RFC 7386 JSON merge patch (null
  deletes a key), json-patch+json as RFC 6902 (add, remove, replace, move, copy, test);
- fieldSelector (metadata.name, metadata.namespace and the fields each resource lists) with `=`,
  `==`, `!=`; labelSelector with `=`, `==`, `!=`, `k`, `!k`, `in`, `notin`; a comma means AND;
- watches (`?watch=true`): newline-delimited JSON events over chunked HTTP/1.1, from a
  resourceVersion, or (none or "0") the matching objects as ADDED first; selectors applied as the
  watch cache applies them (an object that stops matching is sent as DELETED, with the content it
  last matched); `timeoutSeconds`; from a version older than the bounded history (`history=`), one
  ERROR event (410 Expired), then the end.

What it does not: authentication, authorization, admission, API discovery, validation beyond
names, defaulting (but a pod's `status.phase`, Pending when missing: the server also discards a
status given on create, kept here so that a test can make a Running pod in one call), strategic
merge of lists by merge key (a list in a patch replaces the list), server-side apply, graceful
deletion and finalizers (a DELETE removes the object at once, a pod too), generation,
managedFields, pagination (`limit` is ignored, no `continue`), resourceVersion on reads (always
the latest), bookmarks, YAML/protobuf/CBOR. `/status` endpoints read and write the whole object.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import random
import re
import socket
import string
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

Obj = dict[str, Any]
Key = tuple[str, str, str]  # (resource, namespace or "", name)
Predicate = Callable[[Obj], bool]


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group_version: str  # "v1" is the core group, served under /api
    namespaced: bool = True
    fields: tuple[str, ...] = ()  # selectable beyond metadata.name and metadata.namespace
    subresources: tuple[str, ...] = ()

    @property
    def prefix(self) -> str:
        return "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"

    @property
    def group(self) -> str:
        return self.group_version.rpartition("/")[0]

    def named(self, kind: str = "") -> str:  # as messages name it: pods, leases.coordination.k8s.io
        kind = kind or self.plural
        return f"{kind}.{self.group}" if self.group else kind

    def details(self, name: str, kind: str = "") -> Obj:
        return {"name": name, **({"group": self.group} if self.group else {}), "kind": kind or self.plural}


POD_FIELDS = ("spec.nodeName", "spec.schedulerName", "status.phase")
EVENT_FIELDS = ("involvedObject.kind", "involvedObject.name", "reason", "type")
RESOURCES = {
    r.plural: r
    for r in (
        Resource("nodes", "Node", "v1", False, ("spec.unschedulable",), ("status",)),
        Resource("pods", "Pod", "v1", True, POD_FIELDS, ("status", "binding")),
        Resource("events", "Event", "v1", True, EVENT_FIELDS),
        Resource("configmaps", "ConfigMap", "v1"),
        Resource("leases", "Lease", "coordination.k8s.io/v1"),
    )
}

FIRST_VERSION = 1000  # the store's resourceVersion before its first write
_PATH = re.compile(
    r"^(?P<prefix>/api/v1|/apis/[^/]+/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?"
    r"/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?/?$"
)
_MERGE_PATCHES = ("application/merge-patch+json", "application/strategic-merge-patch+json")
_JSON_PATCH = "application/json-patch+json"
_MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"
_OTHER_NAMESPACE = "the namespace of the provided object does not match the namespace sent on the request"
_NO_NAME = "metadata.name: Required value: name or generateName is required"


class ApiError(Exception):
    """An answer that is a `Status` of failure."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Obj:
        out = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        out |= {"message": self.message, "reason": self.reason}
        return out | ({"details": self.details} if self.details else {}) | {"code": self.code}


def _not_found(res: Resource, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{res.named()} "{name}" not found', res.details(name))


def _conflict(res: Resource, name: str, why: str, kind: str = "") -> ApiError:
    message = f'Operation cannot be fulfilled on {res.named(kind)} "{name}": {why}'
    return ApiError(409, "Conflict", message, res.details(name, kind))


def _uid_conflict(res: Resource, name: str, given: str, stored: str, kind: str = "") -> ApiError:
    return _conflict(
        res, name, f"Precondition failed: UID in precondition: {given}, UID in object meta: {stored}", kind
    )


def _invalid(kind: str, name: str, why: str) -> ApiError:
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {why}', {"name": name, "kind": kind})


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


_NO_PATH = ApiError(404, "NotFound", "the server could not find the requested resource")


class _Change(NamedTuple):
    rv: int
    resource: str
    old: Obj | None  # None: created
    new: Obj | None  # None: deleted


@dataclass
class _Fault:
    method: str
    path: re.Pattern[str]
    error: ApiError
    times: int


class ApiServerStandIn:
    """An in-memory API server on 127.0.0.1 (a free port), until close(). Stored objects are never
    changed in place (every write stores a new dict), so they are serialised outside the lock."""

    def __init__(self, history: int = 1000, watch_timeout: float = 300.0) -> None:
        if history < 1:
            raise ValueError("history must keep at least one change")
        self.watch_timeout = watch_timeout  # a watch's length when it names no timeoutSeconds
        self._cond = threading.Condition()  # the one lock; wakes watchers on every write
        self._objects: dict[Key, Obj] = {}
        # Not 0, which a watch reads as "any version": as on a cluster, no version handed out is
        # 0, and those before the first write are gone from the history.
        self._rv = self._evicted = FIRST_VERSION  # _evicted: the newest version not in _history
        self._history: deque[_Change] = deque(maxlen=history)
        self._requests: list[tuple[str, str]] = []
        self._faults: list[_Fault] = []
        self._closed = False
        self._streams = 0  # watches still writing their answer
        self._server = _Server(self)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def __enter__(self) -> ApiServerStandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops serving: open watches end, kept-alive connections are cut."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            # Let open watches write their last chunk, so that clients see them end, not break.
            self._cond.wait_for(lambda: not self._streams, timeout=2.0)
        self._server.shutdown()
        self._server.cut_connections()
        self._server.server_close()
        self._thread.join()

    def api_client(self) -> ApiClient:
        """A `kubernetes.client.ApiClient` for this server (no auth); close it after use."""
        from kubernetes import client

        return client.ApiClient(client.Configuration(host=self.url))

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig file naming this server (no auth), for a command under test (`KUBECONFIG`)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "nobody", "user": {}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "nobody"}}],
            "current-context": "standin",
        }
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    # -- helpers for tests -------------------------------------------------------------------

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path without the query) of every request so far, in order."""
        with self._cond:
            return list(self._requests)

    @property
    def resource_version(self) -> str:
        with self._cond:
            return str(self._rv)

    def create(self, resource: str, obj: Obj) -> Obj:
        """Stores obj as a POST would (uid, timestamps, resourceVersion), in its namespace or
        "default". The client reads it back into its models only if it is complete enough for them
        (a pod needs spec.containers)."""
        res, obj = RESOURCES[resource], copy.deepcopy(obj)
        ns = ((obj.get("metadata") or {}).get("namespace") or "default") if res.namespaced else ""
        obj.setdefault("metadata", {}).pop("resourceVersion", None)
        with self._cond:
            return copy.deepcopy(self._create(res, ns, obj))

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        with self._cond:
            found = self._objects.get((resource, namespace or "", name))
            return copy.deepcopy(found) if found is not None else None

    def objects(self, resource: str) -> list[Obj]:
        with self._cond:
            return [copy.deepcopy(o) for k, o in sorted(self._objects.items()) if k[0] == resource]

    def bump(
        self, resource: str, namespace: str | None, name: str, mutate: Callable[[Obj], None] | None = None
    ) -> str:
        """A write to the object (by `mutate` if given, else of its resourceVersion alone), as a
        kubelet's status update racing a writer would be. Returns the new resourceVersion."""
        key = (resource, namespace or "", name)
        with self._cond:
            new = copy.deepcopy(self._objects[key])  # KeyError if there is none
            if mutate is not None:
                mutate(new)
            self._commit(RESOURCES[resource], key, self._objects[key], new)
            return str(self._rv)

    def fail_next(
        self,
        method: str,
        path_regex: str,
        *,
        status: int = 500,
        reason: str = "InternalError",
        times: int = 1,
        message: str = "injected failure",
    ) -> None:
        """The next `times` requests by `method` ("*": any) whose path matches `path_regex`
        (re.search) get that failure Status instead of an answer."""
        fault = _Fault(method.upper(), re.compile(path_regex), ApiError(status, reason, message), times)
        with self._cond:
            self._faults.append(fault)

    # -- serving ------------------------------------------------------------------------------

    def _serve(
        self, method: str, target: str, content_type: str, body: bytes
    ) -> tuple[int, Obj] | Iterator[Obj]:
        url = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        with self._cond:
            self._requests.append((method, url.path))
            for fault in self._faults:
                if fault.method in ("*", method) and fault.path.search(url.path):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    raise fault.error
        m = _PATH.match(url.path)
        if m is None:
            raise _NO_PATH
        prefix, ns, plural, name, sub = (
            g and unquote(g) for g in m.group("prefix", "ns", "plural", "name", "sub")
        )
        ns = ns or ""
        if prefix == "/api/v1" and plural == "bindings" and ns and name is None:
            _allow(method, "POST")
            with self._cond:
                return 201, self._bind(ns, None, _json(body))
        res = RESOURCES.get(plural)
        if (
            res is None
            or res.prefix != prefix
            or (ns and not res.namespaced)
            or (name is not None and res.namespaced and not ns)
            or (sub is not None and sub not in res.subresources)
        ):
            raise _NO_PATH
        if name is None:
            # A namespaced resource is listed across namespaces, but created in one.
            _allow(method, "GET", *(("POST",) if ns or not res.namespaced else ()))
            if method == "POST":
                with self._cond:
                    return 201, self._create(res, ns, _json(body), from_api=True)
            selected = _selection(res, ns, query)
            if _parse_bool(query.get("watch", "")):
                timeout = _number(query.get("timeoutSeconds")) or self.watch_timeout
                return self._watch(res, selected, query.get("resourceVersion", ""), timeout)
            with self._cond:
                return 200, self._list(res, selected)
        if sub == "binding":
            _allow(method, "POST")
            with self._cond:
                return 201, self._bind(ns, name, _json(body))
        _allow(method, "GET", "PUT", "PATCH", *(("DELETE",) if sub is None else ()))
        with self._cond:
            current = self._objects.get((res.plural, ns, name))
            if current is None:
                raise _not_found(res, name)
            if method == "GET":
                return 200, current
            if method == "PUT":
                return 200, self._replace(res, current, _json(body))
            if method == "PATCH":
                return 200, self._patch(res, current, content_type, _json(body))
            return 200, self._delete(res, current, _json(body) if body.strip() else {})

    # -- the store (all under self._cond) ------------------------------------------------------

    def _commit(self, res: Resource, key: Key, old: Obj | None, new: Obj | None) -> Obj:
        self._rv += 1
        if new is not None:
            new["metadata"]["resourceVersion"] = str(self._rv)
            self._objects[key] = new
        else:
            del self._objects[key]
        if len(self._history) == self._history.maxlen:
            self._evicted = self._history[0].rv
        self._history.append(_Change(self._rv, res.plural, old, new))
        self._cond.notify_all()
        return new if new is not None else _at_version(old or {}, self._rv)

    def _create(self, res: Resource, ns: str, obj: Obj, from_api: bool = False) -> Obj:
        meta = _metadata(obj, res)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(
                random.choices(string.ascii_lowercase + string.digits, k=5)
            )
        name = meta.get("name") or ""
        if not name:
            raise _invalid(res.kind, "", _NO_NAME)
        if res.namespaced and meta.get("namespace", ns) != ns:
            raise _bad_request(_OTHER_NAMESPACE)
        meta.pop("namespace", None)
        if from_api and meta.get("resourceVersion"):
            raise _bad_request("resourceVersion should not be set on objects to be created")
        key = (res.plural, ns, name)
        if key in self._objects:
            raise ApiError(409, "AlreadyExists", f'{res.named()} "{name}" already exists', res.details(name))
        meta |= {"namespace": ns} if res.namespaced else {}
        meta |= {"uid": meta.get("uid") or str(uuid.uuid4()), "creationTimestamp": _now()}
        obj |= {"kind": res.kind, "apiVersion": res.group_version}
        if res.plural == "pods":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
        return self._commit(res, key, None, obj)

    def _replace(self, res: Resource, current: Obj, obj: Obj) -> Obj:
        meta, cur = _metadata(obj, res), current["metadata"]
        if meta.get("name", cur["name"]) != cur["name"]:
            raise _bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({cur['name']})"
            )
        if meta.get("namespace", cur.get("namespace")) != cur.get("namespace"):
            raise _bad_request(_OTHER_NAMESPACE)
        if meta.get("uid") and meta["uid"] != cur["uid"]:
            raise _uid_conflict(res, cur["name"], meta["uid"], cur["uid"])
        return self._update(res, current, obj)

    def _patch(self, res: Resource, current: Obj, content_type: str, patch: Any) -> Obj:
        media = content_type.split(";", maxsplit=1)[0].strip().lower()
        if media in _MERGE_PATCHES and isinstance(patch, dict):
            patched = merge_patch(current, patch)
        elif media == _JSON_PATCH and isinstance(patch, list):
            patched = json_patch(current, patch)
        elif media in (*_MERGE_PATCHES, _JSON_PATCH):
            raise _bad_request(
                f"a {media} body must be a JSON {'array' if media == _JSON_PATCH else 'object'}"
            )
        else:
            accepted = ", ".join((_JSON_PATCH, *_MERGE_PATCHES))
            message = (
                f"the body of the request was in an unknown format - accepted media types include: {accepted}"
            )
            raise ApiError(415, "UnsupportedMediaType", message)
        meta, cur = _metadata(patched, res), current["metadata"]
        for field in ("name", "uid"):
            if meta.get(field) != cur[field]:
                why = f'metadata.{field}: Invalid value: "{meta.get(field)}": field is immutable'
                raise _invalid(res.kind, cur["name"], why)
        return self._update(res, current, patched)

    def _update(self, res: Resource, current: Obj, obj: Obj) -> Obj:
        meta, cur = obj["metadata"], current["metadata"]
        if meta.get("resourceVersion") and meta["resourceVersion"] != cur["resourceVersion"]:
            raise _conflict(res, cur["name"], _MODIFIED)
        meta |= {
            k: cur[k]
            for k in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion")
            if k in cur
        }
        obj |= {"kind": res.kind, "apiVersion": res.group_version}
        if obj == current:
            return current
        return self._commit(res, _key(res, current), current, obj)

    def _delete(self, res: Resource, current: Obj, options: Any) -> Obj:
        pre = (options.get("preconditions") if isinstance(options, dict) else None) or {}
        cur = current["metadata"]
        if pre.get("uid") and pre["uid"] != cur["uid"]:
            raise _uid_conflict(res, cur["name"], pre["uid"], cur["uid"])
        if pre.get("resourceVersion") and pre["resourceVersion"] != cur["resourceVersion"]:
            why = f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, "
            raise _conflict(
                res, cur["name"], why + f"ResourceVersion in object meta: {cur['resourceVersion']}"
            )
        return self._commit(res, _key(res, current), current, None)

    def _bind(self, ns: str, name: str | None, binding: Any) -> Obj:
        pods = RESOURCES["pods"]
        meta = _metadata(binding, pods)
        if name is None:
            name = meta.get("name") or ""
            if not name:
                raise _invalid("Binding", "", _NO_NAME)
        elif meta.get("name", name) != name:
            raise _bad_request("name in URL does not match name in Binding object")
        node = (binding.get("target") or {}).get("name") or ""
        if not node:
            raise _invalid("Binding", name, "target.name: Required value")
        current = self._objects.get(("pods", ns, name))
        if current is None:
            raise _not_found(pods, name)
        uid = current["metadata"]["uid"]
        if meta.get("uid") and meta["uid"] != uid:
            raise _uid_conflict(pods, name, meta["uid"], uid, "pods/binding")
        assigned = (current.get("spec") or {}).get("nodeName")
        if assigned:
            raise _conflict(
                pods, name, f'pod {name} is already assigned to node "{assigned}"', "pods/binding"
            )
        pod = copy.deepcopy(current)
        pod.setdefault("spec", {})["nodeName"] = node
        if meta.get("annotations"):
            pod["metadata"].setdefault("annotations", {}).update(meta["annotations"])
        status = pod.setdefault("status", {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        status["conditions"] = [
            *conditions,
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
        ]
        self._commit(pods, ("pods", ns, name), current, pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _list(self, res: Resource, selected: Predicate) -> Obj:
        # Items carry no kind/apiVersion: the list's say it.
        items = [
            {k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
            for o in self._matching(res, selected)
        ]
        meta = {"resourceVersion": str(self._rv)}
        return {"kind": f"{res.kind}List", "apiVersion": res.group_version, "metadata": meta, "items": items}

    def _matching(self, res: Resource, selected: Predicate) -> list[Obj]:
        return [o for k, o in sorted(self._objects.items()) if k[0] == res.plural and selected(o)]

    def _watch(self, res: Resource, selected: Predicate, since: str, timeout: float) -> Iterator[Obj]:
        with self._cond:
            if since in ("", "0"):
                pos, initial = self._rv, self._matching(res, selected)
            elif since.isdigit():
                pos, initial = int(since), []
            else:
                raise _bad_request(f'resourceVersion: Invalid value: "{since}": must be an integer')
        return self._events(res, selected, pos, initial, time.monotonic() + timeout)

    @contextlib.contextmanager
    def _streaming(self) -> Iterator[None]:
        with self._cond:
            self._streams += 1
        try:
            yield
        finally:
            with self._cond:
                self._streams -= 1
                self._cond.notify_all()

    def _past(self, pos: int) -> bool:
        return self._closed or self._rv > pos

    def _events(
        self, res: Resource, selected: Predicate, pos: int, initial: list[Obj], deadline: float
    ) -> Iterator[Obj]:
        for obj in initial:
            yield {"type": "ADDED", "object": obj}
        while True:
            with self._cond:  # never held across a yield: the client may be slow to read
                self._cond.wait_for(functools.partial(self._past, pos), deadline - time.monotonic())
                if self._closed or self._rv <= pos:
                    return
                message = f"too old resource version: {pos} ({self._evicted})"
                expired = ApiError(410, "Expired", message).status() if pos < self._evicted else None
                changes = [] if expired else list(self._history)[len(self._history) - (self._rv - pos) :]
                pos = self._rv
            if expired is not None:
                yield {"type": "ERROR", "object": expired}
                return
            for change in changes:
                event = _event(change, res, selected)
                if event is not None:
                    yield event


def _event(change: _Change, res: Resource, selected: Predicate) -> Obj | None:
    """What a watch of `res` filtered by `selected` sees of a change."""
    if change.resource != res.plural:
        return None
    was = change.old is not None and selected(change.old)
    if change.new is not None and selected(change.new):
        return {"type": "MODIFIED" if was else "ADDED", "object": change.new}
    if was and change.old is not None:
        return {"type": "DELETED", "object": _at_version(change.old, change.rv)}
    return None


def _selection(res: Resource, ns: str, query: dict[str, str]) -> Predicate:
    fields = _field_selector(res, query.get("fieldSelector", ""))
    labels = _label_selector(query.get("labelSelector", ""))

    def selected(obj: Obj) -> bool:
        meta = obj["metadata"]
        return (not ns or meta.get("namespace") == ns) and fields(obj) and labels(meta.get("labels") or {})

    return selected


def _field_selector(res: Resource, text: str) -> Predicate:
    terms: list[tuple[list[str], bool, str]] = []  # (path, negated, value)
    for term in filter(None, (t.strip() for t in text.split(","))):
        m = re.fullmatch(r"([^=!]+?)\s*(==|!=|=)\s*(.*)", term)
        if m is None:
            raise _bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        field, op, value = m.groups()
        if field not in ("metadata.name", "metadata.namespace", *res.fields):
            raise _bad_request(f"field label not supported: {field}")
        terms.append((field.split("."), op == "!=", value))
    return lambda obj: all((_field(obj, path) == value) != negated for path, negated, value in terms)


def _field(obj: Any, path: list[str]) -> str:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    if isinstance(obj, bool):
        return "true" if obj else "false"
    return "" if obj is None else str(obj)


_LABEL_TERM = re.compile(
    r"\s*(?:!\s*(?P<absent>[\w./-]+)|(?P<key>[\w./-]+)\s*(?:(?P<op>==|!=|=)\s*(?P<value>[\w.-]*)"
    r"|\s+(?P<set>in|notin)\s*\((?P<values>[^)]*)\))?)\s*"
)


def _label_selector(text: str) -> Callable[[dict[str, str]], bool]:
    terms: list[tuple[str, str, set[str]]] = []  # (key, operator, values)
    for term in filter(str.strip, re.split(r",(?![^(]*\))", text)):
        m = _LABEL_TERM.fullmatch(term)
        if m is None:
            raise _bad_request(f"unable to parse requirement: {term!r}")
        if m["absent"]:
            terms.append((m["absent"], "!", set()))
        elif m["set"]:
            terms.append((m["key"], m["set"], {v.strip() for v in m["values"].split(",")}))
        else:
            terms.append((m["key"], (m["op"] or "exists").replace("==", "="), {m["value"] or ""}))

    def holds(labels: dict[str, str], key: str, op: str, values: set[str]) -> bool:
        if op in ("!=", "notin"):  # true of an object without the label, as on the server
            return labels.get(key) not in values
        if op == "!":
            return key not in labels
        return key in labels and (op == "exists" or labels[key] in values)

    return lambda labels: all(holds(labels, *term) for term in terms)


# -- patches ----------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class _PatchError(Exception):
    pass


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 on a copy of doc; an operation that fails (a `test` too) is a 422, as on the server."""
    doc = copy.deepcopy(doc)
    try:
        for op in ops:
            if not isinstance(op, dict) or not isinstance(op.get("path"), str):
                raise _PatchError(f"invalid operation {op!r}")
            kind, path = op.get("op"), _pointer(op["path"])
            if kind == "test" and _resolve(doc, path) != op.get("value"):
                raise _PatchError(f"testing value {op['path']} failed")
            if kind in ("remove", "replace"):
                _remove(doc, path)
            if kind in ("add", "replace"):
                doc = _add(doc, path, op.get("value"))
            elif kind in ("move", "copy"):
                source = _pointer(str(op.get("from", "")))
                value = copy.deepcopy(_resolve(doc, source))
                if kind == "move":
                    _remove(doc, source)
                doc = _add(doc, path, value)
            elif kind not in ("test", "remove"):
                raise _PatchError(f"unexpected operation {kind!r}")
    except _PatchError as err:
        raise ApiError(
            422, "Invalid", f"the server rejected our request due to an error in our request: {err}"
        ) from None
    return doc


def _pointer(path: str) -> list[str]:
    if path and not path.startswith("/"):
        raise _PatchError(f"invalid JSON pointer {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _index(token: str, size: int) -> int:
    if not token.isdigit() or int(token) >= size:
        raise _PatchError(f"index {token!r} out of range")
    return int(token)


def _resolve(doc: Any, path: list[str]) -> Any:
    for token in path:
        if isinstance(doc, dict) and token in doc:
            doc = doc[token]
        elif isinstance(doc, list):
            doc = doc[_index(token, len(doc))]
        else:
            raise _PatchError(f"missing path /{'/'.join(path)}")
    return doc


def _add(doc: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent, last = _resolve(doc, path[:-1]), path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else _index(last, len(parent) + 1), value)
    else:
        raise _PatchError(f"cannot add at /{'/'.join(path)}")
    return doc


def _remove(doc: Any, path: list[str]) -> None:
    if not path:
        raise _PatchError("cannot remove the whole document")
    parent, last = _resolve(doc, path[:-1]), path[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(last, len(parent))]
    else:
        raise _PatchError(f"missing path /{'/'.join(path)}")


# -- small parts ------------------------------------------------------------------------------


def _metadata(obj: Any, res: Resource) -> Obj:
    if not isinstance(obj, dict) or not isinstance(obj.setdefault("metadata", {}), dict):
        raise _bad_request(f"the body must be a JSON object with an object for metadata (a {res.kind})")
    meta: Obj = obj["metadata"]
    return meta


def _key(res: Resource, obj: Obj) -> Key:
    return (res.plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _at_version(obj: Obj, rv: int) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body or b"null")
    except ValueError as err:
        raise _bad_request(f"the body of the request is not JSON: {err}") from None


def _number(text: str | None) -> float:
    try:
        return float(text or 0)
    except ValueError:
        raise _bad_request(f'invalid number "{text}"') from None


def _parse_bool(text: str) -> bool:
    # As Go's strconv.ParseBool, which the server reads ?watch= with.
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("", "0", "f", "F", "false", "FALSE", "False"):
        return False
    raise _bad_request(f'invalid boolean value "{text}"')


def _allow(method: str, *allowed: str) -> None:
    if method not in allowed:
        raise ApiError(
            405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, standin: ApiServerStandIn) -> None:
        self.standin = standin
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def track(self, conn: socket.socket, alive: bool) -> None:
        with self._conns_lock:
            (self._conns.add if alive else self._conns.discard)(conn)

    def cut_connections(self) -> None:
        # A kept-alive connection would otherwise still be served after close().
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked watches, as the client expects
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without this, Nagle and the client's delayed ACK
        # hold the body back ~40 ms on every request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            answer = self.server.standin._serve(
                self.command, self.path, self.headers.get("Content-Type", ""), body
            )
        except ApiError as err:
            answer = (err.code, err.status())
        except Exception as err:  # a bug in the stand-in: say so as the server would, not hang the client
            answer = (500, ApiError(500, "InternalError", f"stand-in failed: {err!r}").status())
        try:
            if isinstance(answer, tuple):
                self._send(*answer)
            else:
                with self.server.standin._streaming():
                    self._stream(answer)
        except OSError:  # the client went away
            self.close_connection = True

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _send(self, code: int, obj: Obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: Iterator[Obj]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in events:
            line = json.dumps(event).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
