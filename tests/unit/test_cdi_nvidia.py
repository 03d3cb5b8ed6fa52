"""The CDI spec on a real NVIDIA driver, without one: a fake /dev of character devices and a fake
`ldconfig -p` naming fake library files, all under tmp_path (sharegpu.runtime.cdi.nvidia).

The parts that need no process; the rest is tests/integration/test_cdi_nvidia.py, and the
simulated GPU's spec tests/integration/test_cdi.py.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from sharegpu.errors import DeviceError
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


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
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


def test_missing_required_pieces_are_named_all_at_once(node: FakeNode) -> None:
    (node.root / "dev/nvidiactl").unlink()
    (node.root / "dev/nvidiactl").write_text("")  # a plain file is not the device
    (node.root / "dev/nvidia7").unlink()
    (node.root / "dev/nvidia-uvm").unlink()  # optional: not named
    node.cache = [line for line in node.cache if "libnvidia-ml" not in line]
    node.cache = [line for line in node.cache if "libcuda.so.1" not in line or "x86-64" not in line]
    refs = [(0, UUIDS[0], None), (1, UUIDS[1], 7), (2, "GPU-x", 3)]
    with pytest.raises(DeviceError) as err:
        nvidia.discover(refs, node.host())
    text = str(err.value)
    assert text.startswith("cannot describe this node's NVIDIA driver for containers: missing ")
    for part in (
        f"{node.root}/dev/nvidiactl (a character device)",
        f"the minor number of GPU 0 ({UUIDS[0]}): NVML gives none",
        f"{node.root}/dev/nvidia7 of GPU 1",
        "libcuda.so.1 (not in the dynamic linker cache)",  # only its i386 entry is left
        "libnvidia-ml.so.1 (not in the dynamic linker cache)",
    ):
        assert part in text, (part, text)
    assert "nvidia-uvm" not in text
    assert "GPU 2" not in text  # its node is there


def test_a_stale_cache_entry_of_a_required_library_is_missing(node: FakeNode) -> None:
    (node.libdir / f"libnvidia-ml.so.{VERSION}").unlink()  # the link dangles
    with pytest.raises(
        DeviceError, match=r"missing libnvidia-ml\.so\.1 \(not in the dynamic linker cache\)$"
    ):
        nvidia.discover([], node.host())


def test_the_cache_is_read_for_driver_libraries_of_x86_64_only() -> None:
    text = "\n".join(
        [
            "6 libs found in cache `/etc/ld.so.cache'",
            "\tlibnvidia-ml.so.1 (libc6) => /i386/libnvidia-ml.so.1",
            "\tlibnvidia-ml.so.1 (libc6,x86-64) => /first/libnvidia-ml.so.1",
            "\tlibnvidia-ml.so.1 (libc6,x86-64) => /second/libnvidia-ml.so.1",
            "\tlibcuda.so (libc6,x86-64) => /first/libcuda.so",
            "\tlibnvidia-ptxjitcompiler.so.1 (libc6,x86-64, hwcap: 0x0000000000000001)"
            " => /h/libnvidia-ptxjitcompiler.so.1",
            "\tlibnvidia-container.so.1 (libc6,x86-64) => /first/libnvidia-container.so.1",
            "\tlibcuda.so.1 (libc6,AArch64) => /arm/libcuda.so.1",
            "Cache generated by: ldconfig (GNU libc) stable release version 2.36",
        ]
    )
    assert nvidia.driver_libraries(text) == {
        "libnvidia-ml.so.1": Path("/first/libnvidia-ml.so.1"),  # the loader's first
        "libnvidia-ptxjitcompiler.so.1": Path("/h/libnvidia-ptxjitcompiler.so.1"),
    }
