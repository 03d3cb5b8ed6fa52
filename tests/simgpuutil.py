"""Helpers for tests of the simulated GPU: paths, the probe, fresh interpreters."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sharegpu import simgpu

REPO = Path(__file__).resolve().parents[1]
NATIVE = REPO / "native"
LIB = REPO / "src" / "sharegpu" / "_lib"
SIMLIB = LIB / "simgpu"
MIB = 1024 * 1024
GIB = 1024 * MIB
KINDS = ["plain", "pitch", "managed", "async", "pool", "vmm", "array"]
PROBES = [pytest.param("sgprobe", id="linked"), pytest.param("sgprobe-dl", id="dlopen")]
# The simulated GPU's tuning from the environment, dropped where a test wants its defaults.
TUNING_VARS = (simgpu.KERNEL_US_ENV, *simgpu.ENGINE_ENV)


def small(env: dict[str, str], tmp_path: Path, mib: int = 256, **extra: object) -> dict[str, str]:
    cfg = tmp_path / "simgpu.json"
    cfg.write_text(json.dumps({"gpus": 2, "memory_mib": mib, **extra}))
    return {**env, "SIMGPU_CONFIG": str(cfg)}


def parse(out: str) -> dict[str, str]:
    kv: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            kv[key] = value
    return kv


def probe(
    env: dict[str, str], *args: str, exe: str = "sgprobe", rc: int = 0, timeout: float = 60
) -> dict[str, str]:
    p = subprocess.run(
        [str(LIB / exe), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert p.returncode == rc, (p.returncode, p.stdout, p.stderr)
    kv = parse(p.stdout)
    kv["_stdout"], kv["_stderr"] = p.stdout, p.stderr
    return kv


def start_hold(env: dict[str, str], kind: str, size: str, seconds: int = 60) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [str(LIB / "sgprobe"), "hold", kind, size, str(seconds)], env=env, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready=1"
    return p


def stop(p: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    p.send_signal(sig)
    p.wait()
    if p.stdout:
        p.stdout.close()


def run_python(env: dict[str, str], code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Runs code (dedented) in a fresh interpreter under env, which must exit 0."""
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    return p


def run_py(env: dict[str, str], code: str, timeout: float = 120) -> dict[str, Any]:
    """Runs code in a fresh interpreter; its last stdout line is JSON."""
    p = run_python(env, code, timeout)
    result: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return result


def needs(module: str) -> None:
    if importlib.util.find_spec(module.split(".", maxsplit=1)[0]) is None:
        pytest.skip(f"{module} is not installed in this interpreter")


# Every driver-API script (run_driver) starts with this: init, the primary context of GPU 0
# current, and helpers.
PRELUDE = r"""
import ctypes, json, time
from cuda.bindings import driver as d

def ck(res):
    err, *rest = res if isinstance(res, tuple) else (res,)
    assert err == d.CUresult.CUDA_SUCCESS, err
    return None if not rest else rest[0] if len(rest) == 1 else rest

def rc(res):
    err = res[0] if isinstance(res, tuple) else res
    return d.CUresult(err).name

def used():
    free, total = ck(d.cuMemGetInfo())
    return total - free

def ipc_event(hexed):  # an interprocess event handle from its 64 bytes in hex
    h = d.CUipcEventHandle()
    ctypes.memmove(h.getPtr(), bytes.fromhex(hexed), 64)
    return h

ck(d.cuInit(0))
dev = ck(d.cuDeviceGet(0))
ctx = ck(d.cuDevicePrimaryCtxRetain(dev))
ck(d.cuCtxSetCurrent(ctx))
out = {}
PTX = (b".version 8.0\n.target sm_90\n.address_size 64\n"
       b".visible .global .align 8 .b8 table[1048576];\n"
       b".visible .const .align 4 .u32 coeffs[4] = {1, 2, 3, 4};\n"
       b".global .f64 scale;\n"
       b".visible .entry spin(.param .u64 us)\n{\n ld.global.u32 %r1, [table];\n ret;\n}\n"
       b".visible .entry other()\n{\n ret;\n}\n\0")
"""


def run_driver(env: dict[str, str], body: str, **sources: str) -> dict[str, Any]:
    """Runs PRELUDE and then body (dedented) in a fresh interpreter; returns its `out` (JSON).
    The script may start children from the same sources: PRELUDE_SRC and each of `sources`."""
    named = "".join(f"{name} = {src!r}\n" for name, src in {"PRELUDE_SRC": PRELUDE, **sources}.items())
    return run_py(env, PRELUDE + named + textwrap.dedent(body) + "\nprint(json.dumps(out))\n")
