"""The driver, CUDA and the GPU as NVML, nvidia-smi and the driver API report them, and the
CUDA-runtime tools this machine has (PyTorch, CuPy, nvcc) with their versions."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pynvml

from gpucheck import nvmlq
from gpucheck.context import StepContext
from gpucheck.target import last_json

MIB = 1 << 20
SMI_FIELDS = "name,uuid,driver_version,memory.total,compute_cap,pci.bus_id,compute_mode,persistence_mode"
TOOLCHAIN = """
import json, importlib
found = {}
for name in ("torch", "cupy", "numba", "cuda.core", "cuda.bindings", "pynvml"):
    try:
        mod = importlib.import_module(name)
        found[name] = str(getattr(mod, "__version__", "present"))
    except Exception as err:
        found[name] = f"absent: {type(err).__name__}"
try:
    import torch
    found["torch.version.cuda"] = str(torch.version.cuda)
except Exception:
    pass
print(json.dumps(found))
"""


def nvidia_smi() -> dict[str, Any]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"found": False}
    query = subprocess.run(
        [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    plain = subprocess.run([smi], capture_output=True, text=True, timeout=30, check=False)
    header = next((line.strip(" |") for line in plain.stdout.splitlines() if "CUDA Version" in line), "")
    rows = [
        dict(zip(SMI_FIELDS.split(","), (c.strip() for c in line.split(",")), strict=False))
        for line in query.stdout.splitlines()
        if line.strip()
    ]
    return {
        "found": True,
        "path": smi,
        "rc": query.returncode,
        "gpus": rows,
        "header": " ".join(header.split()),
    }


def nvcc_version() -> str:
    nvcc = shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if shutil.which("/usr/local/cuda/bin/nvcc") else None
    )
    if nvcc is None:
        return "absent"
    proc = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30, check=False)
    release = [line for line in proc.stdout.splitlines() if "release" in line]
    return release[-1].strip() if release else proc.stdout.strip()[-120:]


def _same_memory(driver_api_mib: int, nvml_mib: int) -> bool:
    """NVML's total counts what the driver reserves for itself (616 MiB on an H200, 0 on the
    simulated GPU); the driver API's does not. They agree when NVML's is that much larger."""
    return driver_api_mib <= nvml_mib <= driver_api_mib * 1.02


def run(ctx: StepContext) -> None:
    from sharegpu.devices import nvml_library

    target = ctx.target
    with nvmlq.session():
        count = pynvml.nvmlDeviceGetCount()
        cuda = nvmlq.ask(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        gpus = []
        for i in range(count):
            h = nvmlq.handle(i)
            total, used = nvmlq.memory(i)
            gpus.append(
                {
                    "index": i,
                    "name": nvmlq.text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": nvmlq.text(pynvml.nvmlDeviceGetUUID(h)),
                    "memory_total_mib": total // MIB,
                    "memory_used_mib": used // MIB,
                    "pci_bus_id": nvmlq.ask(lambda h=h: pynvml.nvmlDeviceGetPciInfo(h).busId),
                    "cuda_capability": nvmlq.ask(pynvml.nvmlDeviceGetCudaComputeCapability, h),
                    "settings": nvmlq.settings(i),
                }
            )
        driver = nvmlq.text(pynvml.nvmlSystemGetDriverVersion())
        nvml_version = nvmlq.ask(pynvml.nvmlSystemGetNVMLVersion)
    cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else str(cuda)
    ctx.figure("nvml", {"library": str(nvml_library()), "version": nvml_version, "gpu_count": count})
    ctx.figure("gpus", gpus)
    first = gpus[0] if gpus else {}
    ctx.figure(
        "gpu",
        {
            "name": first.get("name"),
            "uuid": first.get("uuid"),
            "memory_total_mib": first.get("memory_total_mib"),
            "driver_version": driver,
            "cuda_driver_version": cuda_text,
            "source": target.label,
        },
    )
    ctx.check("NVML lists a GPU", count >= 1, f"{count} GPU(s)")

    info = target.probe(["info"])
    ctx.figure("driver_api", {k: v for k, v in info.items() if k.startswith(("count", "driver", "dev0"))})
    if first:
        ctx.check(
            "the driver API and NVML agree on GPU 0",
            info.get("dev0.uuid") == first["uuid"]
            and _same_memory(int(info.get("dev0.total", 0)) // MIB, first["memory_total_mib"]),
            f"driver API {info.get('dev0.name')} {info.get('dev0.uuid')} "
            f"{int(info.get('dev0.total', 0)) // MIB} MiB (NVML {first['memory_total_mib']} MiB)",
        )

    smi = nvidia_smi()
    ctx.figure("nvidia_smi", smi)
    if target.real:
        ok = smi.get("found") and smi.get("rc") == 0 and smi["gpus"]
        ctx.check("nvidia-smi answers", bool(ok), smi.get("header", ""))
        if ok and first:
            row = smi["gpus"][0]
            ctx.check(
                "nvidia-smi and NVML agree",
                row.get("uuid") == first["uuid"] and row.get("driver_version") == driver,
                f"nvidia-smi: {row.get('name')} driver {row.get('driver_version')} "
                f"{row.get('memory.total')} MiB",
            )

    proc = subprocess.run(
        [target.python, "-c", TOOLCHAIN],
        capture_output=True,
        text=True,
        timeout=60,
        env=target.env,
        check=False,
    )
    tools: dict[str, Any] = last_json(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-300:]}
    tools["nvcc"] = nvcc_version()
    ctx.figure("toolchain", tools)
    torch = tools.get("torch", "absent")
    ctx.summary(
        f"{first.get('name')}, driver {driver}, CUDA {cuda_text}, {first.get('memory_total_mib')} MiB; "
        f"torch {torch}"
    )
