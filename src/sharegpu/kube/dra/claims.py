"""What an allocated ResourceClaim asks of this node: the GPUs the scheduler chose for it, the
share of each it consumes, and its compute settings. Pure: the claim comes as the API server's
JSON, and each mistake is a ClaimError in one line that names the claim.

A claim is one tenant, whatever number of containers use it: its devices are the tenant's GPUs,
with the same memory and compute on each (a tenant has one cap and one share, as a device-plugin
vGPU has). The scheduler writes what each allocation consumes in
`status.allocation.devices.results[].consumedCapacity` (`memory`, `compute`); a result without
it (a cluster without consumable capacity) has the whole device.

Compute settings come from opaque configuration for the driver `sharegpu.io`, in the DeviceClass
or the claim (the claim's wins, key by key):

    opaque:
      driver: sharegpu.io
      parameters: {apiVersion: sharegpu.io/v1alpha1, kind: VgpuConfig, priority: online, policy: cap}

`priority` (online, normal, offline), `policy` (share, cap, burst) and `ceiling` (burst's top, in
percent) are those of `sharegpu run` (docs/compute.md); any other key is an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sharegpu.errors import SharegpuError
from sharegpu.kube.dra.slices import COMPUTE, DRIVER, MEMORY, Part
from sharegpu.spec import MIB, ComputeSpec, tenant_id_from

CONFIG_API = "sharegpu.io/v1alpha1"
CONFIG_KIND = "VgpuConfig"
CONFIG_KEYS = ("priority", "policy", "ceiling")
CONFIG_POLICIES = ("share", "cap", "burst")  # not native: a claim's compute is always enforced


class ClaimError(SharegpuError):
    """A claim this node cannot prepare, and why."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class AllocatedDevice:
    """One GPU of a claim: what the kubelet's answer names, and the share the claim consumes."""

    request: str
    pool: str
    device: str
    gpu_index: int
    share_id: str | None
    memory_bytes: int
    compute_pct: int


@dataclass(frozen=True)
class ClaimPlan:
    ref: ClaimRef
    devices: tuple[AllocatedDevice, ...]
    compute: ComputeSpec
    pod: str | None  # the one pod it is reserved for, for `sharegpu tenants`

    @property
    def tenant(self) -> str:
        return tenant_name(self.ref)

    @property
    def memory_bytes(self) -> int:
        return self.devices[0].memory_bytes

    @property
    def labels(self) -> dict[str, str]:
        labels = {"namespace": self.ref.namespace, "claim": self.ref.name, "claim_uid": self.ref.uid}
        if self.pod:
            labels["pod"] = self.pod
        return labels


def tenant_name(ref: ClaimRef) -> str:
    """`claim-<first 8 of the uid>-<name>`: found again from the kubelet's request alone."""
    return tenant_id_from(f"claim-{ref.uid[:8]}-{ref.name}")


def _quantity(text: Any, what: str, ref: ClaimRef) -> Decimal:
    from kubernetes.utils import parse_quantity

    try:
        return Decimal(parse_quantity(text))
    except (ValueError, TypeError) as err:
        raise ClaimError(f"claim {ref.key}: its {what} {text!r} is not a quantity") from err


def _consumed(result: Mapping[str, Any], part: Part, ref: ClaimRef) -> tuple[int, int]:
    """(memory bytes, compute percent) the result consumes of its device: what the scheduler
    wrote (shared mode), else the whole device (a GPU, or a partition)."""
    memory_total, compute_total = part.memory_bytes, part.compute_pct
    consumed = result.get("consumedCapacity") or {}
    unknown = sorted(set(consumed) - {MEMORY, COMPUTE})
    if unknown:
        raise ClaimError(f"claim {ref.key}: consumes {', '.join(unknown)}, which {DRIVER} does not offer")
    memory = _quantity(consumed[MEMORY], "memory", ref) if MEMORY in consumed else Decimal(memory_total)
    compute = _quantity(consumed[COMPUTE], "compute", ref) if COMPUTE in consumed else Decimal(compute_total)
    if memory <= 0 or memory > memory_total or memory % MIB:  # (a huge value's % fails)
        raise ClaimError(
            f"claim {ref.key}: memory {consumed.get(MEMORY)} on device {result.get('device')} must be whole "
            f"MiB from 1 MiB to the device's {memory_total // MIB} MiB"
        )
    if compute != compute.to_integral_value() or not 1 <= compute <= compute_total:
        raise ClaimError(
            f"claim {ref.key}: compute {consumed.get(COMPUTE)} on device {result.get('device')} must be "
            f"a whole percent from 1 to {compute_total}"
        )
    return int(memory), int(compute)


def _settings(allocation: Mapping[str, Any], requests: set[str], ref: ClaimRef) -> dict[str, str]:
    """The opaque configuration for this driver that applies to the claim's requests: the
    class's first, the claim's over it. A result of a `firstAvailable` subrequest names it
    `<request>/<subrequest>`; a configuration for the main request applies to it too."""
    wanted = requests | {r.split("/", 1)[0] for r in requests}
    entries = [
        c
        for c in allocation.get("devices", {}).get("config") or []
        if (c.get("opaque") or {}).get("driver") == DRIVER
        and (not c.get("requests") or wanted & set(c["requests"]))
    ]
    entries.sort(key=lambda c: c.get("source") != "FromClass")  # stable: the class's first
    settings: dict[str, str] = {}
    for entry in entries:
        params = entry["opaque"].get("parameters")
        if not isinstance(params, Mapping):
            raise ClaimError(f"claim {ref.key}: the {DRIVER} configuration has no parameters object")
        if params.get("apiVersion") != CONFIG_API or params.get("kind") != CONFIG_KIND:
            raise ClaimError(
                f"claim {ref.key}: the {DRIVER} configuration must be apiVersion {CONFIG_API}, kind "
                f"{CONFIG_KIND}; not {params.get('apiVersion')!r}, {params.get('kind')!r}"
            )
        unknown = sorted(set(params) - {"apiVersion", "kind", *CONFIG_KEYS})
        if unknown:
            raise ClaimError(
                f"claim {ref.key}: unknown {CONFIG_KIND} key {', '.join(unknown)} "
                f"(known: {', '.join(CONFIG_KEYS)})"
            )
        settings.update({k: str(v) for k, v in params.items() if k in CONFIG_KEYS})
    return settings


def _reserved_pod(claim: Mapping[str, Any]) -> str | None:
    pods = [
        r.get("name")
        for r in (claim.get("status") or {}).get("reservedFor") or []
        if r.get("resource") == "pods" and not r.get("apiGroup")
    ]
    return pods[0] if len(pods) == 1 and isinstance(pods[0], str) else None


def plan_claim(
    claim: Mapping[str, Any], ref: ClaimRef, node: str, devices_of_node: Mapping[str, Part]
) -> ClaimPlan:
    """The tenant `claim` (the ResourceClaim read from the API server for `ref`) needs on `node`,
    whose published devices are `devices_of_node` (by name)."""
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise ClaimError(
            f"claim {ref.key} is not the one the kubelet asked for (uid {ref.uid}, the API server's is "
            f"{uid}): it was deleted and made again"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"claim {ref.key} is not allocated")
    results = [r for r in allocation.get("devices", {}).get("results") or [] if r.get("driver") == DRIVER]
    if not results:
        raise ClaimError(f"claim {ref.key} has no device of {DRIVER}")
    devices = []
    for result in results:
        name = result.get("device")
        if result.get("pool") != node or name not in devices_of_node:
            raise ClaimError(
                f"claim {ref.key}: device {result.get('pool')}/{name} is not one of node {node}'s "
                f"({', '.join(sorted(devices_of_node)) or 'it has no GPU'})"
            )
        part = devices_of_node[name]
        memory, compute = _consumed(result, part, ref)
        devices.append(
            AllocatedDevice(
                request=str(result.get("request")),
                pool=node,
                device=name,
                gpu_index=part.gpu.index,
                share_id=result.get("shareID"),
                memory_bytes=memory,
                compute_pct=compute,
            )
        )
    _check_shape(devices, ref)
    settings = _settings(allocation, {d.request for d in devices}, ref)
    policy = settings.get("policy", "share").strip().lower()
    if policy not in CONFIG_POLICIES:
        raise ClaimError(
            f"claim {ref.key}: policy {settings['policy']!r} is not one a claim may have "
            f"({', '.join(CONFIG_POLICIES)})"
        )
    ceiling = settings.get("ceiling", "").strip().removesuffix("%")
    if ceiling and policy != "burst":
        raise ClaimError(f"claim {ref.key}: ceiling applies to policy burst only (this is {policy})")
    try:
        spec = ComputeSpec.parse(
            compute=f"{devices[0].compute_pct}%",
            policy=policy,
            ceiling=f"{ceiling}%" if ceiling else None,
            priority=settings.get("priority"),
        )
    except SharegpuError as err:
        raise ClaimError(f"claim {ref.key}: {err}") from err
    return ClaimPlan(ref=ref, devices=tuple(devices), compute=spec, pod=_reserved_pod(claim))


def _check_shape(devices: Sequence[AllocatedDevice], ref: ClaimRef) -> None:
    gpus = [d.gpu_index for d in devices]
    twice = sorted({d.device for d in devices if gpus.count(d.gpu_index) > 1})
    if twice:
        raise ClaimError(
            f"claim {ref.key}: has {', '.join(twice)}, more than one share of one GPU; a claim gets one "
            "share of each GPU (ask for more memory or compute instead, or a constraint "
            "distinctAttribute: sharegpu.io/uuid)"
        )
    shapes = sorted({(d.memory_bytes // MIB, d.compute_pct) for d in devices})
    if len(shapes) > 1:
        shown = ", ".join(f"{m} MiB/{c}%" for m, c in shapes)
        raise ClaimError(
            f"claim {ref.key}: its GPUs have different shares ({shown}); "
            "a sharegpu vGPU has the same memory and compute on each of its GPUs"
        )
