"""Allocate device memory until refused, with PyTorch or CuPy, as an unmodified program would.

    python alloc.py torch|cupy [--chunk-mib 64] [--hold]

Prints one JSON line: what the framework says the device has (torch.cuda.mem_get_info and the
device's total_memory / CuPy's memGetInfo), what NVML says inside the process, how much it got
before the refusal, the refusal's exception type, what the framework's allocator holds, and
whether the process still works after freeing one chunk. With --hold it then keeps the memory
until its standard input closes, so that NVML outside can be read meanwhile.

Runs on a real GPU only (the CUDA runtime cannot run on the simulated driver).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

MIB = 1 << 20


def nvml_inside() -> dict[str, Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))
        pynvml.nvmlShutdown()
        return {"nvml_total": int(info.total), "nvml_used": int(info.used)}
    except Exception as err:
        return {"nvml_error": f"{type(err).__name__}: {err}"}


def with_torch(chunk: int) -> tuple[dict[str, Any], list[Any]]:
    import torch

    free, total = torch.cuda.mem_get_info(0)
    props = torch.cuda.get_device_properties(0)
    found: dict[str, Any] = {"lib": f"torch {torch.__version__}", "free": free, "total": total}
    found["device_total_memory"] = int(props.total_memory)
    held: list[Any] = []
    try:
        while True:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except Exception as err:
        found["error_type"] = f"{type(err).__module__}.{type(err).__qualname__}"
        found["error_is_torch_oom"] = isinstance(err, torch.OutOfMemoryError)
        found["error_first_line"] = str(err).splitlines()[0][:300] if str(err) else ""
    found["allocated"] = len(held) * chunk
    found["torch_memory_allocated"] = int(torch.cuda.memory_allocated(0))
    found["torch_memory_reserved"] = int(torch.cuda.memory_reserved(0))
    if held:
        held.pop()
        try:
            held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
            x = torch.ones(1024, device="cuda")
            found["works_after"] = float((x * 2).sum().item()) == 2048.0
        except Exception as err:
            found["works_after"] = f"{type(err).__name__}: {err}"[:300]
    return found, held


def with_cupy(chunk: int) -> tuple[dict[str, Any], list[Any]]:
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    found: dict[str, Any] = {"lib": f"cupy {cupy.__version__}", "free": int(free), "total": int(total)}
    found["device_total_memory"] = int(cupy.cuda.Device(0).mem_info[1])
    held: list[Any] = []
    try:
        while True:
            held.append(cupy.empty(chunk, dtype=cupy.uint8))
    except Exception as err:
        found["error_type"] = f"{type(err).__module__}.{type(err).__qualname__}"
        found["error_is_cupy_oom"] = isinstance(err, cupy.cuda.memory.OutOfMemoryError)
        found["error_first_line"] = str(err).splitlines()[0][:300] if str(err) else ""
    found["allocated"] = len(held) * chunk
    pool = cupy.get_default_memory_pool()
    found["pool_used"] = int(pool.used_bytes())
    found["pool_total"] = int(pool.total_bytes())
    if held:
        held.pop()
        try:
            held.append(cupy.empty(chunk, dtype=cupy.uint8))
            x = cupy.ones(1024, dtype=cupy.float32)
            found["works_after"] = float((x * 2).sum()) == 2048.0
        except Exception as err:
            found["works_after"] = f"{type(err).__name__}: {err}"[:300]
    return found, held


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib", choices=("torch", "cupy"))
    ap.add_argument("--chunk-mib", type=int, default=64)
    ap.add_argument("--hold", action="store_true")
    args = ap.parse_args()
    chunk = args.chunk_mib * MIB
    found, held = with_torch(chunk) if args.lib == "torch" else with_cupy(chunk)
    found |= nvml_inside()
    found["pid"] = os.getpid()
    found["chunk"] = chunk
    print(json.dumps(found), flush=True)
    if args.hold:
        sys.stdin.read()
    del held
    return 0


if __name__ == "__main__":
    sys.exit(main())
