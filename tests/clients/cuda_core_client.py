#!/usr/bin/env python3
"""cuda-core (NVIDIA's cuda.core, on cuda-bindings) on the (simulated) GPU.

    python tests/clients/cuda_core_client.py --cap-mib 1024     # under `sharegpu run --memory 1GiB`

Device(0).set_current(), name and memory, a stream, Device.allocate (the device's memory pool),
NVRTC compiles a kernel to PTX (nvidia-cuda-nvrtc wheel), launch + sync, then an allocation
past the cap must raise CUDA_ERROR_OUT_OF_MEMORY, and a small one afterwards must still work.
With --repeat K, K more launches, synced (loop_ms vs gpu_ms: the compute share; _scenario.repeat).
Prints one JSON line; exit 0 only if all of it behaved as expected.
"""

from __future__ import annotations

import time

from _scenario import MIB, SPIN_SRC, Scenario, parse_args, version


def main() -> None:
    args = parse_args("cuda-core")
    sc = Scenario("cuda-core", args)
    sc.result["versions"] = {d: version(d) for d in ("cuda-core", "cuda-bindings", "nvidia-cuda-nvrtc")}

    def imports():
        import numpy as np
        from cuda import core
        from cuda.bindings import driver

        return np, core, driver

    np, core, driver = sc.step("import", imports)

    def check(ret):
        """cuda.bindings.driver returns (CUresult, values...)."""
        err, *vals = ret
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{driver.cuGetErrorName(err)[1].decode()}")
        return vals[0] if len(vals) == 1 else vals

    dev = core.Device(args.device)
    sc.step("set_current", dev.set_current)
    sc.result["device_name"] = sc.step("name", lambda: dev.name)
    sc.result["compute_capability"] = sc.step("compute_capability", lambda: list(dev.compute_capability))

    def memory():
        total = check(driver.cuDeviceTotalMem(dev.device_id))
        free, total_ctx = check(driver.cuMemGetInfo())
        sc.expect(total == total_ctx, f"cuDeviceTotalMem {total} != cuMemGetInfo total {total_ctx}")
        sc.check_memory(total_ctx, free)

    sc.step("memory_info", memory)
    stream = sc.step("create_stream", dev.create_stream)
    buf = sc.step("allocate_1mib", lambda: dev.allocate(MIB, stream=stream))

    def compile_kernel():
        arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
        prog = core.Program(SPIN_SRC, code_type="c++", options=core.ProgramOptions(arch=arch))
        mod = prog.compile("ptx")
        return mod.get_kernel("spin_kernel")

    kernel = sc.step("compile_ptx", compile_kernel)

    def launch():
        cfg = core.LaunchConfig(grid=1, block=32)
        t = time.perf_counter()
        core.launch(stream, cfg, kernel, np.uint64(args.spin_us))
        stream.sync()
        sc.check_kernel_ms((time.perf_counter() - t) * 1e3)

    sc.step("launch_sync", launch)
    if args.repeat:
        cfg = core.LaunchConfig(grid=1, block=32)
        us = np.uint64(args.spin_us)
        sc.step("repeat_launch", lambda: sc.repeat(lambda: core.launch(stream, cfg, kernel, us), stream.sync))
    sc.step("free_1mib", lambda: buf.close(stream))

    def over_cap():
        size = (args.cap_mib + 1) * MIB
        sc.over_cap(
            size, lambda n: dev.allocate(n, stream=stream), lambda e: "CUDA_ERROR_OUT_OF_MEMORY" in str(e)
        )

    sc.step("over_cap_allocate", over_cap)

    def after():
        b = dev.allocate(MIB, stream=stream)
        b.close(stream)
        stream.sync()

    sc.step("allocate_after_oom", after)
    sc.step("close_stream", stream.close)
    sc.finish()


if __name__ == "__main__":
    main()
