"""Helpers of the compute tests (test_arbiter.py, test_stalls.py, test_containers.py, ...): a
common start instant, a probe's results, and a token holder stopped or killed at a moment it
holds the GPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import Sim, parse_kv
from sharegpu import native
from sharegpu.arbiter import arbiter_path, ensure_arbiter, read_arbiter
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import DeviceLimit, create_tenant

POLICY = {
    "share": abi.POLICY_SHARE,
    "cap": abi.POLICY_CAP,
    "burst": abi.POLICY_BURST,
    "native": abi.POLICY_NATIVE,
}
PRIORITY = {"offline": abi.PRIORITY_OFFLINE, "normal": abi.PRIORITY_NORMAL, "online": abi.PRIORITY_ONLINE}


def compute_tenant(
    sim: Sim,
    name: str,
    policy: str = "share",
    pct: int = 100,
    *,
    ceiling: int | None = None,
    priority: str = "normal",
    gpu: int = 0,
    arbiter: bool = True,
) -> Path:
    """A tenant on one GPU with compute limits (as `sharegpu run --compute ...` makes it)."""
    uuid = sim.uuids()[gpu]
    share = pct * 10
    top = (ceiling * 10 if ceiling is not None else 1000) if policy == "burst" else share
    limit = DeviceLimit(
        uuid=uuid,
        mem_cap_bytes=256 * MIB,
        policy=POLICY[policy],
        priority=PRIORITY[priority],
        share_permille=share,
        ceiling_permille=top,
    )
    tenant = create_tenant(name, [limit], root=sim.runtime)
    if arbiter:
        ensure_arbiter(sim.runtime, uuid)
    return tenant


def spawn(sim: Sim, tenant: Path | None, *args: object) -> subprocess.Popen[str]:
    """The probe with `args` as a process of `tenant` (None: outside any tenant)."""
    env = sim.tenant_env(tenant) if tenant is not None else sim.env()
    return sim.spawn_probe(*(str(a) for a in args), env=env)


def spin_script(us: int, body: str) -> str:
    """A cuda-python program: the simulated GPU's spin kernel of `us` µs loaded on device 0's
    primary context as `f`, its launch arguments in `params`; then `body`."""
    prelude = f"""
        import ctypes, sys, time
        from cuda.bindings import driver as d
        d.cuInit(0)
        err, dev = d.cuDeviceGet(0)
        err, ctx = d.cuDevicePrimaryCtxRetain(dev)
        d.cuCtxSetCurrent(ctx)
        ptx = (b".version 8.0\\n.target sm_90\\n.address_size 64\\n"
               b".visible .entry spin(.param .u64 us)\\n{{\\n ret;\\n}}\\n")
        err, mod = d.cuModuleLoadData(ptx)
        err, f = d.cuModuleGetFunction(mod, b"spin")
        us = ctypes.c_uint64({us})
        params = (ctypes.c_void_p * 1)(ctypes.addressof(us))
    """
    return textwrap.dedent(prelude) + textwrap.dedent(body)


def spawn_python(sim: Sim, tenant: Path, code: str) -> subprocess.Popen[str]:
    """A Python program (dedented) under `tenant`'s shim, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=sim.tenant_env(tenant),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def spawn_in_pid_namespace(sim: Sim, tenant: Path, *args: object, mount_proc: bool) -> subprocess.Popen[str]:
    """A probe as pid 1 of a new pid namespace, with the host's /proc or its own (a container)."""
    cmd = ["unshare", "--pid", "--fork", "--kill-child", *(["--mount-proc"] if mount_proc else [])]
    cmd += [str(native.probe_path()), *(str(a) for a in args)]
    return subprocess.Popen(
        cmd, env=sim.tenant_env(tenant), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def arbiter_of(sim: Sim, gpu: int = 0) -> Path:
    return arbiter_path(sim.runtime, sim.uuids()[gpu])


def start_at(delay: float = 0.4) -> int:
    """A common CLOCK_MONOTONIC start instant, far enough ahead for every probe to be ready."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) + int(delay * 1e9)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"probe exited {proc.returncode}\n{out}\n{err}"
    assert err.strip() == "", err
    return parse_kv(out)[0]


def achieved(values: dict[str, str]) -> float:
    return float(values["achieved"]) * 100


def freeze_while_holding(path: Path, region_pid: int, host_pid: int, what: str) -> None:
    """SIGSTOP process `host_pid` at a moment it holds the GPU's token (`region_pid` in the
    region): frozen first and checked, let run and tried again otherwise, so the token cannot
    change hands between the look and the freeze.  Returns with it stopped."""
    deadline = time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline, f"{what} never held the token when looked at"
        os.kill(host_pid, signal.SIGSTOP)
        time.sleep(0.005)
        if read_arbiter(path).holder_pid == region_pid:
            return
        os.kill(host_pid, signal.SIGCONT)
        time.sleep(0.01)


def stop_a_token_holder(sim: Sim, a: Path, b: Path, *, runs_s: float, stopped_s: float) -> dict[str, str]:
    """Tenants `a` and `b` saturate GPU 0 from a common start (`a` for `runs_s`, `b` for 3.5 s);
    after a second `a`'s process is stopped (SIGSTOP: docker pause, a debugger) at a moment it
    holds the token, left stopped for `stopped_s` and let go. Returns `b`'s results, both ended."""
    at = start_at()
    frozen = spawn(sim, a, "saturate", runs_s, 500, "kernel", at)
    other = spawn(sim, b, "saturate", 3.5, 500, "kernel", at)
    time.sleep(1.0)
    freeze_while_holding(arbiter_of(sim), frozen.pid, frozen.pid, "the frozen tenant")
    time.sleep(stopped_s)
    frozen.send_signal(signal.SIGCONT)
    values = finish(other)
    finish(frozen)
    return values


def patch_file(path: Path, offset: int, data: bytes) -> None:
    """Overwrite `data` at `offset` of a region file in place (a damaged or foreign region)."""
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def kill_while_holding(path: Path, region_pid: int, host_pid: int, what: str) -> None:
    """SIGKILL process `host_pid` at a moment it holds the GPU's token."""
    freeze_while_holding(path, region_pid, host_pid, what)
    os.kill(host_pid, signal.SIGKILL)


# The region's figures that are not tunables: counters, the clients waiting now, what the
# prediction learned.
FIGURES = (
    "waiting",
    "grants",
    "handovers",
    "handover_idle_ns",
    "reclaims",
    "recoveries",
    "stall_reclaims",
    "entry_waits",
    "online_period_ns",
    "online_jitter_ns",
    "online_samples",
    "holdbacks",
    "holdback_ns",
    "holdback_misses",
    "early_preemptions",
    "quiet_windows",
    "lock_timeouts",
    "broken_since_ns",
    "online_stalls",
    "online_relearns",
    "loans",
    "online_gap_ns",
    "online_gap_samples",
)
