"""Where the compiled C parts live: the shim, the simulated GPU and the probe."""

from __future__ import annotations

from pathlib import Path

from sharegpu.errors import ConfigError

LIB_DIR = Path(__file__).resolve().parent / "_lib"


def _require(path: Path) -> Path:
    if not path.exists():
        raise ConfigError(
            f"{path} is missing: the C libraries are not built (run `make -C native` in a source "
            "tree, or reinstall sharegpu)"
        )
    return path


def shim_path() -> Path:
    """The interposer preloaded into tenant processes."""
    return _require(LIB_DIR / "libsharegpu.so")


def vulkan_layer_share() -> Path | None:
    """The data directory whose vulkan/implicit_layer.d holds the Vulkan layer's manifest (the
    loader searches XDG_DATA_DIRS), or None when the layer was not built (no Vulkan headers)."""
    share = LIB_DIR / "share"
    manifest = share / "vulkan" / "implicit_layer.d" / "sharegpu_vk.json"
    return share if manifest.exists() and (LIB_DIR / "libsharegpu_vk.so").exists() else None


def agent_lib_path() -> Path:
    """The agent's region operations (libsgagent.so: reaping, overhead), built from the shim's
    own ledger and arbiter sources; never the shim itself."""
    return _require(LIB_DIR / "libsgagent.so")


def simgpu_dir() -> Path:
    """Directory holding the simulated GPU's libcuda.so.1 and libnvidia-ml.so.1."""
    return _require(LIB_DIR / "simgpu")


def probe_path(dlopen: bool = False) -> Path:
    """The multi-command driver-API probe (linked, or loading libcuda with dlopen)."""
    return _require(LIB_DIR / ("sgprobe-dl" if dlopen else "sgprobe"))
