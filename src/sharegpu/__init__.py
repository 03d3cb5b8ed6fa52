"""sharegpu: share one NVIDIA GPU between many containers.

Each tenant gets a virtual GPU with a memory cap (and, later, a compute share). The C interposer
(`libsharegpu.so`) enforces the limits inside the tenant's processes; this package creates the
tenants, runs programs under them and shows what every tenant uses.
"""

from __future__ import annotations

import functools

__all__ = ["__version__"]


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sharegpu")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0.0.0+unknown"


def __getattr__(name: str) -> str:
    # Read on first use: importlib.metadata costs ~80 ms, and the container hooks and the shim's
    # helpers import this package without ever asking for the version.
    if name != "__version__":
        raise AttributeError(f"module 'sharegpu' has no attribute {name!r}")
    return _version()
