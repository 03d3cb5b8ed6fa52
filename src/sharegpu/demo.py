"""`make run`: two tenants share one simulated GPU, each capped, each filling memory until refused.

Everything runs as real processes: `sharegpu run` creates each tenant and preloads the shim, and
the workload is the driver-API probe (`sgprobe fill`), an unmodified CUDA program that allocates
256 MiB chunks until the driver says CUDA_ERROR_OUT_OF_MEMORY, then holds its memory for a few
seconds while we look at the node from outside.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sharegpu import simgpu
from sharegpu.native import probe_path
from sharegpu.spec import GIB, MIB, format_size

TENANTS = (("demo-a", 3 * GIB), ("demo-b", 2 * GIB))
CARD = simgpu.SimConfig(gpus=1, memory_bytes=8 * GIB, name="sharegpu simulated H100")
CHUNK = 256 * MIB
HOLD_SECONDS = 4


def _parse(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines if "=" in line)


def run_demo(console: Console) -> int:
    with tempfile.TemporaryDirectory(prefix="sharegpu-demo-") as tmp:
        work = Path(tmp)
        config = CARD.write(work / "simgpu.json")
        env = dict(os.environ)
        env.update(simgpu.environment(state=work / "simgpu.state", config=config))
        env["SHAREGPU_RUNTIME_DIR"] = str(work / "run")
        sharegpu = [sys.executable, "-m", "sharegpu.cli"]

        console.rule("[bold]sharegpu demo: memory isolation on a simulated GPU")
        console.print(
            f"One simulated GPU with {format_size(CARD.memory_bytes)}. Two tenants, each an unmodified CUDA "
            f"program that allocates {format_size(CHUNK)} chunks until the driver refuses.\n"
        )
        procs = {}
        for name, cap in TENANTS:
            cmd = [
                *sharegpu,
                "run",
                "--name",
                name,
                "--memory",
                format_size(cap),
                "--",
                str(probe_path()),
                "fill",
                "plain",
                str(CHUNK),
                str(HOLD_SECONDS),
            ]
            console.print(
                f"$ sharegpu run --name {name} --memory {format_size(cap)} "
                f"-- sgprobe fill plain {CHUNK}   # {format_size(CHUNK)} chunks"
            )
            procs[name] = subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )

        results: dict[str, dict[str, str]] = {}
        for name, proc in procs.items():
            lines: list[str] = []
            assert proc.stdout is not None
            for raw in proc.stdout:
                lines.append(raw.strip())
                if raw.startswith("held="):
                    break
            results[name] = _parse(lines)

        table = Table(
            "TENANT",
            "CAP",
            "ALLOCATED",
            "CHUNKS",
            "REFUSED WITH",
            "cuMemGetInfo TOTAL / FREE",
            title="\nInside each tenant",
        )
        for name, cap in TENANTS:
            r = results[name]
            table.add_row(
                name,
                format_size(cap),
                format_size(int(r.get("bytes", "0"))),
                r.get("count", "?"),
                r.get("error", "?"),
                f"{format_size(int(r.get('total', '0')))} / {format_size(int(r.get('free', '0')))}",
            )
        console.print(table)

        console.print("\n$ sharegpu tenants")
        subprocess.run([*sharegpu, "tenants"], env=env, check=False)
        console.print("\n$ sharegpu devices   (the whole card, as NVML outside the tenants sees it)")
        subprocess.run([*sharegpu, "devices"], env=env, check=False)

        codes = {name: proc.wait() for name, proc in procs.items()}
        ok = all(code == 0 for code in codes.values()) and all(
            int(results[n].get("bytes", "-1")) == cap
            and results[n].get("error") == "CUDA_ERROR_OUT_OF_MEMORY"
            for n, cap in TENANTS
        )
        console.print()
        if ok:
            console.print(
                "[green]Each tenant got exactly its cap "
                f"({', '.join(format_size(c) for _, c in TENANTS)}) and was "
                "refused beyond it; the card kept the rest free.[/green] (simulated GPU)"
            )
            return 0
        console.print(f"[red]demo failed: exit codes {codes}, results {results}[/red]")
        return 1


def main() -> None:  # pragma: no cover - convenience entry point
    started = time.monotonic()
    code = run_demo(Console())
    print(f"({time.monotonic() - started:.1f}s)")
    raise SystemExit(code)


__all__ = ["run_demo"]
