"""The agent's CDI loop: the node's spec file kept equal to its tenants and shapes.

Every `interval_s` it looks at what the spec is made of (the tenants, their limits files, the
GPUs' arbiter directories) and, when that changed or `REFRESH_S` passed, builds the spec
(generate.py) and writes it when it differs from what it last wrote, so a tenant created
through the agent is a `sharegpu.io/vgpu=<tenant>` device within a couple of seconds, and a
removed one stops being one. (Building it reads NVML and every tenant's limits and validates
the whole spec: the costliest loop of all on 50 tenants, when done every second.) With no
device to list the file is removed (a spec must list at least one). A failure is an event
(`cdi.failed`) and a log line, once per distinct reason, and is retried at the next tick; the
last good file stays. A tenant whose files cannot be read is left out and the others written
(one damaged tenant used to stop the spec for the whole node): an event
(`cdi.tenant_left_out`) names it, and the metric `sharegpu_cdi_tenant_left_out` names it.
The file is this runtime directory's (owner.py): another directory's live sharegpu owning it is
a failure, never an overwrite; and a file someone else changed or removed is written again at
the next tick (`cdi.restored`).

The loop is built by the CLI layer and handed to the daemon (sharegpu.agent sits below
sharegpu.runtime and cannot import it).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from sharegpu.agent.events import Event
from sharegpu.errors import SharegpuError, TenantNotFound
from sharegpu.runtime.cdi.generate import build_spec, write_spec
from sharegpu.runtime.cdi.owner import claim
from sharegpu.runtime.cdi.shapes import Shape
from sharegpu.tenant import gpus_dir, iter_tenants, node_lock

REFRESH_S = 30.0  # the GPUs and the driver are read again at least this often


def _inputs(root: Path) -> tuple[object, ...]:
    """What the spec is made of, cheaply: each tenant with its limits file's identity (limits
    are replaced by rename, so a resize is a new inode) and the GPUs with an arbiter."""
    tenants = []
    for path in iter_tenants(root):
        try:
            st = os.stat(path / "limits")
            tenants.append((path.name, st.st_ino, st.st_mtime_ns))
        except OSError:
            tenants.append((path.name, 0, 0))
    try:
        arbiters = sorted(os.listdir(gpus_dir(root)))
    except OSError:
        arbiters = []
    return (tuple(tenants), tuple(arbiters))


def _identity(path: Path) -> tuple[int, int, int] | None:
    """A file's inode, modification time and size: another writer changes at least one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


log = logging.getLogger(__name__)


class CdiKeeper:
    name = "cdi"

    def __init__(
        self, root: Path, target: Path, *, shapes: list[Shape] | None = None, interval_s: float = 1.0
    ):
        self.root = root
        self.target = target
        self.shapes = shapes
        self.interval_s = interval_s
        self._written: str | None = None
        self._failed: str | None = None
        self._left: dict[str, str] = {}  # tenants left out of the last spec built, and why
        self._inputs: tuple[object, ...] | None = None
        self._built_at = float("-inf")
        self._file: tuple[int, int, int] | None = None  # the identity of the file last written

    def tick(self) -> list[Event]:
        inputs, now = _inputs(self.root), time.monotonic()
        unchanged = inputs == self._inputs and now - self._built_at < REFRESH_S
        # Someone else replaced, edited or removed the file we wrote: written again at once.
        tampered = self._written is not None and _identity(self.target) != self._file
        if unchanged and not tampered:
            return []
        self._inputs, self._built_at = inputs, now
        # Built and written under the node lock, as the device plugin writes it at Allocate: of
        # two writers at once, the last has seen every tenant made before it, so neither can
        # drop a tenant the other has just listed.
        with node_lock(self.root):
            try:
                claim(self.target, self.root)  # never another runtime directory's file
                built = build_spec(self.root, None, self.shapes)
            except TenantNotFound:
                self.target.unlink(missing_ok=True)
                self._written = self._file = None
                return []
            except SharegpuError as err:
                return self._failure(str(err))
            spec, events = built.spec, self._left_out(built.left_out)
            text = spec.to_json()
            if text == self._written and not tampered:
                return events
            try:
                write_spec(spec, self.target)
            except SharegpuError as err:
                return events + self._failure(str(err))
            self._file = _identity(self.target)
        if tampered:
            log.warning("cdi: %s was changed by another writer; written again", self.target)
            events.append(
                Event(
                    kind="cdi.restored",
                    severity="warning",
                    message=f"CDI spec {self.target} was changed or removed by another writer; written again",
                    data={"path": str(self.target)},
                )
            )
        self._written, self._failed = text, None
        names = [d.name for d in spec.devices]
        return [
            *events,
            Event(
                kind="cdi.written",
                message=f"CDI spec {self.target}: {len(names)} devices"
                + (f", {len(built.left_out)} damaged tenant(s) left out" if built.left_out else ""),
                data={
                    "path": str(self.target),
                    "devices": names,
                    "cdi_version": spec.cdi_version,
                    "left_out": sorted(built.left_out),
                },
            ),
        ]

    def _left_out(self, left_out: dict[str, str]) -> list[Event]:
        """An event for each tenant newly left out of the spec (or left out for a new reason)."""
        events = [
            Event(
                kind="cdi.tenant_left_out",
                severity="warning",
                tenant=name,
                message=f"tenant {name} left out of the CDI spec: {why}",
                data={"why": why},
            )
            for name, why in sorted(left_out.items())
            if self._left.get(name) != why
        ]
        for event in events:
            log.warning("cdi: %s", event.message)
        self._left = dict(left_out)
        return events

    def _failure(self, why: str) -> list[Event]:
        self._inputs = None  # retried at the next tick
        if why == self._failed:
            return []
        self._failed = why
        log.warning("cdi: %s", why)
        return [Event(kind="cdi.failed", severity="warning", message=f"CDI spec not written: {why}")]
