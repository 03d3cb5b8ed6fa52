"""A real NVIDIA driver as CDI container edits: the device nodes, user-space libraries, tools and
firmware a container needs of it, found on this host. The same pieces NVIDIA's own CDI
generator (`nvidia-ctk cdi generate`) lists, found our way:

- device nodes, under `Host.root`: the control nodes every GPU needs (`/dev/nvidiactl`,
  `/dev/nvidia-uvm`, `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`), and `/dev/nvidia<minor>`
  of each GPU, its minor number from NVML. Only character devices count. The spec names the
  path (and `hostPath` when the root is not `/`), not the device numbers: the runtime reads
  those from the node when a container starts, so a spec written before a driver reload (which
  may give nvidia-uvm another major number) stays right. Read and write, as CUDA opens them.
- libraries, from the dynamic linker cache (`ldconfig -p`), x86-64 entries only, the first
  entry of each soname (the loader's order). Each is mounted as its resolved file at its
  soname's path in the host's directory: host `.../libcuda.so.580.65.06` at
  `.../libcuda.so.1`. The loader opens sonames, so the container needs no soname link, and so
  no hook running `ldconfig` in it as nvidia-ctk does. The cost: the image's loader must search
  that directory by default (Debian and Ubuntu images do for `/usr/lib/x86_64-linux-gnu`).
- tools found on `PATH`, resolved likewise and mounted at the path they were found at;
- the GSP firmware directory of the driver's version, when there is one.

Everything read of the host is an input (`Host`), so tests give a fake /dev and a fake cache.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu.errors import DeviceError
from sharegpu.runtime.cdi.model import ContainerEdits, DeviceNode, Mount, bind_mount

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
REQUIRED_NODES = ("nvidiactl",)
# The driver's user-space libraries, by name before `.so`; any versioned soname of them counts
# (libnvidia-gpucomp's soname is the driver version, libnvidia-nvvm's its own major).
DRIVER_LIBRARIES = (
    "libcuda",
    "libcudadebugger",
    "libnvidia-ml",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libnvidia-nvvm70",
    "libnvidia-opencl",
    "libnvidia-gpucomp",
    "libnvidia-allocator",
    "libnvidia-cfg",
)
REQUIRED_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
TOOLS = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
FIRMWARE_DIR = "lib/firmware/nvidia"  # under the root, then the driver version

_SONAME = re.compile(r"^(?P<stem>[^/]+?)\.so\.[0-9][0-9.]*$")
_CACHE_ENTRY = re.compile(r"^\s*(?P<name>\S+)\s+\((?P<flags>[^)]*)\)\s+=>\s+(?P<path>/.*?)\s*$")

# One GPU as discovery needs it: (NVML index, UUID, minor number or None when NVML gave none).
GpuRef = tuple[int, str, int | None]


LINKER_CACHE = Path("/etc/ld.so.cache")
_cache_read: dict[tuple[int, int, int], str] = {}  # the cache file's identity -> its text


def read_linker_cache() -> str:
    """`ldconfig -p`: the libraries the dynamic linker knows, with their sonames and paths.
    The agent asks every second: the text is read again only when the cache file changed."""
    try:
        st = LINKER_CACHE.stat()
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        ident = (0, 0, 0)
    if ident in _cache_read and ident != (0, 0, 0):
        return _cache_read[ident]
    # sbin first: it is off a non-root user's PATH on some distributions.
    ldconfig = shutil.which("ldconfig", path=f"/sbin:/usr/sbin:{os.environ.get('PATH', os.defpath)}")
    if ldconfig is None:
        raise DeviceError("cannot find ldconfig to read the dynamic linker cache")
    try:
        proc = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as err:
        raise DeviceError(f"cannot read the dynamic linker cache ({ldconfig} -p): {err}") from err
    _cache_read.clear()
    _cache_read[ident] = proc.stdout
    return proc.stdout


@dataclass(frozen=True)
class Host:
    """What discovery reads of the host; the defaults are this host."""

    root: Path = Path("/")  # where /dev and /lib/firmware are
    linker_cache: str | Callable[[], str] = read_linker_cache  # `ldconfig -p` text, or its reader
    path: str | None = None  # where the tools are looked for; None: this process's PATH
    driver_version: str | None = None  # names the firmware directory; None: no firmware


@dataclass(frozen=True)
class Driver:
    """What a container needs of the node's driver: the edits for every vGPU, and each GPU's own
    device nodes by UUID (none for the simulated GPU, which has no device files)."""

    edits: ContainerEdits
    gpu_nodes: Mapping[str, DeviceNode] = field(default_factory=dict)

    def nodes_for(self, uuids: Sequence[str]) -> list[DeviceNode]:
        # A GPU this node lacks (a stale tenant's) has no node: its container just lacks it.
        return [self.gpu_nodes[u] for u in dict.fromkeys(uuids) if u in self.gpu_nodes]


def cached_libraries(cache_text: str, wanted: Callable[[str], bool]) -> dict[str, Path]:
    """{soname: the path the cache lists} for the x86-64 libraries whose soname is `wanted`,
    first entry first (the loader's order)."""
    found: dict[str, Path] = {}
    for line in cache_text.splitlines():
        entry = _CACHE_ENTRY.match(line)
        if entry is None:
            continue  # the header and footer lines
        flags = {f.strip() for f in entry["flags"].split(",")}
        if "x86-64" in flags and wanted(entry["name"]):
            found.setdefault(entry["name"], Path(entry["path"]))
    return found


def driver_libraries(cache_text: str) -> dict[str, Path]:
    """{soname: the path the cache lists} for the driver's x86-64 libraries, first entry first."""

    def driver_soname(name: str) -> bool:
        soname = _SONAME.match(name)
        return soname is not None and soname["stem"] in DRIVER_LIBRARIES

    return cached_libraries(cache_text, driver_soname)


def _char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def _node(host: Host, name: str) -> DeviceNode | None:
    inside = f"/dev/{name}"
    on_host = host.root / "dev" / name
    if not _char_device(on_host):
        return None
    # hostPath only where it differs: the field needs cdiVersion 0.5.0.
    host_path = None if host.root == Path("/") else str(on_host)
    return DeviceNode(path=inside, hostPath=host_path, permissions="rw")


def _library_mounts(host: Host, missing: list[str]) -> list[Mount]:
    text = host.linker_cache if isinstance(host.linker_cache, str) else host.linker_cache()
    mounts = []
    for soname, listed in driver_libraries(text).items():
        real = listed.resolve()
        if real.is_file():  # a stale cache entry is skipped
            mounts.append(bind_mount(str(real), str(listed.parent / soname)))
    have = {Path(m.container_path).name for m in mounts}
    missing += [f"{lib} (not in the dynamic linker cache)" for lib in REQUIRED_LIBRARIES if lib not in have]
    return mounts


def _tool_mounts(host: Host) -> list[Mount]:
    search = host.path if host.path is not None else os.environ.get("PATH", os.defpath)
    mounts = []
    for tool in TOOLS:
        found = shutil.which(tool, path=search)
        if found is not None:
            mounts.append(bind_mount(str(Path(found).resolve()), found))
    return mounts


def _firmware_mounts(host: Host) -> list[Mount]:
    if not host.driver_version:
        return []
    firmware = host.root / FIRMWARE_DIR / host.driver_version
    return [bind_mount(str(firmware), f"/{FIRMWARE_DIR}/{host.driver_version}")] if firmware.is_dir() else []


def discover(gpus: Sequence[GpuRef], host: Host | None = None) -> Driver:
    """The driver's pieces on `host` (default: this one), or DeviceError naming every required
    piece that is missing: /dev/nvidiactl, libcuda.so.1, libnvidia-ml.so.1, each GPU's node."""
    host = host or Host()
    missing: list[str] = []
    nodes = []
    for name in CONTROL_NODES:
        node = _node(host, name)
        if node is not None:
            nodes.append(node)
        elif name in REQUIRED_NODES:
            missing.append(f"{host.root / 'dev' / name} (a character device)")
    gpu_nodes = {}
    for index, uuid, minor in gpus:
        if minor is None:
            missing.append(f"the minor number of GPU {index} ({uuid}): NVML gives none")
            continue
        node = _node(host, f"nvidia{minor}")
        if node is None:
            missing.append(f"{host.root / 'dev' / f'nvidia{minor}'} of GPU {index} (a character device)")
        else:
            gpu_nodes[uuid] = node
    mounts = _library_mounts(host, missing) + _tool_mounts(host) + _firmware_mounts(host)
    if missing:
        raise DeviceError(
            "cannot describe this node's NVIDIA driver for containers: missing " + "; ".join(missing)
        )
    return Driver(edits=ContainerEdits(deviceNodes=nodes, mounts=mounts), gpu_nodes=gpu_nodes)
