"""`sharegpu top`: one screen for the node: a bar per GPU and a row per tenant on each GPU.

Compute achieved is GPU time: the share of the card the GPU spent running the tenant's work over
NVML's last window (1 s), the same figure as `sharegpu tenants`, the API and the metrics; the
tenants of a card never add up to more than the card. Wait and throttled are the change of the
tenant's wait and throttled seconds between two readings divided by the wall time between them:
on the live screen, between two refreshes; with `--once`, over a sampling interval (1 s by
default). With a sampling interval of 0, or for a tenant the first reading did not have, they
are taken over the tenant's lifetime instead, and the header says so.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sharegpu.ops.output import configured, containers, rates_between, size
from sharegpu.ops.snapshot import Snapshot, take


class Sort(StrEnum):
    mem = "mem"
    compute = "compute"
    wait = "wait"
    name = "name"


KEYS = {"m": Sort.mem, "c": Sort.compute, "w": Sort.wait, "n": Sort.name}


@dataclass
class Row:
    tenant: str
    gpu: str  # the GPU's index when known, else a UUID prefix
    state: str
    priority: str
    policy: str  # as configured: "share 30%", "burst 20%-60%", "native"
    memory_used: int  # ledger + overhead
    memory_cap: int
    overhead: int
    compute: float | None  # achieved share of the GPU (0-1); None for native tenants
    wait: float  # share of wall time spent waiting for the token
    throttled: float  # share of wall time held back by a cap or ceiling
    preemptions: int
    oom: int
    over_cap: bool
    error: str | None = None  # the tenant's files cannot be read: shown, never hidden
    container: str = "-"  # the containers its processes run in (output.containers)


def rows(prev: Snapshot | None, cur: Snapshot) -> tuple[list[Row], bool]:
    """The rows of `cur`, rates over the interval since `prev` (True) or over lifetimes (False)."""
    index = {g.uuid: str(g.index) for g in cur.gpus}
    dt = cur.monotonic - prev.monotonic if prev is not None else 0.0
    interval = prev is not None and dt > 0
    rates = rates_between(prev.tenants, cur.tenants, dt) if prev is not None and interval else {}
    found = []
    for t in cur.tenants:
        if t.error:
            # (unreadable: its processes, hence its containers, are unknown too)
            found.append(
                Row(t.id, "-", "unreadable", "", "", 0, 0, 0, None, 0.0, 0.0, 0, 0, False, error=t.error)
            )
            continue
        age = t.age_seconds or 1.0
        for d in t.devices:
            # Between refreshes: GPU time is the arbiter's charges (a native tenant's, NVML's last
            # window) and waits are measured; the first screen has the view's GPU time (the
            # agent's last second, else NVML's) and the tenant's lifetime waits.
            measured = rates.get((t.id, d.uuid))
            gpu_time = (
                d.gpu_busy_ratio if measured is None or measured.gpu_time is None else measured.gpu_time
            )
            compute = gpu_time or 0.0
            wait, throttled = (
                (measured.wait, measured.throttled)
                if measured
                else (d.wait_seconds / age, d.throttled_seconds / age)
            )
            found.append(
                Row(
                    tenant=t.id,
                    gpu=index.get(d.uuid, d.uuid[:12]),
                    state=t.state,
                    priority=d.priority,
                    policy=configured(d),
                    memory_used=d.memory_used_bytes + d.memory_overhead_bytes,
                    memory_cap=d.memory_cap_bytes,
                    overhead=d.memory_overhead_bytes,
                    compute=None if gpu_time is None else min(compute, 1.0),
                    wait=min(wait, 1.0),
                    throttled=min(throttled, 1.0),
                    preemptions=d.preemptions,
                    oom=d.oom_events,
                    over_cap=d.over_cap,
                    container=containers(t),
                )
            )
    return found, interval


def sort_rows(found: list[Row], sort: Sort) -> list[Row]:
    if sort is Sort.mem:
        return sorted(found, key=lambda r: (-r.memory_used, r.tenant, r.gpu))
    if sort is Sort.compute:
        return sorted(found, key=lambda r: (-(r.compute or 0.0), r.tenant, r.gpu))
    if sort is Sort.wait:
        return sorted(found, key=lambda r: (-r.wait, r.tenant, r.gpu))
    return sorted(found, key=lambda r: (r.tenant, r.gpu))


def bar(fraction: float, width: int = 24) -> Text:
    """`[||||||      42%]`, green, yellow past 75%, red past 90%."""
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(fraction * width)
    colour = "red" if fraction > 0.9 else "yellow" if fraction > 0.75 else "green"
    label = f"{fraction * 100:.0f}%"
    inside = ("|" * filled).ljust(width)
    inside = inside[: width - len(label)] + label
    return Text.assemble("[", (inside[:filled], colour), inside[filled:], "]")


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.1f}%"


def render(prev: Snapshot | None, cur: Snapshot, sort: Sort, *, live: bool = False) -> RenderableType:
    found, interval = rows(prev, cur)
    agent = (
        f"agent {cur.agent.version} (pid {cur.agent.pid})" if cur.agent is not None else "no agent (direct)"
    )
    basis = (
        f"rates over the last {cur.monotonic - prev.monotonic:.1f} s"
        if interval and prev is not None
        else "rates over each tenant's lifetime"
    )
    when = time.strftime("%H:%M:%S", time.localtime(cur.wall_time))
    parts: list[RenderableType] = [
        Text(f"sharegpu top - {when} - {agent} - {len(cur.tenants)} tenants - {basis} - sort: {sort}")
    ]
    if cur.gpu_error:
        parts.append(Text.assemble(("GPUs unavailable: ", "red"), cur.gpu_error))
    gpus = Table("GPU", "NAME", "MEMORY", "", "BUSY", "", "TENANTS", box=None)
    for g in cur.gpus:
        used = g.memory_used_bytes / g.memory_total_bytes if g.memory_total_bytes else 0.0
        gpus.add_row(
            str(g.index),
            g.name,
            bar(used),
            f"{size(g.memory_used_bytes)} / {size(g.memory_total_bytes)}",
            bar(g.utilization_pct / 100),
            f"tenants {sum(r.compute or 0.0 for r in found if r.gpu == str(g.index)) * 100:.0f}%",
            str(len(g.tenants)),
        )
    if cur.gpus:
        parts.append(gpus)
    table = Table(
        "TENANT",
        "CONTAINER",
        "GPU",
        "PRIORITY",
        "POLICY",
        "MEMORY USED / CAP",
        "OVERHEAD",
        "COMPUTE / CONFIGURED",
        "WAIT",
        "THROTTLED",
        "PREEMPT",
        "OOM",
        box=None,
    )
    for r in sort_rows(found, sort):
        memory = Text(f"{size(r.memory_used)} / {size(r.memory_cap)}")
        if r.error:
            memory = Text(f"unreadable: {r.error}", "red")
        elif r.over_cap:
            memory.stylize("red")
            memory.append(" over cap", "red")
        table.add_row(
            r.tenant if r.state != "stale" else f"{r.tenant} (stale)",
            r.container,
            r.gpu,
            r.priority,
            r.policy,
            memory,
            size(r.overhead),
            Text(f"{_pct(r.compute)} / {r.policy.rsplit(' ', 1)[-1]}"),
            Text(_pct(r.wait), "yellow" if r.wait > 0.2 else ""),
            Text(_pct(r.throttled), "yellow" if r.throttled > 0 else ""),
            str(r.preemptions),
            Text(str(r.oom), "red" if r.oom else ""),
        )
    parts.append(table if found else Text("no tenants"))
    if live:
        parts.append(Text("keys: m memory, c compute, w wait, n name (sort); q quit", "dim"))
    return Group(*parts)


def once(console: Console, sort: Sort, sample: float) -> None:
    """One frame: two readings `sample` seconds apart (or lifetime rates when 0)."""
    prev = take(strict=False) if sample > 0 else None
    if sample > 0:
        time.sleep(sample)
    console.print(render(prev, take(strict=False), sort))


@contextlib.contextmanager
def _cbreak() -> Iterator[int | None]:
    """stdin in cbreak mode (keys without Enter) when it is a terminal; its fd, else None."""
    if not sys.stdin.isatty():
        yield None
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _key(fd: int | None, timeout: float) -> str | None:
    if fd is None:
        time.sleep(timeout)
        return None
    ready, _, _ = select.select([fd], [], [], timeout)
    return os.read(fd, 1).decode(errors="replace") if ready else None


def live(console: Console, sort: Sort, interval: float) -> None:
    """Refresh every `interval` seconds until q or Ctrl-C. Not on a terminal: frames are
    printed one after the other."""
    try:
        prev, cur = None, take(strict=False)
        if not console.is_terminal:
            while True:
                console.print(render(prev, cur, sort))
                console.print()
                sys.stdout.flush()
                time.sleep(interval)
                prev, cur = cur, take(strict=False)
        with _cbreak() as fd, Live(console=console, screen=True, auto_refresh=False) as screen:
            screen.update(render(prev, cur, sort, live=True), refresh=True)
            due = time.monotonic() + interval
            while True:
                left = due - time.monotonic()
                if left <= 0:
                    prev, cur = cur, take(strict=False)
                    due = time.monotonic() + interval
                else:
                    key = _key(fd, left)
                    if key is None:
                        continue
                    if key.lower() == "q":
                        return
                    if key.lower() not in KEYS:
                        continue
                    sort = KEYS[key.lower()]
                screen.update(render(prev, cur, sort, live=True), refresh=True)
    except KeyboardInterrupt:
        return
