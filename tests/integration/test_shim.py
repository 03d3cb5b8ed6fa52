"""libsharegpu.so: memory isolation through real processes on the simulated GPU.

Every test runs real programs (the C probe linked to libcuda, the dlopen probe, cuda-python,
pynvml, small C helpers from native/shim/tests) with the shim preloaded and a tenant created by
sharegpu.tenant, on a simulated GPU isolated per test (conftest.Sim).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import mmap
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cbuild import INCLUDE, SHIM_DIR, gcc
from conftest import REPO, Sim, parse_kv, python
from sharegpu import native
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import DeviceLimit, create_tenant, tenant_status

CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801
KINDS = ["plain", "pitch", "managed", "async", "pool", "vmm", "array"]
FAKE_UUID = "GPU-11111111-2222-3333-4444-555555555555"


# ---------------------------------------------------------------------------------------------
# helpers


def hook_names() -> list[str]:
    text = (SHIM_DIR / "hooks.def").read_text()
    return re.findall(r"^SG_HOOK\(\w+, (\w+)\)", text, flags=re.M)


def results(res, key: str = "result") -> list[int]:  # type: ignore[no-untyped-def]
    """The CUresult of each allocation a probe command reported, in order."""
    return [int(v) for v in res.all(key)]


def spawn_python(env: dict[str, str], code: str) -> subprocess.Popen[str]:
    """A Python program the test talks to through its stdin and stdout."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def usage_view(tenant: Path) -> tuple[mmap.mmap, abi.Usage]:
    fd = os.open(tenant / abi.USAGE_FILE, os.O_RDWR)
    try:
        view = mmap.mmap(fd, ctypes.sizeof(abi.Usage))
    finally:
        os.close(fd)
    return view, abi.Usage.from_buffer(view)


def wait_for_line(proc: subprocess.Popen[str], key: str, timeout: float = 60) -> str:
    """Read the probe's stdout until a line `key=...` appears; returns its value."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(key + "="):
            return line.strip().split("=", 1)[1]
    raise AssertionError(f"no {key}= line from the probe; got {seen!r}")


# ---------------------------------------------------------------------------------------------
# the library itself


LEDGER_API = {
    "sharegpu_layer_api_version",
    "sharegpu_ledger_state",
    "sharegpu_ledger_device",
    "sharegpu_ledger_charge",
    "sharegpu_ledger_rekey",
    "sharegpu_ledger_credit",
    "sharegpu_ledger_credit_owner",
    "sharegpu_arb_enter",
    "sharegpu_arb_exit",
    "sharegpu_arb_forget",
    "sharegpu_arb_wait_begin",
    "sharegpu_arb_wait_end",
}


def test_exports_are_exactly_the_hooks_dlsym_dlvsym_dlopen_and_the_ledger_api() -> None:
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(native.shim_path())], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1].split("@")[0] for line in nm.splitlines() if line.strip()}
    mapped = set(re.findall(r"^\s+(\w+);", (SHIM_DIR / "exports.map").read_text(), flags=re.M))
    listed = set(hook_names()) | {"dlsym", "dlvsym", "dlopen"} | LEDGER_API  # layer_api.c
    assert len(hook_names()) == len(set(hook_names())), "a hook is listed twice"
    assert exported == listed
    assert mapped == listed


@pytest.mark.parametrize("opt", [pytest.param("-O0", id="O0"), pytest.param("-O2", id="O2")])
def test_builds_warning_free(tmp_path: Path, opt: str) -> None:
    sources = sorted(str(p) for p in SHIM_DIR.glob("*.c"))
    subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-D_GNU_SOURCE",
            "-fPIC",
            "-fvisibility=hidden",
            f"-I{INCLUDE}",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-Wstrict-prototypes",
            "-Wshadow",
            "-Wformat=2",
            "-Wno-unused-parameter",
            opt,
            "-shared",
            f"-Wl,--version-script={SHIM_DIR / 'exports.map'}",
            "-o",
            str(tmp_path / "s.so"),
            *sources,
            "-ldl",
            "-lpthread",
        ],
        check=True,
        capture_output=True,
        text=True,
    )


def test_proc_table_covers_every_hooked_base(tmp_path: Path) -> None:
    exe = gcc(
        tmp_path,
        "proctable_test",
        str(SHIM_DIR / "tests" / "proctable_test.c"),
        str(SHIM_DIR / "proctable.c"),
    )
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    values, lines = parse_kv(out)
    assert [v for k, v in lines if k == "bad"] == []
    assert int(values["checked"]) >= 2 * 20
    assert values["cuMemAlloc@13000"] == "cuMemAlloc_v2"
    assert values["cuMemAlloc@3010"] == "cuMemAlloc"  # the legacy variant: refused by its hook
    assert values["cuMemAllocAsync@12000"] == "cuMemAllocAsync"
    assert values["cuMemAllocAsync@12000_ptds"] == "cuMemAllocAsync_ptsz"
    assert values["cuMemAllocFromPoolAsync@11020_ptds"] == "cuMemAllocFromPoolAsync_ptsz"
    assert values["cuMemAllocAsync@11010"] == "NONE"
    assert values["cuMemCreate@10010"] == "NONE"
    assert values["cuMemFree@3000"] == "PASS"
    assert values["cuGetProcAddress@11030"] == "cuGetProcAddress"
    assert values["cuLaunchKernel@12000"] == "cuLaunchKernel"  # gated by the arbiter (ABI 1.1)
    assert values["cuMemsetD8@12000"] == "UNHOOKED"


# Legacy allocation variants the shim cannot account and so refuses to hand out.
REFUSED = {"cuArray3DCreate"}


def test_proc_table_answers_every_hooked_base_as_the_cuda_headers_do(tmp_path: Path) -> None:
    """For every base the fallback table knows, at every version where the header's table
    changes and in both stream modes: the hook of the very variant the header names (never an
    older variant's hook for a newer ABI, as cuCtxSynchronize v1 for CUDA 13's
    cuCtxSynchronize_v2), PASS for a variant we leave alone, NONE before the first."""
    spec = importlib.util.spec_from_file_location(
        "gen_api", REPO / "native" / "simgpu" / "tools" / "gen_api.py"
    )
    assert spec is not None
    assert spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    sys.modules["gen_api"] = gen
    spec.loader.exec_module(gen)
    _, rows = gen.parse(gen.default_include())
    table = (SHIM_DIR / "proctable.c").read_text()
    bases = sorted(set(re.findall(r'\{"(cu\w+)", \d+,', table)))
    hooked = set(re.findall(r"SG_HOOK\(CU, (\w+)\)", (SHIM_DIR / "hooks.def").read_text()))
    queries, want = [], {}
    for base in bases:
        mine = [r for r in rows if r.name == base]
        assert mine, f"{base}: not in cudaTypedefs.h"
        for version in sorted({r.version for r in mine} | {r.version - 10 for r in mine} | {13000}):
            for ptds in (0, 1):
                ok = [r for r in mine if r.version <= version and (ptds or not r.per_thread)]
                best = max(ok, key=lambda r: (r.version, r.per_thread), default=None)
                if best is None or best.symbol in REFUSED:
                    expect = "NONE"
                else:
                    expect = best.symbol if best.symbol in hooked else "PASS"
                queries.append(f"{base} {version} {ptds}")
                want[(base, version, ptds)] = expect
    exe = gcc(
        tmp_path,
        "proctable_test",
        str(SHIM_DIR / "tests" / "proctable_test.c"),
        str(SHIM_DIR / "proctable.c"),
    )
    out = subprocess.run(
        [str(exe), "--stdin"], input="\n".join(queries), capture_output=True, text=True, check=True
    ).stdout
    got = {(b, int(v), int(p)): t for b, v, p, t in (line.split() for line in out.splitlines())}
    assert len(got) == len(want)
    wrong = {k: (got[k], w) for k, w in want.items() if got[k] != w}
    assert wrong == {}
    assert want[("cuCtxSynchronize", 13000, 0)] == "cuCtxSynchronize_v2"


def run_fake_driver(tmp_path: Path) -> tuple[Path, dict[str, str], subprocess.CompletedProcess[str]]:
    """fakemain.c under the shim, over the fake driver fakecuda.c (whose cuGetProcAddress hands
    out pointers nobody can name, and which loads any module): the program, its environment and
    its run."""
    gcc(
        tmp_path,
        "libcuda.so.1",
        "-fPIC",
        "-fvisibility=hidden",
        "-shared",
        "-Wl,-soname,libcuda.so.1",
        str(SHIM_DIR / "tests" / "fakecuda.c"),
    )
    exe = gcc(tmp_path, "fakemain", str(SHIM_DIR / "tests" / "fakemain.c"), "-ldl")
    tenant = create_tenant("fake", [DeviceLimit(uuid=FAKE_UUID, mem_cap_bytes=MIB)], root=tmp_path / "run")
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(tmp_path),
        "LD_PRELOAD": str(native.shim_path()),
        "SHAREGPU_TENANT": str(tenant),
    }
    proc = subprocess.run([str(exe)], check=False, env=env, capture_output=True, text=True, timeout=60)
    return exe, env, proc


def test_get_proc_address_falls_back_to_the_version_table(tmp_path: Path) -> None:
    """A driver whose cuGetProcAddress returns pointers nobody can name (fakecuda.c): the shim
    must still hand out its hook, so the hidden allocator is never reached."""
    exe, env, proc = run_fake_driver(tmp_path)
    values, _ = parse_kv(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert values["alloc_is_hook"] == "1"
    assert values["alloc_over"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert values["alloc_fit"] == "0"
    assert values["alloc_one_more"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert values["free"] == "0"
    assert values["alloc_after_free"] == "0"
    assert values["total"] == str(MIB)
    assert values["launch_is_hook"] == "1"  # a launch path: our gate, never the hidden one
    assert values["hidden_calls"] == "0"
    assert proc.stderr == ""
    # Without the shim the same program reaches the hidden functions.
    env.pop("LD_PRELOAD")
    plain = subprocess.run([str(exe)], check=False, env=env, capture_output=True, text=True, timeout=60)
    assert parse_kv(plain.stdout)[0]["hidden_calls"] != "0"


def test_ptx_with_a_preprocessor_line_never_reaches_the_driver(tmp_path: Path) -> None:
    """A `#` first on a line, whitespace and comments before it (`/**/#define`, a comment over
    two lines), is a directive a preprocessor could paste names with: the shim refuses that PTX
    itself (the fake driver, fakecuda.c, would load anything).  A `#` inside a line comment is
    no directive and loads."""
    _, _, proc = run_fake_driver(tmp_path)
    values, _ = parse_kv(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for key in ("ptx_directive", "ptx_after_comment", "ptx_after_multiline_comment"):
        assert values[key] == str(CUDA_ERROR_NOT_SUPPORTED), key
    assert values["ptx_hash_in_comment"] == "0"
    assert values["module_loads"] == "1"  # only the last one reached the driver
    assert proc.stderr == ""


def test_dlsym_rtld_next_is_relative_to_the_real_caller(tmp_path: Path) -> None:
    src = str(SHIM_DIR / "tests" / "dlnext.c")
    a = gcc(tmp_path, "libnexta.so", "-DLIB_A", "-fPIC", "-shared", src, "-ldl")
    b = gcc(tmp_path, "libnextb.so", "-DLIB_B", "-fPIC", "-shared", src)
    exe = gcc(tmp_path, "dlnext", src, "-ldl")
    env = {**os.environ, "LD_PRELOAD": f"{native.shim_path()} {a} {b}"}
    out = subprocess.run([str(exe)], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "next=2"


# ---------------------------------------------------------------------------------------------
# more helpers: probes, regions


CAP = 64  # MiB, the default cap of the tests below


def allocs(res) -> list[str]:  # type: ignore[no-untyped-def]
    return res.all("alloc")


def tenant_probe(  # type: ignore[no-untyped-def]
    sim: Sim, tenant: Path, *args: str, dlopen: bool = False, check: bool = True, **env: str
):
    return sim.probe(*args, env=sim.tenant_env(tenant, **env), dlopen=dlopen, check=check)


def spawn_hold(
    sim: Sim, tenant: Path, kind: str, size: str, *, seconds: int = 120, ordinal: int = 0
) -> subprocess.Popen[str]:
    proc = sim.spawn_probe("-d", str(ordinal), "hold", kind, size, str(seconds), env=sim.tenant_env(tenant))
    assert wait_for_line(proc, "ready") == "1"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait(timeout=30)
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


def write_limits(tenant: Path, caps_mib: list[int] | None = None, **fields: int) -> None:
    """Rewrite the limits in place the way the agent resizes: the seqlock of abi.h."""
    path = tenant / abi.LIMITS_FILE
    path.chmod(0o644)
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, ctypes.sizeof(abi.Limits)) as view:
            lim = abi.Limits.from_buffer(view)
            gen = lim.generation
            lim.generation = gen + 1
            if caps_mib is not None:
                for i, cap in enumerate(caps_mib):
                    lim.devices[i].mem_cap_bytes = cap * MIB
            for name, value in fields.items():
                setattr(lim, name, value)
            lim.generation = gen + 2
            del lim
    finally:
        os.close(fd)


def patch_file(path: Path, offset: int, data: bytes) -> None:
    path.chmod(0o644)
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# the cap, every allocation kind


@pytest.mark.parametrize("kind", [pytest.param(k, id=k) for k in KINDS])
def test_cap_is_exact_for_every_allocation_kind(sim: Sim, kind: str) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    res = tenant_probe(sim, tenant, "alloc", kind, "32M", "32M", "1M")
    assert allocs(res) == ["OK", "OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert res.int("total") == CAP * MIB
    assert res.int("devtotal") == CAP * MIB
    assert res.int("free") == 0
    chunk = "2M" if kind == "vmm" else "1M"  # VMM sizes are rounded to the 2 MiB granularity
    fill = tenant_probe(sim, tenant, "fill", kind, chunk)
    assert fill.int("bytes") == CAP * MIB
    assert fill["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert fill["refill"] == "OK"  # after a free it fits again
    view, usage = usage_view(tenant)
    try:
        assert usage.devices[0].mem_used_bytes == 0  # every process gave its slot back at exit
        assert usage.devices[0].mem_peak_bytes == CAP * MIB
        assert usage.devices[0].oom_events == 2
        assert all(p.pid == 0 for p in usage.procs)
    finally:
        del usage
        view.close()


def test_cap_is_exact_to_the_byte(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    res = tenant_probe(sim, tenant, "alloc", "plain", f"{CAP * MIB - 4096}", "4096", "1")
    assert allocs(res) == ["OK", "OK", "CUDA_ERROR_OUT_OF_MEMORY"]


def test_processes_of_one_tenant_share_the_cap(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    holder = spawn_hold(sim, tenant, "plain", "40M")
    try:
        res = tenant_probe(sim, tenant, "alloc", "managed", "40M", "24M", "1")
        assert allocs(res) == ["CUDA_ERROR_OUT_OF_MEMORY", "OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    finally:
        stop(holder)


def test_tenants_on_one_gpu_do_not_affect_each_other(sim: Sim) -> None:
    a = sim.tenant("a", CAP, gpus=[0])
    b = sim.tenant("b", CAP, gpus=[0])
    holder = spawn_hold(sim, a, "plain", f"{CAP}M")
    try:
        res = tenant_probe(sim, b, "alloc", "plain", f"{CAP}M", "1")
        assert allocs(res) == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
        assert res.int("free") == 0
        assert tenant_probe(sim, a, "meminfo").int("free") == 0
    finally:
        stop(holder)
    assert tenant_probe(sim, a, "meminfo").int("free") == CAP * MIB


def test_processes_times_threads_never_exceed_the_cap(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    env = sim.tenant_env(tenant)
    procs = [
        subprocess.Popen(
            [str(native.probe_path()), "threads", "4", kind, "1M"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for kind in ("plain", "async", "managed", "pitch")
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, out + err
        values, _ = parse_kv(out)
        assert values["error"] == "CUDA_ERROR_OUT_OF_MEMORY"
        assert int(values["bytes"]) <= CAP * MIB
    view, usage = usage_view(tenant)
    try:
        assert usage.devices[0].mem_peak_bytes == CAP * MIB  # reached, never passed
        assert usage.devices[0].mem_used_bytes == 0
    finally:
        del usage
        view.close()


BARRIER_SCRIPT = """
    import sys, threading
    from cuda.bindings import driver as d
    assert d.cuInit(0)[0] == 0
    err, dev = d.cuDeviceGet(0)
    err, ctx = d.cuDevicePrimaryCtxRetain(dev)
    held, lock = [], threading.Lock()
    def fill():
        d.cuCtxSetCurrent(ctx)
        while True:
            err, p = d.cuMemAlloc(1 << 20)
            if err != d.CUresult.CUDA_SUCCESS:
                assert err == d.CUresult.CUDA_ERROR_OUT_OF_MEMORY, err
                return
            with lock:
                held.append(p)
    threads = [threading.Thread(target=fill) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(f"held={len(held)}", flush=True)
    sys.stdin.readline()  # keep everything until the test has summed up
"""


def test_held_memory_summed_over_processes_equals_the_cap(sim: Sim) -> None:
    """3 processes x 4 threads fill the cap at once and keep what they got: the sum of what
    they hold at the same moment is exactly the cap."""
    tenant = sim.tenant("t", CAP, gpus=[0])
    env = sim.tenant_env(tenant)
    procs = [spawn_python(env, BARRIER_SCRIPT) for _ in range(3)]
    try:
        held = [int(wait_for_line(p, "held", timeout=120)) for p in procs]
        assert sum(held) == CAP
    finally:
        for p in procs:
            p.communicate(input="\n", timeout=60)
    for p in procs:
        assert p.returncode == 0


def spare_bytes(tenant: Path) -> int:
    view, usage = usage_view(tenant)
    try:
        return sum(p.dev[0].spare_bytes for p in usage.procs if p.pid)
    finally:
        del usage
        view.close()


def test_a_spare_never_keeps_memory_from_another_process(sim: Sim) -> None:
    """A process that allocated and freed keeps a few bytes spare (the ledger's lock-free path,
    ledger.c): they are nobody's use, every view counts them free, and another process of the
    tenant still gets the whole cap (the spare is taken back before a refusal)."""
    tenant = sim.tenant("t", CAP, gpus=[0])
    cycler = sim.spawn_probe("cycle", "plain", "1M", "1000", "120", env=sim.tenant_env(tenant))
    try:
        assert wait_for_line(cycler, "ready") == "1"
        assert 0 < spare_bytes(tenant) <= CAP * MIB // 16
        assert tenant_status(tenant).devices[0].mem_used_bytes == 0
        assert tenant_probe(sim, tenant, "meminfo").int("free") == CAP * MIB
        res = tenant_probe(sim, tenant, "alloc", "plain", f"{CAP}M", "1")
        assert allocs(res) == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
        assert spare_bytes(tenant) == 0  # taken back for the whole-cap allocation
    finally:
        stop(cycler)


FORGED_SPARE_SCRIPT = """
    import ctypes, mmap, os
    from cuda.bindings import driver as d
    from sharegpu.regions import abi
    M = 1 << 20
    results = []
    assert d.cuInit(0)[0] == 0
    d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
    err, p = d.cuMemAlloc(M)
    d.cuMemFree(p)  # a slot, and a spare topped up under the lock
    held = [d.cuMemAlloc(200 * M)[1]]
    fd = os.open(os.path.join(TENANT, abi.USAGE_FILE), os.O_RDWR)
    usage = abi.Usage.from_buffer(mmap.mmap(fd, ctypes.sizeof(abi.Usage)))
    (slot,) = [s for s in usage.procs if s.pid == os.getpid()]

    def forge_and_take(spare, count):
        slot.dev[0].spare_bytes = spare  # one store into the tenant's own, writable, file
        for _ in range(count):
            err, p = d.cuMemAlloc(60 * M)
            results.append(err.name)
            if err == d.CUresult.CUDA_SUCCESS:
                held.append(p)

    forge_and_take(8 << 30, 4)  # the lock-free path spent the slot's spare
    forge_and_take(60 * M, 1)  # a steal before a refusal gave the slot's spare back
    print("allocs=" + ",".join(results))
    print("free_mib=%d" % (d.cuMemGetInfo()[1] // M))
"""


def test_a_spare_written_into_the_usage_file_admits_nothing(sim: Sim) -> None:
    """Issue 34, hole 5: the usage file is writable by the tenant's processes, and the spare's
    lock-free path trusted the slot's spare_bytes: one store let 4 x 60 MiB through a 256 MiB
    cap holding 200 MiB, and a forged spare given back by a steal hid 60 MiB more; the views
    showed the cap free. Our own count (process memory) now decides; the views ignore what no
    process keeps."""
    tenant = sim.tenant("t", 256, gpus=[0])
    env = {**sim.tenant_env(tenant), "PYTHONPATH": str(REPO / "src")}
    values, proc = python(env, f"TENANT = {str(tenant)!r}\n" + textwrap.dedent(FORGED_SPARE_SCRIPT))
    assert proc.returncode == 0, proc.stderr
    assert values["allocs"] == ",".join(["CUDA_ERROR_OUT_OF_MEMORY"] * 5)
    assert int(values["free_mib"]) <= 256 - 200


SPARE_RESIZE_SCRIPT = """
    import sys
    from cuda.bindings import driver as d
    assert d.cuInit(0)[0] == 0
    err, dev = d.cuDeviceGet(0)
    err, ctx = d.cuDevicePrimaryCtxRetain(dev)
    d.cuCtxSetCurrent(ctx)
    err, p = d.cuMemAlloc(1 << 20)
    assert err == d.CUresult.CUDA_SUCCESS, err
    assert d.cuMemFree(p)[0] == d.CUresult.CUDA_SUCCESS
    print("ready=1", flush=True)
    sys.stdin.readline()  # the test shrinks the cap now
    held = []
    for _ in range(4):
        err, p = d.cuMemAlloc(1 << 20)
        print(f"alloc={err.name}", flush=True)
        if err == d.CUresult.CUDA_SUCCESS:
            held.append(p)
"""


def test_a_spare_is_not_spent_past_a_shrunk_cap(sim: Sim) -> None:
    """The spare was charged under the old cap: after a shrink the process follows the new
    limits before it allocates again, so it gets exactly the new cap, not the new cap plus
    what it kept."""
    tenant = sim.tenant("t", CAP, gpus=[0])
    proc = spawn_python(sim.tenant_env(tenant), SPARE_RESIZE_SCRIPT)
    try:
        assert wait_for_line(proc, "ready") == "1"
        assert spare_bytes(tenant) >= 2 * MIB  # more than the new cap below leaves room for
        write_limits(tenant, [2])
        out, err = proc.communicate(input="\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    values = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("alloc=")]
    assert values == ["CUDA_SUCCESS", "CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_OUT_OF_MEMORY"]


# ---------------------------------------------------------------------------------------------
# views


NVML_SCRIPT = """
    import os, pynvml
    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        print(f"dev{i}.total={m.total}\\ndev{i}.used={m.used}\\ndev{i}.free={m.free}")
        m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        print(f"dev{i}.v2={m2.total},{m2.used},{m2.free},{m2.reserved}")
        for name in ("nvmlDeviceGetComputeRunningProcesses",
                     "nvmlDeviceGetComputeRunningProcesses_v2"):
            procs = getattr(pynvml, name)(h)
            print(f"dev{i}.{name}=" + ";".join(f"{p.pid}:{p.usedGpuMemory}" for p in procs))
    print(f"self={os.getpid()}")
"""


def test_views_show_the_vgpu(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    other = sim.tenant("other", CAP, gpus=[0])
    holder = spawn_hold(sim, tenant, "plain", "16M")
    stranger = spawn_hold(sim, other, "plain", "8M")
    try:
        info = tenant_probe(sim, tenant, "meminfo")
        assert (info.int("total"), info.int("devtotal"), info.int("free")) == (
            CAP * MIB,
            CAP * MIB,
            (CAP - 16) * MIB,
        )
        values, _ = python(sim.tenant_env(tenant), NVML_SCRIPT)
        assert int(values["dev0.total"]) == CAP * MIB
        assert int(values["dev0.used"]) == 16 * MIB
        assert int(values["dev0.free"]) == (CAP - 16) * MIB
        assert values["dev0.v2"] == f"{CAP * MIB},{16 * MIB},{(CAP - 16) * MIB},0"
        mine = f"{holder.pid}:{16 * MIB}"
        assert values["dev0.nvmlDeviceGetComputeRunningProcesses"] == mine  # _v3 in pynvml
        assert values["dev0.nvmlDeviceGetComputeRunningProcesses_v2"] == mine
        # GPU 1 is not the tenant's: it shows nothing.
        assert int(values["dev1.total"]) == 0
        assert values["dev1.nvmlDeviceGetComputeRunningProcesses"] == ""
    finally:
        stop(holder)
        stop(stranger)


MPS_LIST_SCRIPT = """
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for name in ("nvmlDeviceGetMPSComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses_v2"):
        print(f"{name}=" + ";".join(f"{p.pid}:{p.usedGpuMemory}" for p in getattr(pynvml, name)(h)))
"""


@pytest.mark.parametrize("mps", [False, True])
def test_the_mps_client_list_shows_only_the_tenants_own_processes(sim: Sim, mps: bool) -> None:
    """Under an MPS server every process on the card is a client: forwarded, the MPS list would
    show a tenant the other tenants' processes. Without a server it stays empty."""
    sim.config.write_text(
        json.dumps({"gpus": sim.gpus, "memory_mib": sim.memory_mib, "mps_block_us": 500 if mps else 0})
    )
    tenant = sim.tenant("t", CAP, gpus=[0])
    other = sim.tenant("other", CAP, gpus=[0])
    holder = spawn_hold(sim, tenant, "plain", "16M")
    stranger = spawn_hold(sim, other, "plain", "8M")
    try:
        values, _ = python(sim.tenant_env(tenant), MPS_LIST_SCRIPT)
    finally:
        stop(holder)
        stop(stranger)
    mine = f"{holder.pid}:{16 * MIB}" if mps else ""
    assert values["nvmlDeviceGetMPSComputeRunningProcesses"] == mine  # _v3 in pynvml
    assert values["nvmlDeviceGetMPSComputeRunningProcesses_v2"] == mine


def test_nvml_v1_process_struct_and_null_pointers(sim: Sim, tmp_path: Path) -> None:
    """The v1 symbol with its own struct, the size query, INSUFFICIENT_SIZE, NULL arguments."""
    tenant = sim.tenant("t", CAP, gpus=[0])
    holder = spawn_hold(sim, tenant, "plain", "8M")
    script = """
        import ctypes
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        assert nv.nvmlInit_v2() == 0
        h = ctypes.c_void_p()
        assert nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
        class P1(ctypes.Structure):
            _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong)]
        n = ctypes.c_uint(0)
        get = nv.nvmlDeviceGetComputeRunningProcesses
        print("size_query=%d,%d" % (get(h, ctypes.byref(n), None), n.value))
        arr = (P1 * 4)()
        n = ctypes.c_uint(4)
        rc = get(h, ctypes.byref(n), arr)
        print("list=%d,%d,%d,%d" % (rc, n.value, arr[0].pid, arr[0].used))
        print("null_count=%d" % nv.nvmlDeviceGetComputeRunningProcesses(h, None, arr))
        n = ctypes.c_uint(2)
        print("null_infos=%d" % nv.nvmlDeviceGetComputeRunningProcesses(h, ctypes.byref(n), None))
        print("null_mem=%d" % nv.nvmlDeviceGetMemoryInfo(h, None))
        cu = ctypes.CDLL("libcuda.so.1")
        print("cu_null_info=%d" % cu.cuMemGetInfo_v2(None, None))
        print("cu_null_alloc=%d" % cu.cuMemAlloc_v2(None, ctypes.c_size_t(1)))
    """
    try:
        values, _ = python(sim.tenant_env(tenant), script)
    finally:
        stop(holder)
    assert values["size_query"] == "7,1"  # NVML_ERROR_INSUFFICIENT_SIZE, one process
    assert values["list"] == f"0,1,{holder.pid},{8 * MIB}"
    assert values["null_count"] == "2"  # NVML_ERROR_INVALID_ARGUMENT
    assert values["null_infos"] == "2"
    assert values["null_mem"] == "2"
    assert values["cu_null_info"] == "1"  # CUDA_ERROR_INVALID_VALUE
    assert values["cu_null_alloc"] == "1"


def test_overhead_counts_against_the_cap(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    view, usage = usage_view(tenant)
    try:
        usage.devices[0].overhead_bytes = 16 * MIB  # what the agent measured outside the ledger
    finally:
        del usage
        view.close()
    res = tenant_probe(sim, tenant, "alloc", "plain", f"{CAP - 16}M", "1")
    assert allocs(res) == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert (res.int("total"), res.int("free")) == (CAP * MIB, 0)
    values, _ = python(sim.tenant_env(tenant), NVML_SCRIPT)
    assert int(values["dev0.used"]) == 16 * MIB


# ---------------------------------------------------------------------------------------------
# dead processes


def test_sigkill_releases_the_charge(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    killed = tenant_probe(sim, tenant, "killself", "plain", "48M", check=False)
    assert killed.returncode == -signal.SIGKILL
    assert killed["ready"] == "1"
    # The next allocation of another process of the tenant gets the memory back.
    res = tenant_probe(sim, tenant, "alloc", "plain", f"{CAP}M")
    assert allocs(res) == ["OK"]
    # And a survivor sees a child's charge come back after SIGKILL (cuMemGetInfo polling).
    ff = tenant_probe(sim, tenant, "forkfree", "vmm", "32M")
    assert ff["child"] == "signal:9"
    assert ff["freed"] == "1"


def test_a_live_process_of_another_pid_namespace_keeps_its_charge(sim: Sim) -> None:
    """Its pid means nothing here (it is 1 in its namespace): only its liveness lock tells that
    it lives, and once it is killed, that it died."""
    tenant = sim.tenant("t", CAP, gpus=[0])
    cmd = [
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        str(native.probe_path()),
        "hold",
        "plain",
        "48M",
        "120",
    ]
    other = subprocess.Popen(
        cmd, env=sim.tenant_env(tenant), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert wait_for_line(other, "ready") == "1"
        _, usage = usage_view(tenant)
        (slot,) = [p for p in usage.procs if p.pid]
        assert slot.pid == 1  # its own namespace's pid
        assert slot.flags & abi.ENTRY_LIVE_LOCK
        # A refused allocation scans for dead slots: the other namespace's must survive it.
        assert allocs(tenant_probe(sim, tenant, "alloc", "plain", "32M")) == ["CUDA_ERROR_OUT_OF_MEMORY"]
        assert [p.alive for p in tenant_status(tenant).processes] == [True]
    finally:
        stop(other)
    assert allocs(tenant_probe(sim, tenant, "alloc", "plain", "48M")) == ["OK"]


def _plant_slot(tenant: Path, slot: int, pid: int, start: int, mib: int) -> None:
    view, usage = usage_view(tenant)
    try:
        p = usage.procs[slot]
        p.pid, p.start_time = pid, start
        p.dev[0].mem_bytes = mib * MIB
        usage.devices[0].mem_used_bytes += mib * MIB
    finally:
        del p, usage
        view.close()


def _start_time(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def test_a_reused_pid_is_not_mistaken_for_the_dead_process(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    me = os.getpid()
    # A live pid with another start time: the slot's process died and its pid was reused.
    _plant_slot(tenant, 3, me, _start_time(me) + 12345, 40)
    # A pid that no longer exists.
    gone = subprocess.Popen(["true"])
    gone.wait()
    _plant_slot(tenant, 7, gone.pid, 1, 20)
    res = tenant_probe(sim, tenant, "alloc", "plain", f"{CAP}M")
    assert allocs(res) == ["OK"]
    view, usage = usage_view(tenant)
    try:
        assert usage.procs[3].pid == 0
        assert usage.procs[7].pid == 0
        assert usage.devices[0].mem_used_bytes == 0
    finally:
        del usage
        view.close()


def test_a_live_process_keeps_its_charge(sim: Sim) -> None:
    """Control for the test above: the right pid and start time is never reclaimed."""
    tenant = sim.tenant("t", CAP, gpus=[0])
    me = os.getpid()
    _plant_slot(tenant, 3, me, _start_time(me), 40)
    res = tenant_probe(sim, tenant, "alloc", "plain", "25M", "24M")
    assert allocs(res) == ["CUDA_ERROR_OUT_OF_MEMORY", "OK"]


def holding_the_usage_lock(tenant: Path, then: str) -> str:
    """A Python program that takes the tenant's usage mutex (`lock`, in `usage`), then runs `then`."""
    prelude = textwrap.dedent(
        f"""
        import ctypes, mmap, os, signal
        from sharegpu.regions import abi
        fd = os.open({str(tenant / abi.USAGE_FILE)!r}, os.O_RDWR)
        view = mmap.mmap(fd, ctypes.sizeof(abi.Usage))
        usage = abi.Usage.from_buffer(view)
        libc = ctypes.CDLL("libc.so.6")
        lock = ctypes.c_void_p(ctypes.addressof(usage.lock))
        assert libc.pthread_mutex_lock(lock) == 0
        """
    )
    return prelude + then + "\n"


def test_owner_death_with_the_lock_held_is_recovered(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    # A process takes the usage mutex, corrupts a total, and dies without unlocking.
    script = holding_the_usage_lock(tenant, "usage.devices[0].mem_used_bytes = 1 << 40\nos._exit(0)")
    python(sim.env(), script)
    res = tenant_probe(sim, tenant, "alloc", "plain", f"{CAP}M", "1")
    assert allocs(res) == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    view, usage = usage_view(tenant)
    try:
        assert usage.recoveries == 1
        assert usage.devices[0].mem_used_bytes == 0
    finally:
        del usage
        view.close()


@pytest.mark.timing
def test_a_stopped_lock_holder_delays_an_admission_by_a_bound_only(sim: Sim) -> None:
    """A process of the tenant stopped inside the usage lock: an allocation is refused after the
    bound (2 s) with one line, instead of hanging for as long as the process stays stopped;
    once it runs and unlocks, allocations work again."""
    tenant = sim.tenant("t", CAP, gpus=[0])
    script = holding_the_usage_lock(
        tenant,
        'print("locked", flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)\nlibc.pthread_mutex_unlock(lock)',
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)], env=sim.env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        res = sim.probe("alloc", "plain", "1M", env=sim.tenant_env(tenant), timeout=20)
        waited = time.monotonic() - started
        assert allocs(res) == ["CUDA_ERROR_OUT_OF_MEMORY"]
        assert 1.5 <= waited < 10
        assert "the usage lock was held for 2000 ms" in res.stderr
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.communicate(timeout=30)
    assert allocs(tenant_probe(sim, tenant, "alloc", "plain", "1M")) == ["OK"]


# ---------------------------------------------------------------------------------------------
# every way into the driver


CUDA_PYTHON_SCRIPT = """
    from cuda.bindings import driver as d
    M = 1 << 20
    print("init=%d" % d.cuInit(0)[0])
    err, dev = d.cuDeviceGet(0)
    err, ctx = d.cuDevicePrimaryCtxRetain(dev)
    d.cuCtxSetCurrent(ctx)
    print("devtotal=%d" % d.cuDeviceTotalMem(dev)[1])
    e1, p1 = d.cuMemAlloc(CAP * M)
    e2, p2 = d.cuMemAlloc(1)
    print("alloc=%d,%d" % (e1, e2))
    err, free, total = d.cuMemGetInfo()
    print("info=%d,%d" % (free, total))
    err, stream = d.cuStreamCreate(0)
    print("free=%d" % d.cuMemFree(p1)[0])
    e3, p3 = d.cuMemAllocAsync(CAP * M, stream)
    e4, p4 = d.cuMemAllocAsync(1, stream)
    print("async=%d,%d" % (e3, e4))
    d.cuMemFreeAsync(p3, stream)
    d.cuStreamSynchronize(stream)
    e5, p5 = d.cuMemAllocManaged(CAP * M, 1)
    print("managed=%d" % e5)
"""


def test_cuda_python_goes_through_get_proc_address(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    values, proc = python(sim.tenant_env(tenant), CUDA_PYTHON_SCRIPT.replace("CAP", str(CAP)))
    assert values["init"] == "0"
    assert int(values["devtotal"]) == CAP * MIB
    assert values["alloc"] == "0,2"
    assert values["info"] == f"0,{CAP * MIB}"
    assert values["free"] == "0"
    assert values["async"] == "0,2"
    assert values["managed"] == "0"
    assert proc.stderr == ""


def test_a_cuda_13_caller_gets_the_hook_of_the_context_taking_synchronize(sim: Sim) -> None:
    """cuda-bindings 13 resolves its cuCtxSynchronize_v2 as "cuCtxSynchronize" at 13000, where
    the driver answers cuCtxSynchronize_v2(ctx): the shim must hand out that variant's hook,
    not the v1 hook, which would drop the context and fail with no current one."""
    tenant = sim.tenant("t", CAP, gpus=[0])
    values, proc = python(
        sim.tenant_env(tenant),
        """
        from cuda.bindings import driver as d
        d.cuInit(0)
        err, ctx = d.cuDevicePrimaryCtxRetain(0)
        d.cuCtxSetCurrent(ctx)
        d.cuCtxSetCurrent(None)  # no current context: only the named one can be synchronised
        print("sync=%d" % d.cuCtxSynchronize_v2(ctx)[0])
        """,
    )
    assert values["sync"] == "0"
    assert proc.stderr == ""


def test_stream_ordered_allocations_are_charged_to_the_stream_or_pool_device(sim: Sim) -> None:
    """The current context is on GPU 0 (1 GiB cap); the stream and the pool are GPU 1's (64 MiB
    cap): their allocations take GPU 1's memory, so GPU 1's cap refuses them."""
    tenant = sim.tenant("t", [1024, 64])
    values, proc = python(
        sim.tenant_env(tenant),
        """
        from cuda.bindings import driver as d
        M = 1 << 20
        d.cuInit(0)
        c0 = d.cuDevicePrimaryCtxRetain(0)[1]
        c1 = d.cuDevicePrimaryCtxRetain(1)[1]
        d.cuCtxSetCurrent(c1)
        s1 = d.cuStreamCreate(0)[1]
        pool1 = d.cuDeviceGetDefaultMemPool(1)[1]
        d.cuCtxSetCurrent(c0)
        s0 = d.cuStreamCreate(0)[1]
        print("async_over=%d" % d.cuMemAllocAsync(100 * M, s1)[0])
        print("async_fit=%d" % d.cuMemAllocAsync(32 * M, s1)[0])
        print("pool_over=%d" % d.cuMemAllocFromPoolAsync(48 * M, pool1, s0)[0])
        print("pool_fit=%d" % d.cuMemAllocFromPoolAsync(16 * M, pool1, s0)[0])
        print("gpu0_async=%d" % d.cuMemAllocAsync(512 * M, s0)[0])
        d.cuCtxSetCurrent(c1)
        err, free, total = d.cuMemGetInfo()
        print("gpu1=%d,%d" % (free, total))
        """,
    )
    assert values["async_over"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert values["async_fit"] == "0"
    assert values["pool_over"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert values["pool_fit"] == "0"
    assert values["gpu0_async"] == "0"  # GPU 0's own cap is untouched by GPU 1's allocations
    assert values["gpu1"] == f"{16 * MIB},{64 * MIB}"
    assert proc.stderr == ""


def test_vmm_memory_stays_charged_while_mapped_after_release(sim: Sim) -> None:
    """Create, map, release at once (the documented idiom): the memory lives until unmapped,
    so the cap must count it until then, not from the release."""
    tenant = sim.tenant("t", 64, gpus=[0])
    values, proc = python(
        sim.tenant_env(tenant),
        """
        from cuda.bindings import driver as d
        M = 1 << 20
        d.cuInit(0)
        ctx = d.cuDevicePrimaryCtxRetain(0)[1]
        d.cuCtxSetCurrent(ctx)
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        vas, results = [], []
        for i in range(4):
            err, h = d.cuMemCreate(32 * M, prop, 0)
            results.append(int(err))
            if err:
                continue
            va = d.cuMemAddressReserve(32 * M, 0, 0, 0)[1]
            d.cuMemMap(va, 32 * M, 0, h, 0)
            d.cuMemRelease(h)
            vas.append(va)
        print("creates=" + ",".join(map(str, results)))
        print("free=%d" % d.cuMemGetInfo()[1])
        d.cuMemUnmap(vas[0], 32 * M)  # the last mapping of a released handle: memory freed
        print("after_unmap=%d" % d.cuMemCreate(32 * M, prop, 0)[0])
        """,
    )
    oom = str(CUDA_ERROR_OUT_OF_MEMORY)
    assert values["creates"] == f"0,0,{oom},{oom}"  # two mapped 32 MiB handles fill 64 MiB
    assert values["free"] == "0"
    assert values["after_unmap"] == "0"
    assert proc.stderr == ""


def test_context_teardown_gives_its_memory_back(sim: Sim) -> None:
    """The driver frees a context's memory with it (cuCtxDestroy, cudaDeviceReset's
    cuDevicePrimaryCtxReset, the last cuDevicePrimaryCtxRelease): the cap is free again, and
    what outlives contexts (a VMM handle) stays charged."""
    tenant = sim.tenant("t", [CAP], gpus=[0])
    values, proc = python(
        sim.tenant_env(tenant),
        """
        from cuda.bindings import driver as d
        M = 1 << 20
        d.cuInit(0)
        def free():
            return d.cuMemGetInfo()[1] // M
        ctx = d.cuCtxCreate(None, 0, 0)[1]
        print("created=%d" % d.cuMemAlloc(48 * M)[0])
        d.cuCtxDestroy(ctx)
        for how in ("reset", "release"):
            d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
            print("%s_before=%d,%d" % (how, d.cuMemAlloc(48 * M)[0], free()))
            if how == "reset":
                d.cuDevicePrimaryCtxReset(0)
            d.cuDevicePrimaryCtxRelease(0)
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
        print("after=%d" % free())
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 0
        err, handle = d.cuMemCreate(32 * M, prop, 0)
        d.cuDevicePrimaryCtxReset(0)
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
        print("vmm=%d,%d" % (err, free()))
        """,
    )
    assert values["created"] == "0"
    # Each 48 MiB fits only because the previous context's 48 MiB were given back.
    assert values["reset_before"] == f"0,{CAP - 48}"
    assert values["release_before"] == f"0,{CAP - 48}"
    assert values["after"] == str(CAP)
    assert values["vmm"] == f"0,{CAP - 32}"  # a VMM handle outlives the context
    assert proc.stderr == ""


def test_context_limits_that_reserve_memory_are_charged(sim: Sim) -> None:
    """The device malloc heap, the printf FIFO and the per-thread stack are device memory the
    driver reserves at cuCtxSetLimit (the simulated driver charges them as a real one does):
    raised past the cap they are refused, raised within it they take its room, lowered or torn
    down with the context they give it back."""
    tenant = sim.tenant("t", [CAP], gpus=[0])
    values, proc = python(
        sim.tenant_env(tenant),
        """
        from cuda.bindings import driver as d
        M = 1 << 20
        L = d.CUlimit
        d.cuInit(0)
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
        def free():
            return d.cuMemGetInfo()[1] // M
        def get(limit):
            return d.cuCtxGetLimit(limit)[1]
        heap = get(L.CU_LIMIT_MALLOC_HEAP_SIZE)
        print("heap_over=%s" % d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, heap + 100 * M)[0].name)
        print("heap_kept=%d" % (get(L.CU_LIMIT_MALLOC_HEAP_SIZE) == heap))
        print("heap_up=%s,%d" % (d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, heap + 32 * M)[0].name, free()))
        print("alloc_over=%s" % d.cuMemAlloc(40 * M)[0].name)
        print("heap_down=%s,%d" % (d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, heap)[0].name, free()))
        fifo = get(L.CU_LIMIT_PRINTF_FIFO_SIZE)
        print("fifo_up=%s,%d" % (d.cuCtxSetLimit(L.CU_LIMIT_PRINTF_FIFO_SIZE, fifo + 16 * M)[0].name, free()))
        stack = get(L.CU_LIMIT_STACK_SIZE)
        # every resident thread gets the stack: 4 KiB more each is far past a 64 MiB cap
        print("stack_over=%s" % d.cuCtxSetLimit(L.CU_LIMIT_STACK_SIZE, stack + 4096)[0].name)
        ctx = d.cuCtxCreate(None, 0, 0)[1]
        res = d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, heap + 24 * M)[0]
        print("other_ctx=%s,%d" % (res.name, free()))
        d.cuCtxDestroy(ctx)
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
        print("after_destroy=%d" % free())
        """,
    )
    assert values["heap_over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert values["heap_kept"] == "1"
    assert values["heap_up"] == f"CUDA_SUCCESS,{CAP - 32}"
    assert values["alloc_over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert values["heap_down"] == f"CUDA_SUCCESS,{CAP}"
    assert values["fifo_up"] == f"CUDA_SUCCESS,{CAP - 16}"
    assert values["stack_over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert values["other_ctx"] == f"CUDA_SUCCESS,{CAP - 16 - 24}"
    assert values["after_destroy"] == str(CAP - 16)  # the destroyed context's heap came back
    assert proc.stderr == ""


def test_3d_and_mipmapped_arrays_are_charged_against_the_cap(sim: Sim) -> None:
    tenant = sim.tenant("t", 64, gpus=[0])
    values, proc = python(
        sim.tenant_env(tenant),
        """
        from cuda.bindings import driver as d
        M = 1 << 20
        d.cuInit(0)
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
        desc = d.CUDA_ARRAY3D_DESCRIPTOR()
        desc.Width, desc.Height, desc.Depth = 1024, 1024, 8  # 32 MiB of float
        desc.Format = d.CUarray_format.CU_AD_FORMAT_FLOAT
        desc.NumChannels = 1
        err, a = d.cuArray3DCreate(desc)
        print("a3d=%d" % err)
        print("used=%d" % (64 * M - d.cuMemGetInfo()[1]))
        desc.Depth = 4  # 16 MiB, plus 1/8 + 1/64 of it for the lower levels: 18.25 MiB
        err, m = d.cuMipmappedArrayCreate(desc, 3)
        print("mip=%d" % err)
        print("mip_over=%d" % d.cuMipmappedArrayCreate(desc, 3)[0])
        d.cuMipmappedArrayDestroy(m)
        d.cuArrayDestroy(a)
        print("after=%d" % (64 * M - d.cuMemGetInfo()[1]))
        """,
    )
    assert values["a3d"] == "0"
    assert values["used"] == str(32 * MIB)
    assert values["mip"] == "0"
    assert values["mip_over"] == str(CUDA_ERROR_OUT_OF_MEMORY)  # 32 + 18.25 + 18.25 > 64
    assert values["after"] == "0"
    assert proc.stderr == ""


def test_an_async_free_gives_memory_back_when_its_stream_reaches_it(sim: Sim) -> None:
    """cuMemFreeAsync behind a 300 ms kernel: the memory is in use until the kernel is done, so
    the cap refuses a new allocation until then, and grants it after a sync."""
    tenant = sim.tenant("t", 64, gpus=[0])
    values, proc = python(
        sim.tenant_env(tenant),
        """
        import ctypes
        from cuda.bindings import driver as d
        M = 1 << 20
        d.cuInit(0)
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
        ptx = (b".version 8.0\\n.target sm_90\\n.address_size 64\\n"
               b".visible .entry spin(.param .u64 us)\\n{\\nret;\\n}\\n\\0")
        f = d.cuModuleGetFunction(d.cuModuleLoadData(ptx)[1], b"spin")[1]
        s1, s2 = d.cuStreamCreate(0)[1], d.cuStreamCreate(0)[1]
        p = d.cuMemAllocAsync(48 * M, s1)[1]
        d.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s1, ((300000,), (ctypes.c_uint64,)), 0)
        print("free=%d" % d.cuMemFreeAsync(p, s1)[0])
        print("before=%d" % d.cuMemAllocAsync(48 * M, s2)[0])
        d.cuStreamSynchronize(s1)
        print("after=%d" % d.cuMemAllocAsync(48 * M, s2)[0])
        """,
    )
    assert values["free"] == "0"
    assert values["before"] == str(CUDA_ERROR_OUT_OF_MEMORY)  # the free is still behind the kernel
    assert values["after"] == "0"
    assert proc.stderr == ""


DEEP_LIB = r"""
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuMemAlloc_v2(CUdeviceptr *p, unsigned long n);
int deep_alloc(unsigned long n) { CUdeviceptr p; return cuMemAlloc_v2(&p, n); }
"""


def test_rtld_deepbind_cannot_bind_the_driver_past_the_shim(sim: Sim, tmp_path: Path) -> None:
    """A library dlopen()ed with RTLD_DEEPBIND (here through ctypes, as sys.setdlopenflags
    would) binds its own dependencies first: its cuMemAlloc_v2 must still meet the cap."""
    src = tmp_path / "deep.c"
    src.write_text(DEEP_LIB)
    lib = tmp_path / "libdeep.so"
    simlib = native.LIB_DIR / "simgpu"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(lib), str(src), f"-L{simlib}", "-l:libcuda.so.1"], check=True
    )
    tenant = sim.tenant("t", 64, gpus=[0])
    values, proc = python(
        sim.tenant_env(tenant),
        f"""
        import ctypes, os
        cu = ctypes.CDLL("libcuda.so.1")
        cu.cuInit(0)
        ctx = ctypes.c_void_p()
        cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
        cu.cuCtxSetCurrent(ctx)
        deep = ctypes.CDLL("{lib}", mode=os.RTLD_NOW | os.RTLD_DEEPBIND)
        print("over=%d" % deep.deep_alloc(ctypes.c_ulong(100 << 20)))
        print("fit=%d" % deep.deep_alloc(ctypes.c_ulong(32 << 20)))
        """,
    )
    assert values["over"] == str(CUDA_ERROR_OUT_OF_MEMORY)
    assert values["fit"] == "0"
    assert "RTLD_DEEPBIND ignored for" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_dlopen_still_resolves_the_callers_runpath(sim: Sim, tmp_path: Path) -> None:
    """glibc resolves a bare name against the RUNPATH of dlopen's caller: the shim's dlopen must
    hand the call on with the caller's return address (a tail call), or libraries that load
    their own dependencies by name (as CUDA libraries do) would stop finding them."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "b.c").write_text("int b_value(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(sub / "libb.so"), str(sub / "b.c")], check=True)
    (tmp_path / "a.c").write_text(
        "#include <dlfcn.h>\n"
        'int a_load(void) { void *h = dlopen("libb.so", RTLD_NOW | RTLD_DEEPBIND);\n'
        '  if (!h) return -1; int (*f)(void) = (int (*)(void))dlsym(h, "b_value"); return f(); }\n'
    )
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            str(tmp_path / "liba.so"),
            str(tmp_path / "a.c"),
            "-Wl,--enable-new-dtags,-rpath,$ORIGIN/sub",
            "-ldl",
        ],
        check=True,
    )
    tenant = sim.tenant("t", 64, gpus=[0])
    values, _ = python(
        sim.tenant_env(tenant),
        f"""
        import ctypes
        print("b=%d" % ctypes.CDLL("{tmp_path / "liba.so"}").a_load())
        """,
    )
    assert values["b"] == "42"


def test_dlopen_probe(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    for kind in ("plain", "pool", "array"):
        res = tenant_probe(sim, tenant, "alloc", kind, f"{CAP}M", "1M", dlopen=True)
        assert allocs(res) == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
        assert res.int("total") == CAP * MIB


def test_inert_without_a_tenant(sim: Sim) -> None:
    for tenant_value in (None, ""):
        env = sim.env(LD_PRELOAD=str(native.shim_path()))
        if tenant_value is not None:
            env["SHAREGPU_TENANT"] = tenant_value
        res = sim.probe("alloc", "plain", "512M", env=env)
        assert allocs(res) == ["OK"]
        assert res.int("total") == sim.memory_mib * MIB  # the full card
        assert res.stderr == ""
    values, _ = python(sim.env(LD_PRELOAD=str(native.shim_path())), NVML_SCRIPT)
    assert int(values["dev0.total"]) == sim.memory_mib * MIB


def test_environment_cannot_raise_the_cap(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    res = tenant_probe(
        sim,
        tenant,
        "alloc",
        "plain",
        f"{CAP}M",
        "1M",
        SHAREGPU_MEM_CAP="100000",
        SHAREGPU_MEM_CAP_BYTES=str(1 << 40),
        CUDA_DEVICE_MEMORY_LIMIT="100g",
        SHAREGPU_LIMITS="/dev/null",
    )
    assert allocs(res) == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert res.int("total") == CAP * MIB


def test_multi_gpu_tenant_matched_by_uuid(sim: Sim) -> None:
    both = sim.tenant("both", [32, 96], gpus=[0, 1])
    r0 = tenant_probe(sim, both, "-d", "0", "alloc", "plain", "32M", "1")
    r1 = tenant_probe(sim, both, "-d", "1", "alloc", "vmm", "96M", "2M")
    assert allocs(r0) == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert allocs(r1) == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert (r0.int("total"), r1.int("total")) == (32 * MIB, 96 * MIB)
    # Limits listing only GPU 1: its entry 0 is ordinal 1, and ordinal 0 has cap 0.
    second = sim.tenant("second", [48], gpus=[1])
    r1 = tenant_probe(sim, second, "-d", "1", "alloc", "plain", "48M", "1")
    r0 = tenant_probe(sim, second, "-d", "0", "alloc", "plain", "1M")
    assert allocs(r1) == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert allocs(r0) == ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert (r1.int("total"), r0.int("total"), r0.int("devtotal")) == (48 * MIB, 0, 0)


RESIZE_SCRIPT = """
    import sys
    from cuda.bindings import driver as d
    M = 1 << 20
    d.cuInit(0)
    err, dev = d.cuDeviceGet(0)
    err, ctx = d.cuDevicePrimaryCtxRetain(dev)
    d.cuCtxSetCurrent(ctx)
    for step in range(3):
        sizes = [int(x) for x in sys.stdin.readline().split()]
        res = [int(d.cuMemAlloc(n * M)[0]) for n in sizes]
        err, free, total = d.cuMemGetInfo()
        print("step%d=%s total=%d" % (step, ",".join(map(str, res)), total // M), flush=True)
"""


def test_a_live_resize_is_followed(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    proc = spawn_python(sim.tenant_env(tenant), RESIZE_SCRIPT)
    assert proc.stdin
    assert proc.stdout

    def step(sizes: str) -> str:
        proc.stdin.write(sizes + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip().split("=", 1)[1]

    try:
        assert step(f"{CAP} 1") == f"0,2 total={CAP}"
        write_limits(tenant, [2 * CAP])  # grow while the process runs
        assert step(f"{CAP} 1") == f"0,2 total={2 * CAP}"
        write_limits(tenant, [CAP // 2])  # shrink below what it holds: nothing more fits
        assert step("1") == f"2 total={CAP // 2}"
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode == 0


# ---------------------------------------------------------------------------------------------
# fail closed


def _zero_mutex(tenant: Path) -> None:
    patch_file(tenant / abi.USAGE_FILE, abi.Usage.lock.offset, bytes(64))


BROKEN = [
    pytest.param(lambda t: patch_file(t / "limits", 0, b"XXXX"), "limits: bad magic", id="magic"),
    pytest.param(
        lambda t: patch_file(t / "limits", 4, (2).to_bytes(2, "little") + bytes(2)),
        "limits: ABI 2.0",
        id="abi-major",
    ),
    pytest.param(lambda t: os.truncate(t / "limits", 100), "limits is truncated", id="short"),
    pytest.param(lambda t: (t / "usage").unlink(), "cannot open", id="no-usage"),
    pytest.param(lambda t: write_limits(t, device_count=17), "device_count 17", id="devices"),
    pytest.param(lambda t: write_limits(t, [0]), "zero memory cap", id="zero-cap"),
    pytest.param(
        lambda t: patch_file(t / "usage", 4, (9).to_bytes(2, "little") + bytes(2)),
        "usage: ABI 9.0",
        id="usage-abi",
    ),
    pytest.param(_zero_mutex, "not initialised as robust", id="mutex"),
    pytest.param(
        lambda t: patch_file(t / "limits", abi.Limits.generation.offset, (7).to_bytes(8, "little")),
        "stays odd",
        id="odd-generation",
    ),
]


@pytest.mark.parametrize(("breakage", "message"), BROKEN)
def test_a_broken_configuration_fails_closed_with_one_line(sim: Sim, breakage, message) -> None:  # type: ignore[no-untyped-def]
    tenant = sim.tenant("t", CAP, gpus=[0])
    breakage(tenant)
    res = tenant_probe(sim, tenant, "alloc", "plain", "1M", check=False)
    assert res.returncode == 1
    assert res["error"] == "CUDA_ERROR_NOT_PERMITTED"  # cuInit refused
    lines = stderr_lines(res.stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith("sharegpu: ")
    assert message in lines[0]
    assert str(tenant) in lines[0]


def test_every_allocation_fails_closed(tmp_path: Path) -> None:
    """Past cuInit (fake driver, broken tenant dir): allocations, views refused; one line."""
    gcc(
        tmp_path,
        "libcuda.so.1",
        "-fPIC",
        "-fvisibility=hidden",
        "-shared",
        "-Wl,-soname,libcuda.so.1",
        str(SHIM_DIR / "tests" / "fakecuda.c"),
    )
    exe = gcc(tmp_path, "fakemain", str(SHIM_DIR / "tests" / "fakemain.c"), "-ldl")
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(tmp_path),
        "LD_PRELOAD": str(native.shim_path()),
        "SHAREGPU_TENANT": str(tmp_path / "missing"),
    }
    proc = subprocess.run([str(exe)], check=False, env=env, capture_output=True, text=True, timeout=60)
    values, _ = parse_kv(proc.stdout)
    for key in ("init", "alloc_over", "alloc_fit", "alloc_after_free", "info"):
        assert values[key] == str(CUDA_ERROR_NOT_PERMITTED), key
    assert values["hidden_calls"] == "0"
    lines = stderr_lines(proc.stderr)
    assert len(lines) == 1
    assert lines[0].startswith("sharegpu: ")
    assert "missing/limits" in lines[0]


# ---------------------------------------------------------------------------------------------
# cost


def test_alloc_free_overhead(sim: Sim) -> None:
    """Goal < 1 us per alloc+free pair on top of the driver; the bound here is loose enough for
    a loaded 2-core machine (the measured figure is printed)."""
    tenant = sim.tenant("t", 1024, gpus=[0])

    def best(env: dict[str, str]) -> int:
        return min(sim.probe("cycle", "plain", "1M", "20000", env=env).int("ns_per_pair") for _ in range(3))

    base = best(sim.env())
    shim = best(sim.tenant_env(tenant))
    print(f"alloc+free pair: {base} ns bare, {shim} ns with the shim (+{shim - base} ns)")
    assert shim - base < 10000


FORK_SCRIPT = """
    import ctypes, mmap, os
    from cuda.bindings import driver as d
    from sharegpu.regions import abi
    M = 1 << 20
    d.cuInit(0)
    err, dev = d.cuDeviceGet(0)
    err, ctx = d.cuDevicePrimaryCtxRetain(dev)
    d.cuCtxSetCurrent(ctx)
    print("parent=%d" % d.cuMemAlloc(16 * M)[0], flush=True)
    pid = os.fork()
    if pid == 0:
        r = d.cuMemAlloc(8 * M)[0]
        if r == d.CUresult.CUDA_ERROR_NOT_INITIALIZED:  # like the real driver after fork
            d.cuInit(0)
            err, ctx = d.cuDevicePrimaryCtxRetain(dev)
            d.cuCtxSetCurrent(ctx)
            r = d.cuMemAlloc(8 * M)[0]
        print("child=%d" % r, flush=True)
        fd = os.open(os.environ["SHAREGPU_TENANT"] + "/usage", os.O_RDONLY)
        usage = abi.Usage.from_buffer_copy(os.read(fd, ctypes.sizeof(abi.Usage)))
        slots = sorted((p.pid, p.dev[0].mem_bytes // M) for p in usage.procs if p.pid)
        print("slots=" + ";".join("%s:%d" % ("child" if s == os.getpid() else "parent"
                                            if s == os.getppid() else s, b) for s, b in slots))
        os._exit(0)  # no exit hook: the slot must be reclaimed as dead
    os.waitpid(pid, 0)
    print("after=%d" % d.cuMemAlloc(48 * M)[0], flush=True)
"""


def test_a_forked_child_claims_its_own_slot(sim: Sim) -> None:
    tenant = sim.tenant("t", CAP, gpus=[0])
    values, _ = python(sim.tenant_env(tenant), FORK_SCRIPT)
    assert values["parent"] == "0"
    assert values["child"] == "0"
    assert values["slots"] == "child:8;parent:16" or values["slots"] == "parent:16;child:8"
    assert values["after"] == "0"  # the dead child's 8 MiB came back
