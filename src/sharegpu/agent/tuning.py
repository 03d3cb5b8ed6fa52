"""The arbiter settings an operator gives the agent, per GPU, and the loop that keeps them.

The agent's settings (sharegpu.agent.config) carry an ``arbiter`` mapping: ``default`` for every
GPU of the node and a GPU UUID for one GPU, each a set of the arbiter region's tunables::

    arbiter:
      default: {online_preempt: early}
      GPU-5f8e0c3a-...: {online_preempt: by-kernel, preempt_min_kernel_ns: 2ms, offline_quiet_ns: 5ms}

A GPU's settings are its UUID's entry over ``default``, field by field; a field named nowhere
is left as it is in the region (the creator's default, or what ``tune_arbiter`` wrote). Times
are nanoseconds, as the region and the API's views name them: a whole number, or a string with
a unit (``300us``, ``5ms``, ``0.5ms``, ``1s``). Every value is checked when the settings load,
against the same ranges as ``tune_arbiter`` (sharegpu.arbiter.TUNABLES), so a bad one
stops the agent before it touches a region. An entry for a GPU this node does not have is
never used (one file can serve a fleet).

``offline_inflight_max`` is not among them: the QoS loop owns it (sharegpu.agent.qos) and
writes only it, and this loop never writes it, so neither undoes the other.

The agent writes the settings to the runtime directory when it starts (sharegpu.service.settings),
and every creation of a tenant, through the agent or without it, tunes its GPUs' regions to them
(sharegpu.service.local). ``ArbiterTuner`` is the agent's side: the creations it serves tune
through it (one writer at a time), and every second it brings every region under the runtime
directory whose fields differ back to the settings: a region made while the agent was down or
made anew by the reaper after damage gets them within a second. Each change is an event
``arbiter.tuned`` with the fields' old and new values.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_serializer,
)

from sharegpu.agent.events import Event
from sharegpu.arbiter import TUNABLES, iter_arbiters
from sharegpu.errors import ConfigError, SpecError
from sharegpu.regions import abi
from sharegpu.service.settings import DEFAULT_KEY, Changes, tune_region

log = logging.getLogger(__name__)

_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s)?\s*$")


def parse_ns(value: object) -> int:
    """A time in nanoseconds: a whole number (ns) or a string with a unit ("5ms", "0.5ms",
    "300us", "1s"; no unit: ns). Anything else is a ValueError with one line."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{value!r} is not a time: a whole number of nanoseconds or a duration such as 5ms")
    if isinstance(value, int):
        return value
    found = _DURATION.match(value)
    if found is None:
        raise ValueError(f"{value!r} is not a time: a whole number of nanoseconds or a duration such as 5ms")
    number, unit = found.group(1), found.group(2) or "ns"
    ns = Decimal(number) * _UNITS[unit]  # the pattern admits only decimals
    if ns != ns.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of nanoseconds")
    return int(ns)


Nanoseconds = Annotated[int, BeforeValidator(parse_ns)]


class ArbiterTuning(BaseModel):
    """Tunables of one GPU's arbiter region (docs/design/arbitration.md): those of
    sharegpu.arbiter.TUNABLES but the QoS loop's ``offline_inflight_max`` (a test holds them
    so), each checked by its entry there; None: not set here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    online_preempt: str | None = Field(
        default=None,
        description="How a higher-class request takes the card from a lower-class holder: "
        "drain (after its kernel), early (at once; the GPU preempts) or by-kernel",
    )
    preempt_min_kernel_ns: Nanoseconds | None = Field(
        default=None, description="by-kernel: preempt early only when the holder's kernels are this long"
    )
    handoff: str | None = Field(
        default=None,
        description="How the token moves within a class at a sync that covers the holder's work: "
        "drain (after its work ends) or queued (at once; the next holder's work waits on the GPU)",
    )
    offline_quiet_ns: Nanoseconds | None = Field(
        default=None, description="No offline grant for this long after an online request; 0: off"
    )
    holdback_max_ns: Nanoseconds | None = Field(
        default=None, description="Longest offline hold-back ahead of a predicted online request; 0: off"
    )
    online_window_ns: Nanoseconds | None = Field(
        default=None, description="An online tenant counts as active this long after its last request"
    )
    quantum_ns: Nanoseconds | None = Field(default=None, description="Longest hold of the token")

    @field_validator("*")
    @classmethod
    def _in_range(cls, value: object, info: ValidationInfo) -> object:
        if value is not None:
            try:
                TUNABLES[str(info.field_name)].check(value)
            except SpecError as err:
                raise ValueError(str(err)) from err
        return value

    @model_serializer
    def _set_only(self) -> dict[str, Any]:
        return dict(self.fields())

    def fields(self) -> dict[str, int | str]:
        """The fields set, by name."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


def check_keys(tunings: Mapping[str, ArbiterTuning]) -> dict[str, ArbiterTuning]:
    """`default` and GPU UUIDs (canonical NVML form, GPU-...); anything else is a ValueError."""
    found: dict[str, ArbiterTuning] = {}
    for key, tuning in tunings.items():
        if key == DEFAULT_KEY:
            found[key] = tuning
            continue
        try:
            uuid = abi.bytes_to_uuid(abi.uuid_to_bytes(key))
        except ValueError as err:
            raise ValueError(f"{key!r} is neither {DEFAULT_KEY!r} nor a GPU UUID (GPU-xxxxxxxx-...)") from err
        if uuid in found:
            raise ValueError(f"GPU {uuid} is named twice")
        found[uuid] = tuning
    return found


class ArbiterTuner:
    """Keeps each GPU's arbiter region at the agent's configured settings (a periodic loop)."""

    name = "arbiter"

    def __init__(
        self, root: Path, tunings: Mapping[str, ArbiterTuning] | None = None, *, interval_s: float = 1.0
    ) -> None:
        self.root = root
        self.tunings = check_keys(tunings or {})
        self.interval_s = interval_s
        self._lock = threading.Lock()  # the loop's thread and the API's creations

    def settings(self) -> dict[str, dict[str, int | str]]:
        """The settings as plain fields, as sharegpu.service.settings keeps them for the node."""
        return {key: tuning.fields() for key, tuning in self.tunings.items()}

    def tick(self) -> list[Event]:
        if not self.tunings:
            return []
        events = []
        for path in iter_arbiters(self.root):
            try:
                event = self.apply(path)
            except (ConfigError, SpecError) as err:
                log.warning("arbiter settings: %s", err)
                continue
            if event is not None:
                events.append(event)
        return events

    def tune(self, path: Path) -> tuple[str, Changes]:
        """Bring the region at `path` to its GPU's settings: its GPU and what changed."""
        with self._lock:
            return tune_region(path, self.settings())

    def apply(self, path: Path) -> Event | None:
        """Bring the region at `path` to its GPU's settings: the event of the change, or None
        when nothing differed (or nothing is configured for it)."""
        if not self.tunings:
            return None
        uuid, changes = self.tune(path)
        return tuned_event(uuid, changes) if changes else None


def tuned_event(uuid: str, changes: Changes) -> Event:
    """The event of settings applied to GPU `uuid`'s region (by the loop, or a creation)."""
    said = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in changes.items())
    return Event(
        kind="arbiter.tuned",
        gpu=uuid,
        message=f"{uuid}: arbiter {said} (the agent's settings)",
        data={"changes": {name: {"from": old, "to": new} for name, (old, new) in changes.items()}},
    )


__all__ = [
    "DEFAULT_KEY",
    "ArbiterTuner",
    "ArbiterTuning",
    "check_keys",
    "parse_ns",
    "tuned_event",
]
