"""The simulated driver's API surface against CUDA 13.0's own headers.

The expected lists come from the headers (native/simgpu/tools/gen_api.py parses cuda.h and
cudaTypedefs.h), never from the simulator's checked-in table, so a stale table fails here.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from simgpuutil import NATIVE, SIMLIB

GEN = NATIVE / "simgpu" / "tools" / "gen_api.py"
NOT_SUPPORTED = 801
VERSIONS = (12000, 12080, 13000)


def _gen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_api", GEN)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_api"] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def header() -> tuple[list[str], list[object]]:
    gen = _gen()
    symbols, rows = gen.parse(gen.default_include())
    return symbols, rows


Header = tuple[list[str], list[object]]


def _exports(lib: Path) -> dict[str, str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], check=True, capture_output=True, text=True)
    kinds = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TW":
            kinds[parts[2].split("@")[0]] = parts[1]
    return kinds


def test_the_generated_table_is_current(built: Path) -> None:
    p = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr


def test_libcuda_exports_every_entry_point_of_cuda_h(
    built: Path, header: tuple[list[str], list[object]]
) -> None:
    symbols, _ = header
    assert len(symbols) > 600  # CUDA 13.0 declares 634, old ABI versions and variants included
    exported = _exports(SIMLIB / "libcuda.so.1")
    assert set(exported) == set(symbols)
    modelled = {s for s, kind in exported.items() if kind == "T"}
    # The families every client needs are modelled, not stubs.
    for s in ("cuInit", "cuGetProcAddress_v2", "cuMemAlloc_v2", "cuLaunchKernel", "cuCtxSynchronize_v2"):
        assert s in modelled


def _expected(rows: list[object], version: int, per_thread: bool) -> dict[str, str]:
    """What the real table answers: the newest row at or below the version; a per-thread
    request takes the per-thread row of the same or a newer version over a plain one."""
    best: dict[str, tuple[int, bool, str]] = {}
    for r in rows:
        name, v, sym, pt = r.name, r.version, r.symbol, r.per_thread  # type: ignore[attr-defined]
        if v > version or (pt and not per_thread):
            continue
        if name not in best or (v, pt) > best[name][:2]:
            best[name] = (v, pt, sym)
    return {name: b[2] for name, b in best.items()}


RESOLVE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
ask = json.loads(sys.stdin.read())
proc = lib.cuGetProcAddress_v2
proc.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                 ctypes.POINTER(ctypes.c_int)]
out = {"dlsym": {s: ctypes.cast(getattr(lib, s), ctypes.c_void_p).value for s in ask["symbols"]}}
for version in (12000, 12080, 13000):
    for flags in (0, 1, 2):  # default, legacy stream, per-thread default stream
        for name in ask["names"]:
            fn, status = ctypes.c_void_p(), ctypes.c_int(-1)
            rc = proc(name.encode(), ctypes.byref(fn), version, flags, ctypes.byref(status))
            out[f"{version}/{flags}/{name}"] = [rc, status.value, fn.value or 0]
out["cuDeviceGetLuid()"] = lib.cuDeviceGetLuid(None, None, 0)
print(json.dumps(out))
"""


def test_cuGetProcAddress_answers_each_name_at_each_version_as_the_real_table(
    sim_env: dict[str, str], header: Header
) -> None:
    symbols, rows = header
    names = sorted({r.name for r in rows})  # type: ignore[attr-defined]
    p = subprocess.run(
        [sys.executable, "-c", RESOLVE, str(SIMLIB / "libcuda.so.1")],
        input=json.dumps({"names": [*names, "cuNoSuchFunction"], "symbols": symbols}),
        env=sim_env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    got = json.loads(p.stdout)
    addr = got["dlsym"]
    for version in VERSIONS:
        for flags in (0, 1, 2):
            want = _expected(rows, version, per_thread=flags == 2)
            for name in names:
                rc, status, fn = got[f"{version}/{flags}/{name}"]
                if name not in want:  # newer than the caller: NOT_FOUND, VERSION_NOT_SUFFICIENT
                    assert (rc, status, fn) == (500, 2, 0), (version, name)
                    continue
                assert (rc, status) == (0, 0), (version, flags, name)
                assert fn == addr[want[name]], (version, flags, name, want[name])
    assert got["13000/0/cuNoSuchFunction"] == [500, 1, 0]  # NOT_FOUND, SYMBOL_NOT_FOUND
    # A CUDA 13 caller gets the context-taking synchronize; a CUDA 12 caller the old one.
    assert _expected(rows, 13000, False)["cuCtxSynchronize"] == "cuCtxSynchronize_v2"
    assert _expected(rows, 12080, False)["cuCtxSynchronize"] == "cuCtxSynchronize"
    assert got["cuDeviceGetLuid()"] == NOT_SUPPORTED


INTERPOSER = r"""
typedef int CUresult;
CUresult cuMemAlloc_v2(void *p, unsigned long n) { (void)p; (void)n; return 999; }
CUresult cuInit(unsigned f) { (void)f; return 999; }
"""

WHO = r"""
import ctypes, json, sys
class Info(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                ("saddr", ctypes.c_void_p)]
lib = ctypes.CDLL(sys.argv[1])
libc = ctypes.CDLL(None)
libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(Info)]
out = {}
for name, version in (("cuMemAlloc", 13000), ("cuInit", 2000)):
    fn = ctypes.c_void_p()
    assert lib.cuGetProcAddress_v2(name.encode(), ctypes.byref(fn), version, 0, None) == 0
    info = Info()
    assert libc.dladdr(fn, ctypes.byref(info))
    out[name] = info.fname.decode()
    out[name + "()"] = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint)(fn.value)(0)
print(json.dumps(out))
"""


def test_cuGetProcAddress_hands_out_the_drivers_own_functions_under_an_interposer(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    src = tmp_path / "interposer.c"
    src.write_text(INTERPOSER)
    so = tmp_path / "libinterposer.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    env = {**sim_env, "LD_PRELOAD": str(so)}
    p = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WHO), str(SIMLIB / "libcuda.so.1")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(p.stdout)
    # Both names resolve inside the simulator, never to the preloaded library's symbol.
    assert Path(out["cuMemAlloc"]).name == "libcuda.so.1"
    assert Path(out["cuInit"]).name == "libcuda.so.1"
    assert out["cuInit()"] == 0  # the driver's cuInit ran, not the interposer's (999)


def test_the_readme_table_adds_up_to_what_the_library_exports(built: Path) -> None:
    exported = _exports(SIMLIB / "libcuda.so.1")
    modelled = sum(1 for kind in exported.values() if kind == "T")
    readme = (NATIVE / "simgpu" / "README.md").read_text()
    rows = re.findall(r"^\|[^|\n]+\| (\d+) / (\d+) \|", readme, re.M)
    assert rows, "the family table of native/simgpu/README.md is missing"
    assert sum(int(m) for m, _ in rows) == modelled
    assert sum(int(t) for _, t in rows) == len(exported)
    assert f"counts the modelled ones: {modelled} of {len(exported)}" in readme.replace("\n", " ")
