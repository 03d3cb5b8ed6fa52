"""Looking after a node: `doctor` checks it, `support-bundle` packs what a bug report needs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from sharegpu.cli.render import Format, OutputOpt, console, emit

app = typer.Typer()


@app.command(
    help="Check this node, in order: NVML, the driver and its CUDA version, the shim (built, "
    "installed, loads without failing closed), the runtime directory, the GPUs' arbiter regions, "
    "the tenants, the CDI spec, the agent, the /etc/ld.so.preload mount, the clock source, and "
    "other GPU-sharing software. One line per check (ok / warn / FAIL) with the fix for what "
    "fails. Exit status 1 when a check fails."
)
def doctor(output: OutputOpt = Format.table) -> None:
    from sharegpu.ops.doctor import print_report, report_document, run_checks

    results = run_checks()
    doc = report_document(results)
    emit(output, doc["kind"], doc["items"], lambda wide: print_report(results, console))
    raise typer.Exit(1 if any(r.status == "fail" for r in results) else 0)


@app.command(
    "support-bundle",
    help="Write a tar.gz for a bug report: status, devices, tenants and recent events (JSON), the "
    "configuration (directories, SHAREGPU_*/SIMGPU_* variables, versions), the doctor's report "
    "and the agent's log when found. No secrets: nothing else from the environment.",
)
def support_bundle(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Where to write it (default sharegpu-support-<time>.tar.gz)."),
    ] = None,
) -> None:
    from sharegpu.ops.bundle import write_bundle

    path, notes = write_bundle(output)
    for note in notes:
        print(f"sharegpu: {note}", file=sys.stderr)
    print(f"wrote {path}")
