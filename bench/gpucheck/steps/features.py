"""Driver-level features this machine has, detected rather than assumed.

- NVML functions: whether the loaded libnvidia-ml exports them (the per-cgroup memory limits of
  newer drivers, nvmlDeviceGetMemoryLimits_v1 / nvmlDeviceSetMemoryLimits_v1; MPS process
  lists; per-process utilization) and every exported name about limits, cgroups or partitions;
  then whether the ones that can be asked harmlessly answer (MIG mode, compute mode,
  per-process utilization).
- MPS: whether the control daemon is installed, whether one already runs, and, on a real GPU,
  whether a private one (its own pipe and log directories, so no other client sees it) starts,
  serves a driver-API client, and quits. It is always told to quit before the step ends. While
  a client holds memory, which NVML list names it and which the server (the audit reads both).
- The kernel's device-memory cgroup controller (dmem, Linux 6.14+): /sys/fs/cgroup/dmem.capacity.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import struct
import time
from pathlib import Path
from typing import Any

import pynvml

from gpucheck import nvmlq
from gpucheck.context import StepContext
from gpucheck.mps import private_daemon
from gpucheck.target import Lines
from sharegpu import mps as node_mps
from sharegpu.native import probe_path

NVML_FUNCTIONS = (
    "nvmlDeviceGetMemoryLimits_v1",
    "nvmlDeviceSetMemoryLimits_v1",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetComputeMode",
    "nvmlDeviceGetVgpuSchedulerState",
)
INTERESTING = re.compile(r"limit|cgroup|partition|mps|timeslice|scheduler", re.IGNORECASE)


def exported_symbols(path: Path) -> list[str]:
    """The names in an ELF64 shared library's dynamic symbol table that it defines."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return []
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names: list[str] = []
    for sec in sections:
        if sec[1] != 11:  # SHT_DYNSYM
            continue
        strtab = sections[sec[6]]
        str_off = strtab[4]
        for off in range(sec[4], sec[4] + sec[5], 24):
            st_name, _info, _other, st_shndx = struct.unpack_from("<IBBH", data, off)
            if st_shndx == 0 or not st_name:  # undefined
                continue
            end = data.index(b"\0", str_off + st_name)
            names.append(data[str_off + st_name : end].decode(errors="replace"))
    return sorted(set(names))


def nvml_functions(library: Path | None) -> dict[str, Any]:
    if library is None:
        return {"library": None}
    lib = ctypes.CDLL(str(library))
    present = {name: hasattr(lib, name) for name in NVML_FUNCTIONS}
    exported = exported_symbols(library)
    return {
        "library": str(library),
        "exported_count": len(exported),
        "present": present,
        "limit_cgroup_partition_mps_scheduler": [
            n for n in exported if n.startswith("nvml") and INTERESTING.search(n)
        ],
    }


def answers() -> dict[str, Any]:
    with nvmlq.session():
        h = nvmlq.handle(0)
        since = int((time.time() - 1) * 1e6)
        util = nvmlq.ask(pynvml.nvmlDeviceGetProcessUtilization, h, since)
        return {
            "mig_mode": nvmlq.ask(pynvml.nvmlDeviceGetMigMode, h),
            "compute_mode": nvmlq.ask(pynvml.nvmlDeviceGetComputeMode, h),
            "process_utilization": util if isinstance(util, str) else "supported",
            "mps_processes": nvmlq.ask(lambda: len(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h))),
        }


def mps(ctx: StepContext) -> dict[str, Any]:
    found: dict[str, Any] = {
        "control": shutil.which(node_mps.CONTROL),
        "server": shutil.which("nvidia-cuda-mps-server"),
    }
    daemon = node_mps.find(node_mps.pipe_dir())  # the node's own, as doctor and the CDI spec see it
    found["daemon_running"] = daemon.state == "running"
    found["node_daemon"] = {"pipe_dir": str(daemon.pipe_dir), "state": daemon.state, "pid": daemon.pid}
    if found["control"] is None:
        found["private_daemon"] = f"not tried: {node_mps.CONTROL} is not installed"
        return found
    if not ctx.target.real:
        found["private_daemon"] = (
            "not tried: the simulated GPU has no MPS daemon (it models one: SIMGPU_MPS_BLOCK_US)"
        )
        return found
    with private_daemon(ctx.target.scratch("mps"), ctx.target.env) as private:
        if private.found["started"]:
            try:
                probe = ctx.target.probe(["launch", "10", "10"], env=private.env, timeout=30)
                found["private_daemon"] = (
                    "served a driver-API client" if probe.get("kernels") == "10" else str(probe)
                )
            except Exception as err:
                found["private_daemon"] = f"started, but a client failed: {err}"[:300]
            found["nvml_under_mps"] = _lists_under(ctx, private.env)
        else:
            found["private_daemon"] = private.found["why_not"]
    found["private_daemon_start_rc"] = private.found.get("start_rc")
    found["private_daemon_stopped"] = private.found.get("stopped")
    if "control.log_tail" in private.found:
        found["private_daemon_log_tail"] = private.found["control.log_tail"]
    return found


def _lists_under(ctx: StepContext, env: dict[str, str]) -> dict[str, Any]:
    """Where NVML lists a client of the daemon and the daemon's server: the audit reads both
    lists (sharegpu.devices) and spares the server (sharegpu.mps.is_server); this shows the
    driver doing what that assumes."""
    from sharegpu.devices import processes_by_gpu

    holder = ctx.target.spawn([str(probe_path()), "hold", "plain", "64M", "20"], env=env)
    try:
        Lines(holder).wait_for(lambda line: line.startswith("ready"), timeout=30)
        with nvmlq.session():
            h = nvmlq.handle(0)
            lists = {
                "compute": nvmlq.ask(lambda: _rows(pynvml.nvmlDeviceGetComputeRunningProcesses(h))),
                "mps": nvmlq.ask(lambda: _rows(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h))),
            }
        daemon = node_mps.find(Path(env[node_mps.PIPE_ENV]))
        merged = {p.pid for procs in processes_by_gpu().values() for p in procs}
        servers = [pid for pid in merged if node_mps.is_server(pid, daemon)]
        return {
            "client_pid": holder.pid,
            "lists": lists,
            "client_in_audit_view": holder.pid in merged,
            "servers_recognised": servers,
        }
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    finally:
        holder.kill()
        holder.wait(timeout=30)


def _rows(procs: Any) -> list[list[Any]]:
    """[pid, comm, MiB] of NVML's process entries."""
    rows = []
    for p in procs:
        try:
            comm = Path(f"/proc/{p.pid}/comm").read_text().strip()
        except OSError:
            comm = "?"
        rows.append([int(p.pid), comm, int(p.usedGpuMemory or 0) >> 20])
    return rows


def run(ctx: StepContext) -> None:
    from sharegpu.devices import nvml_library

    library = nvml_library()
    functions = ctx.figure("nvml_functions", nvml_functions(library))
    ctx.figure("nvml_answers", answers())
    found = ctx.figure("mps", mps(ctx))
    dmem = Path("/sys/fs/cgroup/dmem.capacity")
    ctx.figure("dmem_cgroup", dmem.read_text().strip() if dmem.exists() else "absent")
    ctx.check("NVML was found and read", library is not None, str(library))
    if found.get("private_daemon_start_rc") == 0:
        ctx.check("the private MPS daemon was stopped", bool(found.get("private_daemon_stopped")))
        under = found.get("nvml_under_mps", {})
        ctx.check(
            "an MPS client is in the audit's NVML view",
            bool(under.get("client_in_audit_view")),
            str(under)[:300],
        )
    present = functions.get("present", {})
    limits = "yes" if present.get("nvmlDeviceSetMemoryLimits_v1") else "no"
    ctx.summary(
        f"NVML memory limits: {limits}; MPS control: {'yes' if found['control'] else 'no'}"
        f" ({found.get('private_daemon', '')}); dmem cgroup: {'yes' if dmem.exists() else 'no'}"
    )
