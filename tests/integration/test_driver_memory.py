"""Device memory the driver places for a program without an allocation call, under the cap.

- Graph memory nodes: what a graph's allocation nodes take from the device's graph memory pool is
  charged when the graph runs (launch or upload), kept while the pool keeps it, and given back at
  cuDeviceGraphMemTrim; a launch that would grow the pool past the cap is refused.
- Module globals: a module's `__device__`/`__constant__` variables are charged when it is loaded
  (PTX, ELF cubin, or a fatbin container of those, compressed or not, made here by CUDA 13's own
  ptxas and fatbinary), refused past the cap, given back at unload or with the context.

Real processes through cuda-python (a real driver-API client) on the simulated GPU, whose
driver keeps graph memory and module variables as a real one does (native/simgpu/cuda/graph_mem.c,
module.c).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import random
import re
import shutil
import struct
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from cbuild import SHIM_DIR, gcc
from conftest import REPO, Sim, parse_kv, python
from sharegpu import native

CAP = 64  # MiB

PRELUDE = """
from cuda.bindings import driver as d
M = 1 << 20
d.cuInit(0)
d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
stream = d.cuStreamCreate(0)[1]
def free(dev=0):
    ctx = d.cuDevicePrimaryCtxRetain(dev)[1]
    d.cuCtxPushCurrent(ctx)
    left = d.cuMemGetInfo()[1] // M
    d.cuCtxPopCurrent()
    return left
def free_bytes():
    return d.cuMemGetInfo()[1]
def alloc_graph(mib, dev=0):
    g = d.cuGraphCreate(0)[1]
    p = d.CUDA_MEM_ALLOC_NODE_PARAMS()
    p.poolProps.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.poolProps.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.poolProps.location.id = dev
    p.bytesize = mib * M
    err, node = d.cuGraphAddMemAllocNode(g, None, 0, p)
    assert err == d.CUresult.CUDA_SUCCESS, err
    return g, int(p.dptr)
def launch(x):
    res = d.cuGraphLaunch(x, stream)[0]
    d.cuStreamSynchronize(stream)
    return res.name
"""


def run(env: dict[str, str], body: str):  # type: ignore[no-untyped-def]
    return python(env, PRELUDE + textwrap.dedent(body))


def test_a_graph_allocation_is_charged_when_the_graph_runs_and_given_back_at_trim(sim: Sim) -> None:
    tenant = sim.tenant("t", [CAP], gpus=[0])
    values, proc = run(
        sim.tenant_env(tenant),
        """
        g, ptr = alloc_graph(48)
        x = d.cuGraphInstantiate(g, 0)[1]
        print("instantiated=%d" % free())
        print("launch=%s,%d" % (launch(x), free()))
        print("alloc_over=%s" % d.cuMemAlloc(32 * M)[0].name)
        print("relaunch_live=%s,%d" % (launch(x), free()))
        print("freed=%s,%d" % (d.cuMemFree(ptr)[0].name, free()))
        print("relaunch=%s,%d" % (launch(x), free()))
        d.cuMemFree(ptr)
        print("trim=%s,%d" % (d.cuDeviceGraphMemTrim(0)[0].name, free()))
        print("alloc_after=%s" % d.cuMemAlloc(48 * M)[0].name)
        """,
    )
    assert values["instantiated"] == str(CAP)  # a node takes nothing until the graph runs
    assert values["launch"] == f"CUDA_SUCCESS,{CAP - 48}"
    assert values["alloc_over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    # a relaunch while the last launch's allocation is live: the driver would refuse it, and
    # the admission, which counts what is live as taken, refuses it first; nothing moves
    assert values["relaunch_live"] == f"CUDA_ERROR_OUT_OF_MEMORY,{CAP - 48}"
    assert values["freed"] == f"CUDA_SUCCESS,{CAP - 48}"  # the pool keeps what it took
    assert values["relaunch"] == f"CUDA_SUCCESS,{CAP - 48}"  # served from the pool: no growth
    assert values["trim"] == f"CUDA_SUCCESS,{CAP}"
    assert values["alloc_after"] == "CUDA_SUCCESS"
    assert proc.stderr == ""


def test_a_graph_that_would_grow_the_pool_past_the_cap_is_refused_before_it_runs(sim: Sim) -> None:
    tenant = sim.tenant("t", [CAP], gpus=[0])
    values, _ = run(
        sim.tenant_env(tenant),
        """
        big, _ = alloc_graph(CAP + 16)
        x = d.cuGraphInstantiate(big, 0)[1]
        print("launch=%s,%d" % (launch(x), free()))
        print("upload=%s,%d" % (d.cuGraphUpload(x, stream)[0].name, free()))
        params = d.CUDA_GRAPH_INSTANTIATE_PARAMS()
        params.flags = d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD
        params.hUploadStream = stream
        d.cuGraphExecDestroy(x)
        print("instantiate_upload=%s,%d" % (d.cuGraphInstantiateWithParams(big, params)[0].name, free()))
        ok, _ = alloc_graph(40)
        y = d.cuGraphInstantiate(ok, 0)[1]
        print("upload_ok=%s,%d" % (d.cuGraphUpload(y, stream)[0].name, free()))
        print("then_launch=%s,%d" % (launch(y), free()))
        print("alloc_over=%s" % d.cuMemAlloc(32 * M)[0].name)
        """.replace("CAP", str(CAP)),
    )
    assert values["launch"] == f"CUDA_ERROR_OUT_OF_MEMORY,{CAP}"
    assert values["upload"] == f"CUDA_ERROR_OUT_OF_MEMORY,{CAP}"
    assert values["instantiate_upload"] == f"CUDA_ERROR_OUT_OF_MEMORY,{CAP}"
    assert values["upload_ok"] == f"CUDA_SUCCESS,{CAP - 40}"  # an upload maps it ahead of the launch
    assert values["then_launch"] == f"CUDA_SUCCESS,{CAP - 40}"
    assert values["alloc_over"] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_captured_stream_allocations_are_charged_once_when_the_graph_runs(sim: Sim) -> None:
    """cuMemAllocAsync on a capturing stream makes an allocation node: nothing at capture (no
    memory exists yet), the pool's growth at each launch, never twice for one allocation."""
    tenant = sim.tenant("t", [CAP], gpus=[0])
    values, proc = run(
        sim.tenant_env(tenant),
        """
        d.cuStreamBeginCapture(stream, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        err, ptr = d.cuMemAllocAsync(40 * M, stream)
        print("captured_alloc=%s,%d" % (err.name, free()))
        d.cuMemFreeAsync(ptr, stream)
        g = d.cuStreamEndCapture(stream)[1]
        x = d.cuGraphInstantiate(g, 0)[1]
        print("first=%s,%d" % (launch(x), free()))
        print("second=%s,%d" % (launch(x), free()))
        print("alloc_over=%s" % d.cuMemAlloc(32 * M)[0].name)
        d.cuGraphExecDestroy(x)
        print("trim=%s,%d" % (d.cuDeviceGraphMemTrim(0)[0].name, free()))
        """,
    )
    assert values["captured_alloc"] == f"CUDA_SUCCESS,{CAP}"
    assert values["first"] == f"CUDA_SUCCESS,{CAP - 40}"
    assert values["second"] == f"CUDA_SUCCESS,{CAP - 40}"
    assert values["alloc_over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert values["trim"] == f"CUDA_SUCCESS,{CAP}"
    assert proc.stderr == ""


def test_graph_memory_is_charged_to_the_device_its_node_names(sim: Sim) -> None:
    """The current context on GPU 0, an allocation node on GPU 1: GPU 1's cap pays."""
    tenant = sim.tenant("t", [CAP, CAP], gpus=[0, 1])
    values, _ = run(
        sim.tenant_env(tenant),
        """
        g, _ = alloc_graph(48, dev=1)
        x = d.cuGraphInstantiate(g, 0)[1]
        print("launch=%s,%d,%d" % (launch(x), free(0), free(1)))
        big, _ = alloc_graph(24, dev=1)
        y = d.cuGraphInstantiate(big, 0)[1]
        print("over=%s,%d,%d" % (launch(y), free(0), free(1)))
        """,
    )
    assert values["launch"] == f"CUDA_SUCCESS,{CAP},{CAP - 48}"
    assert values["over"] == f"CUDA_ERROR_OUT_OF_MEMORY,{CAP},{CAP - 48}"


# ---------------------------------------------------------------------------------------------
# module globals


def ptx(global_mib: int) -> bytes:
    return (
        ".version 8.0\n.target sm_90\n.address_size 64\n"
        f".visible .global .align 8 .b8 big[{global_mib << 20}];\n"
        ".visible .const .align 4 .u32 small[4] = {1, 2, 3, 4};\n"
        ".visible .entry k()\n{\n\tld.global.u32 %r1, [big];\n\tret;\n}\n"
    ).encode() + b"\0"


def cubin(global_mib: int) -> bytes:
    """A minimal ELF64 cubin as the ELF specification lays it out: one `.nv.global` (NOBITS)
    section holding one object symbol of global_mib MiB."""
    shstr = b"\0.shstrtab\0.strtab\0.symtab\0.nv.global\0"
    strtab = b"\0big\0"
    object_sym = (1, 0x11, 0, 4, 0, global_mib << 20)  # "big": STB_GLOBAL|STT_OBJECT, section 4
    sym = struct.pack("<IBBHQQ", 0, 0, 0, 0, 0, 0) + struct.pack("<IBBHQQ", *object_sym)
    body = shstr + strtab + sym
    off_shstr, off_str, off_sym = 64, 64 + len(shstr), 64 + len(shstr) + len(strtab)
    shoff = 64 + len(body)

    def sh(name: int, kind: int, off: int, size: int, *, link: int = 0, entsize: int = 0) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, off, size, link, 0, 8, entsize)

    sections = (
        sh(0, 0, 0, 0)
        + sh(1, 3, off_shstr, len(shstr))  # .shstrtab
        + sh(11, 3, off_str, len(strtab))  # .strtab
        + sh(19, 2, off_sym, len(sym), link=2, entsize=24)  # .symtab
        + sh(27, 8, 0, global_mib << 20)  # .nv.global, NOBITS
    )
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x33]) + bytes(8)
    header = ident + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 5, 1)
    return header + body + sections


def test_module_globals_are_charged_at_load_and_given_back_at_unload(sim: Sim, tmp_path: Path) -> None:
    tenant = sim.tenant("t", [CAP], gpus=[0])
    (tmp_path / "big.ptx").write_bytes(ptx(40)[:-1])
    values, proc = run(
        sim.tenant_env(tenant),
        f"""
        ptx48, ptx80, elf48 = {ptx(48)!r}, {ptx(80)!r}, {cubin(48)!r}
        err, mod = d.cuModuleLoadData(ptx48)
        print("ptx=%s,%d" % (err.name, free_bytes()))
        print("global=%d" % d.cuModuleGetGlobal(mod, b"big")[2])
        print("alloc_over=%s" % d.cuMemAlloc(32 * M)[0].name)
        print("unload=%s,%d" % (d.cuModuleUnload(mod)[0].name, free_bytes()))
        print("ptx_over=%s,%d" % (d.cuModuleLoadData(ptx80)[0].name, free_bytes()))
        err, mod = d.cuModuleLoadDataEx(elf48, 0, [], [])
        print("cubin=%s,%d" % (err.name, free_bytes()))
        d.cuModuleUnload(mod)
        err, mod = d.cuModuleLoad({str(tmp_path / "big.ptx")!r}.encode())
        print("file=%s,%d" % (err.name, free_bytes()))
        ctx = d.cuCtxCreate(None, 0, 0)[1]
        err, other = d.cuModuleLoadData({ptx(16)!r})
        print("other_ctx=%s,%d" % (err.name, free_bytes()))
        d.cuCtxDestroy(ctx)
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
        print("ctx_gone=%d" % free_bytes())
        """,
    )
    cap, small = CAP << 20, 16  # each PTX module also has a 16-byte `.const` array
    assert values["ptx"] == f"CUDA_SUCCESS,{cap - (48 << 20) - small}"
    assert values["global"] == str(48 << 20)
    assert values["alloc_over"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert values["unload"] == f"CUDA_SUCCESS,{cap}"
    assert values["ptx_over"] == f"CUDA_ERROR_OUT_OF_MEMORY,{cap}"
    assert values["cubin"] == f"CUDA_SUCCESS,{cap - (48 << 20)}"
    assert values["file"] == f"CUDA_SUCCESS,{cap - (40 << 20) - small}"
    assert values["other_ctx"] == f"CUDA_SUCCESS,{cap - (56 << 20) - 2 * small}"
    assert values["ctx_gone"] == str(cap - (40 << 20) - small)  # the context's module went with it
    assert proc.stderr == ""


# Each way of writing a module-scope variable of 3 GiB that a PTX reader (the driver's lexer:
# all whitespace equivalent, C comments, strings) takes as a declaration, shown with the very
# characters.  A shim that misses one lets 3 GiB past a 1000 MiB cap.
G3 = 3 << 30
HIDDEN_GLOBALS = {
    "cr_before_global": f".visible\r.global .align 8 .b8 big[{G3}];",
    "vt_before_global": f"\v.global .b8 big[{G3}];",
    "ff_before_global": f"\f.global .b8 big[{G3}];",
    "comment_end_before_global": f"/* x */.global .b8 big[{G3}];",
    "semicolon_in_a_comment": f".global /* ; */ .b8 big[{G3}];",
    "percent_name": f".global .b8 %big[{G3}];",
    "name_of_300_chars": f".global .b8 {'g' * 300}[{G3}];",
    "second_declarator": f".global .b8 small[16], big[{G3}];",
    "declarator_after_an_initialiser": f".global .u32 tab[4] = {{1, 2, 3, 4}}, big[{G3 // 4}];",
    "constant_expression_dimension": ".global .b8 big[3 << 30];",
    "three_dimensions": ".global .b8 big[3][1024][1048576];",
    "string_holding_a_comment_opener": f'.file 1 "a/*b.cu"\n.global .b8 big[{G3}];\n// */',
    "weak": f".weak .global .b8 big[{G3}];",
    "common": f".common .global .b8 big[{G3}];",
    "line_continuation": f".glo\\\nbal .b8 big[{G3}];",
}
COMMENTED_GLOBALS = f"// .global .b8 fake[{G3}];\n/* .global .b8 fake2[{G3}];\n*/"


def ptx_with(decl: str) -> bytes:
    head = ".version 8.0\n.target sm_90\n.address_size 64\n"
    return (head + decl + "\n.visible .entry k()\n{\n\tret;\n}\n").encode() + b"\0"


LOAD_EACH = """
for name, image in images.items():
    before = d.cuMemGetInfo()[1]
    err, mod = d.cuModuleLoadData(image)
    print("%s=%s,%d" % (name, err.name, (before - d.cuMemGetInfo()[1]) >> 20))
    if err == d.CUresult.CUDA_SUCCESS:
        d.cuModuleUnload(mod)
"""


def test_every_global_a_ptx_reader_would_place_is_charged(sim_factory: Callable[..., Sim]) -> None:
    """Under a 1000 MiB cap every hidden 3 GiB global is refused; a global inside a comment is
    none (the driver places nothing for it) and loads.  On the bare simulated GPU each hidden
    global takes its 3 GiB: the model reads PTX as the driver does, not more forgivingly."""
    sim = sim_factory(memory_mib=8 * 1024)
    images = {name: ptx_with(decl) for name, decl in HIDDEN_GLOBALS.items()}
    images["commented"] = ptx_with(COMMENTED_GLOBALS)
    images["preprocessor"] = ptx_with(f"#define G .glo ## bal\nG .b8 big[{G3}];")
    # a comment is whitespace: the `#` after one is still first on its line
    paste = f"#define CAT(a, b) a##b\n.global .b8 CAT(b, ig)[{G3}];"
    images["preprocessor_after_comment"] = ptx_with("/**/" + paste)
    images["preprocessor_after_multiline_comment"] = ptx_with("/*\n*/" + paste)
    body = f"images = {images!r}\n" + LOAD_EACH
    tenant = sim.tenant("t", [1000], gpus=[0])
    capped, proc = run(sim.tenant_env(tenant), body)
    bare, _ = run(sim.env(), body)
    for name in HIDDEN_GLOBALS:
        assert bare[name] == "CUDA_SUCCESS,3072", name  # the model places it
        assert capped[name] == "CUDA_ERROR_OUT_OF_MEMORY,0", name
    assert bare["commented"] == "CUDA_SUCCESS,0"
    assert capped["commented"] == "CUDA_SUCCESS,0"
    # a preprocessor could paste names no text spells: the shim refuses such PTX (and the
    # model, which does not run one, refuses it too)
    for name in ("preprocessor", "preprocessor_after_comment", "preprocessor_after_multiline_comment"):
        assert capped[name] == bare[name] == "CUDA_ERROR_NOT_SUPPORTED,0", name
    assert proc.stderr == ""


def test_a_module_file_is_read_once_and_that_image_is_charged(
    sim_factory: Callable[..., Sim], tmp_path: Path
) -> None:
    """cuModuleLoad: the file is read once, by the shim, and the bytes read are what the driver
    loads and what is sized.  A pipe (readable once) and a file past 256 MiB are charged like
    any file; a file that cannot be read fails as the driver fails it."""
    sim = sim_factory(memory_mib=8 * 1024)
    image = ptx_with(f".global .b8 big[{G3}];")[:-1]
    padded = tmp_path / "padded.ptx"
    with padded.open("wb") as f:
        f.write(image)
        f.write(b" " * (257 << 20))
    tenant = sim.tenant("t", [1000], gpus=[0])
    values, proc = run(
        sim.tenant_env(tenant),
        f"""
        import os
        def load(path):
            before = d.cuMemGetInfo()[1]
            err, mod = d.cuModuleLoad(path.encode())
            return "%s,%d" % (err.name, (before - d.cuMemGetInfo()[1]) >> 20)
        r, w = os.pipe()
        os.write(w, {image!r})
        os.close(w)
        print("pipe=" + load("/proc/self/fd/%d" % r))
        print("padded=" + load({str(padded)!r}))
        print("missing=" + load({str(tmp_path / "missing.ptx")!r}))
        print("directory=" + load({str(tmp_path)!r}))
        """,
    )
    assert values["pipe"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
    assert values["padded"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
    assert values["missing"] == "CUDA_ERROR_FILE_NOT_FOUND,0"
    assert values["directory"] == "CUDA_ERROR_FILE_NOT_FOUND,0"
    assert proc.stderr == ""


def test_library_globals_are_charged_at_load_and_given_back_at_unload(
    sim_factory: Callable[..., Sim], tmp_path: Path
) -> None:
    """cuLibraryLoadData / cuLibraryLoadFromFile (how CUDA 12+ runtimes load every fatbin): the
    library's globals, placed in the current context, are charged at load, refused past the
    cap (a use after the load would have placed them uncharged), given back at cuLibraryUnload."""
    sim = sim_factory(memory_mib=8 * 1024)
    big = tmp_path / "big.ptx"
    big.write_bytes(ptx_with(f".global .b8 big[{G3}];")[:-1])
    tenant = sim.tenant("t", [1000], gpus=[0])
    values, proc = run(
        sim.tenant_env(tenant),
        f"""
        def report(err, before):
            return "%s,%d" % (err.name, (before - d.cuMemGetInfo()[1]) >> 20)
        def from_data(image):
            before = d.cuMemGetInfo()[1]
            err, lib = d.cuLibraryLoadData(image, [], [], 0, [], [], 0)
            return report(err, before), lib
        before = d.cuMemGetInfo()[1]
        err, lib = d.cuLibraryLoadFromFile({str(big)!r}.encode(), [], [], 0, [], [], 0)
        print("file_big=" + report(err, before))
        result, lib = from_data({ptx_with(f".global .b8 big[{G3}];")!r})
        print("data_big=" + result)
        if lib is not None and result.startswith("CUDA_SUCCESS"):
            d.cuLibraryGetGlobal(lib, b"big")  # a use places it in this context
            print("alloc_after_use=%s" % d.cuMemAlloc(900 * M)[0].name)
        result, lib = from_data({ptx_with(f".global .b8 fits[{48 << 20}];")!r})
        print("data_fits=" + result)
        print("global=%d" % d.cuLibraryGetGlobal(lib, b"fits")[2])
        before = d.cuMemGetInfo()[1]
        print("unload=%s,%d" % (d.cuLibraryUnload(lib)[0].name, (d.cuMemGetInfo()[1] - before) >> 20))
        """,
    )
    assert values["file_big"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
    assert values["data_big"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
    assert "alloc_after_use" not in values
    assert values["data_fits"] == "CUDA_SUCCESS,48"
    assert values["global"] == str(48 << 20)
    assert values["unload"] == "CUDA_SUCCESS,48"
    assert proc.stderr == ""


def test_an_image_whose_headers_say_more_than_it_holds_is_refused(
    sim_factory: Callable[..., Sim], tmp_path: Path
) -> None:
    """The shim copies an image as far as its own headers say (ELF: the tables and every
    section with bytes; fatbin: header size + fat size) and hands the driver that copy.  Headers
    that overflow, point past 1 GiB, or (in a file) past the file's end are refused with
    CUDA_ERROR_INVALID_IMAGE: followed, they would send the scan for names out of bounds.  So is
    an ELF whose symbols the scan cannot all read (it failed open: loaded, nothing charged), and
    a fatbin whose header fits but whose entries are none (zeros: an entry header of 0 bytes;
    before fatbins were read such a container was copied and loaded unread)."""
    sim = sim_factory(memory_mib=8 * 1024)
    good = cubin(48)
    shoff = struct.unpack_from("<Q", good, 40)[0]

    def with_strtab(offset: int) -> bytes:  # section 2 (.strtab) moved to offset
        image = bytearray(good)
        struct.pack_into("<Q", image, shoff + 2 * 64 + 24, offset)
        return bytes(image)

    far = bytearray(good)
    struct.pack_into("<Q", far, 40, 1 << 40)  # the section header table 1 TiB away
    name_out = bytearray(good)  # the 48 MiB object's name past the end of its string table
    struct.pack_into("<I", name_out, 64 + len(b"\0.shstrtab\0.strtab\0.symtab\0.nv.global\0") + 5 + 24, 1000)
    bad_entsize = bytearray(good)  # a symbol table whose entries are not ELF64 symbols
    struct.pack_into("<Q", bad_entsize, shoff + 3 * 64 + 56, 16)
    images = {
        "cubin": good,
        "table_far_away": bytes(far),
        "name_out_of_its_table": bytes(name_out),
        "symbols_of_another_size": bytes(bad_entsize),
        "section_offset_overflows": with_strtab((1 << 64) - 8),
        "fatbin_of_zeros": struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 64) + bytes(64),
        "fatbin_too_big": struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 1 << 40),
    }
    past_end = tmp_path / "past_end.cubin"
    past_end.write_bytes(with_strtab(len(good)))  # the file ends where .strtab starts
    tenant = sim.tenant("t", [1000], gpus=[0])
    values, proc = run(
        sim.tenant_env(tenant),
        f"""
        images = {images!r}
        for name, image in images.items():
            before = d.cuMemGetInfo()[1]
            err, mod = d.cuModuleLoadData(image)
            print("%s=%s,%d" % (name, err.name, (before - d.cuMemGetInfo()[1]) >> 20))
            if err == d.CUresult.CUDA_SUCCESS:
                d.cuModuleUnload(mod)
        print("file_past_end=%s" % d.cuModuleLoad({str(past_end)!r}.encode())[0].name)
        """,
    )
    assert values["cubin"] == "CUDA_SUCCESS,48"
    # Symbols the scan cannot all read: refused, not loaded with a global nobody was charged for.
    unread = ("name_out_of_its_table", "symbols_of_another_size")
    for name in ("table_far_away", "section_offset_overflows", "fatbin_too_big", "fatbin_of_zeros", *unread):
        assert values[name] == "CUDA_ERROR_INVALID_IMAGE,0", name
    assert values["file_past_end"] == "CUDA_ERROR_INVALID_IMAGE"
    assert proc.stderr == ""


TRIES = 1500  # before the copy the first uncharged load came within 100 tries


@pytest.mark.parametrize(
    "mode", [pytest.param(m, id=m) for m in ("module", "module-ex", "library", "library-preserved")]
)
def test_a_name_flipped_during_the_load_is_still_charged(
    sim_factory: Callable[..., Sim], tmp_path: Path, mode: str
) -> None:
    """A second thread flips a global's name (`big` <-> `%ig`) while the same buffer is loaded
    again and again (native/shim/tests/modrace.c).  The shim copies the image before anything
    reads it, so the driver places and the scan asks for the same name: every successful load
    is charged in full and the tenant's usage never passes its cap.  A shim that scans the
    caller's live buffer after the driver read it loses this race within a hundred tries or so
    (a comment before the declaration gives the flip time to land between the two reads).
    library-preserved: with CU_LIBRARY_BINARY_IS_PRESERVED, which the shim withdraws (the
    driver is handed the shim's copy, freed after the load)."""
    sim = sim_factory(memory_mib=8 * 1024)
    simgpu = str(native.LIB_DIR / "simgpu")
    source = str(SHIM_DIR / "tests" / "modrace.c")
    program = gcc(tmp_path, "modrace", source, f"-L{simgpu}", "-l:libcuda.so.1", "-lpthread")
    tenant = sim.tenant("t", [1000], gpus=[0])
    proc = subprocess.run(
        [str(program), mode, str(TRIES), "400"],
        env=sim.tenant_env(tenant),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    values, _ = parse_kv(proc.stdout)
    assert values["uncharged"] == "0", proc.stdout
    assert values["tries"] == values["loads"] == str(TRIES), proc.stdout
    assert int(values["big"]) > 0, proc.stdout  # both names were loaded: the race was live
    assert int(values["pct"]) > 0, proc.stdout
    assert int(values["max_used"]) <= 1000 << 20
    assert proc.stderr == ""


# ---------------------------------------------------------------------------------------------
# fatbin globals: containers made by CUDA 13's own tools (ptxas, fatbinary) from .venv-clients

TOOLS_GLOB = ".venv-clients/lib/python3*/site-packages/nvidia/cu13/bin"
FATBIN_MAGIC = 0xBA55ED50
ZSTD, LZ4 = 0x8000, 0x2000


@pytest.fixture(scope="module")
def cuda_tools() -> Path:
    """The nvidia-cuda-nvcc wheel's bin/ (ptxas, fatbinary) in .venv-clients; missing, the
    tests fail (they never skip): `make clients`, which `make test` runs first, installs it."""
    found = sorted(REPO.glob(TOOLS_GLOB))
    if not found or not (found[-1] / "fatbinary").exists() or not (found[-1] / "ptxas").exists():
        pytest.fail(f"no ptxas/fatbinary in {REPO / TOOLS_GLOB}: run `make clients` (or `make test`)")
    return found[-1]


def fatbinary(tools: Path, work: Path, text: bytes, *, elf: bool = True, compress: str = "") -> bytes:
    """A fatbin container as `fatbinary` writes it: an ELF cubin (`ptxas` of the text, for the
    sm its `.target` names) unless elf is False, and the PTX text itself; compress: ""
    (fatbinary's default: the PTX zstd-compressed), "none" (--compress=false) or "all"
    (--compress-all: the ELF too)."""
    sm = re.search(rb"\.target sm_(\d+)", text)
    assert sm is not None
    name = hashlib.sha256(text + f"{elf}{compress}".encode()).hexdigest()[:16]
    ptx, cubin, out = work / f"{name}.ptx", work / f"{name}.cubin", work / f"{name}.fatbin"
    ptx.write_bytes(text.rstrip(b"\0"))
    cmd = [str(tools / "fatbinary"), "-64", f"--create={out}"]
    if elf:
        subprocess.run(
            [str(tools / "ptxas"), f"-arch=sm_{sm[1].decode()}", str(ptx), "-o", str(cubin)], check=True
        )
        cmd.append(f"--image3=kind=elf,sm={sm[1].decode()},file={cubin}")
    cmd.append(f"--image3=kind=ptx,sm={sm[1].decode()},file={ptx}")
    cmd += {"": [], "none": ["--compress=false"], "all": ["--compress-all"]}[compress]
    subprocess.run(cmd, check=True)
    return out.read_bytes()


def entries(fatbin: bytes) -> list[tuple[bytearray, bytes]]:
    """A container's entries, (entry header, payload) pairs (the layout:
    native/include/sharegpu/fatbin.h)."""
    header, fat = struct.unpack_from("<6xHQ", fatbin)
    out, off = [], header
    while off < header + fat:
        size, payload = struct.unpack_from("<4xIQ", fatbin, off)
        out.append((bytearray(fatbin[off : off + size]), fatbin[off + size : off + size + payload]))
        off += size + payload
    return out


def container(parts: list[tuple[bytearray, bytes]]) -> bytes:
    """Entries back in a container; each entry header's payload size set to its payload's."""
    body = b""
    for h, p in parts:
        struct.pack_into("<Q", h, 8, len(p))
        body += bytes(h) + p
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def lz4_ptx(plain: bytes) -> bytes:
    """An uncompressed PTX-only container with its entry LZ4-compressed as older toolkits
    did (flag 0x2000; the system's liblz4.so.1 compresses, as it decompresses for the shim)."""
    lz4 = ctypes.CDLL("liblz4.so.1")
    ((h, p),) = entries(plain)
    text = p.rstrip(b"\0") + b"\0"
    dst = ctypes.create_string_buffer(len(text) + 64 + len(text) // 200)
    n = lz4.LZ4_compress_default(text, dst, len(text), len(dst))
    assert n > 0
    flags = (struct.unpack_from("<Q", h, 40)[0] & ~ZSTD) | LZ4
    struct.pack_into("<I", h, 16, n)
    struct.pack_into("<Q", h, 40, flags)
    struct.pack_into("<Q", h, 56, len(text))
    return container([(h, dst.raw[:n] + bytes(-n % 8))])


def fatbin_forms(tools: Path, work: Path, text: bytes) -> dict[str, bytes]:
    """One PTX text in each container form: everything uncompressed, fatbinary's default (a
    plain ELF, the PTX zstd-compressed), the PTX alone zstd-compressed, everything
    zstd-compressed, the PTX alone LZ4-compressed."""
    return {
        "uncompressed": fatbinary(tools, work, text, compress="none"),
        "default": fatbinary(tools, work, text),
        "zstd_ptx_only": fatbinary(tools, work, text, elf=False),
        "compress_all": fatbinary(tools, work, text, compress="all"),
        "lz4_ptx_only": lz4_ptx(fatbinary(tools, work, text, elf=False, compress="none")),
    }


# Every way a program hands the driver a fatbin: in memory (cuModuleLoadData, the runtime's
# cuLibraryLoadData, cuModuleLoadFatBinary), through a fatbin wrapper (__fatBinC_Wrapper_t, what
# a program registers) pointing to it, and in a file.  load_each prints name.how=result,MiB taken
# (a library once used: the simulated driver, like a real one, places it in a context then).
FATBIN_LOADERS = """
import ctypes, struct
keep = []
def wrapper(image, version=1):
    fat = ctypes.create_string_buffer(image, len(image))
    w = ctypes.create_string_buffer(struct.pack("<IIQQ", 0x466243B1, version, ctypes.addressof(fat), 0), 24)
    keep.append((fat, w))
    return ctypes.addressof(w)
def as_file(image):
    keep.append("%s/load%d.fatbin" % (work, len(keep)))
    with open(keep[-1], "wb") as f:
        f.write(image)
    return keep[-1].encode()
def lib(load):
    def run(image):
        err, handle = load(image)
        if err == d.CUresult.CUDA_SUCCESS:
            d.cuLibraryGetGlobal(handle, b"big")  # a use places a lazily loaded library here
        return err, lambda: d.cuLibraryUnload(handle)
    return run
def mod(load):
    def run(image):
        err, handle = load(image)
        return err, lambda: d.cuModuleUnload(handle)
    return run
loaders = {
    "lib_data": lib(lambda image: d.cuLibraryLoadData(image, [], [], 0, [], [], 0)),
    "lib_wrapper": lib(lambda image: d.cuLibraryLoadData(wrapper(image), [], [], 0, [], [], 0)),
    "lib_file": lib(lambda image: d.cuLibraryLoadFromFile(as_file(image), [], [], 0, [], [], 0)),
    "mod_data": mod(d.cuModuleLoadData),
    "mod_fatbinary": mod(d.cuModuleLoadFatBinary),
    "mod_wrapper": mod(lambda image: d.cuModuleLoadData(wrapper(image))),
    "mod_file": mod(lambda image: d.cuModuleLoad(as_file(image))),
}
def load_each(images, hows=tuple(loaders)):
    for name, image in images.items():
        for how in hows:
            before = d.cuMemGetInfo()[1]
            err, unload = loaders[how](image)
            print("%s.%s=%s,%d" % (name, how, err.name, (before - d.cuMemGetInfo()[1]) >> 20))
            if err == d.CUresult.CUDA_SUCCESS:
                unload()
"""
LOADERS = ("lib_data", "lib_wrapper", "lib_file", "mod_data", "mod_fatbinary", "mod_wrapper", "mod_file")


def load_fatbins(env: dict[str, str], work: Path, images: dict[str, bytes], hows=LOADERS):  # type: ignore[no-untyped-def]
    return run(env, f"work = {str(work)!r}\n{FATBIN_LOADERS}\nload_each({images!r}, {tuple(hows)!r})\n")


def test_a_fatbin_global_past_the_cap_is_refused_however_the_fatbin_is_loaded(
    sim_factory: Callable[..., Sim], cuda_tools: Path, tmp_path: Path
) -> None:
    """A 3 GiB `.global` in a fatbin made by fatbinary (everything uncompressed, the PTX
    zstd-compressed alone or beside a plain ELF, everything compressed, the PTX LZ4-compressed),
    loaded every way under a 1000 MiB cap: refused with CUDA_ERROR_OUT_OF_MEMORY, nothing left
    charged (the shim reads every entry, decompressed, for names and asks the driver their
    sizes; before, a fatbin was copied unread and the 3 GiB loaded).  On the bare simulated GPU
    each load takes its 3 GiB: the model places a fatbin's globals as a driver does."""
    sim = sim_factory(memory_mib=8 * 1024)
    images = fatbin_forms(cuda_tools, tmp_path, ptx_with(f".visible .global .align 8 .b8 big[{G3}];"))
    tenant = sim.tenant("t", [1000], gpus=[0])
    capped, proc = load_fatbins(sim.tenant_env(tenant), tmp_path, images)
    bare, bare_proc = load_fatbins(sim.env(), tmp_path, images)
    for name in images:
        for how in LOADERS:
            assert bare[f"{name}.{how}"] == "CUDA_SUCCESS,3072", (name, how)
            assert capped[f"{name}.{how}"] == "CUDA_ERROR_OUT_OF_MEMORY,0", (name, how)
    assert proc.stderr == bare_proc.stderr == ""


def test_fatbin_globals_are_charged_at_load_and_given_back_at_unload(
    sim_factory: Callable[..., Sim], cuda_tools: Path, tmp_path: Path
) -> None:
    """A fatbin with a 48 MiB `.global` and a 16-byte `.const` array fits a 1000 MiB cap:
    loaded every way, in every container form, the driver's sizes of both are in the tenant's
    used memory (the vGPU's free memory drops by them) and come back at unload."""
    sim = sim_factory(memory_mib=8 * 1024)
    decls = (
        f".visible .global .align 8 .b8 big[{48 << 20}];\n.visible .const .align 4 .u32 small[4] = {{1, 2}};"
    )
    images = fatbin_forms(cuda_tools, tmp_path, ptx_with(decls))
    tenant = sim.tenant("t", [1000], gpus=[0])
    body = f"""
        images = {images!r}
        for name, image in images.items():
            for how, load in loaders.items():
                before = free_bytes()
                err, unload = load(image)
                taken = before - free_bytes()
                unload()
                print("%s.%s=%s,%d,%d" % (name, how, err.name, taken, before - free_bytes()))
        err, lib = d.cuLibraryLoadData(images["default"], [], [], 0, [], [], 0)
        print("big=%d" % d.cuLibraryGetGlobal(lib, b"big")[2])
        print("small=%d" % d.cuLibraryGetGlobal(lib, b"small")[2])
        """
    values, proc = run(
        sim.tenant_env(tenant), f"work = {str(tmp_path)!r}\n{FATBIN_LOADERS}\n" + textwrap.dedent(body)
    )
    for name in images:
        for how in LOADERS:
            assert values[f"{name}.{how}"] == f"CUDA_SUCCESS,{(48 << 20) + 16},0", (name, how)
    assert values["big"] == str(48 << 20)
    assert values["small"] == "16"
    assert proc.stderr == ""


def test_a_fatbin_that_lies_about_its_layout_is_refused_and_changes_nothing(
    sim_factory: Callable[..., Sim], cuda_tools: Path, tmp_path: Path
) -> None:
    """Containers around a 3 GiB global whose own numbers do not hold: an entry header running
    past the fat size, a payload past the end, bytes after the last entry, a decompressed size
    stated larger or smaller than the data, compressed garbage (zstd, LZ4), PTX text going on
    past a NUL, a wrapper of an unknown version.  The shim refuses each with
    CUDA_ERROR_INVALID_IMAGE before the driver sees it (a scan that gave up and let it load
    would leave what a driver reads its own way uncharged), as the bare simulated GPU does;
    nothing is charged.  The first decompression refusal says why on stderr, once."""
    sim = sim_factory(memory_mib=8 * 1024)
    text = ptx_with(f".visible .global .align 8 .b8 big[{G3}];")
    plain = fatbinary(cuda_tools, tmp_path, text, compress="none")
    ((zh, zp),) = entries(fatbinary(cuda_tools, tmp_path, text, elf=False))
    ((ph, pp),) = entries(fatbinary(cuda_tools, tmp_path, text, elf=False, compress="none"))
    ((lh, lp),) = entries(lz4_ptx(fatbinary(cuda_tools, tmp_path, text, elf=False, compress="none")))

    def patched(image: bytes, fmt: str, off: int, value: int) -> bytes:
        out = bytearray(image)
        struct.pack_into(fmt, out, off, value)
        return bytes(out)

    def zstd_stating(size: int) -> bytes:
        return container([(bytearray(patched(bytes(zh), "<Q", 56, size)), zp)])

    stated = struct.unpack_from("<Q", zh, 56)[0]
    text_end = pp.rstrip(b"\0") + b"\0"
    images = {
        "entry_header_past_the_fat_size": patched(plain, "<I", 16 + 4, len(plain)),
        "payload_past_the_end": patched(plain, "<Q", 16 + 8, len(plain)),
        "bytes_after_the_last_entry": patched(plain + bytes(8), "<Q", 8, len(plain) - 16 + 8),
        "decompressed_size_larger": zstd_stating(stated + 8),
        "decompressed_size_smaller": zstd_stating(stated - 8),
        "zstd_garbage": container([(bytearray(zh), bytes(range(256))[: len(zp)])]),
        "lz4_garbage": container([(bytearray(lh), b"\xff" * len(lp))]),
        "ptx_past_a_nul": container([(bytearray(ph), text_end + b"xx" + bytes(-(len(text_end) + 2) % 8))]),
    }
    tenant = sim.tenant("t", [1000], gpus=[0])
    hows = ("lib_data", "mod_data")
    capped, proc = load_fatbins(sim.tenant_env(tenant), tmp_path, images, hows)
    bare, bare_proc = load_fatbins(sim.env(), tmp_path, images, hows)
    for name in images:
        for how in hows:
            assert capped[f"{name}.{how}"] == "CUDA_ERROR_INVALID_IMAGE,0", (name, how)
            assert bare[f"{name}.{how}"] == "CUDA_ERROR_INVALID_IMAGE,0", (name, how)
    assert proc.stderr == (
        "sharegpu: a zstd-compressed fatbin entry does not decompress to its stated size: "
        "the load is refused (CUDA_ERROR_INVALID_IMAGE)\n"
    )
    assert bare_proc.stderr == ""
    body = f"""
        before = d.cuMemGetInfo()[1]
        err = d.cuModuleLoadData(wrapper({plain!r}, 7))[0]
        print("wrapper_v7=%s,%d" % (err.name, before - d.cuMemGetInfo()[1]))
        """
    for env, values in ((sim.tenant_env(tenant), capped), (sim.env(), bare)):
        values.update(run(env, f"work = {str(tmp_path)!r}\n{FATBIN_LOADERS}\n" + textwrap.dedent(body))[0])
    assert capped["wrapper_v7"] == bare["wrapper_v7"] == "CUDA_ERROR_INVALID_IMAGE,0"


def test_a_fatbin_the_shim_cannot_read_is_refused_with_a_reason(
    sim_factory: Callable[..., Sim], cuda_tools: Path, tmp_path: Path
) -> None:
    """What the shim cannot read, a driver might still load with its globals: refused with
    CUDA_ERROR_NOT_SUPPORTED and one line on stderr, never loaded uncharged.  A zstd entry
    when the libzstd.so.1 found (here: one beside the shim, tried first, that lacks the
    functions) cannot decompress it (the model, beside such a library, refuses it too); a PTX
    entry with a preprocessor line (also refused by the model).  An entry of a kind nobody
    knows that holds no ELF is skipped with one line (NVIDIA's own libraries carry such kinds;
    refusing them would fail their loads), and the entries beside it are still read: here the
    ELF's 3 GiB global is refused."""
    sim = sim_factory(memory_mib=8 * 1024)
    text = ptx_with(f".visible .global .align 8 .b8 big[{G3}];")
    zstd = fatbinary(cuda_tools, tmp_path, text, elf=False)
    (eh, ep), (ph, pp) = entries(fatbinary(cuda_tools, tmp_path, text, compress="none"))
    struct.pack_into("<H", ph, 0, 0x40)  # the PTX entry, of a kind nobody knows
    unknown_kind = container([(eh, ep), (ph, pp)])
    pre = fatbinary(cuda_tools, tmp_path, ptx_with(f"#define G .global\nG .b8 big[{G3}];"), elf=False)
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    shutil.copy(native.shim_path(), shim_dir / "libsharegpu.so")
    (tmp_path / "empty.c").write_text("int sharegpu_not_zstd;\n")
    gcc(shim_dir, "libzstd.so.1", "-shared", "-fPIC", str(tmp_path / "empty.c"))
    tenant = sim.tenant("t", [1000], gpus=[0])
    hows = ("lib_data", "mod_data")
    env = sim.tenant_env(tenant)
    env["LD_PRELOAD"] = str(shim_dir / "libsharegpu.so")
    no_zstd, no_zstd_proc = load_fatbins(env, tmp_path, {"zstd": zstd}, hows)
    capped, proc = load_fatbins(
        sim.tenant_env(tenant), tmp_path, {"unknown_kind": unknown_kind, "preprocessor": pre}, hows
    )
    bare, bare_proc = load_fatbins(sim.env(), tmp_path, {"preprocessor": pre}, hows)
    sim_dir = tmp_path / "simgpu"  # the model beside the same library: it cannot read it either
    shutil.copytree(native.simgpu_dir(), sim_dir, symlinks=True)
    shutil.copy(shim_dir / "libzstd.so.1", sim_dir / "libzstd.so.1")
    bare_no_zstd, _ = load_fatbins(sim.env(LD_LIBRARY_PATH=str(sim_dir)), tmp_path, {"zstd": zstd}, hows)
    for how in hows:
        assert no_zstd[f"zstd.{how}"] == bare_no_zstd[f"zstd.{how}"] == "CUDA_ERROR_NOT_SUPPORTED,0"
        assert capped[f"unknown_kind.{how}"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
        assert capped[f"preprocessor.{how}"] == bare[f"preprocessor.{how}"] == "CUDA_ERROR_NOT_SUPPORTED,0"
    assert no_zstd_proc.stderr == (
        "sharegpu: libzstd.so.1 cannot be opened, so a zstd-compressed fatbin entry cannot be read "
        "for its globals: the load is refused (CUDA_ERROR_NOT_SUPPORTED); install it, or put it "
        "beside libsharegpu.so\n"
    )
    assert proc.stderr == (
        "sharegpu: a fatbin entry of kind 64 (not PTX, not an ELF) is not read for its globals: what "
        "a driver places from it is counted by the agent's reconciler, not admitted here\n"
    )
    assert bare_proc.stderr == ""


def test_the_model_places_the_globals_of_the_entry_a_driver_would_load(
    sim_factory: Callable[..., Sim], cuda_tools: Path, tmp_path: Path
) -> None:
    """The simulated driver loads one entry of a fatbin, as a driver does: an sm_90 ELF before
    the PTX (its 16-byte `big`, not the PTX's 3 GiB one), the PTX when the only ELF is sm_80
    (SASS runs within its major version only), none when all there is is sm_100
    (CUDA_ERROR_NO_BINARY_FOR_GPU); an LTO IR entry (nvJitLink's input) is never loaded and
    the shim does not read it.  Under the shim the charge is the driver's size of the loaded
    entry's globals, whatever the other entries declare."""
    sim = sim_factory(memory_mib=8 * 1024)
    big = ptx_with(f".visible .global .align 8 .b8 big[{G3}];")
    small = ptx_with(".visible .global .align 8 .b8 big[16];")
    sm80 = big.replace(b"sm_90", b"sm_80")
    sm100 = big.replace(b"sm_90", b"sm_100").replace(b".version 8.0", b".version 8.8")
    small_elf = entries(fatbinary(cuda_tools, tmp_path, small))[0]
    big_ptx = entries(fatbinary(cuda_tools, tmp_path, big))[1]
    sm80_elf = entries(fatbinary(cuda_tools, tmp_path, sm80))[0]
    sm100_elf = entries(fatbinary(cuda_tools, tmp_path, sm100))[0]
    lto = (bytearray(big_ptx[0]), b"\x5a" * len(big_ptx[1]))
    struct.pack_into("<H", lto[0], 0, 8)  # LTO IR: CUDA 13 stores it encrypted, unreadable here
    images = {
        "elf_before_ptx": container([small_elf, big_ptx]),
        "ptx_past_an_sm80_elf": container([sm80_elf, big_ptx]),
        "only_sm100": container([sm100_elf]),
        "lto_ir_beside_ptx": container([lto, big_ptx]),
    }
    tenant = sim.tenant("t", [1000], gpus=[0])
    body = f"""
        for name, image in {images!r}.items():
            before = free_bytes()
            err, mod = d.cuModuleLoadData(image)
            print("%s=%s,%d" % (name, err.name, before - free_bytes()))
            if err == d.CUresult.CUDA_SUCCESS:
                d.cuModuleUnload(mod)
        """
    capped, proc = run(sim.tenant_env(tenant), body)
    bare, bare_proc = run(sim.env(), body)
    assert bare["elf_before_ptx"] == capped["elf_before_ptx"] == "CUDA_SUCCESS,16"
    assert bare["ptx_past_an_sm80_elf"] == f"CUDA_SUCCESS,{G3}"
    assert capped["ptx_past_an_sm80_elf"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
    assert bare["only_sm100"] == capped["only_sm100"] == "CUDA_ERROR_NO_BINARY_FOR_GPU,0"
    assert bare["lto_ir_beside_ptx"] == f"CUDA_SUCCESS,{G3}"
    assert capped["lto_ir_beside_ptx"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
    assert proc.stderr == bare_proc.stderr == ""


def test_the_fatbin_reader_stays_inside_any_container(cuda_tools: Path, tmp_path: Path) -> None:
    """The shim's reader (native/shim/fatnames.c over sharegpu/fatbin.h) under AddressSanitizer
    and UBSan, each container in a buffer of exactly its size: real containers (zstd, LZ4,
    uncompressed) read in full, and 3000 of them with a header field or byte changed (sizes 0,
    one off, past the end, huge; kinds; flags) are each read or refused without one access
    outside the buffer."""
    exe = gcc(
        tmp_path,
        "fatscan",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        "-g",
        str(SHIM_DIR / "tests" / "fatscan.c"),
        str(SHIM_DIR / "modnames.c"),
        str(SHIM_DIR / "fatnames.c"),
        "-ldl",
    )
    text = ptx_with(f".visible .global .align 8 .b8 big[{G3}];\n.visible .const .align 4 .u32 c[2];")
    bases = list(fatbin_forms(cuda_tools, tmp_path, text).values())
    rng = random.Random(34)
    fields = [(4, "<I"), (8, "<Q"), (16, "<I"), (40, "<Q"), (56, "<Q"), (0, "<H")]
    files = []
    for i in range(3000):
        image = bytearray(rng.choice(bases))
        starts = [16]
        while starts[-1] < len(image):
            size, payload = struct.unpack_from("<4xIQ", image, starts[-1])
            starts.append(starts[-1] + size + payload)
        at = rng.choice(starts[:-1])
        if rng.random() < 0.2:  # the container's own header, or any byte of an entry header
            at, (off, fmt) = (
                (0, rng.choice([(6, "<H"), (8, "<Q")]))
                if rng.random() < 0.5
                else (at, (rng.randrange(64), "<B"))
            )
        else:
            off, fmt = rng.choice(fields)
        width = struct.calcsize(fmt)
        old = struct.unpack_from(fmt, image, at + off)[0]
        value = rng.choice(
            [0, 1, old - 1, old + 1, old + 8, len(image), (1 << (8 * width)) - 1, rng.getrandbits(8 * width)]
        )
        struct.pack_into(fmt, image, at + off, value % (1 << (8 * width)))
        path = tmp_path / f"m{i}.fatbin"
        path.write_bytes(bytes(image))
        files.append(path)
    for n, base in enumerate(bases):
        (tmp_path / f"base{n}.fatbin").write_bytes(base)
    proc = subprocess.run(
        [str(exe), *(str(tmp_path / f"base{n}.fatbin") for n in range(len(bases))), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr == ""
    results = [line.split("=")[1].split(",") for line in proc.stdout.splitlines()]
    assert len(results) == len(bases) + len(files)
    for res, names in results[: len(bases)]:
        assert res == "0"
        assert int(names) >= 2  # big, c, and the entry's other identifiers
    assert {res for res, _ in results[len(bases) :]} >= {"0", "200"}  # some read, some refused


# ---------------------------------------------------------------------------------------------
# the device runtime's reservations: cuCtxSetLimit(SYNC_DEPTH / PENDING_LAUNCH_COUNT)

SLOT = 4096  # bytes the simulated driver places per pending-launch slot (simgpu cuda/limits.c)
LEVEL = 860  # MiB it places per sync-depth level, the Programming Guide's "up to 860MB"

LIMITS = """
L = d.CUlimit
def get(limit):
    err, value = d.cuCtxGetLimit(limit)
    return "%s,%d" % (err.name, value or 0)
def set_(limit, value):
    before = d.cuMemGetInfo()[1]
    err = d.cuCtxSetLimit(limit, value)[0]
    return "%s,%d" % (err.name, (before - d.cuMemGetInfo()[1]) >> 20)
"""


def test_pending_launch_slots_are_placed_and_charged(sim_factory: Callable[..., Sim]) -> None:
    """Each pending device-runtime launch above the default 2048 is a slot of device memory: the
    simulated driver places it (refused when the card cannot hold it), the shim charges it,
    refuses it past the cap, gives it back when lowered and with the context."""
    sim = sim_factory(memory_mib=1024)
    pending = "L.CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT"
    body = LIMITS + textwrap.dedent(f"""
        print("default=" + get({pending}))
        print("up=" + set_({pending}, 2048 + 8192))
        print("over=" + set_({pending}, 2048 + 300 * 256))
        print("huge=" + set_({pending}, 1 << 62))
        print("alloc_over=%s" % d.cuMemAlloc(40 * M)[0].name)
        print("down=" + set_({pending}, 2048))
        print("alloc=%s" % d.cuMemAlloc(40 * M)[0].name)
        ctx = d.cuCtxCreate(None, 0, 0)[1]
        print("other_ctx=" + set_({pending}, 2048 + 4096))
        d.cuCtxDestroy(ctx)
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
        print("ctx_gone=%d" % free())
        """)
    bare, _ = run(sim.env(), body.replace("300 * 256", "2000 * 256"))
    assert bare["default"] == "CUDA_SUCCESS,2048"
    assert bare["up"] == "CUDA_SUCCESS,32"  # 8192 slots of 4 KiB
    assert bare["over"] == "CUDA_ERROR_OUT_OF_MEMORY,0"  # 2000 MiB more than a 1024 MiB card
    assert bare["huge"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
    assert bare["down"] == "CUDA_SUCCESS,-32"
    assert bare["other_ctx"] == "CUDA_SUCCESS,16"
    tenant = sim.tenant("t", [CAP], gpus=[0])
    capped, proc = run(sim.tenant_env(tenant), body)
    assert capped["up"] == "CUDA_SUCCESS,32"
    assert capped["over"] == "CUDA_ERROR_OUT_OF_MEMORY,0"  # 300 MiB past a 64 MiB cap
    assert capped["huge"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
    assert capped["alloc_over"] == "CUDA_ERROR_OUT_OF_MEMORY"  # 32 + 40 > 64
    assert capped["down"] == "CUDA_SUCCESS,-32"
    assert capped["alloc"] == "CUDA_SUCCESS"
    assert capped["other_ctx"] == "CUDA_SUCCESS,16"
    assert capped["ctx_gone"] == str(CAP - 40)  # the other context's slots went with it
    assert proc.stderr == ""


def test_sync_depth_levels_are_placed_and_charged_below_compute_capability_9(
    sim_factory: Callable[..., Sim],
) -> None:
    """Below compute capability 9.0 each sync-depth level above the default 2 reserves parent-grid
    state (860 MiB a level): placed by the simulated driver, charged by the shim, refused past
    the cap or the card.  From 9.0 on the driver refuses the limit and nothing is placed."""
    sim = sim_factory(memory_mib=4096)
    sim.config.write_text(json.dumps({"gpus": sim.gpus, "memory_mib": sim.memory_mib, "cc_major": 8}))
    depth = "L.CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH"
    body = LIMITS + textwrap.dedent(f"""
        print("default=" + get({depth}))
        print("up=" + set_({depth}, 3))
        print("over=" + set_({depth}, 8))
        print("too_deep=" + set_({depth}, 25))
        print("alloc_over=%s" % d.cuMemAlloc(200 * M)[0].name)
        print("down=" + set_({depth}, 2))
        print("alloc=%s" % d.cuMemAlloc(200 * M)[0].name)
        """)
    bare, _ = run(sim.env(), body)
    assert bare["default"] == "CUDA_SUCCESS,2"
    assert bare["up"] == f"CUDA_SUCCESS,{LEVEL}"
    assert bare["over"] == "CUDA_ERROR_OUT_OF_MEMORY,0"  # 6 levels: 5160 MiB, a 4096 MiB card
    assert bare["too_deep"] == "CUDA_ERROR_INVALID_VALUE,0"
    assert bare["down"] == f"CUDA_SUCCESS,-{LEVEL}"
    tenant = sim.tenant("t", [1000], gpus=[0])
    capped, proc = run(sim.tenant_env(tenant), body)
    assert capped["up"] == f"CUDA_SUCCESS,{LEVEL}"
    assert capped["over"] == "CUDA_ERROR_OUT_OF_MEMORY,0"
    assert capped["alloc_over"] == "CUDA_ERROR_OUT_OF_MEMORY"  # 860 + 200 > 1000
    assert capped["down"] == f"CUDA_SUCCESS,-{LEVEL}"
    assert capped["alloc"] == "CUDA_SUCCESS"
    assert proc.stderr == ""

    hopper = sim_factory(memory_mib=4096)  # compute capability 9.0, the default
    tenant = hopper.tenant("t", [1000], gpus=[0])
    for env in (hopper.env(), hopper.tenant_env(tenant)):
        values, _ = run(env, body)
        assert values["default"] == "CUDA_ERROR_UNSUPPORTED_LIMIT,0"
        assert values["up"] == "CUDA_ERROR_UNSUPPORTED_LIMIT,0"
        assert values["alloc"] == "CUDA_SUCCESS"


# ---------------------------------------------------------------------------------------------
# context memory


def test_every_context_has_memory_of_its_own_on_the_simulated_gpu(sim_factory: Callable[..., Sim]) -> None:
    """A driver gives each context its own memory (local memory, heap, FIFO, its channels), so a
    second context of one process costs as much as the first; one that does not fit fails."""
    sim = sim_factory(memory_mib=800)
    sim.config.write_text(json.dumps({"gpus": 1, "memory_mib": 800, "context_overhead_mib": 300}))
    values, proc = run(
        sim.env(),
        """
        def used():
            f, t = d.cuMemGetInfo()[1:]
            return (t - f) >> 20
        print("primary=%d" % used())
        one = d.cuCtxCreate(None, 0, 0)[1]
        print("one=%d" % used())
        two = d.cuCtxCreate(None, 0, 0)
        print("two=%s,%d" % (two[0].name, used()))
        d.cuCtxDestroy(one)
        d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1])
        print("destroyed=%d" % used())
        """,
    )
    assert values["primary"] == "300"
    assert values["one"] == "600"
    assert values["two"] == "CUDA_ERROR_OUT_OF_MEMORY,600"  # a third 300 MiB: 600 + 300 > 800
    assert values["destroyed"] == "300"
    assert proc.stderr == ""


def test_a_context_s_own_memory_counts_against_the_cap_from_its_creation(
    sim_factory: Callable[..., Sim],
) -> None:
    """Each context takes device memory of its own (here 200 MiB, "context_overhead_mib").  A
    process that allocates its whole cap right after creating its context, before any
    reconciliation, must not hold more than the cap on the card."""
    sim = sim_factory(memory_mib=2048)
    sim.config.write_text(json.dumps({"gpus": 1, "memory_mib": 2048, "context_overhead_mib": 200}))
    tenant = sim.tenant("t", [512], gpus=[0])
    bare = sim.env()
    values, proc = run(
        sim.tenant_env(tenant),
        f"""
        import subprocess, sys
        print("allocs=%s" % ",".join(d.cuMemAlloc(128 * M)[0].name for _ in range(4)))
        # the card as a process without the shim sees it, less that process's own context
        probe = "from cuda.bindings import driver as d; d.cuInit(0); "
        probe += "d.cuCtxSetCurrent(d.cuDevicePrimaryCtxRetain(0)[1]); "
        probe += "f, t = d.cuMemGetInfo()[1:]; print((t - f) >> 20)"
        out = subprocess.run([sys.executable, "-c", probe], env={bare!r}, capture_output=True, text=True)
        print("card_used=%d" % (int(out.stdout) - 200))
        """,
    )
    assert proc.stderr == ""
    # the tenant's context (200) and allocations on the card stay within its 512 MiB
    assert int(values["card_used"]) <= 512, values
    assert values["allocs"] == "CUDA_SUCCESS,CUDA_SUCCESS,CUDA_ERROR_OUT_OF_MEMORY,CUDA_ERROR_OUT_OF_MEMORY"


def test_a_context_s_memory_is_refused_past_the_cap_and_given_back_when_it_ends(
    sim_factory: Callable[..., Sim],
) -> None:
    """Created and primary contexts alike (200 MiB each under a 512 MiB cap): one that does
    not fit is refused (and not left on the card); cuCtxDestroy, the primary context's reset and
    the process's exit give the memory back; a release that leaves references does not."""
    sim = sim_factory(memory_mib=2048)
    sim.config.write_text(json.dumps({"gpus": 1, "memory_mib": 2048, "context_overhead_mib": 200}))
    tenant = sim.tenant("t", [512], gpus=[0])
    values, proc = run(
        sim.tenant_env(tenant),
        """
        print("primary=%d" % free())
        err, c1 = d.cuCtxCreate(None, 0, 0)
        print("create=%s,%d" % (err.name, free_bytes() // M))
        err, c2 = d.cuCtxCreate(None, 0, 0)
        print("over=%s,%d" % (err.name, free_bytes() // M))
        print("destroy=%s,%d" % (d.cuCtxDestroy(c1)[0].name, free()))
        print("release=%s,%d" % (d.cuDevicePrimaryCtxRelease(0)[0].name, free()))
        d.cuDevicePrimaryCtxReset(0)
        err, c3 = d.cuCtxCreate(None, 0, 0)
        print("reset=%s,%d" % (err.name, free_bytes() // M))
        """,
    )
    assert proc.stderr == ""
    assert values["primary"] == "312"  # 512 - the primary context's 200
    assert values["create"] == "CUDA_SUCCESS,112"
    assert values["over"] == "CUDA_ERROR_OUT_OF_MEMORY,112"  # 600 > 512: refused, c1 current again
    assert values["destroy"] == "CUDA_SUCCESS,312"
    assert values["release"] == "CUDA_SUCCESS,312"  # references remain: the context stays
    assert values["reset"] == "CUDA_SUCCESS,312"  # only c3 now
    # the refused context left nothing on the card, and the exit gave every estimate back
    values, _ = run(sim.tenant_env(tenant), 'print("next=%d" % free())')
    assert values["next"] == "312"


def test_a_killed_process_s_context_memory_comes_back_without_an_agent(
    sim_factory: Callable[..., Sim],
) -> None:
    """A process killed with SIGKILL runs no exit handler: the next process that needs the room
    releases its slot, and takes its context's memory off the tenant's overhead as well as its
    allocations (ABI 1.9: the slot records it). Without an agent nothing else would: on an H200
    each killed process left its 518 MiB context charged to the tenant for good."""
    sim = sim_factory(memory_mib=2048)
    sim.config.write_text(json.dumps({"gpus": 1, "memory_mib": 2048, "context_overhead_mib": 200}))
    tenant = sim.tenant("t", [512], gpus=[0])
    env = sim.tenant_env(tenant)
    probe = str(native.probe_path())
    for _ in range(3):  # 200 + 256 fit the 512 only if each killed one's 200 + 256 came back
        killed = subprocess.run(
            [probe, "killself", "plain", "256M"], env=env, capture_output=True, timeout=60, check=False
        )
        assert killed.returncode == -9, killed.stdout
    got = parse_kv(
        subprocess.run(
            [probe, "alloc", "plain", "256M"], env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout
    )[0]
    assert got["alloc"] == "OK"


def test_a_context_detached_to_its_end_gives_its_memory_back(sim_factory: Callable[..., Sim]) -> None:
    """cuCtxAttach and cuCtxDetach (deprecated; pycuda detaches at exit): the detach that drops
    a created context's usage count to zero destroys it, so its allocations and its own memory
    leave the cap then (they stayed charged until the process exited); one that leaves a use
    does not."""
    sim = sim_factory(memory_mib=2048)
    sim.config.write_text(json.dumps({"gpus": 1, "memory_mib": 2048, "context_overhead_mib": 100}))
    tenant = sim.tenant("t", [512], gpus=[0])
    values, proc = run(
        sim.tenant_env(tenant),
        """
        import ctypes
        cu = ctypes.CDLL("libcuda.so.1")
        err, c1 = d.cuCtxCreate(None, 0, 0)
        err, p = d.cuMemAlloc(200 * M)
        print("alloc=%s,%d" % (err.name, free()))
        current = ctypes.c_void_p()
        print("attach=%d" % cu.cuCtxAttach(ctypes.byref(current), 0))
        print("same=%d" % (current.value == int(c1)))
        print("detach=%d,%d" % (cu.cuCtxDetach(ctypes.c_void_p(int(c1))), free()))
        print("last=%d,%d" % (cu.cuCtxDetach(ctypes.c_void_p(int(c1))), free()))
        print("again=%s" % d.cuMemAlloc(300 * M)[0].name)
        """,
    )
    assert proc.stderr == ""
    assert values["alloc"] == "CUDA_SUCCESS,112"  # 512 - the primary's 100 - c1's 100 - 200
    assert values["attach"] == "0"
    assert values["same"] == "1"
    assert values["detach"] == "0,112"  # one use left: the context and its memory stay
    assert values["last"] == "0,412"  # destroyed: its 200 MiB and its own 100 MiB are back
    assert values["again"] == "CUDA_SUCCESS"
