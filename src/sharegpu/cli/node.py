"""What this node holds, as lists and a live screen: `devices`, `tenants`, `status` (each once or
`--watch`ed) and `top`. The tables and documents themselves are sharegpu.ops.output's."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Annotated

import typer

from sharegpu.cli.render import Format, IntervalOpt, OutputOpt, WatchOpt, console, emit, is_document, show

app = typer.Typer()


class TopSort(StrEnum):  # sharegpu.ops.top.Sort, without importing the screen for every command
    mem = "mem"
    compute = "compute"
    wait = "wait"
    name = "name"


@app.command(
    help="List the GPUs of this node: memory and utilization as NVML reports them, and what the "
    "tenants were given (memory caps, compute guarantees) and use.\n\n"
    "Example: sharegpu devices -o wide --watch"
)
def devices(output: OutputOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    from sharegpu.ops.output import devices_items, devices_table
    from sharegpu.ops.snapshot import take

    def frame() -> None:
        gpus = take(tenants=False).gpus
        emit(
            output,
            "DeviceList",
            devices_items(gpus),
            lambda wide: devices_table(gpus, wide=wide),
            stream=watch,
        )

    show(frame, output, watch, interval, "sharegpu devices")


@app.command(
    help="List the tenants on this node: memory cap and usage, configured and used GPU time.\n\n"
    "Example: sharegpu tenants -o yaml"
)
def tenants(
    output: OutputOpt = Format.table,
    watch: WatchOpt = False,
    interval: IntervalOpt = 2.0,
    sample: Annotated[
        float,
        typer.Option(
            "--sample",
            min=0,
            help="Tables: seconds between the two readings GPU TIME, WAIT and THROTTLED are measured over "
            "(GPU TIME: the arbiter's charges; a native tenant's, NVML's last second); 0: one reading "
            "(lifetime waits). --watch: between frames.",
        ),
    ] = 1.0,
) -> None:
    from sharegpu.ops.output import rates_between, tenants_items, tenants_renderable
    from sharegpu.ops.snapshot import Snapshot, take

    last: list[Snapshot] = []  # the previous reading: rates between frames

    def frame() -> None:
        snap = take(gpus=False)
        rates, window = None, None
        if not is_document(output):  # the documents carry the raw seconds: one reading, no rates
            if not last and sample > 0:
                last.append(snap)
                time.sleep(sample)
                snap = take(gpus=False)
            if last:
                window = snap.monotonic - last[0].monotonic
                rates = rates_between(last[0].tenants, snap.tenants, window)
            last[:] = [snap]
        emit(
            output,
            "TenantList",
            tenants_items(snap.tenants),
            lambda wide: tenants_renderable(snap.tenants, wide=wide, rates=rates, window_s=window),
            stream=watch,
        )

    show(frame, output, watch, interval, "sharegpu tenants")


@app.command(
    help="Summarize this node: the agent (running or not, version), the GPUs, the tenants by "
    "state, and the agent's recent warnings and errors.\n\n"
    "Example: sharegpu status -o json"
)
def status(output: OutputOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    from sharegpu.ops.output import status_item, status_renderable
    from sharegpu.ops.snapshot import take

    def frame() -> None:
        snap = take(events=True, strict=False)
        emit(
            output,
            "NodeStatus",
            [status_item(snap)],
            lambda wide: status_renderable(snap, wide=wide),
            stream=watch,
        )

    show(frame, output, watch, interval, "sharegpu status")


@app.command(
    help="A live screen of the node: a bar per GPU (memory, busy) and a row per tenant on each GPU "
    "(memory used / cap / overhead, compute achieved / configured, wait, throttled, preemptions, "
    "OOM refusals). Keys: m, c, w, n sort; q quits. Rates are measured between refreshes; with "
    "--once, over --sample seconds (0: over each tenant's lifetime).\n\n"
    "Example: sharegpu top --sort compute"
)
def top(
    sort: Annotated[TopSort, typer.Option("--sort", "-s", help="Order of the tenant rows.")] = TopSort.mem,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit (no live screen).")] = False,
    interval: Annotated[
        float, typer.Option("--interval", "-n", help="Seconds between refreshes.", min=0.1)
    ] = 2.0,
    sample: Annotated[
        float,
        typer.Option("--sample", help="--once: seconds between the two readings (0: lifetime rates).", min=0),
    ] = 1.0,
) -> None:
    from sharegpu.ops import top as top_screen

    order = top_screen.Sort(sort.value)
    if once:
        top_screen.once(console, order, sample)
    else:
        top_screen.live(console, order, interval)
