"""A minimal container root filesystem made from this host's files, for trying vGPU containers
without an image registry: static busybox as the shell, the driver-API probe, and the C
libraries they need as `ldd` resolves them here. The shim and the (simulated) driver are not in
it: a vGPU container gets those from the CDI spec.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from sharegpu import native
from sharegpu.errors import ConfigError

APPLETS = ("sh", "cat", "echo", "sleep", "ls", "env", "true")


def host_libraries(*binaries: Path) -> set[Path]:
    """The shared libraries the binaries load (ldd), except sharegpu's own."""
    found: set[Path] = set()
    for binary in binaries:
        try:
            out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as err:
            raise ConfigError(f"cannot list the libraries of {binary} with ldd: {err}") from err
        for line in out.splitlines():
            match = re.search(r"(/\S+) \(0x", line)
            if match and native.LIB_DIR not in Path(match[1]).parents:
                found.add(Path(match[1]))
    return found


def build_rootfs(dest: Path) -> Path:
    """dest/ with bin/busybox (and its applets), bin/sgprobe and their libraries."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise ConfigError("busybox is not installed (Debian: apt-get install busybox-static)")
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    (dest / "tmp").mkdir(exist_ok=True)
    shutil.copy(busybox, dest / "bin" / "busybox")
    for applet in APPLETS:
        link = dest / "bin" / applet
        if not link.is_symlink():
            link.symlink_to("busybox")
    shutil.copy(native.probe_path(), dest / "bin" / "sgprobe")
    probe, shim, driver = native.probe_path(), native.shim_path(), native.simgpu_dir() / "libcuda.so.1"
    for lib in host_libraries(probe, shim, driver):
        target = dest / lib.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(lib, target)
    return dest
