"""The package as a user installs it: public names, the console script, a wheel with the C parts."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import sharegpu
from sharegpu import errors

REPO = Path(__file__).resolve().parent.parent


def test_public_names() -> None:
    assert sharegpu.__all__ == ["__version__"]
    assert sorted(errors.__all__) == [
        "AdmissionError",
        "AgentError",
        "CommandNotFound",
        "ConfigError",
        "DeviceError",
        "SharegpuError",
        "SpecError",
        "TenantBusy",
        "TenantError",
        "TenantExists",
        "TenantNotFound",
        "UnknownGpu",
    ]
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.SharegpuError)


def test_help_lists_the_commands() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in (
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
    ):
        assert command in out


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
        "sharegpu/cli.py",
    ):
        assert member in names, member
