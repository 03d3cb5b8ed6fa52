"""A fake NVIDIA driver install under a temporary directory, for the CDI spec of a real driver
(sharegpu.runtime.cdi.nvidia): character devices, a fake `ldconfig -p` naming fake library files,
nvidia-smi and the firmware. Used by tests/unit and tests/integration test_cdi_nvidia.py."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sharegpu.runtime.cdi import nvidia

VERSION = "580.65.06"
UUIDS = ("GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000")
NVIDIA_MAJOR = 195


def char_device(path: Path, minor: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))


def library(directory: Path, soname: str, real: str | None = None) -> Path:
    """A library file; with `real`, the file is `real` and `soname` a link to it, as the driver
    installs them."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / (real or soname)).write_bytes(b"\x7fELF fake")
    if real:
        (directory / soname).symlink_to(real)
    return directory / soname


def cache_line(soname: str, path: Path, flags: str = "libc6,x86-64") -> str:
    return f"\t{soname} ({flags}) => {path}"


@dataclass
class FakeNode:
    root: Path  # the host root: dev/, lib/firmware/
    libdir: Path
    bindir: Path
    cache: list[str]

    def host(self) -> nvidia.Host:
        text = "\n".join([f"{len(self.cache)} libs found in cache `/etc/ld.so.cache'", *self.cache])
        return nvidia.Host(root=self.root, linker_cache=text, path=str(self.bindir), driver_version=VERSION)


def fake_node(tmp_path: Path) -> FakeNode:
    """A driver install: the control nodes, GPUs of minor 3 and 7, the driver's libraries (and
    some that are not the driver's, and 32-bit ones), nvidia-smi and the firmware."""
    root = tmp_path / "host"
    for minor, name in enumerate(("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")):
        char_device(root / "dev" / name, 250 + minor)
    char_device(root / "dev/nvidia3", 3)
    char_device(root / "dev/nvidia7", 7)
    (root / "lib/firmware/nvidia" / VERSION).mkdir(parents=True)
    libdir = root / "usr/lib/x86_64-linux-gnu"
    i386 = root / "usr/lib/i386-linux-gnu"
    cache = [
        # 32-bit first: the x86-64 entry must still be chosen
        cache_line("libcuda.so.1", library(i386, "libcuda.so.1", f"libcuda.so.{VERSION}"), "libc6"),
        cache_line("libcuda.so.1", library(libdir, "libcuda.so.1", f"libcuda.so.{VERSION}")),
        cache_line("libcuda.so", library(libdir, "libcuda.so", "libcuda.so.dev")),  # the link for linking
        cache_line("libnvidia-ml.so.1", library(libdir, "libnvidia-ml.so.1", f"libnvidia-ml.so.{VERSION}")),
        cache_line(
            "libnvidia-nvvm.so.4", library(libdir, "libnvidia-nvvm.so.4", f"libnvidia-nvvm.so.{VERSION}")
        ),
        # a soname that is the version itself, on a plain file; flags with more than the arch
        cache_line(
            f"libnvidia-gpucomp.so.{VERSION}",
            library(libdir, f"libnvidia-gpucomp.so.{VERSION}"),
            "libc6,x86-64, OS ABI: Linux 3.2.0",
        ),
        cache_line("libcudart.so.12", library(libdir, "libcudart.so.12")),  # CUDA's, not the driver's
        cache_line("libnvidia-egl-wayland.so.1", library(libdir, "libnvidia-egl-wayland.so.1")),
        cache_line("libnvidia-cfg.so.1", libdir / "libnvidia-cfg.so.1"),  # a stale entry: no file
    ]
    bindir = tmp_path / "bin"
    real_smi = tmp_path / "opt/nvidia/nvidia-smi"
    real_smi.parent.mkdir(parents=True)
    real_smi.write_text("#!/bin/sh\n")
    real_smi.chmod(0o755)
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(real_smi)
    (bindir / "nvidia-debugdump").write_text("not executable")
    return FakeNode(root, libdir, bindir, cache)
