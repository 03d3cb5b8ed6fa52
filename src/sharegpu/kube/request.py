"""What a pod asks of sharegpu: its vGPU resources and annotations, read with clear errors.

A container asks for vGPUs with extended resources, the same in `limits` and `requests` (the
API server requires extended resources to be equal in both when both are given):

    resources: {limits: {sharegpu.io/vgpu: 1, sharegpu.io/vgpu-memory: 4096, sharegpu.io/vgpu-compute: 30}}

- `sharegpu.io/vgpu`: how many vGPUs (each on a GPU of its own);
- `sharegpu.io/vgpu-memory`: MiB per vGPU; may be left out only for a whole GPU (compute 100),
  which then has all of the GPU's memory;
- `sharegpu.io/vgpu-compute`: percent of a GPU per vGPU, 1 to 100 (default 100).

The pod's annotations apply to all of its containers:

- `sharegpu.io/priority`: `online`, `normal` (default) or `offline`; a pod of one of sharegpu's
  PriorityClasses (`sharegpu-online`, ...) has its priority, and an annotation saying otherwise
  is refused as a contradiction;
- `sharegpu.io/policy`: `share` (default), `cap` or `burst` (docs/compute.md);
- `sharegpu.io/gpu-model`: the GPU models the pod may run on, comma-separated (NVML names).

Pods are read as the JSON the API server and the kube-scheduler send (`metadata`, `spec`), so
the same code reads a pod from an extender request, a watch and the `kubernetes` client
(`ApiClient().sanitize_for_serialization(pod)`). Everything wrong with a pod is reported at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes.utils import parse_quantity
from pydantic import BaseModel, ValidationError

from sharegpu.errors import SpecError

PREFIX = "sharegpu.io/"
RESOURCE_VGPU = PREFIX + "vgpu"
RESOURCE_MEMORY = PREFIX + "vgpu-memory"
RESOURCE_COMPUTE = PREFIX + "vgpu-compute"
RESOURCES = (RESOURCE_VGPU, RESOURCE_MEMORY, RESOURCE_COMPUTE)
ANNOTATION_PRIORITY = PREFIX + "priority"
ANNOTATION_POLICY = PREFIX + "policy"
ANNOTATION_GPU_MODEL = PREFIX + "gpu-model"
# Written by sharegpu itself (the extender at bind, the device plugin at allocation): a user
# may read them, not set them.
ANNOTATION_ASSIGNMENT = PREFIX + "assignment"
ANNOTATION_ALLOCATED = PREFIX + "allocated"
USER_ANNOTATIONS = (ANNOTATION_PRIORITY, ANNOTATION_POLICY, ANNOTATION_GPU_MODEL)
OWN_ANNOTATIONS = (ANNOTATION_ASSIGNMENT, ANNOTATION_ALLOCATED)

PRIORITIES = ("online", "normal", "offline")
# deploy/kubernetes's PriorityClasses: a pod in one of them has that priority unless annotated.
PRIORITY_CLASSES = {"sharegpu-online": "online", "sharegpu-normal": "normal", "sharegpu-offline": "offline"}
POLICIES = ("share", "cap", "burst")
MAX_VGPUS = 16  # per container: no node has more GPUs
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases after which a pod's containers never run again: its GPUs are free."""
_BINARY_SUFFIX = re.compile(r"[KMGTPE]i$")


class PodRequestError(SpecError):
    """A pod's vGPU request cannot be honoured as written (bad input: the pod must change)."""


_M = TypeVar("_M", bound=BaseModel)


def read_versioned(model: type[_M], text: str, *, where: str, version: int, error: type[SpecError]) -> _M:
    """A JSON annotation sharegpu wrote (`where`: "pod ns/name: sharegpu.io/..."), checked against
    its model and version; `error` names what is wrong (edited by hand, or a newer writer)."""
    try:
        data = json.loads(text)
        if isinstance(data, dict) and data.get("version", version) != version:
            raise error(f"{where} is version {data.get('version')}, this sharegpu reads version {version}")
        return model.model_validate(data)
    except (ValueError, ValidationError) as err:
        first = str(err).splitlines()[0]
        raise error(f"{where} is not what sharegpu writes: {first}") from err


@dataclass(frozen=True)
class ContainerRequest:
    name: str
    count: int  # vGPUs, each on its own GPU
    memory_mib: int | None  # per vGPU; None: the whole GPU (compute 100 only)
    compute_pct: int  # per vGPU, 1-100


@dataclass(frozen=True)
class PodRequest:
    namespace: str
    name: str
    uid: str
    containers: tuple[ContainerRequest, ...]  # only those that ask for vGPUs, in pod order
    priority: str
    policy: str
    models: frozenset[str]  # empty: any model

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def vgpus(self) -> int:
        return sum(c.count for c in self.containers)


def _whole(value: object, what: str, problems: list[str], unit: str = "") -> int | None:
    """An extended resource's quantity: a whole number (the API server allows no other), in any
    decimal form a quantity takes. The API server hands back the canonical one: 8000 as "8k",
    16000 as "16k", 1e3 as "1e3". A binary suffix (4Gi) is refused: these numbers count MiB or
    percent, and "4Gi" MiB is not 4 GiB."""
    text = str(value).strip()
    try:
        number = None if _BINARY_SUFFIX.search(text) else parse_quantity(text)
    except ValueError:
        number = None
    if number is None or number != number.to_integral_value():
        problems.append(f"{what} must be a whole number{unit}, not {text!r}")
        return None
    return int(number)


def _container(spec: Mapping[str, Any], problems: list[str]) -> ContainerRequest | None:
    name = str(spec.get("name", "?"))
    resources = spec.get("resources") or {}
    limits = dict(resources.get("limits") or {})
    requests = dict(resources.get("requests") or {})
    asked: dict[str, int] = {}
    given = set()  # asked for, well-formed or not: a bad value is one problem, not two
    for key in RESOURCES:
        if key in limits and key in requests and str(limits[key]).strip() != str(requests[key]).strip():
            problems.append(f"container {name}: {key} differs between limits and requests")
        value = limits.get(key, requests.get(key))
        if value is not None:
            given.add(key)
            unit = " of MiB (4096 for 4 GiB)" if key == RESOURCE_MEMORY else ""
            number = _whole(value, f"container {name}: {key}", problems, unit)
            if number is not None:
                asked[key] = number
    unknown = sorted(k for k in {*limits, *requests} if k.startswith(PREFIX) and k not in RESOURCES)
    if unknown:
        problems.append(
            f"container {name}: unknown resource {', '.join(unknown)} (known: {', '.join(RESOURCES)})"
        )
    if not asked:
        return None
    count = asked.get(RESOURCE_VGPU)
    if count is None:
        others = ", ".join(k for k in asked)
        problems.append(f"container {name}: {others} without {RESOURCE_VGPU} (how many vGPUs)")
        return None
    if not 1 <= count <= MAX_VGPUS:
        problems.append(f"container {name}: {RESOURCE_VGPU} must be 1 to {MAX_VGPUS}, not {count}")
    memory = asked.get(RESOURCE_MEMORY)
    if memory is not None and memory < 1:
        problems.append(f"container {name}: {RESOURCE_MEMORY} must be at least 1 (MiB), not {memory}")
    compute = asked.get(RESOURCE_COMPUTE, 100)
    if not 1 <= compute <= 100:
        problems.append(
            f"container {name}: {RESOURCE_COMPUTE} must be 1 to 100 (percent of a GPU), not {compute}"
        )
    elif memory is None and compute < 100 and RESOURCE_MEMORY not in given:
        problems.append(
            f"container {name}: {RESOURCE_COMPUTE} {compute} without {RESOURCE_MEMORY}: a shared vGPU needs "
            "its memory in MiB (only a whole GPU, compute 100, has all of its memory by default)"
        )
    return ContainerRequest(name=name, count=count, memory_mib=memory, compute_pct=compute)


def _choice(
    annotations: Mapping[str, str], key: str, allowed: tuple[str, ...], default: str, problems: list[str]
) -> str:
    value = str(annotations.get(key, default)).strip().lower()
    if value not in allowed:
        problems.append(f"annotation {key} must be one of {', '.join(allowed)}, not {value!r}")
        return default
    return value


def pod_request(pod: Mapping[str, Any]) -> PodRequest | None:
    """The pod's vGPU request, None when it asks for none; PodRequestError naming every problem."""
    meta = pod.get("metadata") or {}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    problems: list[str] = []
    specs = (pod.get("spec") or {}).get("containers") or []
    containers = [c for c in (_container(s, problems) for s in specs) if c is not None]
    init = [s for s in (pod.get("spec") or {}).get("initContainers") or [] if _container(s, []) is not None]
    if init:
        problems.append("init containers cannot have vGPUs: " + ", ".join(str(s.get("name")) for s in init))
    ours = [k for k in annotations if k.startswith(PREFIX)]
    if not containers and not problems:
        user_set = [k for k in ours if k in USER_ANNOTATIONS]
        if user_set:
            problems.append(
                f"annotations {', '.join(sorted(user_set))} on a pod that asks for no {RESOURCE_VGPU}"
            )
        else:
            return None
    unknown = sorted(k for k in ours if k not in USER_ANNOTATIONS and k not in OWN_ANNOTATIONS)
    if unknown:
        problems.append(f"unknown annotation {', '.join(unknown)} (known: {', '.join(USER_ANNOTATIONS)})")
    priority = _choice(annotations, ANNOTATION_PRIORITY, PRIORITIES, "normal", problems)
    policy = _choice(annotations, ANNOTATION_POLICY, POLICIES, "share", problems)
    models = frozenset(m.strip() for m in annotations.get(ANNOTATION_GPU_MODEL, "").split(",") if m.strip())
    if ANNOTATION_GPU_MODEL in annotations and not models:
        problems.append(f"annotation {ANNOTATION_GPU_MODEL} names no model")
    klass = str((pod.get("spec") or {}).get("priorityClassName") or "")
    implied = PRIORITY_CLASSES.get(klass)
    if implied is not None:
        if ANNOTATION_PRIORITY not in annotations:
            priority = implied
        elif priority != implied:
            problems.append(
                f"annotation {ANNOTATION_PRIORITY}: {priority} contradicts the pod's priority class {klass} "
                f"({implied}): drop one"
            )
    name = str(meta.get("name", ""))
    namespace = str(meta.get("namespace") or "default")
    if problems:
        raise PodRequestError(f"pod {namespace}/{name}: " + "; ".join(problems))
    return PodRequest(
        namespace=namespace,
        name=name,
        uid=str(meta.get("uid", "")),
        containers=tuple(containers),
        priority=priority,
        policy=policy,
        models=models,
    )


def pod_finished(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's phase is one after which it never runs again (FINISHED_PHASES)."""
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES


def run_as_user(pod: Mapping[str, Any], container: str) -> int | None:
    """The uid the pod's container runs as, as its spec says: the container's
    `securityContext.runAsUser`, else the pod's; None when neither sets it (the image's user,
    unknown here). The tenant's files are given to that user, so that a pod that runs as
    non-root (`runAsNonRoot`, Pod Security `restricted`) can use its vGPU."""
    spec = pod.get("spec") or {}
    for c in spec.get("containers") or []:
        if c.get("name") == container:
            uid = (c.get("securityContext") or {}).get("runAsUser")
            if isinstance(uid, int) and uid >= 0:
                return uid
    uid = (spec.get("securityContext") or {}).get("runAsUser")
    return uid if isinstance(uid, int) and uid >= 0 else None
