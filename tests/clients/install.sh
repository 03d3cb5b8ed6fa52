#!/usr/bin/env bash
# Installs the three third-party CUDA clients, and wgpu (a Vulkan client), into a venv of their own
# (not the project's .venv):
#   bash tests/clients/install.sh [VENV]        (default: .venv-clients at the repository root)
# `make clients` runs it (and `make test` runs that). PYTHON picks the interpreter (python3).
# Everything comes from PyPI wheels of the CUDA 13.0 line, except pycuda, which is built from its
# sdist against the wheels' CUDA headers and linked against the simulator's libcuda.so (build it
# first: `make native`). No /usr/local/cuda, no Boost package: pycuda's bundled Boost subset is
# used. Needs g++ and Python.h (python3-dev), for the pycuda build and for nvcc (SourceModule).
# Any failure stops it with a non-zero status; running it again finishes or redoes nothing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${1:-$root/.venv-clients}
python=${PYTHON:-python3}
simlib=$root/src/sharegpu/_lib/simgpu
pycuda_version=2026.1

die() { echo "install.sh: $*" >&2; exit 1; }
[ -e "$simlib/libcuda.so" ] || die "$simlib/libcuda.so missing: run make native"
command -v g++ >/dev/null || die "no g++ (pycuda's build and nvcc need it): apt-get install g++"
"$python" - <<'EOF' || die "no Python.h for $python (pycuda's build needs it): apt-get install python3-dev"
import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
EOF

"$python" -m venv "$venv"
py=$venv/bin/python
pip=("$py" -m pip install --quiet --disable-pip-version-check --no-input --progress-bar off)

# 1. cuda-core on cuda-bindings 13.0, NVRTC 13.0
"${pip[@]}" numpy "cuda-bindings==13.0.3" "cuda-core==1.2.2" "nvidia-cuda-nvrtc==13.0.88"
# 2. numba-cuda on the same cuda-bindings, NVVM (+ libdevice) 13.0, the CUDA runtime and nvJitLink
"${pip[@]}" "numba-cuda==0.30.4" "nvidia-nvvm==13.0.88" "nvidia-cuda-runtime==13.0.96" \
    "nvidia-nvjitlink==13.0.88" "nvidia-cuda-cccl==13.0.85"
# 3. pycuda: nvcc 13.0 for SourceModule; cudaProfiler.h (not in the runtime wheel) for the build
"${pip[@]}" "nvidia-cuda-nvcc==13.0.88" "nvidia-cuda-crt==13.0.88" "nvidia-cuda-profiler-api==13.0.85" \
    setuptools wheel
# 4. wgpu (WebGPU over Vulkan, wgpu-native inside the wheel): a Vulkan client of the Vulkan layer
"${pip[@]}" "wgpu==0.32.0"

if "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('pycuda') != '$pycuda_version')" \
    2>/dev/null; then
    echo "install.sh: pycuda $pycuda_version already built in $venv"
else
    cu13=$("$py" -c 'import nvidia.cu13; print(list(nvidia.cu13.__path__)[0])')
    [ -e "$cu13/include/cuda.h" ] || die "no cuda.h in $cu13/include"
    src=$(mktemp -d)
    trap 'rm -rf "$src"' EXIT
    "$py" -m pip download --quiet --disable-pip-version-check --no-input --no-deps --no-binary pycuda \
        "pycuda==$pycuda_version" -d "$src"
    tar -xzf "$src/pycuda-$pycuda_version.tar.gz" -C "$src"
    cat > "$src/pycuda-$pycuda_version/siteconf.py" <<EOF
USE_SHIPPED_BOOST = True
CUDA_TRACE = False
CUDA_ROOT = '$cu13'
CUDA_INC_DIR = ['$cu13/include']
CUDA_ENABLE_GL = False
CUDA_ENABLE_CURAND = False
CUDADRV_LIB_DIR = ['$simlib']
CUDADRV_LIBNAME = ['cuda']
CXXFLAGS = []
LDFLAGS = []
EOF
    "${pip[@]}" --no-build-isolation "$src/pycuda-$pycuda_version"
fi

# Each client imports (pycuda's extension needs libcuda.so.1: the simulator's).
LD_LIBRARY_PATH=$simlib "$py" -c 'import cuda.core, numba.cuda, pycuda.driver, wgpu' \
    || die "a client does not import in $venv"
"$py" -m pip list --disable-pip-version-check 2>/dev/null \
    | grep -iE '^(cuda|numba|nvidia|pycuda|numpy|llvmlite|wgpu)' || true
