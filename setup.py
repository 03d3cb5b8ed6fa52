"""Build hook: compile the C libraries with gcc (no CUDA toolkit) into the package's _lib/."""

import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildNative(build_py):
    """Runs `make -C native` so that wheels and `pip install .` carry the shim and simgpu."""

    def run(self) -> None:
        super().run()
        out = Path(self.build_lib).resolve() / "sharegpu" / "_lib"
        subprocess.run(["make", "-s", "-C", str(ROOT / "native"), f"LIBDIR={out}"], check=True)


class NativeDistribution(Distribution):
    """The wheel holds ELF binaries: tag it for the platform, not as pure Python."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildNative}, distclass=NativeDistribution)
