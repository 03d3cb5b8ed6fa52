"""What `devices`, `tenants` and `status` show: their tables (narrow and wide), their items, the
one document every JSON and YAML output is, `{"version": 1, "kind": ..., "items": [...]}`, its
text, and the watch loop. The CLI picks the format and prints through sharegpu.cli.render; the
support bundle writes the same documents. In watch mode JSON is one compact document per line
and YAML one document per frame (``---``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from sharegpu.agent.models import ArbiterView, DeviceView, GpuView, TenantView
from sharegpu.errors import SharegpuError
from sharegpu.ops.snapshot import Snapshot

JSON_VERSION = 1


def document(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"version": JSON_VERSION, "kind": kind, "items": items}


def dump(doc: dict[str, Any], fmt: str, *, stream: bool = False) -> str:
    """The document as JSON (indented, or one line when `stream`) or, for "yaml", YAML (one
    `---` document)."""
    if fmt == "yaml":
        import yaml

        return "---\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False).rstrip("\n")
    if stream:
        return json.dumps(doc, separators=(",", ":"))
    return json.dumps(doc, indent=2)


def size(n: int) -> str:
    from sharegpu.spec import format_size

    return format_size(n) if n else "0"


def pct(ratio: float) -> str:
    return f"{ratio * 100:g}%"


def duration(ns: int) -> str:
    """A time from the regions' nanoseconds, shortest unit that keeps it whole: 5ms, 300us, 1.5ms."""
    for unit, scale in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if ns >= scale:
            return f"{ns / scale:g}{unit}"
    return f"{ns}ns"


def preemption(arb: ArbiterView) -> str:
    """How an online request takes the card, with the early preemptions so far: 'early (12)',
    'by-kernel>=1ms (3)', 'drain (0)'."""
    mode = arb.online_preempt
    if mode == "by-kernel":
        mode += f">={duration(arb.preempt_min_kernel_ns)}"
    return f"{mode} ({arb.early_preemptions})"


def quiet(arb: ArbiterView) -> str:
    """The quiet window after online requests, with the windows so far: 'off (0)', '5ms (31)'."""
    window = duration(arb.offline_quiet_ns) if arb.offline_quiet_ns else "off"
    return f"{window} ({arb.quiet_windows})"


def configured(d: DeviceView) -> str:
    if d.policy == "native":
        return "native"
    if d.policy == "burst":
        return f"burst {pct(d.compute_share_ratio)}-{pct(d.compute_ceiling_ratio)}"
    return f"{d.policy} {pct(d.compute_share_ratio)}"


# -- devices ---------------------------------------------------------------------------------------


def containers(t: TenantView) -> str:
    """The containers a tenant's processes run in (short ids, as runtimes print them), else the
    container its labels name, else "-"."""
    found = [c.id[:12] for c in t.containers] or (
        [t.labels["container"][:12]] if "container" in t.labels else []
    )
    return ",".join(found) or "-"


def devices_items(gpus: list[GpuView]) -> list[dict[str, Any]]:
    return [g.model_dump(mode="json") for g in gpus]


def devices_table(gpus: list[GpuView], *, wide: bool = False) -> Table:
    columns = ["INDEX", "UUID", "NAME", "MEMORY USED / TOTAL", "UTIL", "CAPS", "GUARANTEED", "TENANTS"]
    if wide:
        columns += ["TENANTS USE", "GPU TIME (1s)", "HOLDER", "WAITING", "HANDOVERS", "PREEMPT (EARLY)"]
        columns += ["QUIET (WINDOWS)", "TENANT NAMES"]
    table = Table(*columns, box=None)
    for g in gpus:
        caps = size(g.memory_allocated_bytes) + (" [overcommitted]" if g.memory_overcommitted else "")
        row = [
            str(g.index),
            g.uuid,
            g.name,
            f"{size(g.memory_used_bytes)} / {size(g.memory_total_bytes)}",
            f"{g.utilization_pct}%",
            caps,
            pct(g.compute_guaranteed_ratio),
            str(len(g.tenants)),
        ]
        if wide:
            arb = g.arbiter
            row += [
                size(g.memory_tenants_used_bytes),
                f"{g.compute_used_ratio * 100:.1f}%",
                "-" if arb is None or arb.holder_pid is None else str(arb.holder_pid),
                "-" if arb is None else str(arb.waiting),
                "-" if arb is None else str(arb.handovers),
                "-" if arb is None else preemption(arb),
                "-" if arb is None else quiet(arb),
                ",".join(g.tenants) or "-",
            ]
        table.add_row(*row)
    return table


# -- tenants ---------------------------------------------------------------------------------------


def tenants_items(tenants: list[TenantView]) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json") for t in tenants]


class WindowRates(NamedTuple):
    """One tenant's rates on one GPU between two readings: shares of the window (0-1)."""

    wait: float
    throttled: float
    gpu_time: float | None  # the arbiter's charges over the window; None: not arbitrated (NVML's)


def rates_between(
    before: list[TenantView], after: list[TenantView], seconds: float
) -> dict[tuple[str, str], WindowRates]:
    """{(tenant, GPU uuid): its rates} between two readings about `seconds` apart, for the tenants
    in both (the same incarnation). GPU time is what the arbiter charged over the window (exact,
    and blind to pid namespaces) for a tenant it schedules; a native tenant's is NVML's.  The
    window is the time between the two readings of the tenant's counters where the views say
    it (a reading's start was off by the first one's imports: every rate 23% low, now and then,
    on a loaded 2-core VM), else `seconds`."""
    old = {(t.id, t.incarnation, d.uuid): (t, d) for t in before for d in t.devices}
    found = {}
    for t in after:
        for d in t.devices:
            prev_tenant, prev = old.get((t.id, t.incarnation, d.uuid), (None, None))
            window = seconds
            if prev_tenant is not None and t.counters_monotonic and prev_tenant.counters_monotonic:
                window = t.counters_monotonic - prev_tenant.counters_monotonic
            if prev is not None and window > 0:
                wait = max(d.wait_seconds - prev.wait_seconds, 0.0) / window
                throttled = max(d.throttled_seconds - prev.throttled_seconds, 0.0) / window
                charged = max(d.held_seconds - prev.held_seconds, 0.0) / window
                found[(t.id, d.uuid)] = WindowRates(
                    min(wait, 1.0), min(throttled, 1.0), None if d.policy == "native" else min(charged, 1.0)
                )
    return found


def tenants_renderable(
    items: list[TenantView],
    *,
    wide: bool = False,
    rates: dict[tuple[str, str], WindowRates] | None = None,
    window_s: float | None = None,
) -> RenderableType:
    """The tenants table.  Every rate of a row is over one window, named in its header: GPU TIME,
    WAIT and THROTTLED (`rates`, measured between two readings `window_s` apart: GPU TIME from
    the arbiter's charges, a native tenant's from NVML's last window; a tenant new since the
    first reading shows "-").  The lifetime shares are the wide table's "(LIFE)" columns, and
    NVML's figure, the cross-check of GPU TIME, its "GPU TIME (NVML)".  Without `rates` (a single
    reading) GPU TIME is the view's (the agent's last second, else NVML's) and WAIT and
    THROTTLED are lifetime shares, and the headers say so."""
    if not items:
        return Text("no tenants")
    window = f"{items[0].devices[0].busy_window_seconds:g}s" if items[0].devices else "1s"
    rate = "LIFE" if rates is None else f"{window_s or 0:.1f}s"
    columns = [
        "TENANT",
        "CONTAINER",
        "GPU",
        "PRIORITY",
        "COMPUTE",
        f"GPU TIME ({window if rates is None else rate})",
        f"WAIT ({rate})",
        f"THROTTLED ({rate})",
    ]
    columns += ["MEMORY USED / CAP", "OOM", "PROCS"]
    if wide:
        columns += [
            "STATE",
            "WAIT (LIFE)",
            "THROTTLED (LIFE)",
            "HELD (LIFE)",
            f"GPU TIME (NVML {window})",
            "OVERHEAD",
            "PEAK",
            "WEIGHT",
            "PREEMPTIONS",
            "GENERATION",
            "LABELS",
        ]
    table = Table(*columns, box=None)
    for t in items:
        name = f"{t.id} (stale)" if t.stale else t.id
        if t.error:
            row = [name, containers(t), "-", "", "", "", "", "", f"[red]unreadable: {t.error}[/red]", "", ""]
            table.add_row(*row, *([t.state, "", "", "", "", "", "", "", "", "", ""] if wide else []))
            continue
        age = t.age_seconds or 1.0
        live = sum(1 for p in t.processes if p.alive)
        for i, d in enumerate(t.devices):
            memory = f"{size(d.memory_used_bytes + d.memory_overhead_bytes)} / {size(d.memory_cap_bytes)}"
            row = [
                name if i == 0 else "",
                containers(t) if i == 0 else "",
                d.uuid,
                d.priority,
                configured(d),
                _gpu_time(d, rates, (t.id, d.uuid)),
                *_waits(d, age, rates, (t.id, d.uuid)),
                memory + (" [yellow]over cap[/yellow]" if d.over_cap else ""),
                str(d.oom_events),
                str(live) if i == 0 else "",
            ]
            if wide:
                labels = ",".join(f"{k}={v}" for k, v in sorted(t.labels.items()))
                row += [
                    t.state if i == 0 else "",
                    f"{d.wait_seconds / age * 100:.1f}%",
                    f"{d.throttled_seconds / age * 100:.1f}%",
                    "-" if d.held_ratio is None else f"{d.held_ratio * 100:.1f}%",
                    _percent(d.nvml_busy_ratio),
                    size(d.memory_overhead_bytes),
                    size(d.memory_peak_bytes),
                    str(d.weight),
                    str(d.preemptions),
                    "-" if t.limits_generation is None else str(t.limits_generation),
                    (labels or "-") if i == 0 else "",
                ]
            table.add_row(*row)
    notes = [Text(f"note: {t.id}: {t.note}") for t in items if t.note]
    return Group(table, *notes) if notes else table


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.1f}%"


def _gpu_time(d: DeviceView, rates: dict[tuple[str, str], WindowRates] | None, key: tuple[str, str]) -> str:
    """GPU TIME of one row: the charges over the window when measured, else the view's figure."""
    if rates is None:
        return _percent(d.gpu_busy_ratio)
    if key not in rates:
        return "-"  # new since the first reading
    charged = rates[key].gpu_time
    return _percent(d.gpu_busy_ratio if charged is None else charged)


def _waits(
    d: DeviceView, age: float, rates: dict[tuple[str, str], WindowRates] | None, key: tuple[str, str]
) -> list[str]:
    """WAIT and THROTTLED of one row: over the window when measured, else over its lifetime."""
    if rates is None:
        return [f"{d.wait_seconds / age * 100:.1f}%", f"{d.throttled_seconds / age * 100:.1f}%"]
    if key not in rates:
        return ["-", "-"]  # new since the first reading
    row = rates[key]
    return [f"{row.wait * 100:.1f}%", f"{row.throttled * 100:.1f}%"]


# -- status ----------------------------------------------------------------------------------------


def status_item(snap: Snapshot) -> dict[str, Any]:
    agent: dict[str, Any] = {"running": snap.agent is not None, "socket": str(snap.socket)}
    if snap.agent is not None:
        h = snap.agent
        agent |= {
            "version": h.version,
            "pid": h.pid,
            "uptime_seconds": round(h.uptime_seconds, 1),
            "enforce": h.enforce,
            "allow_overcommit": h.allow_overcommit,
            "loops": {
                name: {"ticks": loop.ticks, "errors": loop.errors, "last_error": loop.last_error}
                for name, loop in h.loops.items()
            },
        }
    counts = {"total": len(snap.tenants), "running": 0, "idle": 0, "stale": 0, "error": 0, "over_cap": 0}
    for t in snap.tenants:
        counts[t.state] += 1
        counts["over_cap"] += int(t.over_cap)
    return {
        "runtime_dir": str(snap.runtime_dir),
        "agent": agent,
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "name": g.name,
                "memory_total_bytes": g.memory_total_bytes,
                "memory_used_bytes": g.memory_used_bytes,
                "memory_allocated_bytes": g.memory_allocated_bytes,
                "utilization_pct": g.utilization_pct,
                "tenants": len(g.tenants),
            }
            for g in snap.gpus
        ],
        "gpu_error": snap.gpu_error,
        "tenants": counts,
        "warnings": [e.model_dump(mode="json") for e in snap.warnings],
    }


def status_renderable(snap: Snapshot, *, wide: bool = False) -> RenderableType:
    item = status_item(snap)
    lines: list[RenderableType] = []
    agent = item["agent"]
    if agent["running"]:
        lines.append(
            Text.from_markup(
                f"agent:    [green]running[/green] (sharegpu {agent['version']}, pid {agent['pid']}, "
                f"up {agent['uptime_seconds']:.0f} s, enforce {agent['enforce']})"
            )
        )
        if wide:
            for name, loop in agent["loops"].items():
                err = f", last error: {loop['last_error']}" if loop["last_error"] else ""
                lines.append(Text(f"  loop {name}: {loop['ticks']} ticks, {loop['errors']} errors{err}"))
    else:
        lines.append(
            Text.from_markup(f"agent:    [yellow]not running[/yellow] (nothing answers on {agent['socket']})")
        )
    lines.append(Text(f"runtime:  {item['runtime_dir']}"))
    if item["gpu_error"]:
        lines.append(Text.from_markup(f"gpus:     [red]unavailable[/red]: {item['gpu_error']}"))
    else:
        lines.append(Text(f"gpus:     {len(item['gpus'])}"))
        for g in snap.gpus:
            lines.append(
                Text(
                    f"  {g.index} {g.name} {g.uuid if wide else g.uuid[:12]}: "
                    f"{size(g.memory_used_bytes)} / {size(g.memory_total_bytes)} used, "
                    f"{size(g.memory_allocated_bytes)} capped, util {g.utilization_pct}%, "
                    f"{len(g.tenants)} tenants"
                )
            )
    c = item["tenants"]
    lines.append(
        Text(
            f"tenants:  {c['total']} ({c['running']} running, {c['idle']} idle, {c['stale']} stale, "
            f"{c['error']} unreadable, {c['over_cap']} over cap)"
        )
    )
    if snap.agent is not None:
        if snap.warnings:
            lines.append(Text("recent warnings:"))
            for e in snap.warnings:
                when = time.strftime("%H:%M:%S", time.localtime(e.time))
                who = f" [{e.tenant}]" if e.tenant else ""
                colour = "red" if e.severity == "error" else "yellow"
                lines.append(
                    Text.assemble(f"  {when} ", (e.severity.upper(), colour), f" {e.kind}{who} {e.message}")
                )
        else:
            lines.append(Text("recent warnings: none"))
    return Group(*lines)


# -- watching --------------------------------------------------------------------------------------


def watch(frame: Callable[[], None], interval: float, console: Console, *, header: str | None = None) -> None:
    """Call `frame` every `interval` seconds until Ctrl-C (which returns normally). On a
    terminal the screen is cleared between frames; piped, frames follow each other. An error
    in one frame (the agent went away) is printed and the next frame tried."""
    try:
        while True:
            if console.is_terminal:
                console.clear()
            if header is not None:
                console.print(f"{header}   {time.strftime('%Y-%m-%d %H:%M:%S')}", highlight=False)
            try:
                frame()
            except SharegpuError as err:
                print(f"sharegpu: error: {err}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        return
