#!/usr/bin/env python3
"""Generates the simulated driver's API surface from CUDA's own headers.

    python native/simgpu/tools/gen_api.py [--include DIR] [--check]

Reads `cuda.h`, `cudaProfiler.h` and their `*Typedefs.h` (CUDA 13.0; DIR defaults to
$CUDA_HOME/include, /usr/local/cuda/include, then the wheels' headers in .venv-clients) and
writes, next to this folder:

  cuda/api_table.inc   SIMGPU_SYM(symbol) for every exported entry point, then
                       SIMGPU_ROW(name, version, symbol, per_thread) for every
                       `PFN_<name>_v<version>[_ptds|_ptsz]` of cudaTypedefs.h: the
                       cuGetProcAddress table (per_thread 1: a row for per-thread callers only)
  cuda.map             the version script exporting exactly those symbols

The build needs neither header: the outputs are checked in, and `--check` (used by the tests)
fails when they differ from what the headers give.

Exported symbols are the functions cuda.h and cudaProfiler.h declare when the driver itself
includes them (`__CUDA_API_VERSION_INTERNAL`: old ABI versions and `_ptds`/`_ptsz` variants included; the
header's static inline helpers excluded).  A name's typedef versions, oldest first, belong to
its exported variants `name`, `name_v2`, `name_v3`, ... in that order; a `_ptds`/`_ptsz`
typedef of version V names the per-thread variant of the symbol in force at V.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SIMGPU = Path(__file__).resolve().parent.parent
TABLE = SIMGPU / "cuda" / "api_table.inc"
MAP = SIMGPU / "cuda.map"


@dataclass(frozen=True)
class Row:
    name: str  # what a caller passes to cuGetProcAddress
    version: int  # the first CUDA version this row answers
    symbol: str
    per_thread: bool  # a _ptds/_ptsz row: answers only CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM


def default_include() -> Path:
    """$CUDA_HOME/include, /usr/local/cuda/include, or the headers of the CUDA 13.0 wheels that
    `make clients` installs into .venv-clients (nvidia-cuda-nvcc, -crt, -profiler-api)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(home) / "include"] if home else []
    candidates.append(Path("/usr/local/cuda/include"))
    candidates += sorted(
        (SIMGPU.parent.parent / ".venv-clients").glob("lib/python3*/site-packages/nvidia/cu13/include")
    )
    for d in candidates:
        if (d / "cudaTypedefs.h").is_file() and (d / "cudaProfilerTypedefs.h").is_file():
            return d
    raise SystemExit(
        "gen_api: cuda.h/cudaTypedefs.h not found: pass --include DIR, set CUDA_HOME or run make clients"
    )


def _preprocess(include: Path, *headers: str) -> str:
    source = "".join(f"#include <{h}>\n" for h in headers)
    out = subprocess.run(
        ["gcc", "-E", "-P", "-D__CUDA_API_VERSION_INTERNAL", "-I", str(include), "-x", "c", "-"],
        input=source,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return re.sub(r"\s+", " ", out)


def _abi_rank(base: str, symbol: str) -> int:
    m = re.fullmatch(re.escape(base) + r"_v(\d+)", symbol)
    return int(m.group(1)) if m else 1


def parse(include: Path) -> tuple[list[str], list[Row]]:
    decls = _preprocess(include, "cuda.h", "cudaProfiler.h")
    symbols = sorted(
        m.group(2) for m in re.finditer(r"(static inline )?CUresult (cu\w+) ?\(", decls) if not m.group(1)
    )
    exported = set(symbols)
    typedefs = _preprocess(include, "cudaTypedefs.h", "cudaProfilerTypedefs.h")
    plain: dict[str, list[int]] = {}
    threaded: dict[tuple[str, int], str] = {}
    for name, version, suffix in re.findall(r"\*\s*PFN_(cu\w+?)_v(\d+)(_ptds|_ptsz)?\s*\)", typedefs):
        if suffix:
            threaded[(name, int(version))] = suffix
        else:
            plain.setdefault(name, []).append(int(version))
    rows: list[Row] = []
    for name, versions in sorted(plain.items()):
        variants = sorted(
            (s for s in exported if re.fullmatch(re.escape(name) + r"(_v\d+)?", s)),
            key=lambda s: _abi_rank(name, s),
        )
        versions.sort()
        if len(variants) != len(versions):
            raise SystemExit(f"gen_api: {name}: typedef versions {versions} but exported variants {variants}")
        rows += [Row(name, v, s, per_thread=False) for v, s in zip(versions, variants, strict=True)]
    for (name, version), suffix in sorted(threaded.items()):
        older = [r for r in rows if r.name == name and not r.per_thread and r.version <= version]
        if not older:
            raise SystemExit(f"gen_api: {name} v{version}{suffix} has no plain variant before it")
        symbol = max(older, key=lambda r: r.version).symbol + suffix
        if symbol not in exported:
            raise SystemExit(f"gen_api: {name} v{version}: {symbol} is not declared in cuda.h")
        rows.append(Row(name, version, symbol, per_thread=True))
    rows.sort(key=lambda r: (r.name, r.version, r.per_thread))
    named = {r.symbol for r in rows}
    if named != exported:
        raise SystemExit(f"gen_api: declared but in no typedef: {sorted(exported - named)}")
    return symbols, rows


def render_table(symbols: list[str], rows: list[Row]) -> str:
    lines = [
        "/* Generated by native/simgpu/tools/gen_api.py from CUDA 13.0's cuda.h, cudaProfiler.h and",
        " * their typedef headers: do not edit.  SIMGPU_SYM: every exported entry point; SIMGPU_ROW:",
        " * the cuGetProcAddress table (request name, first CUDA version, symbol, 1 for a",
        " * per-thread-default-stream row). */",
    ]
    lines += [f"SIMGPU_SYM({s})" for s in symbols]
    lines += [f'SIMGPU_ROW("{r.name}", {r.version}, {r.symbol}, {int(r.per_thread)})' for r in rows]
    return "\n".join(lines) + "\n"


def render_map(symbols: list[str]) -> str:
    body = "".join(f"    {s};\n" for s in symbols)
    return (
        "/* Generated by native/simgpu/tools/gen_api.py: every entry point of CUDA 13.0's cuda.h and\n"
        "   cudaProfiler.h. */\n"
        "{\n  global:\n" + body + "  local:\n    *;\n};\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--include", type=Path, default=None, help="folder with cuda.h and cudaTypedefs.h")
    ap.add_argument("--check", action="store_true", help="fail if the checked-in files are out of date")
    args = ap.parse_args(argv)
    symbols, rows = parse(args.include or default_include())
    outputs = {TABLE: render_table(symbols, rows), MAP: render_map(symbols)}
    stale = [p for p, text in outputs.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(
                f"gen_api: {p} is out of date: run python {Path(__file__).relative_to(SIMGPU.parent.parent)}",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for p in stale:
        p.write_text(outputs[p])
    print(f"gen_api: {len(symbols)} entry points, {len(rows)} cuGetProcAddress rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
