"""What real programs do, modelled the way a GPU does it: cuda-python (cuda.bindings.driver)
drives the simulated driver alone, in fresh processes, and every bad input leaves the
simulator's per-process charge where it was."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from simgpuutil import LIB, MIB, probe, run_driver, small


def run(env: dict[str, str], body: str) -> dict[str, object]:
    # The scripts may start children from the same sources (PRELUDE_SRC, VMM_SRC).
    return run_driver(env, body, VMM_SRC=VMM_PRELUDE, VMM_CHILD=VMM_CHILD)


def test_stream_priorities_context_and_device_of_a_stream(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        out["range"] = ck(d.cuCtxGetStreamPriorityRange())
        hi = ck(d.cuStreamCreateWithPriority(d.CUstream_flags.CU_STREAM_NON_BLOCKING, -100))
        lo = ck(d.cuStreamCreateWithPriority(0, 7))
        out["prio"] = [ck(d.cuStreamGetPriority(hi)), ck(d.cuStreamGetPriority(lo))]
        out["flags"] = [int(ck(d.cuStreamGetFlags(hi))), int(ck(d.cuStreamGetFlags(lo)))]
        out["ids"] = len({ck(d.cuStreamGetId(hi)), ck(d.cuStreamGetId(lo))})
        ck(d.cuCtxSetCurrent(None))  # the stream names its context: none need be current
        sctx, green = ck(d.cuStreamGetCtx_v2(hi))
        out["ctx_same"] = int(sctx) == int(ctx)
        out["green"] = int(green)
        out["device"] = int(ck(d.cuStreamGetDevice(hi)))
        out["no_ctx_default_stream"] = rc(d.cuStreamGetPriority(0))
        out["ctx_id"] = ck(d.cuCtxGetId(ctx)) > 0
        ck(d.cuCtxSynchronize_v2(ctx))  # CUDA 13: synchronise a named context
        out["dev_v2"] = int(ck(d.cuCtxGetDevice_v2(ctx)))
        """,
    )
    assert res["range"] == [0, -5]  # least, greatest, as on an H100/H200
    assert res["prio"] == [-5, 0]  # out-of-range priorities are clamped
    assert res["flags"] == [1, 0]
    assert res["ids"] == 2
    assert res["ctx_same"] is True
    assert res["green"] == 0
    assert res["device"] == 0
    assert res["no_ctx_default_stream"] == "CUDA_ERROR_INVALID_CONTEXT"
    assert res["ctx_id"] is True
    assert res["dev_v2"] == 0


@pytest.mark.timing
def test_library_kernel_launched_on_a_stream_with_no_current_context(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        base = used()
        lib = ck(d.cuLibraryLoadData(PTX, None, None, 0, None, None, 0))
        out["lazy"] = used() - base  # nothing is placed before the first use in a context
        kern = ck(d.cuLibraryGetKernel(lib, b"spin"))
        out["name"] = ck(d.cuKernelGetName(kern)).decode()
        stream = ck(d.cuStreamCreate(0))
        ck(d.cuCtxSetCurrent(None))
        t = time.monotonic()
        ck(d.cuLaunchKernel(d.CUfunction(int(kern)), 1, 1, 1, 32, 1, 1, 0, stream,
                            ((30000,), (ctypes.c_uint64,)), 0))
        ck(d.cuStreamSynchronize(stream))
        out["ms"] = (time.monotonic() - t) * 1000
        ck(d.cuCtxSetCurrent(ctx))
        out["loaded"] = used() - base  # the launch loaded the library into the stream's context
        dptr, size = ck(d.cuLibraryGetGlobal(lib, b"table"))
        out["table"] = size
        _, csize = ck(d.cuLibraryGetGlobal(lib, b"coeffs"))
        out["coeffs"] = csize
        out["scale"] = ck(d.cuLibraryGetGlobal(lib, b"scale"))[1]
        ck(d.cuMemcpyHtoD(dptr, b"\x07" * size, size))  # a global is real device memory
        back = bytearray(16)
        ck(d.cuMemcpyDtoH(back, dptr, 16))
        out["copied"] = bytes(back) == b"\x07" * 16
        mod = ck(d.cuLibraryGetModule(lib))
        f = ck(d.cuKernelGetFunction(kern))
        out["func_mod_same"] = int(ck(d.cuFuncGetModule(f))) == int(mod)
        out["unload_module_of_library"] = rc(d.cuModuleUnload(mod))
        ck(d.cuLibraryUnload(lib))
        out["after_unload"] = used() - base
        out["launch_unloaded"] = rc(d.cuLaunchKernel(d.CUfunction(int(kern)), 1, 1, 1, 1, 1, 1, 0,
                                                     stream, 0, 0))
        """,
    )
    assert res["lazy"] == 0
    assert res["name"] == "spin"
    assert res["ms"] >= 30
    assert res["table"] == MIB
    assert res["coeffs"] == 16
    assert res["scale"] == 8
    # 1 MiB table, then 16 B of coefficients and the double (each aligned to its own size).
    assert res["loaded"] == MIB + 16 + 8
    assert res["copied"] is True
    assert res["func_mod_same"] is True
    assert res["unload_module_of_library"] == "CUDA_ERROR_INVALID_HANDLE"
    assert res["after_unload"] == 0
    assert res["launch_unloaded"] == "CUDA_ERROR_INVALID_HANDLE"


def test_module_globals_are_device_memory_of_the_module(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        base = used()
        mod = ck(d.cuModuleLoadData(PTX))
        out["loaded"] = used() - base
        out["size"] = ck(d.cuModuleGetGlobal(mod, b"table"))[1]
        out["missing"] = rc(d.cuModuleGetGlobal(mod, b"nope"))
        out["ld_global_is_no_variable"] = rc(d.cuModuleGetGlobal(mod, b"r1"))
        ck(d.cuModuleUnload(mod))
        out["after"] = used() - base
        """,
    )
    assert res["loaded"] == MIB + 24
    assert res["size"] == MIB
    assert res["missing"] == "CUDA_ERROR_NOT_FOUND"
    assert res["ld_global_is_no_variable"] == "CUDA_ERROR_NOT_FOUND"
    assert res["after"] == 0


def test_bad_images_names_and_handles_get_the_drivers_errors_and_leak_nothing(
    sim_env: dict[str, str],
) -> None:
    res = run(
        sim_env,
        r"""
        base = used()
        out["garbage_module"] = rc(d.cuModuleLoadData(b"this is not an image\0"))
        out["garbage_library"] = rc(d.cuLibraryLoadData(b"\x01\x02\x03\x04junk\0", None, None, 0,
                                                        None, None, 0))
        out["missing_file"] = rc(d.cuModuleLoad(b"/nonexistent/k.ptx"))
        lib = ck(d.cuLibraryLoadData(PTX, None, None, 0, None, None, 0))
        out["unknown_kernel"] = rc(d.cuLibraryGetKernel(lib, b"absent"))
        mod = ck(d.cuModuleLoadData(PTX))
        out["unknown_function"] = rc(d.cuModuleGetFunction(mod, b"absent"))
        ck(d.cuModuleUnload(mod))
        out["unload_twice"] = rc(d.cuModuleUnload(mod))
        ck(d.cuLibraryUnload(lib))
        out["kernel_of_unloaded"] = rc(d.cuLibraryGetKernel(lib, b"spin"))
        out["leak"] = used() - base
        """,
    )
    assert res["garbage_module"] == "CUDA_ERROR_INVALID_IMAGE"
    assert res["garbage_library"] == "CUDA_ERROR_INVALID_IMAGE"
    assert res["missing_file"] == "CUDA_ERROR_FILE_NOT_FOUND"
    assert res["unknown_kernel"] == "CUDA_ERROR_NOT_FOUND"
    assert res["unknown_function"] == "CUDA_ERROR_NOT_FOUND"
    assert res["unload_twice"] == "CUDA_ERROR_INVALID_HANDLE"
    assert res["kernel_of_unloaded"] == "CUDA_ERROR_INVALID_HANDLE"
    assert res["leak"] == 0


def test_context_limits_reserve_device_memory(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        L = d.CUlimit
        base = used()
        out["defaults"] = [ck(d.cuCtxGetLimit(L.CU_LIMIT_STACK_SIZE)),
                           ck(d.cuCtxGetLimit(L.CU_LIMIT_PRINTF_FIFO_SIZE)),
                           ck(d.cuCtxGetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE))]
        ck(d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, 72 << 20))
        out["heap"] = used() - base
        ck(d.cuCtxSetLimit(L.CU_LIMIT_STACK_SIZE, 2048))
        out["heap_and_stack"] = used() - base
        out["huge_stack"] = rc(d.cuCtxSetLimit(L.CU_LIMIT_STACK_SIZE, 1 << 20))
        out["after_refusal"] = used() - base
        out["bad_limit"] = rc(d.cuCtxSetLimit(L.CU_LIMIT_SHMEM_SIZE, 1))
        ck(d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20))
        ck(d.cuCtxSetLimit(L.CU_LIMIT_STACK_SIZE, 1024))
        out["restored"] = used() - base
        ck(d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, 40 << 20))
        ck(d.cuDevicePrimaryCtxReset(dev))  # the context's end gives the reservation back
        ck(d.cuCtxSetCurrent(ck(d.cuDevicePrimaryCtxRetain(dev))))
        out["after_reset"] = used() - base
        out["fresh_limit"] = ck(d.cuCtxGetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE))
        """,
    )
    assert res["defaults"] == [1024, MIB, 8 * MIB]
    assert res["heap"] == 64 * MIB
    # 1 KiB more stack for each of the 132 SMs x 2048 resident threads.
    assert res["heap_and_stack"] == 64 * MIB + 1024 * 132 * 2048
    assert res["huge_stack"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert res["after_refusal"] == res["heap_and_stack"]
    assert res["bad_limit"] == "CUDA_ERROR_UNSUPPORTED_LIMIT"
    assert res["restored"] == 0
    assert res["after_reset"] == 0
    assert res["fresh_limit"] == 8 * MIB


def test_linker_function_attributes_and_occupancy(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        link = ck(d.cuLinkCreate(0, [], []))
        ck(d.cuLinkAddData(link, d.CUjitInputType.CU_JIT_INPUT_PTX, PTX, len(PTX), b"k.ptx", 0, [], []))
        image, size = ck(d.cuLinkComplete(link))
        mod = ck(d.cuModuleLoadData(ctypes.string_at(image, size)))
        ck(d.cuLinkDestroy(link))
        f = ck(d.cuModuleGetFunction(mod, b"other"))
        A = d.CUfunction_attribute
        out["threads"] = ck(d.cuFuncGetAttribute(A.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f))
        ck(d.cuFuncSetAttribute(f, A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100000))
        out["smem"] = ck(d.cuFuncGetAttribute(A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f))
        out["too_much_smem"] = rc(d.cuFuncSetAttribute(
            f, A.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1 << 20))
        out["readonly"] = rc(d.cuFuncSetAttribute(f, A.CU_FUNC_ATTRIBUTE_NUM_REGS, 8))
        out["blocks256"] = ck(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(f, 256, 0))
        out["blocks_smem"] = ck(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(f, 128, 100000))
        out["potential"] = ck(d.cuOccupancyMaxPotentialBlockSize(f, None, 0, 0))
        out["name"] = ck(d.cuFuncGetName(f)).decode()
        """,
    )
    assert res["threads"] == 1024
    assert res["smem"] == 100000
    assert res["too_much_smem"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["readonly"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["blocks256"] == 8  # 2048 threads per SM
    assert res["blocks_smem"] == 2  # 228 KiB of shared memory per SM
    assert res["potential"] == [132 * 2, 1024]
    assert res["name"] == "other"


@pytest.mark.timing
def test_host_function_runs_when_the_stream_reaches_it(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        mod = ck(d.cuModuleLoadData(PTX))
        spin = ck(d.cuModuleGetFunction(mod, b"spin"))
        stream = ck(d.cuStreamCreate(0))
        seen = []
        t = time.monotonic()
        ck(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, ((40000,), (ctypes.c_uint64,)), 0))
        HostFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        keep = HostFn(lambda data: seen.append((time.monotonic() - t) * 1000))
        ck(d.cuLaunchHostFunc(stream, d.CUhostFn(ctypes.cast(keep, ctypes.c_void_p).value), 0))
        ev = ck(d.cuEventCreate(0))
        ck(d.cuEventRecord(ev, stream))
        other = ck(d.cuStreamCreate(0))
        ck(d.cuStreamWaitEvent(other, ev, 0))
        ck(d.cuStreamSynchronize(other))
        out["host_ms"] = seen
        out["bad_event"] = rc(d.cuStreamWaitEvent(other, d.CUevent(0), 0))
        """,
    )
    assert len(res["host_ms"]) == 1  # type: ignore[arg-type]
    assert res["host_ms"][0] >= 40  # type: ignore[index]
    assert res["bad_event"] == "CUDA_ERROR_INVALID_HANDLE"


def test_memory_pools_cache_freed_memory_and_free_when_the_stream_gets_there(
    sim_env: dict[str, str],
) -> None:
    res = run(
        sim_env,
        r"""
        A = d.CUmemPool_attribute
        def attr(pool, a):
            return int(ck(d.cuMemPoolGetAttribute(pool, a)))
        mod = ck(d.cuModuleLoadData(PTX))
        spin = ck(d.cuModuleGetFunction(mod, b"spin"))
        base = used()
        pool = ck(d.cuDeviceGetMemPool(dev))
        stream = ck(d.cuStreamCreate(0))
        p = ck(d.cuMemAllocAsync(64 << 20, stream))
        out["allocated"] = used() - base
        ck(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, ((50000,), (ctypes.c_uint64,)), 0))
        ck(d.cuMemFreeAsync(p, stream))
        out["queued_free"] = [used() - base, attr(pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)]
        ck(d.cuStreamSynchronize(stream))  # reached, and trimmed to the threshold (0)
        out["after_sync"] = [used() - base, attr(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)]

        ck(d.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, d.cuuint64_t(2**64 - 1)))
        p = ck(d.cuMemAllocAsync(64 << 20, stream))
        ck(d.cuMemFreeAsync(p, stream))
        ck(d.cuStreamSynchronize(stream))
        out["cached"] = [used() - base, attr(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
                         attr(pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)]
        q = ck(d.cuMemAllocAsync(32 << 20, stream))
        out["reused"] = used() - base  # no growth: the cache serves it
        ck(d.cuMemPoolTrimTo(pool, 0))
        out["trimmed_live"] = used() - base
        ck(d.cuMemFreeAsync(q, stream))
        ck(d.cuStreamSynchronize(stream))
        ck(d.cuMemPoolTrimTo(pool, 0))
        out["trimmed"] = used() - base
        out["high"] = attr(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)

        total = ck(d.cuDeviceTotalMem(dev))
        out["too_big"] = rc(d.cuMemAllocAsync(total + 1, stream))
        out["free_unknown"] = rc(d.cuMemFreeAsync(12345, stream))
        raw = ctypes.CDLL("libcuda.so.1")  # an attribute no enum of the bindings can carry
        out["bad_attr"] = d.CUresult(raw.cuMemPoolGetAttribute(ctypes.c_void_p(int(pool)), 99,
                                                               ctypes.byref(ctypes.c_uint64()))).name

        props = d.CUmemPoolProps()
        props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        props.location.id = 1
        pool1 = ck(d.cuMemPoolCreate(props))
        out["pool_of_other_device"] = rc(d.cuDeviceSetMemPool(dev, pool1))
        r = ck(d.cuMemAllocFromPoolAsync(16 << 20, pool1, stream))  # ordered on GPU 0's stream
        out["gpu0_after_pool1"] = used() - base
        ctx1 = ck(d.cuDevicePrimaryCtxRetain(1))
        ck(d.cuCtxSetCurrent(ctx1))
        out["gpu1"] = used()
        ck(d.cuCtxSetCurrent(ctx))
        ck(d.cuMemFreeAsync(r, stream))
        ck(d.cuStreamSynchronize(stream))
        ck(d.cuMemPoolDestroy(pool1))
        ck(d.cuCtxSetCurrent(ctx1))
        out["gpu1_after"] = used()
        out["leak"] = 0
        """,
    )
    assert res["allocated"] == 64 * MIB
    assert res["queued_free"] == [64 * MIB, 64 * MIB]  # a kernel is still ahead of the free
    assert res["after_sync"] == [0, 0]
    assert res["cached"] == [64 * MIB, 64 * MIB, 0]  # kept, and charged, above a high threshold
    assert res["reused"] == 64 * MIB
    assert res["trimmed_live"] == 32 * MIB
    assert res["trimmed"] == 0
    assert res["high"] == 64 * MIB
    assert res["too_big"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert res["free_unknown"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["bad_attr"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["pool_of_other_device"] == "CUDA_ERROR_INVALID_DEVICE"
    assert res["gpu0_after_pool1"] == 0  # the pool's device holds it, not the stream's
    assert res["gpu1"] == 16 * MIB
    assert res["gpu1_after"] == 0


def test_pitch_follows_the_configured_alignment(sim_env: dict[str, str], tmp_path: Path) -> None:
    code = r"""
        p, pitch = ck(d.cuMemAllocPitch(1000, 8, 4))
        out["pitch"] = pitch
        out["charged"] = used()
    """
    assert run(sim_env, code)["pitch"] == 1024  # the default: not the 512 an interposer may guess
    env = small(sim_env, tmp_path, mib=1024, pitch_alignment=256)
    res = run(env, code)
    assert res["pitch"] == 1024  # 1000 rounded up to 256
    env = small(sim_env, tmp_path, mib=1024, pitch_alignment=128)
    assert run(env, code)["charged"] == 1024 * 8
    bad = small(sim_env, tmp_path, mib=1024, pitch_alignment=100)
    p = subprocess.run(
        [str(LIB / "sgprobe"), "info"], env=bad, capture_output=True, text=True, timeout=60, check=False
    )
    assert p.returncode == 1
    assert '"pitch_alignment" must be a power of two' in p.stderr


@pytest.mark.timing
def test_legacy_launch_api_and_profiler_switches(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        out["cc"] = ck(d.cuDeviceComputeCapability(dev))
        mod = ck(d.cuModuleLoadData(PTX))
        spin = ck(d.cuModuleGetFunction(mod, b"spin"))
        out["no_shape"] = rc(d.cuLaunchGrid(spin, 1, 1))
        ck(d.cuFuncSetBlockShape(spin, 32, 1, 1))
        out["bad_shape"] = rc(d.cuFuncSetBlockShape(spin, 2048, 1, 1))
        ck(d.cuParamSetSize(spin, 8))
        ck(d.cuParamSetv(spin, 0, (30000).to_bytes(8, "little"), 8))
        t = time.monotonic()
        ck(d.cuLaunchGrid(spin, 2, 1))
        ck(d.cuCtxSynchronize())
        out["ms"] = (time.monotonic() - t) * 1000
        out["too_many_params"] = rc(d.cuParamSetSize(spin, 8192))
        ck(d.cuProfilerStart())
        ck(d.cuProfilerStop())
        c2 = ck(d.cuCtxCreate(None, 0, dev))
        same = ck(d.cuCtxAttach(0))
        out["attach_same"] = int(same) == int(c2)
        ck(d.cuCtxDetach(c2))  # one use left
        out["alive_after_one_detach"] = rc(d.cuCtxGetApiVersion(c2))
        ck(d.cuCtxDetach(c2))  # the last: destroyed
        out["after_last_detach"] = rc(d.cuCtxGetApiVersion(c2))
        """,
    )
    assert res["cc"] == [9, 0]
    assert res["no_shape"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["bad_shape"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["ms"] >= 30  # the spin time came through the argument buffer
    assert res["too_many_params"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["attach_same"] is True
    assert res["alive_after_one_detach"] == "CUDA_SUCCESS"
    assert res["after_last_detach"] == "CUDA_ERROR_INVALID_CONTEXT"


@pytest.mark.timing
def test_a_sync_waits_as_its_context_or_event_asks(sim_env: dict[str, str]) -> None:
    """CU_CTX_SCHED_SPIN and _YIELD keep the waiting thread on its CPU (no timer can wake it
    late), BLOCKING_SYNC and the default sleep, and an event made with CU_EVENT_BLOCKING_SYNC
    sleeps whatever its context says: each wait's CPU time over its wall time."""
    res = run(
        sim_env,
        r"""
        def cpu_share(flags, event_flags=None):
            c = ck(d.cuCtxCreate(None, flags, dev))
            out.setdefault("flags", []).append(int(ck(d.cuCtxGetFlags())) & 7)
            fn = ck(d.cuModuleGetFunction(ck(d.cuModuleLoadData(PTX)), b"spin"))
            t, cpu = time.monotonic(), time.thread_time()
            ck(d.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, ((150000,), (ctypes.c_uint64,)), 0))
            if event_flags is None:
                ck(d.cuCtxSynchronize())
            else:
                ev = ck(d.cuEventCreate(event_flags))
                ck(d.cuEventRecord(ev, 0))
                ck(d.cuEventSynchronize(ev))
            share = (time.thread_time() - cpu) / (time.monotonic() - t)
            ck(d.cuCtxDestroy(c))
            return share

        for name, flags, event in [("spin", 1, None), ("yield", 2, None), ("blocking", 4, None),
                                   ("auto", 0, None), ("spin_event", 1, 0), ("spin_blocking_event", 1, 1)]:
            out[name] = cpu_share(flags, event)
        """,
    )
    assert res["flags"] == [1, 2, 4, 0, 1, 1]
    # A spinning wait takes what CPU the host gives it (a loaded 2-core machine: half or more).
    spinning = {k: res[k] for k in ("spin", "spin_event")}
    assert min(spinning.values()) > 0.4, res
    assert res["yield"] > 0.2, res
    # A sleeping one wakes ahead of the work's end and spins only the rest (tens of µs).
    sleeping = {k: res[k] for k in ("blocking", "auto", "spin_blocking_event")}
    assert max(sleeping.values()) < 0.1, res


def test_a_process_in_another_pid_namespace_is_never_reaped_while_alive(
    sim_env: dict[str, str], tmp_path: Path
) -> None:
    env = small(sim_env, tmp_path, mib=256)
    for unshare in (["unshare", "--pid", "--fork"], ["unshare", "--pid", "--fork", "--mount-proc"]):
        # Inside, getpid() is 1, and /proc/1 on the outside is another process: the simulator
        # must know the holder by its pid in the /proc it shares, or not judge it at all.
        holder = subprocess.Popen(
            [*unshare, str(LIB / "sgprobe"), "hold", "plain", "200M", "4"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready=1"
        kv = probe(env, "alloc", "plain", "100M")  # forces a reap: the holder is alive
        assert kv["alloc"] == "CUDA_ERROR_OUT_OF_MEMORY", unshare
        assert int(kv["free"]) == 56 * MIB
        assert holder.wait(timeout=30) == 0
        holder.stdout.close()
        assert probe(env, "alloc", "plain", "100M")["alloc"] == "OK"  # its exit gave it back
    # A holder killed behind the same /proc is seen dead from here and reaped.
    holder = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--kill-child=KILL",
            str(LIB / "sgprobe"),
            "hold",
            "plain",
            "200M",
            "60",
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "ready=1"
    holder.kill()
    holder.wait()
    holder.stdout.close()
    deadline = time.monotonic() + 10
    while probe(env, "alloc", "plain", "100M")["alloc"] != "OK":
        assert time.monotonic() < deadline, "the killed holder's memory was never reaped"
        time.sleep(0.1)


VMM_PRELUDE = r"""
G = 2 << 20
prop = d.CUmemAllocationProp()
prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
prop.location.id = 0
FD = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
def mapped(handle, size):
    va = ck(d.cuMemAddressReserve(size, 0, 0, 0))
    ck(d.cuMemMap(va, size, 0, handle, 0))
    acc = d.CUmemAccessDesc()
    acc.location = prop.location
    acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ck(d.cuMemSetAccess(va, size, [acc], 1))
    return va
"""


# The importing process: maps what it was given and reads it.
VMM_CHILD = r"""
import sys
fd = int(sys.argv[1])
h = ck(d.cuMemImportFromShareableHandle(fd, FD))
va = mapped(h, 16 * G)
buf = bytearray(700)
ck(d.cuMemcpyDtoH(buf, va, 700))
out["read"] = bytes(buf[:7]).decode()
out["device_used"] = used()
ck(d.cuMemUnmap(va, 16 * G))
ck(d.cuMemRelease(h))
print(json.dumps(out))
"""


# The importer of an interprocess event: waits for the exporter's kernel on the GPU, then runs
# its own 100 ms kernel; prints when the wait call returned and when its kernel was done, and
# from its own events when the wait ended (start) after a reference taken on an idle stream.
IPC_EVENT_CHILD = r"""
import sys
h = ipc_event(sys.argv[1])
mod = ck(d.cuModuleLoadData(PTX))
spin = ck(d.cuModuleGetFunction(mod, b"spin"))
ev = ck(d.cuIpcOpenEventHandle(h))
out["query_while_pending"] = rc(d.cuEventQuery(ev))
out["elapsed"] = rc(d.cuEventElapsedTime(ev, ev))
stream = ck(d.cuStreamCreate(0))
idle = ck(d.cuStreamCreate(0))
ref, start, end = (ck(d.cuEventCreate(0)) for _ in range(3))
out["ref_at"] = time.monotonic()
ck(d.cuEventRecord(ref, idle))  # an idle stream: it completes at once
t = time.monotonic()
ck(d.cuStreamWaitEvent(stream, ev, 0))
out["wait_call_ms"] = (time.monotonic() - t) * 1000
out["stream_waiting"] = rc(d.cuStreamQuery(stream))
ck(d.cuEventRecord(start, stream))
ck(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, ((100000,), (ctypes.c_uint64,)), 0))
ck(d.cuEventRecord(end, stream))
ck(d.cuStreamSynchronize(stream))
out["done_at"] = time.monotonic()
out["gate_ms"] = ck(d.cuEventElapsedTime(ref, start))
out["kernel_ms"] = ck(d.cuEventElapsedTime(start, end))
ck(d.cuEventSynchronize(ev))
out["query_after"] = rc(d.cuEventQuery(ev))
ck(d.cuEventDestroy(ev))
print(json.dumps(out))
"""


@pytest.mark.timing
def test_an_interprocess_event_orders_two_processes_work_on_the_gpu(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        import subprocess, sys
        F = d.CUevent_flags
        mod = ck(d.cuModuleLoadData(PTX))
        spin = ck(d.cuModuleGetFunction(mod, b"spin"))
        out["supported"] = ck(d.cuDeviceGetAttribute(
            d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED, dev))
        timed = ck(d.cuEventCreate(F.CU_EVENT_INTERPROCESS))
        out["export_timed"] = rc(d.cuIpcGetEventHandle(timed))
        ev = ck(d.cuEventCreate(F.CU_EVENT_INTERPROCESS | F.CU_EVENT_DISABLE_TIMING))
        h = ck(d.cuIpcGetEventHandle(ev))
        raw = ctypes.string_at(h.getPtr(), 64)
        stream = ck(d.cuStreamCreate(0))
        child = PRELUDE_SRC + IPC_EVENT_CHILD
        launched = out["launched"] = time.monotonic()
        ck(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, ((300000,), (ctypes.c_uint64,)), 0))
        ck(d.cuEventRecord(ev, stream))
        p = subprocess.run([sys.executable, "-c", child, raw.hex()], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        kid = json.loads(p.stdout.strip().splitlines()[-1])
        ck(d.cuStreamSynchronize(stream))
        out["child"] = kid
        out["child_done_ms"] = (kid["done_at"] - launched) * 1000
        bad = d.CUipcEventHandle()
        out["open_garbage"] = rc(d.cuIpcOpenEventHandle(bad))
        ck(d.cuEventDestroy(ev))
        out["open_destroyed"] = rc(d.cuIpcOpenEventHandle(h))
        """.replace("IPC_EVENT_CHILD", repr(IPC_EVENT_CHILD)),
    )
    kid = res["child"]
    assert res["supported"] == 1
    assert res["export_timed"] == "CUDA_ERROR_INVALID_VALUE"  # timing events cannot be shared
    assert kid["query_while_pending"] == "CUDA_ERROR_NOT_READY"  # the exporter's record is seen
    assert kid["elapsed"] == "CUDA_ERROR_INVALID_HANDLE"  # an imported event has no timing
    # The wait does not block the importer: the GPU holds its kernel until the exporter's ends.
    assert kid["wait_call_ms"] < 150
    assert kid["stream_waiting"] == "CUDA_ERROR_NOT_READY"
    assert res["child_done_ms"] >= 300 + 100 - 5  # never beside the exporter's kernel
    # An event recorded behind the wait completes when the exporter's kernel ends: the importer
    # reads from its own clock when its work could start.
    gate_open_ms = (kid["ref_at"] - res["launched"]) * 1000 + kid["gate_ms"]
    assert 300 <= gate_open_ms <= 320
    assert 99 <= kid["kernel_ms"] <= 101
    assert kid["query_after"] == "CUDA_SUCCESS"
    assert res["open_garbage"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["open_destroyed"] == "CUDA_ERROR_INVALID_HANDLE"


# An exporter that records its event after a 3 s kernel, prints the handle, and waits to be killed.
IPC_EVENT_EXPORTER = r"""
F = d.CUevent_flags
mod = ck(d.cuModuleLoadData(PTX))
spin = ck(d.cuModuleGetFunction(mod, b"spin"))
ev = ck(d.cuEventCreate(F.CU_EVENT_INTERPROCESS | F.CU_EVENT_DISABLE_TIMING))
stream = ck(d.cuStreamCreate(0))
ck(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, ((3000000,), (ctypes.c_uint64,)), 0))
ck(d.cuEventRecord(ev, stream))
print(ctypes.string_at(ck(d.cuIpcGetEventHandle(ev)).getPtr(), 64).hex(), flush=True)
time.sleep(60)
"""


def test_a_wait_on_a_killed_exporters_event_ends_when_its_work_is_dropped(
    sim_env: dict[str, str],
) -> None:
    res = run(
        sim_env,
        r"""
        import subprocess, sys
        exporter = subprocess.Popen([sys.executable, "-c", PRELUDE_SRC + IPC_EVENT_EXPORTER],
                                    stdout=subprocess.PIPE, text=True)
        ev = ck(d.cuIpcOpenEventHandle(ipc_event(exporter.stdout.readline().strip())))
        mod = ck(d.cuModuleLoadData(PTX))
        spin = ck(d.cuModuleGetFunction(mod, b"spin"))
        stream = ck(d.cuStreamCreate(0))
        ck(d.cuStreamWaitEvent(stream, ev, 0))
        ck(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, ((10000,), (ctypes.c_uint64,)), 0))
        time.sleep(0.2)
        out["gated"] = rc(d.cuStreamQuery(stream))  # held behind the exporter's 3 s kernel
        exporter.kill()
        exporter.wait()
        t = time.monotonic()
        ck(d.cuStreamSynchronize(stream))
        out["sync_s"] = time.monotonic() - t
        out["event"] = rc(d.cuEventQuery(ev))
        """.replace("IPC_EVENT_EXPORTER", repr(IPC_EVENT_EXPORTER)),
    )
    assert res["gated"] == "CUDA_ERROR_NOT_READY"
    assert res["sync_s"] < 2.0  # the dead exporter's work is dropped at the next sweep (0.1 s)
    assert res["event"] == "CUDA_SUCCESS"


def test_vmm_memory_is_shared_between_processes_through_a_posix_descriptor(
    sim_env: dict[str, str],
) -> None:
    res = run(
        sim_env,
        r"""
        import os, subprocess, sys
        exec(VMM_SRC)
        base = used()
        prop.requestedHandleTypes = FD
        h = ck(d.cuMemCreate(16 * G, prop, 0))
        va = mapped(h, 16 * G)
        ck(d.cuMemcpyHtoD(va, b"shared!" * 100, 700))
        fd = int(ck(d.cuMemExportToShareableHandle(h, FD, 0)))
        child = PRELUDE_SRC + VMM_SRC + VMM_CHILD
        p = subprocess.run([sys.executable, "-c", child, str(fd)], pass_fds=(fd,),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        out["child"] = json.loads(p.stdout.strip().splitlines()[-1])
        out["mine"] = used() - base
        plain = d.CUmemAllocationProp()
        plain.type, plain.location = prop.type, prop.location
        h2 = ck(d.cuMemCreate(G, plain, 0))
        out["export_plain"] = rc(d.cuMemExportToShareableHandle(h2, FD, 0))
        null = os.open("/dev/null", os.O_RDONLY)
        out["import_not_a_handle"] = rc(d.cuMemImportFromShareableHandle(null, FD))
        out["unmap_unmapped"] = rc(d.cuMemUnmap(int(va) + 16 * G, G))
        ck(d.cuMemRelease(h2))
        ck(d.cuMemUnmap(va, 16 * G))
        ck(d.cuMemRelease(h))
        out["after"] = used() - base
        """,
    )
    assert res["child"]["read"] == "shared!"
    assert res["child"]["device_used"] >= 32 * MIB  # the exporter's charge, seen on the card
    assert res["mine"] == 32 * MIB  # charged once, to the process that created it
    assert res["export_plain"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["import_not_a_handle"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["unmap_unmapped"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["after"] == 0


def test_3d_and_mipmapped_arrays_are_charged_as_device_memory(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        base = used()
        desc = d.CUDA_ARRAY3D_DESCRIPTOR()
        desc.Width, desc.Height, desc.Depth = 256, 128, 16
        desc.Format = d.CUarray_format.CU_AD_FORMAT_FLOAT
        desc.NumChannels = 4
        a3 = ck(d.cuArray3DCreate(desc))
        out["3d"] = used() - base
        got = ck(d.cuArray3DGetDescriptor(a3))
        out["desc"] = [got.Width, got.Height, got.Depth, got.NumChannels]
        mip = ck(d.cuMipmappedArrayCreate(desc, 3))
        out["mip"] = used() - base - out["3d"]
        lvl = ck(d.cuMipmappedArrayGetLevel(mip, 2))
        g2 = ck(d.cuArray3DGetDescriptor(lvl))
        out["level2"] = [g2.Width, g2.Height, g2.Depth]
        out["destroy_level"] = rc(d.cuArrayDestroy(lvl))
        out["too_many_levels"] = rc(d.cuMipmappedArrayCreate(desc, 12))
        cube = d.CUDA_ARRAY3D_DESCRIPTOR()
        cube.Width, cube.Height, cube.Depth = 64, 32, 6
        cube.Format, cube.NumChannels, cube.Flags = desc.Format, 1, 0x04
        out["bad_cubemap"] = rc(d.cuArray3DCreate(cube))
        sparse = d.CUDA_ARRAY3D_DESCRIPTOR()
        sparse.Width, sparse.Height, sparse.Depth = 1024, 1024, 1
        sparse.Format, sparse.NumChannels, sparse.Flags = desc.Format, 1, 0x40
        before = used()
        sp = ck(d.cuArray3DCreate(sparse))
        out["sparse"] = used() - before
        ck(d.cuArrayDestroy(sp))
        ck(d.cuMipmappedArrayDestroy(mip))
        ck(d.cuArrayDestroy(a3))
        out["after"] = used() - base
        """,
    )
    level0 = 256 * 128 * 16 * 16
    assert res["3d"] == level0
    assert res["desc"] == [256, 128, 16, 4]
    # Each level halves every dimension: 1 + 1/8 + 1/64 of the first.
    assert res["mip"] == level0 + level0 // 8 + level0 // 64
    assert res["level2"] == [64, 32, 4]
    assert res["destroy_level"] == "CUDA_ERROR_INVALID_HANDLE"
    assert res["too_many_levels"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["bad_cubemap"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["sparse"] == 0
    assert res["after"] == 0


@pytest.mark.timing
def test_graph_memory_nodes_charge_at_launch_and_stay_in_the_graph_pool(
    sim_env: dict[str, str],
) -> None:
    res = run(
        sim_env,
        r"""
        GA = d.CUgraphMem_attribute
        def gattr(a):
            return int(ck(d.cuDeviceGetGraphMemAttribute(dev, a)))
        mod = ck(d.cuModuleLoadData(PTX))
        spin = ck(d.cuModuleGetFunction(mod, b"spin"))
        base = used()
        g = ck(d.cuGraphCreate(0))
        p = d.CUDA_MEM_ALLOC_NODE_PARAMS()
        p.poolProps.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.poolProps.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        p.poolProps.location.id = 0
        p.bytesize = 32 << 20
        alloc = ck(d.cuGraphAddMemAllocNode(g, None, 0, p))
        dptr = p.dptr
        kp = d.CUDA_KERNEL_NODE_PARAMS()
        kp.func, kp.gridDimX, kp.gridDimY, kp.gridDimZ = spin, 1, 1, 1
        kp.blockDimX, kp.blockDimY, kp.blockDimZ = 1, 1, 1
        kp.kernelParams = ((10000,), (ctypes.c_uint64,))
        k = ck(d.cuGraphAddKernelNode(g, [alloc], 1, kp))
        free_node = ck(d.cuGraphAddMemFreeNode(g, [k], 1, dptr))
        out["before_launch"] = used() - base
        exe = ck(d.cuGraphInstantiate(g, 0))
        stream = ck(d.cuStreamCreate(0))
        ck(d.cuGraphLaunch(exe, stream))
        ck(d.cuStreamSynchronize(stream))
        out["after_launch"] = [used() - base, gattr(GA.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT),
                               gattr(GA.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)]
        ck(d.cuGraphLaunch(exe, stream))  # the pool's cache serves the second launch
        ck(d.cuStreamSynchronize(stream))
        out["relaunch"] = used() - base
        ck(d.cuDeviceGraphMemTrim(dev))
        out["trimmed"] = used() - base

        # A graph that does not free its allocation: live until cuMemFree, no relaunch before.
        g2 = ck(d.cuGraphCreate(0))
        p.bytesize = 8 << 20
        ck(d.cuGraphAddMemAllocNode(g2, None, 0, p))
        kept = p.dptr
        exe2 = ck(d.cuGraphInstantiate(g2, 0))
        ck(d.cuGraphLaunch(exe2, stream))
        out["live"] = used() - base
        out["relaunch_live"] = rc(d.cuGraphLaunch(exe2, stream))
        ck(d.cuMemFree(kept))
        out["double_free"] = rc(d.cuMemFree(kept))
        ck(d.cuGraphLaunch(exe2, stream))
        ck(d.cuMemFreeAsync(kept, stream))
        ck(d.cuStreamSynchronize(stream))
        ck(d.cuDeviceGraphMemTrim(dev))
        out["freed"] = used() - base

        # Capture: cuMemAllocAsync and cuMemFreeAsync become memory nodes.
        cap = ck(d.cuStreamCreate(0))
        ck(d.cuStreamBeginCapture(cap, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
        q = ck(d.cuMemAllocAsync(4 << 20, cap))
        ck(d.cuMemFreeAsync(q, cap))
        g3 = ck(d.cuStreamEndCapture(cap))
        out["captured"] = used() - base
        ip = d.CUDA_GRAPH_INSTANTIATE_PARAMS()
        exe3 = ck(d.cuGraphInstantiateWithParams(g3, ip))
        out["result"] = int(ip.result_out)
        ck(d.cuGraphLaunch(exe3, cap))
        ck(d.cuStreamSynchronize(cap))
        out["captured_launched"] = gattr(GA.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)

        kp.kernelParams = ((40000,), (ctypes.c_uint64,))
        ck(d.cuGraphExecKernelNodeSetParams(exe, k, kp))
        t = time.monotonic()
        ck(d.cuGraphLaunch(exe, stream))
        ck(d.cuStreamSynchronize(stream))
        out["updated_ms"] = (time.monotonic() - t) * 1000
        out["set_on_free_node"] = rc(d.cuGraphExecKernelNodeSetParams(exe, free_node, kp))
        out["free_not_graph"] = rc(d.cuGraphAddMemFreeNode(g, None, 0, 12345))
        # The generic node API: an allocation node and its free node through cuGraphAddNode.
        ck(d.cuDeviceGraphMemTrim(dev))
        g4 = ck(d.cuGraphCreate(0))
        np_ = d.CUgraphNodeParams()
        np_.type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEM_ALLOC
        np_.alloc.poolProps = p.poolProps
        np_.alloc.bytesize = 2 << 20
        a4 = ck(d.cuGraphAddNode(g4, None, None, 0, np_))
        fp = d.CUgraphNodeParams()
        fp.type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEM_FREE
        fp.free.dptr = np_.alloc.dptr
        ck(d.cuGraphAddNode(g4, [a4], None, 1, fp))
        hp = d.CUgraphNodeParams()
        hp.type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_HOST
        out["host_node"] = rc(d.cuGraphAddNode(g4, None, None, 0, hp))
        exe4 = ck(d.cuGraphInstantiate(g4, 0))
        ck(d.cuGraphLaunch(exe4, stream))
        ck(d.cuStreamSynchronize(stream))
        out["generic_reserved"] = gattr(GA.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
        ck(d.cuGraphExecDestroy(exe4))
        ck(d.cuGraphDestroy(g4))
        p.bytesize = 1 << 50
        out["too_big"] = rc(d.cuGraphAddMemAllocNode(g, None, 0, p))
        for x in (exe, exe2, exe3):
            ck(d.cuGraphExecDestroy(x))
        for x in (g, g2, g3):
            ck(d.cuGraphDestroy(x))
        ck(d.cuDeviceGraphMemTrim(dev))
        out["end"] = used() - base
        """,
    )
    assert res["before_launch"] == 0  # an address, no memory, until the graph runs
    assert res["after_launch"] == [32 * MIB, 0, 32 * MIB]  # freed into the graph pool, kept
    assert res["relaunch"] == 32 * MIB
    assert res["trimmed"] == 0
    assert res["live"] == 8 * MIB
    assert res["relaunch_live"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["double_free"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["freed"] == 0
    assert res["captured"] == 0
    assert res["result"] == 0
    assert res["captured_launched"] == 4 * MIB
    assert res["updated_ms"] >= 40
    assert res["set_on_free_node"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["free_not_graph"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["host_node"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert res["generic_reserved"] == 2 * MIB
    assert res["too_big"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert res["end"] == 0


@pytest.mark.timing
def test_cooperative_launch_on_several_devices(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        ctx1 = ck(d.cuDevicePrimaryCtxRetain(1))
        mods, streams = [], []
        for c in (ctx, ctx1):
            ck(d.cuCtxSetCurrent(c))
            mods.append(ck(d.cuModuleGetFunction(ck(d.cuModuleLoadData(PTX)), b"spin")))
            streams.append(ck(d.cuStreamCreate(0)))
        ck(d.cuCtxSetCurrent(ctx))
        arg = ctypes.c_uint64(50000)
        argv = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
        lp = []
        for i in range(2):
            p = d.CUDA_LAUNCH_PARAMS()
            p.function, p.hStream = mods[i], streams[i]
            p.gridDimX = p.gridDimY = p.gridDimZ = p.blockDimX = p.blockDimY = p.blockDimZ = 1
            p.kernelParams = ctypes.addressof(argv)
            lp.append(p)
        t = time.monotonic()
        ck(d.cuLaunchCooperativeKernelMultiDevice(lp, 2, 0))
        for s in streams:
            ck(d.cuStreamSynchronize(s))
        out["ms"] = (time.monotonic() - t) * 1000
        lp[1].hStream = streams[0]
        out["same_device"] = rc(d.cuLaunchCooperativeKernelMultiDevice(lp, 2, 0))
        """,
    )
    assert 50 <= res["ms"] < 95  # one engine per GPU: the two kernels overlap
    assert res["same_device"] == "CUDA_ERROR_INVALID_DEVICE"


def test_unified_copies_memsets_and_pinned_host_memory(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        base = used()
        dev_buf = ck(d.cuMemAlloc(4096))
        host = ck(d.cuMemAllocHost(4096))
        out["pinned_charged"] = used() - base - 4096
        ctypes.memmove(host, b"unified" * 10, 70)
        ck(d.cuMemcpy(dev_buf, host, 70))  # host -> device through one entry point
        ck(d.cuMemsetD16(int(dev_buf) + 1024, 0xBEEF, 4))
        stream = ck(d.cuStreamCreate(0))
        ck(d.cuMemsetD8Async(int(dev_buf) + 2048, 7, 16, stream))
        back = bytearray(4096)
        ck(d.cuMemcpyAsync(ctypes.addressof((ctypes.c_char * 4096).from_buffer(back)), dev_buf, 4096, stream))
        ck(d.cuStreamSynchronize(stream))
        out["text"] = bytes(back[:7]).decode()
        out["d16"] = bytes(back[1024:1032]).hex()
        out["d8"] = bytes(back[2048:2050]).hex()
        b, size = ck(d.cuMemGetAddressRange(int(dev_buf) + 100))
        out["range"] = [int(b) == int(dev_buf), size >= 4096]
        out["misaligned"] = rc(d.cuMemsetD16(int(dev_buf) + 1, 1, 1))
        out["past_end"] = rc(d.cuMemcpy(int(dev_buf) + 4000, host, 4096))
        out["not_device"] = rc(d.cuMemGetAddressRange(host))
        ck(d.cuMemFreeHost(host))
        ck(d.cuMemFree(dev_buf))
        out["after"] = used() - base
        """,
    )
    assert res["pinned_charged"] == 0  # host memory, not the GPU's
    assert res["text"] == "unified"
    assert res["d16"] == "efbeefbeefbeefbe"
    assert res["d8"] == "0707"
    assert res["range"] == [True, True]
    assert res["misaligned"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["past_end"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["not_device"] == "CUDA_ERROR_NOT_FOUND"
    assert res["after"] == 0


def test_vmm_memory_lives_until_released_and_unmapped(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        r"""
        exec(VMM_SRC)
        base = used()
        h = ck(d.cuMemCreate(4 * G, prop, 0))
        va = mapped(h, 4 * G)
        ck(d.cuMemRelease(h))  # the documented idiom: release right after mapping
        out["released_mapped"] = used() - base
        out["release_twice"] = rc(d.cuMemRelease(h))
        ck(d.cuMemUnmap(va, 4 * G))
        out["unmapped"] = used() - base
        ck(d.cuMemAddressFree(va, 4 * G))
        """,
    )
    assert res["released_mapped"] == 8 * MIB  # still mapped: still the process's memory
    assert res["release_twice"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["unmapped"] == 0
