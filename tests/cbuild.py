"""Compiling the C helpers the shim tests run (native/shim/tests/*.c) with the project's warnings."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import REPO

SHIM_DIR = REPO / "native" / "shim"
INCLUDE = REPO / "native" / "include"


def gcc(tmp_path: Path, out: str, *args: str) -> Path:
    """tmp_path/out built from args (sources, flags) at -O2 with -Wall -Wextra -Werror."""
    target = tmp_path / out
    cmd = [
        "gcc",
        "-std=c11",
        "-D_GNU_SOURCE",
        f"-I{INCLUDE}",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-O2",
        "-o",
        str(target),
        *args,
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return target
