"""PyTorch loops for the compute steps: a matmul loop (optionally replayed as a CUDA graph), an
online inference loop and an offline training loop.

    python torch_loop.py matmul --seconds S --start-file F [--size 4096] [--batch 10] [--graph]
    python torch_loop.py infer  --requests N --period-ms P --start-file F
    python torch_loop.py train  --seconds S --start-file F

Each sets up (imports, CUDA context, cuBLAS, a warm-up), prints {"ready": pid}, waits until the
start file holds a CLOCK_MONOTONIC instant in ns and that instant has come, runs, and prints one
JSON line of results. Work is counted as completed when its CUDA event has completed inside the
window (the loops keep one batch queued while waiting for the previous one, as training loops
do). Runs on a real GPU only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def wait_for_start(path: Path) -> int:
    print(json.dumps({"ready": os.getpid()}), flush=True)
    while True:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text:
            break
        time.sleep(0.002)
    start = int(text)
    while (now := time.clock_gettime_ns(time.CLOCK_MONOTONIC)) < start:
        time.sleep(min((start - now) / 1e9, 0.01))
    return start


def completed_in(work: Callable[[], object], seconds: float) -> int:
    """Call `work` back to back for `seconds`, two calls queued on the GPU at a time; how many
    finished within the time (the one still queued at the end is not counted)."""
    deadline = time.monotonic() + seconds
    events: list[torch.cuda.Event] = []
    completed = 0
    while time.monotonic() < deadline:
        work()
        ev = torch.cuda.Event()
        ev.record()
        events.append(ev)
        if len(events) >= 2:
            events.pop(0).synchronize()
            if time.monotonic() <= deadline:
                completed += 1
    torch.cuda.synchronize()
    return completed


def matmul(args: argparse.Namespace) -> dict[str, Any]:
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)

    def batch() -> None:
        for _ in range(args.batch):
            torch.matmul(a, b, out=out)

    graph = None
    if args.graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            batch()  # warm-up outside the capture, as torch.cuda.graph asks
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            batch()
    run = graph.replay if graph is not None else batch
    run()
    torch.cuda.synchronize()
    start = wait_for_start(args.start_file)
    late_ms = (time.clock_gettime_ns(time.CLOCK_MONOTONIC) - start) / 1e6
    completed = completed_in(run, args.seconds)
    flops = 2 * args.size**3 * args.batch * completed
    return {
        "pid": os.getpid(),
        "mode": "graph" if graph is not None else "kernels",
        "batches": completed,
        "matmuls": completed * args.batch,
        "seconds": args.seconds,
        "rate_per_s": completed * args.batch / args.seconds,
        "tflops": flops / args.seconds / 1e12,
        "late_ms": round(late_ms, 2),
    }


def mlp(width: int, depth: int) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).cuda().to(torch.bfloat16)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def infer(args: argparse.Namespace) -> dict[str, Any]:
    model = mlp(4096, 8).eval()
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(5):
            model(x)
        torch.cuda.synchronize()
        start = wait_for_start(args.start_file)
        latencies = []
        for i in range(args.requests):
            due = start + int(i * args.period_ms * 1e6)
            while (now := time.clock_gettime_ns(time.CLOCK_MONOTONIC)) < due:
                time.sleep(min((due - now) / 1e9, 0.002))
            began = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            model(x)
            torch.cuda.synchronize()
            latencies.append((time.clock_gettime_ns(time.CLOCK_MONOTONIC) - began) / 1e3)
    return {
        "pid": os.getpid(),
        "requests": len(latencies),
        "p50_us": percentile(latencies, 0.5),
        "p99_us": percentile(latencies, 0.99),
        "max_us": max(latencies),
        "mean_us": sum(latencies) / len(latencies),
    }


def train(args: argparse.Namespace) -> dict[str, Any]:
    model = mlp(8192, 4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
        opt.step()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    wait_for_start(args.start_file)
    steps = completed_in(step, args.seconds)
    return {"pid": os.getpid(), "steps": steps, "seconds": args.seconds, "steps_per_s": steps / args.seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("matmul", "infer", "train"))
    ap.add_argument("--start-file", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--period-ms", type=float, default=20.0)
    args = ap.parse_args()
    result = {"matmul": matmul, "infer": infer, "train": train}[args.mode](args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
