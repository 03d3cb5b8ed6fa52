"""The package as a user installs it: public names, the console script, a wheel with the C parts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_help_lists_the_commands() -> None:
    """The Commands panel names exactly the CLI's commands, each as its own row (a substring
    test would pass for `run` on the word `runtime` anywhere in the text)."""
    from sharegpu.cli import app

    out = subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "100", "NO_COLOR": "1"},
    ).stdout
    panel = out[out.index("Commands") :]
    rows = {m.group(1) for m in re.finditer(r"^\W\s([a-z][a-z-]*)\s{2,}\S", panel, flags=re.M)}
    registered = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    registered |= {g.name or "" for g in app.registered_groups}
    assert rows == registered
    assert {
        "run",
        "devices",
        "tenants",
        "resize",
        "events",
        "agent",
        "upgrade",
        "simgpu",
        "demo",
        "simulate",
    } <= rows


@pytest.mark.slow
def test_wheel_carries_the_native_libraries(tmp_path: Path) -> None:
    """`pip install .` on a fresh machine: the build compiles the C parts into the package."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(REPO)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("sharegpu-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for member in (
        "sharegpu/_lib/libsharegpu.so",
        "sharegpu/_lib/simgpu/libcuda.so.1",
        "sharegpu/_lib/simgpu/libnvidia-ml.so.1",
        "sharegpu/_lib/sgprobe",
        "sharegpu/cli/__init__.py",
    ):
        assert member in names, member
