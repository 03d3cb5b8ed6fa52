"""vGPU specs at the edges: human sizes and percentages in, bytes and permille out.

Sizes: ``512MiB``, ``4GiB``, ``1.5GiB``, ``2T`` (k/M/G/T alone are binary, as Docker reads them),
``500MB`` (decimal units are accepted and converted). A memory cap must be a whole number of MiB
and at least 1 MiB: the shim charges exact bytes, so a cap of N MiB admits exactly N MiB.

Shares: ``30%`` or ``30`` → 300 permille, 1%..100% in whole percent.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from decimal import Decimal

from sharegpu.errors import SpecError

MIB = 1 << 20
GIB = 1 << 30

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 1000,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 1000**2,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 1000**3,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 1000**4,
}

_SIZE_RE = re.compile(r"^\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[a-zA-Z]*)\s*$")
_TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


_MAX_SIZE = 1 << 63  # the ABI keeps sizes in 64-bit fields


def parse_size(text: str) -> int:
    """Parse a size such as ``4GiB`` into bytes; a bare number needs a unit to avoid guesses."""
    match = _SIZE_RE.match(text)
    if not match:
        raise SpecError(f"invalid size {text!r}: expected a number and a unit, like 512MiB or 4GiB")
    unit = match["unit"].lower()
    if unit not in _UNITS:
        raise SpecError(f"invalid size {text!r}: unknown unit {match['unit']!r} (use MiB, GiB, TiB)")
    if unit == "":
        raise SpecError(f"invalid size {text!r}: add a unit, like {text.strip()}MiB or {text.strip()}GiB")
    value = Decimal(match["num"]) * _UNITS[unit]  # exact: no float rounding, no overflow
    if value >= _MAX_SIZE:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise SpecError(f"invalid size {shown!r}: too large (sizes must be under 8 EiB)")
    if value != value.to_integral_value():
        raise SpecError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def parse_memory_cap(text: str) -> int:
    """Parse a memory cap: a positive whole number of MiB, returned in bytes."""
    size = parse_size(text)
    if size <= 0:
        raise SpecError(f"invalid memory cap {text!r}: must be at least 1MiB")
    if size % MIB:
        raise SpecError(
            f"invalid memory cap {text!r}: must be a whole number of MiB "
            f"({size / MIB:.3f} MiB); caps have 1 MiB granularity"
        )
    return size


def parse_percent(text: str, what: str = "share") -> int:
    """Parse ``30%`` (or ``30``) into permille; whole percent from 1 to 100."""
    raw = text.strip().removesuffix("%").strip()
    if not re.fullmatch(r"[0-9]+", raw):
        raise SpecError(f"invalid {what} {text!r}: expected a whole percentage like 30%")
    pct = int(raw)
    if not 1 <= pct <= 100:
        raise SpecError(f"invalid {what} {text!r}: must be between 1% and 100%")
    return pct * 10


def validate_tenant_id(name: str) -> str:
    """Tenant ids become directory names and metric labels: keep them short and plain."""
    if not _TENANT_RE.match(name):
        raise SpecError(
            f"invalid tenant name {name!r}: use 1-63 lowercase letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


_NOT_IN_TENANT_ID = re.compile(r"[^a-z0-9_.-]")
_MAX_TENANT_ID = 63


def tenant_id_from(text: str) -> str:
    """A tenant id made from a name chosen elsewhere (a container id, a pod's uid and container):
    lowercased, each character an id does not allow made '-', and a result over 63 characters cut
    and ended with a digest of the whole, so that long names that differ late stay apart. The
    caller gives a prefix that starts with a letter ("ctr-", "pod-")."""
    name = _NOT_IN_TENANT_ID.sub("-", text.lower())
    if len(name) > _MAX_TENANT_ID:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[: _MAX_TENANT_ID - 9]}-{digest}"
    return validate_tenant_id(name)


def format_size(size: int) -> str:
    """Bytes to the shortest exact binary unit: 4294967296 → '4GiB', 1536 MiB → '1.5GiB'."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", 1 << 10)):
        if size >= scale:
            value = size / scale
            text = f"{value:.2f}".rstrip("0").rstrip(".")
            return f"{text}{unit}"
    return f"{size}B"


@dataclass(frozen=True)
class GpuSelector:
    """A ``--gpu`` argument: an NVML index or a (prefix of a) GPU UUID."""

    index: int | None = None
    uuid: str | None = None

    @classmethod
    def parse(cls, text: str) -> GpuSelector:
        text = text.strip()
        if re.fullmatch(r"[0-9]+", text):
            return cls(index=int(text))
        if re.fullmatch(r"GPU-[0-9a-fA-F-]{4,}", text):
            return cls(uuid=text.lower().replace("gpu-", "GPU-", 1))
        raise SpecError(f"invalid GPU {text!r}: give an index (0, 1, ...) or a UUID (GPU-...)")

    def __str__(self) -> str:
        return str(self.index) if self.index is not None else str(self.uuid)


POLICIES = ("share", "cap", "burst", "native")
PRIORITIES = ("online", "normal", "offline")
MAX_WEIGHT = 1000


@dataclass(frozen=True)
class ComputeSpec:
    """A tenant's compute settings on each of its GPUs (docs/design/arbitration.md, "Policies").

    ``share_permille`` is the share (``share``), the ceiling (``cap``) or the guarantee
    (``burst``); ``ceiling_permille`` is the burst ceiling and equals ``share_permille`` for the
    other policies.
    """

    policy: str = "share"
    priority: str = "normal"
    share_permille: int = 1000
    ceiling_permille: int = 1000
    weight: int = 1

    @property
    def guarantee_permille(self) -> int:
        """What this tenant is promised on a contended card (0 for share and native)."""
        return self.share_permille if self.policy in ("cap", "burst") else 0

    @classmethod
    def parse(
        cls,
        compute: str | None = None,
        policy: str | None = None,
        ceiling: str | None = None,
        priority: str | None = None,
        weight: int | None = None,
    ) -> ComputeSpec:
        policy = (policy or "share").strip().lower()
        if policy not in POLICIES:
            raise SpecError(f"invalid policy {policy!r}: use one of {', '.join(POLICIES)}")
        priority = (priority or "normal").strip().lower()
        if priority not in PRIORITIES:
            raise SpecError(f"invalid priority {priority!r}: use one of {', '.join(PRIORITIES)}")
        if weight is not None and not 1 <= weight <= MAX_WEIGHT:
            raise SpecError(f"invalid weight {weight}: must be between 1 and {MAX_WEIGHT}")
        if policy == "native":
            if compute is not None or ceiling is not None:
                raise SpecError("--policy native has no compute control: drop --compute/--ceiling")
            return cls(policy, priority, 1000, 1000, weight or 1)
        share = parse_percent(compute, "compute share") if compute is not None else 1000
        if ceiling is not None and policy != "burst":
            raise SpecError(f"--ceiling applies to --policy burst only (this is {policy})")
        top = (
            parse_percent(ceiling, "ceiling")
            if ceiling is not None
            else (1000 if policy == "burst" else share)
        )
        if top < share:
            raise SpecError(f"ceiling {top // 10}% is below the guarantee {share // 10}%")
        return cls(policy, priority, share, top, weight or 1)
