"""A plain cuda-python program that waits for its own work: the Python twin of `sgprobe syncloop`.

    python bench/_pyclient.py SECONDS K US GAP_US [START_NS]

From the CLOCK_MONOTONIC instant START_NS, for SECONDS: K launches of the spin kernel (US µs each)
through `cuda.bindings.driver`, an event after each, then `cuCtxSynchronize`, then GAP_US of
host time (spun up to 1 ms, slept beyond); again and again. Prints the same keys as the probe:
bursts=, window_kernels= (kernels completed inside the window: every kernel of a burst whose sync
returned inside it, and of the burst that crosses its end those whose event did), achieved=
(window_kernels x US / SECONDS). Nothing in it knows about sharegpu: under `LD_PRELOAD` it is an
unmodified client that resolves its driver entry points through cuGetProcAddress.
"""

from __future__ import annotations

import ctypes
import sys
import time

from cuda.bindings import driver as cu

# `spin` runs for its parameter in µs: a GPU reads its global nanosecond timer until that much
# time has passed (as sgprobe's kernel does); the simulated GPU runs no code and takes the
# parameter as the kernel's time.
PTX = (
    b".version 8.0\n.target sm_90\n.address_size 64\n"
    b".visible .entry spin(.param .u64 us)\n{\n"
    b" .reg .pred %p;\n .reg .u64 %rd<5>;\n"
    b" ld.param.u64 %rd1, [us];\n mul.lo.u64 %rd1, %rd1, 1000;\n mov.u64 %rd2, %globaltimer;\n"
    b"SPIN:\n mov.u64 %rd3, %globaltimer;\n sub.u64 %rd4, %rd3, %rd2;\n"
    b" setp.lt.u64 %p, %rd4, %rd1;\n @%p bra SPIN;\n ret;\n}\n"
)


def check(result: tuple[object, ...]) -> tuple[object, ...]:
    if result[0] != cu.CUresult.CUDA_SUCCESS:
        print(f"fail={result[0]}", flush=True)
        sys.exit(1)
    return result[1:]


def host_gap(ns: int) -> None:
    if ns > 1_000_000:
        time.sleep(ns / 1e9)
        return
    until = time.monotonic_ns() + ns
    while time.monotonic_ns() < until:
        pass


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    seconds, k, us, gap_us = float(argv[0]), int(argv[1]), int(argv[2]), int(argv[3])
    start_ns = int(argv[4]) if len(argv) == 5 else 0
    check(cu.cuInit(0))
    (dev,) = check(cu.cuDeviceGet(0))
    (ctx,) = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    (mod,) = check(cu.cuModuleLoadData(PTX))
    (fn,) = check(cu.cuModuleGetFunction(mod, b"spin"))
    arg = ctypes.c_uint64(us)
    params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
    stream = cu.CUstream(0)
    ev0 = check(cu.cuEventCreate(0))[0]
    events = [check(cu.cuEventCreate(0))[0] for _ in range(k)]

    def launch() -> None:
        check(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, ctypes.addressof(params), 0))

    launch()  # warm-up: loading, and joining the arbiter
    check(cu.cuCtxSynchronize())
    if start_ns:
        delay = start_ns - time.monotonic_ns()
        if delay > 0:
            time.sleep(delay / 1e9)
    t0 = time.monotonic_ns()
    deadline = t0 + int(seconds * 1e9)
    window_ms = seconds * 1e3
    check(cu.cuEventRecord(ev0, stream))
    print("started=1", flush=True)
    bursts = inside = 0
    while time.monotonic_ns() < deadline:
        for ev in events:
            launch()
            check(cu.cuEventRecord(ev, stream))
        check(cu.cuCtxSynchronize())
        bursts += 1
        if time.monotonic_ns() <= deadline:
            inside += k
        else:
            inside += sum(1 for ev in events if check(cu.cuEventElapsedTime(ev0, ev))[0] <= window_ms)
            break
        host_gap(gap_us * 1000)
    t1 = time.monotonic_ns()
    print(f"bursts={bursts}")
    print(f"kernels={bursts * k}")
    print(f"window_kernels={inside}")
    print(f"achieved={inside * us * 1e3 / (seconds * 1e9):.4f}")
    print(f"wall_ns={t1 - t0}")
    print(f"start_ns={t0}")
    print(f"end_ns={t1}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
