#!/usr/bin/env python3
"""pycuda (built from its sdist, linked against libcuda.so) on the (simulated) GPU.

    python tests/clients/pycuda_client.py --cap-mib 1024     # under `sharegpu run --memory 1GiB`

pycuda.autoinit (a context on device 0), the device's name and total_memory(), mem_get_info(),
gpuarray.to_gpu + get (a round trip: simgpu copies really move data), a SourceModule kernel
compiled by nvcc (the nvidia-cuda-nvcc wheel's, else whatever `nvcc` is on PATH) and launched,
synchronize, then mem_alloc past the cap must raise pycuda's MemoryError
(cuMemAlloc failed: out of memory), and a small allocation afterwards must still work.
With --repeat K, K more launches, synced (loop_ms vs gpu_ms: the compute share; _scenario.repeat).
Prints one JSON line; exit 0 only if all of it behaved as expected.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

from _scenario import MIB, SPIN_SRC, Scenario, parse_args, version


def nvcc_path() -> str | None:
    """The nvidia-cuda-nvcc wheel's nvcc (nvidia/cu13/bin/nvcc), else the one on PATH."""
    try:
        import nvidia.cu13

        for root in nvidia.cu13.__path__:
            cand = os.path.join(root, "bin", "nvcc")
            if os.access(cand, os.X_OK):
                return cand
    except ImportError:
        pass
    return shutil.which("nvcc")


def main() -> None:
    args = parse_args("pycuda")
    sc = Scenario("pycuda", args)
    sc.result["versions"] = {d: version(d) for d in ("pycuda", "nvidia-cuda-nvcc")}
    nvcc = nvcc_path()
    sc.result["nvcc"] = nvcc
    if nvcc:
        # SourceModule runs `nvcc` from PATH; the wheel's bin/ also holds ptxas etc.
        os.environ["PATH"] = os.path.dirname(nvcc) + os.pathsep + os.environ.get("PATH", "")
    os.environ.setdefault("CUDA_DEVICE", str(args.device))  # pycuda.autoinit's device

    def imports():
        import numpy as np
        import pycuda.autoinit  # noqa: F401 - creates the context
        import pycuda.driver as drv
        from pycuda import gpuarray
        from pycuda.compiler import SourceModule

        return np, drv, gpuarray, SourceModule

    np, drv, gpuarray, SourceModule = sc.step("import_autoinit", imports)
    dev = drv.Context.get_device()
    sc.result["device_name"] = sc.step("name", dev.name)
    sc.result["compute_capability"] = sc.step("compute_capability", lambda: list(dev.compute_capability()))

    def memory():
        free, total = drv.mem_get_info()
        sc.expect(
            dev.total_memory() == total,
            f"Device.total_memory {dev.total_memory()} != mem_get_info total {total}",
        )
        sc.check_memory(total, free)

    sc.step("memory_info", memory)
    host = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
    garr = sc.step("to_gpu_1mib", lambda: gpuarray.to_gpu(host))

    def roundtrip():
        sc.expect(bool((garr.get() == host).all()), "gpuarray.get did not return what to_gpu sent")

    sc.step("get", roundtrip)

    def compile_kernel():
        if not nvcc:
            raise RuntimeError("no nvcc: install nvidia-cuda-nvcc (or put one on PATH)")
        mod = SourceModule(SPIN_SRC, no_extern_c=True)  # SPIN_SRC has its own extern "C"
        return mod, mod.get_function("spin_kernel")

    _mod, kernel = sc.step("source_module", compile_kernel)  # the module outlives its function

    def launch():
        t = time.perf_counter()
        kernel(np.uint64(args.spin_us), block=(32, 1, 1), grid=(1, 1))
        drv.Context.synchronize()
        sc.check_kernel_ms((time.perf_counter() - t) * 1e3)

    sc.step("launch_sync", launch)
    if args.repeat:
        us = np.uint64(args.spin_us)
        sc.step(
            "repeat_launch",
            lambda: sc.repeat(lambda: kernel(us, block=(32, 1, 1), grid=(1, 1)), drv.Context.synchronize),
        )

    def over_cap():
        size = (args.cap_mib + 1) * MIB
        sc.over_cap(
            size,
            drv.mem_alloc,
            lambda e: isinstance(e, (MemoryError, drv.MemoryError)) or "out of memory" in str(e),
        )

    sc.step("over_cap_allocate", over_cap)

    def after():
        a = drv.mem_alloc(MIB)
        a.free()
        drv.Context.synchronize()

    sc.step("allocate_after_oom", after)
    sc.finish()


if __name__ == "__main__":
    sys.exit(main())
