"""`make run`: tenants sharing one simulated GPU, first its memory, then its time.

Everything runs as real processes: `sharegpu run` creates each tenant and preloads the shim; the
workloads are the driver-API probe (`sgprobe`), an unmodified CUDA program.

1. Memory: two tenants with different caps each allocate 256 MiB chunks until the driver says
   CUDA_ERROR_OUT_OF_MEMORY, then hold their memory while we look at the node from outside.
2. Compute: an online service (bursts of kernels, latency measured) next to an offline batch job
   that wants the whole card: the online latency alone, next to the batch job under sharegpu, and
   next to the same batch job without sharegpu; the GPU time each got. Once with requests on a
   regular beat (the arbiter predicts them), once at random (Poisson: it cannot).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sharegpu import simgpu
from sharegpu.native import parse_probe_output, probe_path
from sharegpu.spec import GIB, MIB, format_size

TENANTS = (("demo-a", 3 * GIB), ("demo-b", 2 * GIB))
CARD = simgpu.SimConfig(gpus=1, memory_bytes=8 * GIB, name="sharegpu simulated H100")
CHUNK = 256 * MIB
HOLD_SECONDS = 4
# The online service: 100 requests (so that p99 is not just the worst one), one every 30 ms, each
# 4 kernels of 1 ms. The batch job: 0.5 ms kernels back to back for as long as the service runs.
BURSTS, PERIOD_MS, BURST_KERNELS, BURST_US = 100, 30, 4, 1000
BATCH_US = 500
# A request is late when it took more than this times the service's median alone.
LATE_FACTOR = 1.2


@dataclass
class Node:
    env: dict[str, str]

    @property
    def sharegpu(self) -> list[str]:
        return [sys.executable, "-m", "sharegpu.cli"]

    def start(self, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            args, env=env or self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def show(self, console: Console, *args: str) -> None:
        console.print(f"\n$ sharegpu {' '.join(args)}")
        subprocess.run([*self.sharegpu, *args], env=self.env, check=False)


def memory_part(node: Node, console: Console) -> bool:
    console.rule("[bold]1. Memory: each tenant sees a GPU the size of its cap")
    console.print(
        f"One simulated GPU with {format_size(CARD.memory_bytes)}. Two tenants, each an unmodified CUDA "
        f"program that allocates {format_size(CHUNK)} chunks until the driver refuses.\n"
    )
    procs = {}
    for name, cap in TENANTS:
        console.print(
            f"$ sharegpu run --name {name} --memory {format_size(cap)} -- sgprobe fill plain {CHUNK}"
        )
        cmd = [*node.sharegpu, "run", "--name", name, "--memory", format_size(cap), "--",
               str(probe_path()), "fill", "plain", str(CHUNK), str(HOLD_SECONDS)]  # fmt: skip
        procs[name] = node.start(cmd)

    results: dict[str, dict[str, str]] = {}
    for name, proc in procs.items():
        lines: list[str] = []
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.append(raw.strip())
            if raw.startswith("held="):
                break
        results[name] = parse_probe_output(lines)

    table = Table("TENANT", "CAP", "ALLOCATED", "CHUNKS", "REFUSED WITH", "cuMemGetInfo TOTAL / FREE",
                  title="\nInside each tenant")  # fmt: skip
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
    node.show(console, "tenants")
    console.print("(the card as NVML sees it from outside the tenants)")
    node.show(console, "devices")

    codes = {name: proc.wait() for name, proc in procs.items()}
    for proc in procs.values():
        assert proc.stdout is not None
        proc.stdout.close()
    ok = all(code == 0 for code in codes.values()) and all(
        int(results[n].get("bytes", "-1")) == cap and results[n].get("error") == "CUDA_ERROR_OUT_OF_MEMORY"
        for n, cap in TENANTS
    )
    if ok:
        console.print(
            "\n[green]Each tenant got exactly its cap "
            f"({', '.join(format_size(c) for _, c in TENANTS)}) and was refused beyond it; the card "
            "kept the rest free.[/green]"
        )
    else:
        console.print(f"[red]memory part failed: exit codes {codes}, results {results}[/red]")
    return ok


def _compute_round(
    node: Node, console: Console, with_batch: bool, shim: bool, arrivals: str = "bursts"
) -> dict[str, dict[str, str]]:
    """One round: the online service (and the batch job) from one common start instant;
    `arrivals` is "bursts" (a regular beat) or "poisson" (random gaps of the same mean)."""
    start = str(time.clock_gettime_ns(time.CLOCK_MONOTONIC) + 1_500_000_000)
    probe = str(probe_path())
    online = [probe, arrivals, str(BURSTS), str(PERIOD_MS), str(BURST_KERNELS), str(BURST_US), start]
    batch = [probe, "saturate", f"{BURSTS * PERIOD_MS / 1000:g}", str(BATCH_US), "kernel", start]
    bare_env = {k: v for k, v in node.env.items() if k != "LD_PRELOAD"}
    jobs = {"online": online, **({"batch": batch} if with_batch else {})}
    procs = {}
    for name, workload in jobs.items():
        priority = "online" if name == "online" else "offline"
        wrap = [*node.sharegpu, "run", "--name", name, "-m", "1GiB", "--priority", priority, "--"]
        procs[name] = node.start([*wrap, *workload] if shim else workload, node.env if shim else bare_env)
    if shim and with_batch and arrivals == "bursts":
        time.sleep(2.3)  # into the run: show both tenants while they work
        node.show(console, "tenants")
    results = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        results[name] = parse_probe_output(out.splitlines())
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed ({proc.returncode}): {out.strip()[-500:]}")
    return results


def _late(online: dict[str, str], limit_us: float) -> int:
    """How many of the service's requests took longer than `limit_us`."""
    return sum(float(v) > limit_us for v in online["lat_us_all"].split(","))


def compute_part(node: Node, console: Console) -> bool:
    console.rule("[bold]2. Compute: an online service next to a batch job that wants the whole card")
    console.print(
        f"Online service: {BURSTS} requests, one every {PERIOD_MS} ms, each {BURST_KERNELS} kernels of "
        f"{BURST_US / 1000:g} ms (latency measured per request). "
        f"Batch job: {BATCH_US / 1000:g} ms kernels back to back. "
        "The simulated GPU time-slices processes the way a GPU time-slices contexts.\n"
        "$ sharegpu run --name online --priority online -- sgprobe bursts ...\n"
        "$ sharegpu run --name batch --priority offline -- sgprobe saturate ..."
    )
    rounds = {
        arrivals: (
            _compute_round(node, console, with_batch=False, shim=True, arrivals=arrivals)["online"],
            _compute_round(node, console, with_batch=True, shim=True, arrivals=arrivals),
            _compute_round(node, console, with_batch=True, shim=False, arrivals=arrivals),
        )
        for arrivals in ("bursts", "poisson")
    }
    window = BURSTS * PERIOD_MS / 1000
    online_busy = BURSTS * BURST_KERNELS * BURST_US / 1e6

    def batch_share(r: dict[str, str]) -> str:
        gpu = float(r["gpu_ns"]) / 1e9
        left = gpu / (window - online_busy) * 100
        return f"{gpu / window * 100:.0f}% of the card, {left:.0f}% of what online left"

    table = Table(
        "REQUESTS",
        "ONLINE SERVICE",
        "LATENCY p50",
        "p99",
        "p99 vs ALONE",
        f"LATE (> {LATE_FACTOR:g}x)",
        "BATCH JOB GOT",
        title="\nResults",
    )
    improved = True
    for arrivals, (alone, shared, bare) in rounds.items():
        pattern = "regular beat" if arrivals == "bursts" else "random"
        p99_alone = float(alone["p99_us"])
        limit_us = LATE_FACTOR * float(alone["p50_us"])
        table.add_row(
            pattern,
            "alone",
            f"{float(alone['p50_us']) / 1000:.2f} ms",
            f"{p99_alone / 1000:.2f} ms",
            "1.00x",
            f"{_late(alone, limit_us)} of {BURSTS}",
            "-",
        )
        for label, r in (("with batch, sharegpu", shared), ("with batch, no sharegpu", bare)):
            on = r["online"]
            table.add_row(
                "",
                label,
                f"{float(on['p50_us']) / 1000:.2f} ms",
                f"{float(on['p99_us']) / 1000:.2f} ms",
                f"{float(on['p99_us']) / p99_alone:.2f}x",
                f"{_late(on, limit_us)} of {BURSTS}",
                batch_share(r["batch"]),
            )
        # Judged on the count of late requests, not on one p99: on a loaded host two requests
        # delayed by the host's scheduler move a p99 of 100 requests; they move this count by two.
        improved = improved and _late(shared["online"], limit_us) < _late(bare["online"], limit_us) / 2
    console.print(table)
    console.print(
        "\n[green]Under sharegpu the online service keeps nearly its alone latency on a regular beat: the "
        "arbiter learns the period of its requests and clears the card just before each one. A random "
        "request cannot be predicted: it waits for the batch kernel in flight (or, with long batch "
        "kernels, for the GPU to preempt it at the end of its time slice), still far less than without "
        "sharegpu; under an MPS daemon the shim makes the batch job a low-priority client, and the GPU "
        "serves random requests first too (docs/design/arbitration.md). The batch job uses the time the "
        "service leaves idle. LATE counts the requests that took more than "
        f"{LATE_FACTOR:g} times the service's median alone.[/green]"
        if improved
        else "[red]compute part: sharegpu did not halve the online service's late requests[/red]"
    )
    return improved


def run_demo(console: Console) -> int:
    with tempfile.TemporaryDirectory(prefix="sharegpu-demo-") as tmp:
        work = Path(tmp)
        config = CARD.write(work / "simgpu.json")
        env = dict(os.environ)
        env.update(simgpu.environment(state=work / "simgpu.state", config=config))
        env["SHAREGPU_RUNTIME_DIR"] = str(work / "run")
        node = Node(env)
        ok = memory_part(node, console)
        console.print()
        ok = compute_part(node, console) and ok
        console.print("\n(all figures: simulated GPU)")
        return 0 if ok else 1


__all__ = ["run_demo"]
