#!/usr/bin/env python3
"""Build the tracer: python3 build.py LIBCUDA OUTDIR [EXTRA_NAMES_FILE].

OUTDIR/cutrace.so traces what a client gets through dlsym and cuGetProcAddress (cuda-bindings,
so cuda-core and numba-cuda; ctypes), with or without sharegpu's shim (LD_PRELOAD
"cutrace.so libsharegpu.so": the tracer first).

OUTDIR/cutrace-linked.so also exports a stub for every cu* function LIBCUDA exports, so that a
client linked against libcuda (pycuda) binds to it; EXTRA_NAMES_FILE (one name a line, e.g.
`nm -D -u _driver.so`) adds names LIBCUDA lacks, which then resolve to cufill's stand-ins (or
CUDA_ERROR_NOT_FOUND), so such a client loads at all. Use it without the shim only: libcuda taking
its own functions' addresses binds to those exports, and the shim's "real" pointers would then
loop back through them.

OUTDIR/cufill.so: the stand-ins of cufill.c (CUTRACE_FILL), to follow a scenario past a missing
entry point.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def build(here: str, outdir: str, variant: str, names: list[str]) -> str:
    inc_dir = os.path.join(outdir, variant + ".inc.d")
    os.makedirs(inc_dir, exist_ok=True)
    with open(os.path.join(inc_dir, "names.inc"), "w") as f:
        f.write("static const char *const cutrace_named[] = {\n")
        f.write('    "",\n')  # slot 0: never named, so the array is never empty
        f.writelines(f'    "{n}",\n' for n in names)
        f.write("};\n")
        f.write(f"static const int cutrace_nnamed = {len(names) + 1};\n")
        if names:
            f.write("__asm__(\n")
            for i, n in enumerate(names, start=1):
                f.write(f'    ".globl {n}\\n.type {n},@function\\n.set {n}, cutrace_stubs+{16 * i}\\n"\n')
            f.write(");\n")
    out = os.path.join(outdir, variant + ".so")
    cmd = [
        "gcc",
        "-O2",
        "-shared",
        "-fPIC",
        "-Wall",
        "-I",
        inc_dir,
        "-o",
        out,
        os.path.join(here, "cutrace.c"),
        "-ldl",
        "-lpthread",
    ]
    subprocess.run(cmd, check=True)
    return out


def main() -> int:
    lib, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", lib], check=True, capture_output=True, text=True
    ).stdout
    linked = {m.group(1) for m in re.finditer(r"^\S+ [TW] (cu\w+)$", nm, re.M)}
    if len(sys.argv) > 3:
        linked |= {w for w in Path(sys.argv[3]).read_text().split() if re.fullmatch(r"cu\w+", w)}
    linked = sorted(linked)
    print(build(here, outdir, "cutrace", []))
    print(build(here, outdir, "cutrace-linked", linked))
    cuda_inc = os.environ.get("CUDA_INC_DIR", "/usr/local/cuda/include")
    fill = os.path.join(outdir, "cufill.so")
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-shared",
            "-fPIC",
            "-Wall",
            "-I",
            cuda_inc,
            "-o",
            fill,
            os.path.join(here, "cufill.c"),
            "-ldl",
        ],
        check=True,
    )
    print(fill)
    return 0


if __name__ == "__main__":
    sys.exit(main())
