"""sharegpu: share one NVIDIA GPU between many containers.

Each tenant gets a virtual GPU with a memory cap (and, later, a compute share). The C interposer
(`libsharegpu.so`) enforces the limits inside the tenant's processes; this package creates the
tenants, runs programs under them and shows what every tenant uses.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sharegpu")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
