"""From a spec (memory, GPUs, compute) to the vGPUs of a tenant, and a resize of them.

Shared by every path that makes or changes a tenant (the agent's service, `sharegpu run` and
`sharegpu resize` without the agent), so they accept the same input and fail the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from sharegpu.devices import Gpu, select_gpus
from sharegpu.errors import DeviceError, SpecError, UnknownGpu
from sharegpu.regions import abi
from sharegpu.spec import (
    MAX_WEIGHT,
    POLICIES,
    PRIORITIES,
    ComputeSpec,
    GpuSelector,
    format_size,
    parse_percent,
)
from sharegpu.tenant import DeviceLimit

POLICY_CODES = {
    "share": abi.POLICY_SHARE,
    "cap": abi.POLICY_CAP,
    "burst": abi.POLICY_BURST,
    "native": abi.POLICY_NATIVE,
}
PRIORITY_CODES = {
    "online": abi.PRIORITY_ONLINE,
    "normal": abi.PRIORITY_NORMAL,
    "offline": abi.PRIORITY_OFFLINE,
}


def device_limit(uuid: str, memory_bytes: int, compute: ComputeSpec) -> DeviceLimit:
    return DeviceLimit(
        uuid=uuid,
        mem_cap_bytes=memory_bytes,
        policy=POLICY_CODES[compute.policy],
        priority=PRIORITY_CODES[compute.priority],
        share_permille=compute.share_permille,
        ceiling_permille=compute.ceiling_permille,
        weight=compute.weight,
    )


def compute_of(dev: DeviceLimit) -> ComputeSpec:
    """The ComputeSpec a device limit was made from."""
    return ComputeSpec(
        policy=abi.POLICY_NAMES.get(dev.policy, "share"),
        priority=abi.PRIORITY_NAMES.get(dev.priority, "normal"),
        share_permille=dev.share_permille,
        ceiling_permille=dev.ceiling_permille,
        weight=dev.weight,
    )


def choose_gpus(selectors: Sequence[GpuSelector], gpus: list[Gpu]) -> list[Gpu]:
    """select_gpus, with a selector that matches nothing reported as UnknownGpu."""
    try:
        return select_gpus(list(selectors), gpus)
    except DeviceError as err:
        if gpus:
            raise UnknownGpu(str(err)) from err
        raise


def check_fits(memory_bytes: int, gpus: Sequence[Gpu]) -> None:
    for gpu in gpus:
        if memory_bytes > gpu.memory_total:
            raise SpecError(
                f"memory cap {format_size(memory_bytes)} is larger than GPU {gpu.index} "
                f"({gpu.name}, {format_size(gpu.memory_total)})"
            )


def plan_devices(
    memory_bytes: int, selectors: Sequence[GpuSelector], compute: ComputeSpec, gpus: list[Gpu]
) -> list[DeviceLimit]:
    """The vGPUs of a new tenant: one per selected GPU (all when none), each with the cap."""
    chosen = choose_gpus(selectors, gpus)
    check_fits(memory_bytes, chosen)
    return [device_limit(g.uuid, memory_bytes, compute) for g in chosen]


def merge_compute(
    current: ComputeSpec,
    *,
    compute: str | None = None,
    policy: str | None = None,
    ceiling: str | None = None,
    priority: str | None = None,
    weight: int | None = None,
) -> ComputeSpec:
    """`current` with the given fields changed, validated as `ComputeSpec.parse` validates a new
    spec. What is not given is kept where it still applies: the share (unless the new policy is
    native), the burst ceiling (when the tenant stays burst)."""
    new_policy = (policy or current.policy).strip().lower()
    if new_policy not in POLICIES:
        raise SpecError(f"invalid policy {new_policy!r}: use one of {', '.join(POLICIES)}")
    new_priority = (priority or current.priority).strip().lower()
    if new_priority not in PRIORITIES:
        raise SpecError(f"invalid priority {new_priority!r}: use one of {', '.join(PRIORITIES)}")
    new_weight = weight if weight is not None else current.weight
    if not 1 <= new_weight <= MAX_WEIGHT:
        raise SpecError(f"invalid weight {new_weight}: must be between 1 and {MAX_WEIGHT}")
    if new_policy == "native":
        if compute is not None or ceiling is not None:
            raise SpecError("--policy native has no compute control: drop --compute/--ceiling")
        return ComputeSpec("native", new_priority, 1000, 1000, new_weight)
    if compute is not None:
        share = parse_percent(compute, "compute share")
    else:
        share = current.share_permille if current.policy != "native" else 1000
    if ceiling is not None and new_policy != "burst":
        raise SpecError(f"--ceiling applies to --policy burst only (this is {new_policy})")
    if new_policy != "burst":
        top = share
    elif ceiling is not None:
        top = parse_percent(ceiling, "ceiling")
    else:
        top = current.ceiling_permille if current.policy == "burst" else 1000
    if top < share:
        raise SpecError(f"ceiling {top / 10:g}% is below the guarantee {share / 10:g}%")
    return ComputeSpec(new_policy, new_priority, share, top, new_weight)


def resized(
    current: list[DeviceLimit],
    gpus: Sequence[Gpu],
    *,
    memory_bytes: int | None = None,
    compute: str | None = None,
    policy: str | None = None,
    ceiling: str | None = None,
    priority: str | None = None,
    weight: int | None = None,
) -> list[DeviceLimit]:
    """The new limits of a resize: the same GPUs, with the given fields changed on each."""
    if not current:
        raise SpecError("the tenant has no GPU to resize")
    if memory_bytes is not None:
        check_fits(memory_bytes, [g for g in gpus if g.uuid in {d.uuid for d in current}])
    spec = merge_compute(
        compute_of(current[0]),
        compute=compute,
        policy=policy,
        ceiling=ceiling,
        priority=priority,
        weight=weight,
    )
    return [
        device_limit(d.uuid, memory_bytes if memory_bytes is not None else d.mem_cap_bytes, spec)
        for d in current
    ]


def memory_totals(gpus: Sequence[Gpu], allow_overcommit: bool) -> dict[str, int] | None:
    """What admission checks memory caps against (GPU UUID -> card memory); None: unchecked."""
    return None if allow_overcommit else {g.uuid: g.memory_total for g in gpus}
