"""Build hook: compile the C libraries with gcc (no CUDA toolkit) into the package's _lib/."""

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildNative(build_py):
    """Runs `make -C native` so that wheels and `pip install .` carry the shim and simgpu."""

    def run(self) -> None:
        super().run()
        out = Path(self.build_lib).resolve() / "sharegpu" / "_lib"
        subprocess.run(["make", "-s", "-C", str(ROOT / "native"), f"OUT={out}"], check=True)


setup(cmdclass={"build_py": BuildNative})
