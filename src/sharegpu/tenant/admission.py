"""Admission: what a GPU can honour next to the tenants it has (compute guarantees, memory caps),
and the node's rule on memory overcommit."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from sharegpu.errors import AdmissionError, ConfigError
from sharegpu.regions import abi
from sharegpu.spec import format_size
from sharegpu.tenant.paths import iter_tenants, runtime_dir
from sharegpu.tenant.records import DeviceLimit
from sharegpu.tenant.regions import read_device_limits


def _guarantee(dev: DeviceLimit) -> int:
    return dev.share_permille if dev.policy in (abi.POLICY_CAP, abi.POLICY_BURST) else 0


def _allocated(base: Path, exclude: str | None) -> dict[str, tuple[int, int]]:
    """Per GPU: (permille promised to cap/burst tenants, bytes of memory caps), all tenants but
    `exclude`. One read of each tenant's limits for every GPU a request asks about (it was one
    per GPU: a tenant on all 8 GPUs read the node's limits 8 times per resize)."""
    found: dict[str, tuple[int, int]] = {}
    for path in iter_tenants(base.parent):
        if path.name == exclude:
            continue
        with contextlib.suppress(ConfigError):
            for dev in read_device_limits(path):
                guaranteed, memory = found.get(dev.uuid, (0, 0))
                found[dev.uuid] = (guaranteed + _guarantee(dev), memory + dev.mem_cap_bytes)
    return found


def admit(
    base: Path,
    devices: Sequence[DeviceLimit],
    *,
    exclude: str | None = None,
    before: Sequence[DeviceLimit] = (),
    memory_totals: Mapping[str, int] | None = None,
) -> None:
    """Refuse what could not be honoured next to the other tenants. On a resize (`before` given)
    only what grows is checked: shrinking is always allowed, even on an overcommitted card."""
    old = {d.uuid: d for d in before}
    allocated: dict[str, tuple[int, int]] | None = None  # read when a device grows
    for dev in devices:
        prev = old.get(dev.uuid)
        grows_compute = _guarantee(dev) > (_guarantee(prev) if prev else 0)
        grows_memory = memory_totals is not None and dev.mem_cap_bytes > (prev.mem_cap_bytes if prev else 0)
        if not (grows_compute or grows_memory):
            continue
        if allocated is None:
            allocated = _allocated(base, exclude)
        taken, memory = allocated.get(dev.uuid, (0, 0))
        if grows_compute and taken + _guarantee(dev) > 1000:
            raise AdmissionError(
                f"compute guarantees on {dev.uuid} would total {(taken + _guarantee(dev)) / 10:g}% "
                f"({taken / 10:g}% already promised to cap/burst tenants): they could not all be honoured"
            )
        total = (memory_totals or {}).get(dev.uuid)
        if grows_memory and total is not None and memory + dev.mem_cap_bytes > total:
            raise AdmissionError(
                f"memory caps on {dev.uuid} would total {format_size(memory + dev.mem_cap_bytes)} of "
                f"the card's {format_size(total)} ({format_size(memory)} already given to other tenants, "
                f"{format_size(max(total - memory, 0))} left): they could not all be honoured "
                "(an agent started with --allow-overcommit allows it)"
            )


# The node's rule on overcommit, written by the agent so that `sharegpu run` without it applies
# the same rule.

ADMISSION_FILE = "admission.json"


def write_admission_policy(root: Path, *, allow_overcommit: bool) -> None:
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{ADMISSION_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"allow_overcommit": allow_overcommit}) + "\n")
    os.replace(tmp, root / ADMISSION_FILE)


def overcommit_allowed(root: Path | None = None) -> bool:
    """Whether memory caps may sum past a card: the agent's --allow-overcommit, last set."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        policy = json.loads(((root or runtime_dir()) / ADMISSION_FILE).read_text())
        return bool(policy.get("allow_overcommit", False))
    return False
