"""The Python mirror (abi.py) and the C header (abi.h) describe the same bytes."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from sharegpu.regions import abi

INCLUDE = Path(__file__).resolve().parents[2] / "native" / "include"


def _c_layout(tmp_path: Path) -> dict[str, int]:
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        '#include "sharegpu/abi.h"',
        "int main(void) {",
    ]
    for cname, struct in abi.STRUCTS.items():
        lines.append(f'  printf("{cname}.sizeof %zu\\n", sizeof(struct {cname}));')
        for fname, *_ in struct._fields_:
            lines.append(f'  printf("{cname}.{fname} %zu\\n", offsetof(struct {cname}, {fname}));')
    for name in (
        "SG_ABI_MAJOR",
        "SG_ABI_MINOR",
        "SG_MAGIC_LIMITS",
        "SG_MAGIC_USAGE",
        "SG_MAGIC_ARBITER",
        "SG_MAX_DEVICES",
        "SG_MAX_PROCS",
        "SG_SLOT_CTX_ENTRIES",
        "SG_TENANT_ID_LEN",
        "SG_ARB_MAX_TENANTS",
        "SG_ARB_MAX_CLIENTS",
        "SG_ARB_DEFAULT_QUANTUM_NS",
        "SG_ARB_MIN_QUANTUM_NS",
        "SG_ARB_MAX_QUANTUM_NS",
        "SG_ARB_DEFAULT_OFFLINE_INFLIGHT",
        "SG_ARB_DEFAULT_ONLINE_WINDOW_NS",
        "SG_ARB_PREEMPT_DRAIN",
        "SG_ARB_PREEMPT_EARLY",
        "SG_ARB_PREEMPT_BY_KERNEL",
        "SG_ARB_DEFAULT_ONLINE_PREEMPT",
        "SG_ARB_DEFAULT_PREEMPT_MIN_KERNEL_NS",
        "SG_ARB_DEFAULT_OFFLINE_QUIET_NS",
        "SG_ARB_HANDOFF_DRAIN",
        "SG_ARB_HANDOFF_QUEUED",
        "SG_ARB_DEFAULT_HANDOFF",
        "SG_ARB_FILE_SIZE",
        "SG_ARB_HANDOFFS_OFFSET",
        "SG_ARB_HO_WAITS",
        "SG_ARB_HO_LENDS",
        "SG_ARB_HO_SEVERAL",
        "SG_ARB_YIELD_CLASS",
        "SG_ARB_YIELD_TURN",
        "SG_ARB_YIELD_LOAN",
        "SG_ARB_HOLDING",
        "SG_POLICY_SHARE",
        "SG_POLICY_CAP",
        "SG_POLICY_BURST",
        "SG_POLICY_NATIVE",
        "SG_PRIORITY_OFFLINE",
        "SG_PRIORITY_NORMAL",
        "SG_PRIORITY_ONLINE",
    ):
        lines.append(f'  printf("{name} %lu\\n", (unsigned long){name});')
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    subprocess.run(
        ["gcc", "-std=c11", "-Wall", "-Werror", f"-I{INCLUDE}", str(src), "-o", str(exe)],
        check=True,
    )
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_every_offset_and_size_agrees(tmp_path: Path) -> None:
    c = _c_layout(tmp_path)
    for cname, struct in abi.STRUCTS.items():
        assert c[f"{cname}.sizeof"] == ctypes.sizeof(struct), cname
        for fname, *_ in struct._fields_:
            assert c[f"{cname}.{fname}"] == getattr(struct, fname).offset, f"{cname}.{fname}"


def test_constants_agree(tmp_path: Path) -> None:
    c = _c_layout(tmp_path)
    assert (c["SG_ABI_MAJOR"], c["SG_ABI_MINOR"]) == (abi.ABI_MAJOR, abi.ABI_MINOR)
    assert c["SG_MAGIC_LIMITS"] == abi.MAGIC_LIMITS
    assert c["SG_MAGIC_USAGE"] == abi.MAGIC_USAGE
    assert c["SG_MAGIC_ARBITER"] == abi.MAGIC_ARBITER
    assert c["SG_MAX_DEVICES"] == abi.MAX_DEVICES
    assert c["SG_MAX_PROCS"] == abi.MAX_PROCS
    assert c["SG_SLOT_CTX_ENTRIES"] == abi.SLOT_CTX_ENTRIES
    assert c["SG_TENANT_ID_LEN"] == abi.TENANT_ID_LEN
    assert c["SG_ARB_MAX_TENANTS"] == abi.ARB_MAX_TENANTS
    assert c["SG_ARB_MAX_CLIENTS"] == abi.ARB_MAX_CLIENTS
    assert c["SG_ARB_DEFAULT_QUANTUM_NS"] == abi.ARB_DEFAULT_QUANTUM_NS
    assert c["SG_ARB_MIN_QUANTUM_NS"] == abi.ARB_MIN_QUANTUM_NS
    assert c["SG_ARB_MAX_QUANTUM_NS"] == abi.ARB_MAX_QUANTUM_NS
    assert c["SG_ARB_DEFAULT_OFFLINE_INFLIGHT"] == abi.ARB_DEFAULT_OFFLINE_INFLIGHT
    assert c["SG_ARB_DEFAULT_ONLINE_WINDOW_NS"] == abi.ARB_DEFAULT_ONLINE_WINDOW_NS
    assert c["SG_ARB_HOLDING"] == abi.ARB_HOLDING
    assert [c["SG_ARB_PREEMPT_DRAIN"], c["SG_ARB_PREEMPT_EARLY"], c["SG_ARB_PREEMPT_BY_KERNEL"]] == [
        abi.ARB_PREEMPT_DRAIN,
        abi.ARB_PREEMPT_EARLY,
        abi.ARB_PREEMPT_BY_KERNEL,
    ]
    assert c["SG_ARB_DEFAULT_ONLINE_PREEMPT"] == abi.ARB_DEFAULT_ONLINE_PREEMPT
    assert c["SG_ARB_DEFAULT_PREEMPT_MIN_KERNEL_NS"] == abi.ARB_DEFAULT_PREEMPT_MIN_KERNEL_NS
    assert c["SG_ARB_DEFAULT_OFFLINE_QUIET_NS"] == abi.ARB_DEFAULT_OFFLINE_QUIET_NS
    assert c["SG_ARB_HANDOFF_DRAIN"] == abi.ARB_HANDOFF_DRAIN
    assert c["SG_ARB_HANDOFF_QUEUED"] == abi.ARB_HANDOFF_QUEUED
    assert c["SG_ARB_DEFAULT_HANDOFF"] == abi.ARB_DEFAULT_HANDOFF
    assert c["SG_ARB_FILE_SIZE"] == abi.ARB_FILE_SIZE
    assert c["SG_ARB_HANDOFFS_OFFSET"] == abi.ARB_HANDOFFS_OFFSET
    assert [c["SG_ARB_HO_WAITS"], c["SG_ARB_HO_LENDS"], c["SG_ARB_HO_SEVERAL"]] == [
        abi.ARB_HO_WAITS,
        abi.ARB_HO_LENDS,
        abi.ARB_HO_SEVERAL,
    ]
    assert [c["SG_ARB_YIELD_CLASS"], c["SG_ARB_YIELD_TURN"], c["SG_ARB_YIELD_LOAN"]] == [
        abi.ARB_YIELD_CLASS,
        abi.ARB_YIELD_TURN,
        abi.ARB_YIELD_LOAN,
    ]
    assert [
        c["SG_POLICY_SHARE"],
        c["SG_POLICY_CAP"],
        c["SG_POLICY_BURST"],
        c["SG_POLICY_NATIVE"],
    ] == [abi.POLICY_SHARE, abi.POLICY_CAP, abi.POLICY_BURST, abi.POLICY_NATIVE]
    assert [c["SG_PRIORITY_OFFLINE"], c["SG_PRIORITY_NORMAL"], c["SG_PRIORITY_ONLINE"]] == [
        abi.PRIORITY_OFFLINE,
        abi.PRIORITY_NORMAL,
        abi.PRIORITY_ONLINE,
    ]
