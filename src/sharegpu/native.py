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
