"""Where the compiled C parts live: the shim, the simulated GPU and the probe."""

from __future__ import annotations

import json
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


VK_LAYER_NAME = "VK_LAYER_SHAREGPU_vgpu"


def vulkan_layer_share(lib_dir: Path = LIB_DIR) -> Path | None:
    """The data directory whose vulkan/implicit_layer.d holds the Vulkan layer's manifest (the
    loader searches XDG_DATA_DIRS), or None when the layer was not built (no Vulkan headers).

    A manifest the loader would skip (malformed, another layer's, naming a library that is not
    there) is an error, not None: the loader says nothing to the program and its Vulkan memory
    would go unmetered."""
    share = lib_dir / "share"
    manifest = share / "vulkan" / "implicit_layer.d" / "sharegpu_vk.json"
    if not manifest.exists() and not (lib_dir / "libsharegpu_vk.so").exists():
        return None
    try:
        layer = json.loads(manifest.read_text())["layer"]
        library = (manifest.parent / layer["library_path"]).resolve()
        if layer["name"] != VK_LAYER_NAME:
            raise ValueError(f"it names the layer {layer['name']!r}, not {VK_LAYER_NAME}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"the Vulkan layer's manifest {manifest} is unusable ({err}): rebuild with make"
        ) from err
    if not library.is_file():
        raise ConfigError(
            f"the Vulkan layer's manifest {manifest} names {library}, which is missing: rebuild with make"
        )
    return share


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


# Keys the probe prints once per request (sgprobe bursts/poisson), in request order.
PROBE_PER_REQUEST = ("lat_us", "runq_us", "launch_us", "span_us", "woke_us")


def parse_probe_output(lines: list[str]) -> dict[str, str]:
    """The probe's `key=value` lines; a key printed once per request (PROBE_PER_REQUEST) keeps its
    last value, and all of them, in order and comma-separated, under `<key>_all`."""
    pairs = [line.split("=", 1) for line in lines if "=" in line]
    values = dict(pairs)
    for key in PROBE_PER_REQUEST:
        values[f"{key}_all"] = ",".join(v for k, v in pairs if k == key)
    return values
