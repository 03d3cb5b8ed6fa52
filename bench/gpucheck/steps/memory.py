"""Memory caps under `sharegpu run --memory 4GiB`, seen by unmodified programs.

Each program allocates 64 MiB at a time until refused and reports what it saw; while it still
holds the memory, NVML is read from outside the tenant. The claims, for each program:

- inside, the device is the vGPU: the free/total query and the device's total memory say 4 GiB;
  so does NVML inside the process;
- allocating stops at the cap: at most 4 GiB, and less than two chunks short of it (the
  caching allocators round a request up to a block; 64 MiB is a whole number of blocks);
- the refusal is the program's own out-of-memory error (torch.OutOfMemoryError, CuPy's
  OutOfMemoryError, cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY), and the process still
  works after freeing a chunk;
- outside, NVML shows the card (its full memory), and the process's memory on it.

The driver-API probe runs everywhere; PyTorch, CuPy and the nvcc-built program on a real GPU.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpucheck import nvmlq
from gpucheck.context import StepContext
from gpucheck.target import Lines, Target, last_json, parse_kv

MIB = 1 << 20
CAP = 4096 * MIB
CHUNK_MIB = 64
PROGRAMS = Path(__file__).resolve().parents[1] / "programs"
NVML_INSIDE = (
    "import pynvml; pynvml.nvmlInit(); "
    "m = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)); print(m.total)"
)


def card_total(target: Target) -> int:
    """The card's memory as the driver API reports it outside any tenant."""
    return int(target.probe(["info"])["dev0.total"])


def outside() -> dict[str, Any]:
    with nvmlq.session():
        total, used = nvmlq.memory(0)
        procs = nvmlq.process_used(0)
    return {"nvml_total": total, "nvml_used": used, "nvml_processes": procs}


def hold_and_look(
    ctx: StepContext, name: str, argv: list[str], ready: Callable[[str], bool], closes_stdin: bool
) -> tuple[list[str], dict[str, Any]]:
    """Run `argv` as tenant `name` (4 GiB); once it prints a line `ready` accepts, read NVML
    from outside, then let it finish. Its output lines and what NVML said."""
    run = ctx.target.run_command(["--memory", "4GiB", "--name", name], argv)
    proc = ctx.target.spawn(run, stdin=subprocess.PIPE)
    lines = Lines(proc)
    try:
        lines.wait_for(ready, timeout=ctx.scale(120, 60))
        seen = outside()
    finally:
        if closes_stdin and proc.stdin:
            proc.stdin.close()
    out = lines.rest(timeout=60)
    rc = proc.wait(timeout=30)
    ctx.figure("exit_status", rc)
    ctx.check("the program and sharegpu run exited 0", rc == 0, f"status {rc}")
    return out, seen


def judge(ctx: StepContext, got: dict[str, Any], seen: dict[str, Any], oom_ok: bool, oom_name: str) -> None:
    if "init_error" in got:
        ctx.figure("inside", got)
        ctx.check("the CUDA runtime initialised under the shim", False, str(got["init_error"]))
        ctx.summary(f"the CUDA runtime did not initialise: {got['init_error']}")
        return
    card = ctx.figure("card_total_mib", card_total(ctx.target) // MIB)
    chunk = int(got.get("chunk", CHUNK_MIB * MIB))
    allocated = int(got.get("allocated", 0))
    ctx.figure("cap_mib", CAP // MIB)
    ctx.figure("inside", got)
    ctx.figure("outside", seen)
    ctx.check(
        "the free/total query shows the vGPU",
        int(got.get("total", -1)) == CAP,
        f"total {int(got.get('total', 0)) // MIB} MiB",
    )
    ctx.check(
        "the device's total memory is the vGPU's",
        int(got.get("device_total_memory", -1)) == CAP,
        f"{int(got.get('device_total_memory', 0)) // MIB} MiB",
    )
    if "nvml_total" in got or "nvml_error" in got:
        ctx.check(
            "NVML inside the process shows the vGPU",
            int(got.get("nvml_total", -1)) == CAP,
            str(got.get("nvml_total", got.get("nvml_error"))),
        )
    procs: dict[int, int] = {int(k): v for k, v in seen["nvml_processes"].items()}
    pid = got.get("pid")
    mine = procs.get(int(pid)) if pid is not None else (max(procs.values()) if procs else None)
    ctx.figure("nvml_process_used_mib", None if mine is None else mine // MIB)
    # The cap counts the context's own memory (hundreds of MiB on a real GPU, which no
    # allocation returns), so what the program allocated stops short of the cap by that much;
    # what the card holds for the process is what reaches it.
    held = mine if mine is not None else allocated
    ctx.figure("context_mib", None if mine is None else (mine - allocated) // MIB)
    ctx.check(
        "what the card holds for the process reaches the cap (within two chunks)",
        CAP - 2 * chunk < held,
        f"{held // MIB} MiB of {CAP // MIB} (allocated {allocated // MIB} MiB)",
    )
    # A context grows after its creation (modules loaded lazily at a first launch): that is the
    # node agent's reconciler's to count, and no agent runs here, so up to a chunk over is
    # reported as a figure rather than failed.
    ctx.figure("over_cap_mib", max(0, held - CAP) // MIB)
    ctx.check(
        "and passes it by no more than a chunk (no agent here to reconcile a context's growth)",
        held <= CAP + chunk,
        f"{held // MIB} MiB of {CAP // MIB}",
    )
    for key in ("torch_memory_reserved", "pool_total"):
        if key in got:
            ctx.check(
                f"the allocator's {key.split('_', 1)[1]} stays within the cap",
                int(got[key]) <= CAP,
                f"{int(got[key]) // MIB} MiB",
            )
    ctx.check(f"the refusal is {oom_name}", oom_ok, str(got.get("error_type")))
    ctx.check(
        "the process still works after freeing a chunk", got.get("works_after", got.get("refill")) is True
    )
    # NVML's total is a little over the driver API's (it counts what the driver reserves:
    # 616 MiB on an H200), so outside it is the card when it is at least the driver API's figure.
    ctx.check(
        "NVML outside shows the card",
        card <= int(seen["nvml_total"]) // MIB <= card * 1.02 and card * MIB > CAP,
        f"{int(seen['nvml_total']) // MIB} MiB (driver API {card} MiB)",
    )
    if mine is not None:
        ctx.check("NVML outside charges the process what it holds", mine >= allocated, f"{mine // MIB} MiB")
    ctx.summary(
        f"cap {CAP // MIB} MiB: sees {int(got.get('total', 0)) // MIB} MiB, got {allocated // MIB} MiB "
        f"+ context {'?' if mine is None else (mine - allocated) // MIB} MiB, "
        f"refused with {str(got.get('error_type')).rsplit('.', 1)[-1]}; "
        f"NVML outside {int(seen['nvml_total']) // MIB} MiB"
    )


def probe(ctx: StepContext) -> None:
    from sharegpu.native import probe_path

    out, seen = hold_and_look(
        ctx,
        "gc-mem-probe",
        [str(probe_path()), "fill", "plain", f"{CHUNK_MIB}M", "2"],
        lambda line: line == "held=1",
        False,
    )
    kv = parse_kv("\n".join(out))
    got: dict[str, Any] = {
        "lib": "driver API (sgprobe)",
        "free": int(kv.get("free", -1)),
        "total": int(kv.get("total", -1)),
        "device_total_memory": int(kv.get("devtotal", -1)),
        "allocated": int(kv.get("bytes", 0)),
        "chunk": CHUNK_MIB * MIB,
        "error_type": kv.get("error"),
        "refill": kv.get("refill") == "OK",
    }
    nvml = subprocess.run(
        ctx.target.run_command(
            ["--memory", "4GiB", "--name", "gc-mem-nvml"], [ctx.target.python, "-c", NVML_INSIDE]
        ),
        env=ctx.target.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    got["nvml_total"] = int(nvml.stdout.split()[-1]) if nvml.returncode == 0 and nvml.stdout.split() else -1
    judge(ctx, got, seen, got["error_type"] == "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_OUT_OF_MEMORY")


def _framework(ctx: StepContext, lib: str) -> None:
    if importlib.util.find_spec(lib) is None:
        raise ctx.skip(f"{lib} is not installed for {ctx.target.python}")
    argv = [ctx.target.python, str(PROGRAMS / "alloc.py"), lib, "--chunk-mib", str(CHUNK_MIB), "--hold"]
    out, seen = hold_and_look(ctx, f"gc-mem-{lib}", argv, lambda line: line.startswith("{"), True)
    got = last_json("\n".join(out))
    if lib == "torch":
        judge(ctx, got, seen, got.get("error_is_torch_oom") is True, "torch.OutOfMemoryError")
    else:
        judge(ctx, got, seen, got.get("error_is_cupy_oom") is True, "cupy.cuda.memory.OutOfMemoryError")


def torch(ctx: StepContext) -> None:
    _framework(ctx, "torch")


def cupy(ctx: StepContext) -> None:
    _framework(ctx, "cupy")


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or next(
        (str(p) for p in (Path("/usr/local/cuda/bin/nvcc"),) if p.exists()), None
    )


def nvcc(ctx: StepContext) -> None:
    compiler = nvcc_path()
    if compiler is None:
        raise ctx.skip("nvcc is not installed here (nor /usr/local/cuda/bin/nvcc)")
    exe = ctx.target.scratch("nvcc") / "cuda_malloc"
    began = time.monotonic()
    build = subprocess.run(
        [compiler, "-O2", "-o", str(exe), str(PROGRAMS / "cuda_malloc.cu")],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    ctx.figure("compile_s", round(time.monotonic() - began, 1))
    if not ctx.check("nvcc built the program", build.returncode == 0, build.stderr.strip()[-300:]):
        return
    out, seen = hold_and_look(
        ctx, "gc-mem-nvcc", [str(exe), str(CHUNK_MIB), "hold"], lambda line: line.startswith("{"), True
    )
    got = json.loads(next(line for line in reversed(out) if line.startswith("{")))
    judge(ctx, got, seen, got.get("error_type") == "cudaErrorMemoryAllocation", "cudaErrorMemoryAllocation")
