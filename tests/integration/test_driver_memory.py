"""Device memory the driver places for a program without an allocation call, under the cap.

- Graph memory nodes: what a graph's allocation nodes take from the device's graph memory pool is
  charged when the graph runs (launch or upload), kept while the pool keeps it, and given back at
  cuDeviceGraphMemTrim; a launch that would grow the pool past the cap is refused.
- Module globals: a module's `__device__`/`__constant__` variables are charged when it is loaded
  (PTX or ELF cubin), refused past the cap, given back at unload or with the context.

Real processes through cuda-python (a real driver-API client) on the simulated GPU, whose
driver keeps graph memory and module variables as a real one does (native/simgpu/cuda/graph_mem.c,
module.c).
"""

from __future__ import annotations

import json
import struct
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from cbuild import SHIM_DIR, gcc
from conftest import Sim, parse_kv, python
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
