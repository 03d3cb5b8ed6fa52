"""Where the plugin finds the pods being started on its node, and where it records that a
container was allocated.

Pods are the API server's JSON (`metadata`, `spec`, `status`), as kube/request.py reads them.
`KubePodSource` asks the API server (kube/apiclient.py: in-cluster credentials, else the
kubeconfig); `FilePodSource` reads a JSON file of pods (a list, or a PodList's `items`) and writes
the allocation back into it: for a node without an API server, and for the tests. The file is
also what the pod reaper reconciles with then (`pods_on`, podwatch.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sharegpu.errors import ConfigError
from sharegpu.kube.apiclient import api_client
from sharegpu.kube.assignment import allocated_containers
from sharegpu.kube.request import ANNOTATION_ALLOCATED

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

Pod = dict[str, Any]


class PodSource(Protocol):
    def pending_pods(self, node: str) -> list[Pod]:
        """The pods bound to `node` that have not started (phase Pending)."""
        ...

    def mark_allocated(self, pod: Pod, container: str) -> None:
        """Add `container` to the pod's `sharegpu.io/allocated` annotation."""
        ...


def _with_container(annotations: dict[str, str] | None, container: str) -> str:
    done = allocated_containers(annotations)
    return ",".join([*done, container] if container not in done else done)


def _pending_on(pod: Pod, node: str) -> bool:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    return spec.get("nodeName") == node and (status.get("phase") or "Pending") == "Pending"


class FilePodSource:
    def __init__(self, path: Path):
        self.path = path

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield
        except OSError as err:
            raise ConfigError(f"cannot lock the pod file {self.path}: {err.strerror or err}") from err

    def _read(self) -> list[Pod]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"cannot read the pod file {self.path}: {err}") from err
        pods = data.get("items") if isinstance(data, dict) else data
        if not isinstance(pods, list) or not all(isinstance(p, dict) for p in pods):
            raise ConfigError(f"the pod file {self.path} is neither a list of pods nor a PodList")
        return pods

    def pending_pods(self, node: str) -> list[Pod]:
        with self._locked():
            return [p for p in self._read() if _pending_on(p, node)]

    def pods_on(self, node: str) -> list[Pod]:
        """Every pod bound to `node`, whatever its phase; ConfigError when the file cannot be
        read (never "no pods")."""
        with self._locked():
            return [p for p in self._read() if (p.get("spec") or {}).get("nodeName") == node]

    def mark_allocated(self, pod: Pod, container: str) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        with self._locked():
            pods = self._read()
            for found in pods:
                meta = found.setdefault("metadata", {})
                if meta.get("uid") == uid:
                    annotations = meta.setdefault("annotations", {})
                    annotations[ANNOTATION_ALLOCATED] = _with_container(annotations, container)
                    break
            else:
                raise ConfigError(f"pod {uid} is no longer in {self.path}")
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
            with os.fdopen(fd, "w") as f:
                json.dump(pods, f, indent=1)
            os.replace(tmp, self.path)


class KubePodSource:
    """The API server through the `kubernetes` client. Lists are read from the API server, not
    a cache; the plugin also remembers what it allocated, so a list that lags a patch is safe."""

    def __init__(self, api: ApiClient | None = None) -> None:
        from kubernetes import client

        self._client = api or api_client("deviceplugin")
        self._api = client.CoreV1Api(self._client)

    def pending_pods(self, node: str) -> list[Pod]:
        selector = f"spec.nodeName={node},status.phase=Pending"
        found = self._api.list_pod_for_all_namespaces(field_selector=selector)
        return [dict(self._client.sanitize_for_serialization(p)) for p in found.items]

    def mark_allocated(self, pod: Pod, container: str) -> None:
        meta = pod.get("metadata") or {}
        value = _with_container(meta.get("annotations"), container)
        body = {"metadata": {"annotations": {ANNOTATION_ALLOCATED: value}}}
        self._api.patch_namespaced_pod(str(meta.get("name")), str(meta.get("namespace") or "default"), body)
