"""Shared plumbing of the client scenarios: steps with timings, expectations, one JSON line.

A scenario runs its steps in order; the first step that raises or whose expectation fails
stops it. The JSON line always comes out (on stdout), a one-line reason goes to stderr, and the
exit status is 0 only when every step behaved as expected.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

MIB = 1 << 20

# The kernel every scenario launches. Its name starts with "spin": on simgpu it runs for its first
# (uint64) parameter in microseconds; on a real GPU the code itself spins on %globaltimer for as
# long, so the elapsed time of launch+sync means the same on both.
SPIN_US = 20_000
SPIN_SRC = r"""
extern "C" __global__ void spin_kernel(unsigned long long us)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < us * 1000ull);
}
"""


class Failed(Exception):
    """An expectation that did not hold."""


def parse_args(client: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=f"{client} scenario on the (simulated) GPU")
    p.add_argument(
        "--cap-mib",
        type=int,
        required=True,
        help="memory the process should see: the vGPU cap under sharegpu, else the card size",
    )
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--spin-us", type=int, default=SPIN_US, help="kernel duration (µs)")
    p.add_argument(
        "--repeat",
        type=int,
        default=0,
        metavar="K",
        help="then launch the kernel K more times (loop_ms, the wall time, vs gpu_ms = K x spin)",
    )
    p.add_argument(
        "--sync-every",
        type=int,
        default=1,
        metavar="N",
        help="in the --repeat loop, sync after every N launches (0: once, at the end)",
    )
    p.add_argument("--traceback", action="store_true", help="print the traceback of a failed step")
    args = p.parse_args()
    if args.repeat < 0 or args.sync_every < 0 or args.spin_us <= 0:
        p.error("--repeat and --sync-every must be >= 0, --spin-us > 0")
    return args


class Scenario:
    def __init__(self, client: str, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.perf_counter()
        self.result: dict[str, Any] = {
            "client": client,
            "cap_mib": args.cap_mib,
            "versions": {},
            "device_name": None,
            "total_mib": None,
            "free_mib": None,
            "kernel_ok": False,
            "kernel_ms": None,
            "oom": None,
            "repeat": args.repeat,
            "loop_ms": None,
            "gpu_ms": None,
            "loop_ratio": None,
            "sync_every": args.sync_every,
            "steps": [],
            "ok": False,
            "failed_step": None,
            "error": None,
        }

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        """Runs one step; records its time and what it raised. A failure ends the scenario."""
        t = time.perf_counter()
        try:
            value = fn()
        except BaseException as exc:
            ms = (time.perf_counter() - t) * 1e3
            self.result["steps"].append({"step": name, "ok": False, "ms": round(ms, 3)})
            self.result["failed_step"] = name
            self.result["error"] = describe(exc)
            if self.args.traceback:
                traceback.print_exc()
            self.finish()
        ms = (time.perf_counter() - t) * 1e3
        self.result["steps"].append({"step": name, "ok": True, "ms": round(ms, 3)})
        return value

    def expect(self, cond: bool, what: str) -> None:
        if not cond:
            raise Failed(what)

    def check_memory(self, total: int, free: int) -> None:
        cap = self.args.cap_mib * MIB
        self.result["total_mib"] = round(total / MIB, 3)
        self.result["free_mib"] = round(free / MIB, 3)
        self.expect(total == cap, f"total memory {total} B != cap {cap} B ({self.args.cap_mib} MiB)")
        self.expect(0 < free <= total, f"free memory {free} B not in (0, total={total}]")

    def check_kernel_ms(self, ms: float, spin: bool = True) -> None:
        """Launch+sync took `ms`; a spin kernel must have taken at least --spin-us."""
        self.result["kernel_ms"] = round(ms, 3)
        if spin:
            floor = self.args.spin_us / 1e3 * 0.9
            self.expect(
                ms >= floor, f"launch+sync took {ms:.3f} ms, less than the kernel's {self.args.spin_us} µs"
            )
        self.result["kernel_ok"] = True

    def repeat(self, launch: Callable[[], Any], sync: Callable[[], Any]) -> None:
        """--repeat K: K launches, a sync after every --sync-every N of them and at the end. loop_ms is
        the wall time of all of it, gpu_ms the GPU time asked for (K x --spin-us); held to a compute
        cap of C%, loop_ms ~ gpu_ms / C. (sharegpu's token gates launches, not execution: work queued
        without a sync runs at once and is charged afterwards, so --sync-every 0 shows no slowdown.)"""
        k, every = self.args.repeat, self.args.sync_every
        t = time.perf_counter()
        for i in range(1, k + 1):
            launch()
            if every and i % every == 0:
                sync()
        sync()
        loop_ms = (time.perf_counter() - t) * 1e3
        gpu_ms = k * self.args.spin_us / 1e3
        self.result["loop_ms"] = round(loop_ms, 3)
        self.result["gpu_ms"] = round(gpu_ms, 3)
        self.result["loop_ratio"] = round(loop_ms / gpu_ms, 3) if gpu_ms else None
        self.expect(
            loop_ms >= gpu_ms * 0.9, f"{k} launches + syncs took {loop_ms:.3f} ms, less than {gpu_ms} ms"
        )

    def over_cap(
        self, size: int, alloc: Callable[[int], Any], is_oom: Callable[[BaseException], bool]
    ) -> None:
        """Allocates `size` bytes (past the cap): must raise the client's out-of-memory error."""
        try:
            buf = alloc(size)
        except BaseException as exc:
            self.result["oom"] = {"size_mib": size // MIB, **describe(exc)}
            if not is_oom(exc):
                raise Failed(
                    f"the over-cap allocation raised {type(exc).__name__}, not an out-of-memory error"
                ) from exc
            return
        self.result["oom"] = {"size_mib": size // MIB, "class": None, "message": "no error"}
        del buf
        raise Failed(f"an allocation of {size // MIB} MiB past the {self.args.cap_mib} MiB cap succeeded")

    def finish(self) -> None:
        r = self.result
        r["elapsed_ms"] = round((time.perf_counter() - self.t0) * 1e3, 3)
        r["ok"] = r["failed_step"] is None
        print(json.dumps(r), flush=True)
        if not r["ok"]:
            e = r["error"] or {}
            print(
                f"{r['client']}: step {r['failed_step']!r} failed: {e.get('class')}: {e.get('message')}",
                file=sys.stderr,
                flush=True,
            )
            sys.exit(1)
        sys.exit(0)


def describe(exc: BaseException) -> dict[str, str]:
    cls = type(exc)
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "message": str(exc)[:500]}


def version(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
