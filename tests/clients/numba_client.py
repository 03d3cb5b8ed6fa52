#!/usr/bin/env python3
"""numba-cuda on the (simulated) GPU.

    python tests/clients/numba_client.py --cap-mib 1024     # under `sharegpu run --memory 1GiB`

The device's name, get_memory_info(), cuda.to_device + copy_to_host (a round trip: simgpu copies
really move data), a @cuda.jit kernel compiled through NVVM (nvidia-nvvm wheel) and launched,
synchronize, then cuda.device_array past the cap must raise numba's CudaAPIError
CUDA_ERROR_OUT_OF_MEMORY, and a small array afterwards must still work.
numba mangles kernel names (`_ZN8__main__4spin...`), so the simulator cannot take this kernel's
duration from its first parameter as it does for kernels named `spin*`: it gives every other
kernel SIMGPU_KERNEL_US, which this script sets to --spin-us before the driver starts (the
simulator reads it at cuInit; a real driver ignores it). On a real GPU the kernel itself sleeps
--spin-us in 1 µs `nanosleep`s, so launch + sync takes about as long on both. With --repeat K,
K more launches, synced (loop_ms vs gpu_ms: the compute share; _scenario.repeat).
Prints one JSON line; exit 0 only if all of it behaved as expected.
"""

from __future__ import annotations

import os
import time

from _scenario import MIB, Scenario, parse_args, version


def main() -> None:
    args = parse_args("numba-cuda")
    sc = Scenario("numba-cuda", args)
    sc.result["versions"] = {
        d: version(d) for d in ("numba-cuda", "numba", "cuda-bindings", "nvidia-nvvm", "nvidia-cuda-runtime")
    }

    def imports():
        import numpy as np
        from numba import cuda

        return np, cuda

    # Before anything starts the driver: the simulated duration of every (non-`spin*`) kernel.
    os.environ["SIMGPU_KERNEL_US"] = str(args.spin_us)
    sc.result["simgpu_kernel_us"] = args.spin_us
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")  # a 1-block grid is the point
    np, cuda = sc.step("import", imports)
    sc.step("select_device", lambda: cuda.select_device(args.device))
    ctx = sc.step("current_context", cuda.current_context)

    def name():
        n = ctx.device.name
        return n.decode() if isinstance(n, bytes) else n

    sc.result["device_name"] = sc.step("name", name)
    sc.result["compute_capability"] = sc.step(
        "compute_capability", lambda: list(ctx.device.compute_capability)
    )

    def memory():
        free, total = ctx.get_memory_info()
        sc.check_memory(total, free)

    sc.step("memory_info", memory)
    host = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    darr = sc.step("to_device_1mib", lambda: cuda.to_device(host))

    def roundtrip():
        back = darr.copy_to_host()
        sc.expect(bool((back == host).all()), "copy_to_host did not return what to_device sent")

    sc.step("copy_to_host", roundtrip)

    def compile_kernel():
        @cuda.jit("void(uint64)")
        def spin(us):
            for _ in range(us):
                cuda.nanosleep(1000)

        return spin

    kernel = sc.step("jit_compile", compile_kernel)
    us = np.uint64(args.spin_us)

    def launch():
        t = time.perf_counter()
        kernel[1, 32](us)
        cuda.synchronize()
        sc.check_kernel_ms((time.perf_counter() - t) * 1e3)

    sc.step("launch_sync", launch)
    if args.repeat:
        sc.step("repeat_launch", lambda: sc.repeat(lambda: kernel[1, 32](us), cuda.synchronize))

    def over_cap():
        size = (args.cap_mib + 1) * MIB
        sc.over_cap(
            size,
            lambda n: cuda.device_array(n, dtype=np.uint8),
            lambda e: "OUT_OF_MEMORY" in str(e) or getattr(e, "code", None) == 2,
        )

    sc.step("over_cap_allocate", over_cap)

    def after():
        a = cuda.device_array(MIB, dtype=np.uint8)
        del a
        cuda.synchronize()

    sc.step("allocate_after_oom", after)
    sc.finish()


if __name__ == "__main__":
    main()
