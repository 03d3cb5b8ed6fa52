"""Vulkan on lavapipe (Mesa's Vulkan driver on the CPU) for the layer's tests: the driver's
manifest, the plain Vulkan program native/vklayer/tests/vkprobe.c, and lavapipe's deviceUUID as a
GPU UUID (tests/integration/test_vulkan.py, tests/e2e/test_containers_vulkan.py)."""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
from pathlib import Path

from cbuild import SHIM_DIR, gcc
from conftest import parse_kv
from sharegpu import native
from sharegpu.runtime.rootfs import build_rootfs, host_libraries

SOURCE = SHIM_DIR.parent / "vklayer" / "tests" / "vkprobe.c"


def lavapipe_icd() -> Path:
    found = sorted(glob.glob("/usr/share/vulkan/icd.d/lvp_icd.*.json"))
    assert found, "lavapipe is not installed (Debian: mesa-vulkan-drivers; .ci/run installs it)"
    return Path(found[0])


def build_vkprobe(out: Path) -> Path:
    """vkprobe, linked against the Vulkan loader and libcuda.so.1 (its `mixed` command)."""
    assert native.vulkan_layer_share() is not None, (
        "the Vulkan layer is not built: install the Vulkan headers (Debian: libvulkan-dev) and run make"
    )
    simgpu = str(native.LIB_DIR / "simgpu")
    return gcc(out, "vkprobe", str(SOURCE), f"-L{simgpu}", "-l:libcuda.so.1", "-lvulkan")


def vk_env(tmp: Path) -> dict[str, str]:
    """Only lavapipe as the Vulkan driver (the loader also finds Mesa's hardware drivers)."""
    return {"VK_ICD_FILENAMES": str(lavapipe_icd()), "XDG_RUNTIME_DIR": str(tmp)}


def lavapipe_uuid(vkprobe: Path, tmp: Path) -> str:
    """lavapipe's deviceUUID as a GPU UUID, asked of the driver with no layer and no tenant."""
    env = vk_env(tmp) | {"LD_LIBRARY_PATH": str(native.LIB_DIR / "simgpu")}  # vkprobe links libcuda.so.1
    proc = subprocess.run(
        [str(vkprobe), "info", "13"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    return "GPU-" + parse_kv(proc.stdout)[0]["uuid"]


def build_vulkan_rootfs(dest: Path, work: Path) -> Path:
    """dest/: the busybox root filesystem (sharegpu.runtime.rootfs) plus vkprobe, the Vulkan
    loader, lavapipe and their libraries, and lavapipe's manifest: what a rendering image holds,
    and no sharegpu file (the CDI device brings those)."""
    build_rootfs(dest)
    vkprobe = build_vkprobe(work)
    shutil.copy(vkprobe, dest / "bin" / "vkprobe")
    icd = lavapipe_icd()
    driver = Path(json.loads(icd.read_text())["ICD"]["library_path"])
    for lib in {*host_libraries(vkprobe, driver), driver}:
        target = dest / lib.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.copy(lib, target)
    (dest / icd.parent.relative_to("/")).mkdir(parents=True, exist_ok=True)
    shutil.copy(icd, dest / icd.relative_to("/"))
    return dest
