#!/usr/bin/env python3
"""Summarise a cutrace log: python3 report.py LOG [--cuda-h /usr/local/cuda/include/cuda.h].

Prints, in first-call order, each entry point called (top level, depth 0; stand-ins of
CUTRACE_FILL marked MISSING), with the enum argument decoded where it matters (device, pool,
function attributes, limits, pointer attributes), the out-value, counts and result codes; then the
lookups the client made that the driver answered NOT_FOUND.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

# function -> (argument index, enum type) to decode
ENUM_ARGS = {
    "cuDeviceGetAttribute": (1, "CUdevice_attribute"),
    "cuMemPoolSetAttribute": (1, "CUmemPool_attribute"),
    "cuMemPoolGetAttribute": (1, "CUmemPool_attribute"),
    "cuFuncGetAttribute": (1, "CUfunction_attribute"),
    "cuFuncSetAttribute": (1, "CUfunction_attribute"),
    "cuKernelGetAttribute": (1, "CUfunction_attribute"),
    "cuKernelSetAttribute": (0, "CUfunction_attribute"),
    "cuCtxSetLimit": (0, "CUlimit"),
    "cuCtxGetLimit": (1, "CUlimit"),
    "cuPointerGetAttribute": (1, "CUpointer_attribute"),
}


def enums(path: str) -> dict[str, dict[int, str]]:
    text = Path(path).read_text()
    out: dict[str, dict[int, str]] = {}
    for m in re.finditer(r"typedef enum (\w+)\s*\{(.*?)\}\s*(\w+);", text, re.S):
        body = re.sub(r"/\*.*?\*/", "", m.group(2), flags=re.S)
        vals: dict[int, str] = {}
        nxt = 0
        for item in body.split(","):
            em = re.match(r"\s*(\w+)\s*(?:=\s*(0x[0-9a-fA-F]+|-?\d+|\w+))?\s*$", item)
            if not em:
                continue
            if em.group(2):
                try:
                    nxt = int(em.group(2), 0)
                except ValueError:
                    nxt = next((k for k, v in vals.items() if v == em.group(2)), nxt)
            vals.setdefault(nxt, em.group(1))
            nxt += 1
        out[m.group(3)] = vals
        out[m.group(1)] = vals
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--cuda-h", default="/usr/local/cuda/include/cuda.h")
    ap.add_argument("--lookups", action="store_true", help="also list the lookups answered NOT_FOUND")
    ap.add_argument(
        "--all-depths", action="store_true", help="also calls made inside the driver or a stand-in"
    )
    a = ap.parse_args()
    en = enums(a.cuda_h)
    errs = en.get("CUresult", {})
    calls: collections.OrderedDict[tuple, dict] = collections.OrderedDict()
    notfound: list[str] = []
    for line in Path(a.log).read_text().splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "R":
            name, rc = f[2], int(f[5])
            if rc != 0 and "fill" not in f[6:]:
                notfound.append(f"{name}@{f[3]}")
            continue
        if f[0] != "C":
            continue
        depth, name, rc = int(f[2]), f[3], int(f[4])
        if depth and not a.all_depths:
            continue
        args = [int(x, 16) for x in f[5:9]]
        rest = f[9:]
        fill = "fill" in rest
        out = next((x[4:] for x in rest if x.startswith("out=")), "")
        detail = ""
        if name in ENUM_ARGS:
            i, ty = ENUM_ARGS[name]
            v = args[i]
            detail = en.get(ty, {}).get(v, str(v))
        key = (name, detail, fill)
        e = calls.setdefault(key, {"n": 0, "rc": collections.Counter(), "out": collections.Counter()})
        e["n"] += 1
        e["rc"][errs.get(rc, str(rc))] += 1
        if out:
            e["out"][out] += 1
    for (name, detail, fill), e in calls.items():
        rcs = ",".join(f"{k}x{v}" if v > 1 else k for k, v in e["rc"].items())
        outs = ";".join(list(e["out"])[:3])
        print(
            f"{'MISSING ' if fill else '        '}{name}{'(' + detail + ')' if detail else ''}"
            f"  n={e['n']}  -> {rcs}{'  out=' + outs if outs else ''}"
        )
    if notfound and a.lookups:
        print(f"\nlookups answered NOT_FOUND (resolved, not necessarily called): {len(notfound)}")
        print(" ".join(sorted(set(notfound))))


if __name__ == "__main__":
    main()
