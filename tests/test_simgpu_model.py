"""What real programs do, modelled the way a GPU does it: cuda-python (cuda.bindings.driver)
drives the simulated driver alone, in fresh processes, and every bad input leaves the
simulator's per-process charge where it was."""

from __future__ import annotations

import textwrap

from simgpuutil import MIB, run_py

# Every script starts with this: init, the primary context of GPU 0 current, and helpers.
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


def run(env: dict[str, str], body: str) -> dict[str, object]:
    return run_py(env, PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n")


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
