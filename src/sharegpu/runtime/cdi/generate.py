"""sharegpu's CDI spec: one device per tenant, `sharegpu.io/vgpu=<tenant>`, and one per shape,
`sharegpu.io/vgpu=gpu0-4GiB-30`, whose hooks make a tenant per container (hook.py).

What a container that asks for a tenant's vGPU gets (docs/containers.md):

- every vGPU (the spec's own `containerEdits`): the shim, read-only, at a fixed path; a file
  mounted read-only over `/etc/ld.so.preload` that names it, so every process of the container
  loads it without LD_PRELOAD; `SHAREGPU_TENANT=/run/sharegpu/tenant`; and the driver: on the
  simulated GPU its two libraries (read-only, with LD_LIBRARY_PATH) and its state file; on a
  real NVIDIA driver its control device nodes, libraries, tools and firmware (nvidia.py); and,
  when it was built, the Vulkan layer beside the shim with its manifest at
  `/etc/vulkan/implicit_layer.d/sharegpu_vk.json` and `SHAREGPU_VULKAN=1` (docs/vulkan.md);
- each tenant's device: on a real driver, /dev/nvidia<minor> of each of its GPUs; its limits
  read-only and its usage read-write at `/run/sharegpu/tenant/{limits,usage}`, and the arbiter
  directory of each of its GPUs at `/run/sharegpu/tenant/gpus/<uuid>` (read-write: the token
  is passed through it). Files are mounted one by one, never the tenant directory, whose `gpus`
  link names a host path; the arbiter is mounted as its directory so that a rebuilt region
  (replaced by rename) is seen.
  A shape's device has its GPU's device node and the hooks that make its tenant.

No limit travels in the environment: a process inside cannot raise its cap by changing it, and
root inside cannot write the read-only limits. The spec is validated before it is written, and
written atomically (a temporary file renamed over the old one), so a runtime never reads half.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sharegpu import mps, simgpu
from sharegpu.devices import Gpu, driver_version, list_gpus, nvml_library
from sharegpu.errors import CdiSpecError, ConfigError, SpecError, TenantNotFound
from sharegpu.native import simgpu_dir, vulkan_layer_share
from sharegpu.regions import abi
from sharegpu.runtime.cdi import nvidia
from sharegpu.runtime.cdi.binds import tenant_binds
from sharegpu.runtime.cdi.model import (
    ContainerEdits,
    Device,
    Hook,
    Mount,
    Spec,
    bind_mount,
    minimum_version,
    validate,
)
from sharegpu.runtime.cdi.owner import claim
from sharegpu.runtime.cdi.shapes import Shape, default_shapes
from sharegpu.runtime.run import preload_shim
from sharegpu.spec import format_size
from sharegpu.tenant import RUNTIME_ENV, iter_tenants, node_lock, read_device_limits, tenant_path

KIND = "sharegpu.io/vgpu"
DEFAULT_SPEC_DIR = Path("/var/run/cdi")
SPEC_FILE = "sharegpu.json"
CONTAINER_TENANT_DIR = abi.CONTAINER_TENANT_DIR
CONTAINER_SHIM = "/usr/lib/sharegpu/libsharegpu.so"
CONTAINER_SIMGPU_DIR = "/usr/lib/sharegpu/simgpu"
CONTAINER_VK_LAYER = "/usr/lib/sharegpu/libsharegpu_vk.so"  # beside the shim, where it looks for it
CONTAINER_VK_MANIFEST = "/etc/vulkan/implicit_layer.d/sharegpu_vk.json"  # a loader's search path
VK_MANIFEST_FILE = "sharegpu_vk.json"  # under <runtime>/cdi: the manifest as the container sees it
PRELOAD_FILE = "ld.so.preload"  # under <runtime>/cdi: what /etc/ld.so.preload shows inside
SHIM_CODECS = ("libzstd.so.1", "liblz4.so.1")  # what fatbin entries are compressed with


def _bind(host: Path | str, container: str, *, writable: bool = False) -> Mount:
    return bind_mount(str(host), container, writable=writable)


def preload_file(root: Path) -> Path:
    """The host file mounted over /etc/ld.so.preload: one line, the shim's path inside."""
    return _keep_file(root / "cdi" / PRELOAD_FILE, CONTAINER_SHIM + "\n")


def _keep_file(path: Path, text: str) -> Path:
    """path, holding text (written atomically, mode 0644, only when it differs)."""
    try:
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(path, text, mode=0o644)
    except OSError as err:
        raise ConfigError(f"cannot write {path}: {err.strerror or err}") from err
    return path


def vulkan_edits(root: Path) -> ContainerEdits:
    """The Vulkan layer for every process of the container (enabled by SHAREGPU_VULKAN), when
    it was built: the library beside the shim, and its manifest naming it by that path."""
    share = vulkan_layer_share()
    if share is None:
        return ContainerEdits()
    manifest = json.loads((share / "vulkan" / "implicit_layer.d" / VK_MANIFEST_FILE).read_text())
    manifest["layer"]["library_path"] = CONTAINER_VK_LAYER
    path = _keep_file(root / "cdi" / VK_MANIFEST_FILE, json.dumps(manifest, indent=4) + "\n")
    return ContainerEdits(
        env=["SHAREGPU_VULKAN=1"],
        mounts=[
            _bind(share.parent / "libsharegpu_vk.so", CONTAINER_VK_LAYER),
            _bind(path, CONTAINER_VK_MANIFEST),
        ],
    )


def simulated_driver_edits() -> ContainerEdits:
    """The simulated GPU's libraries and shared state, as the container's driver."""
    state = simgpu.state_path()
    return ContainerEdits(
        env=[f"LD_LIBRARY_PATH={CONTAINER_SIMGPU_DIR}", f"{simgpu.STATE_ENV}={state}"],
        mounts=[_bind(simgpu_dir(), CONTAINER_SIMGPU_DIR), _bind(state, str(state), writable=True)],
    )


def node_driver(gpus: Sequence[Gpu], host: nvidia.Host | None = None) -> nvidia.Driver:
    """What a container needs of this node's driver: the simulated GPU's when NVML is its
    library, else the real driver's as found on `host` (default: this host, at NVML's version).
    A given `host` is always read as a real driver's (tests)."""
    if host is None:
        library = nvml_library()
        if library is not None and library.parent == simgpu_dir():
            return nvidia.Driver(edits=simulated_driver_edits())
        host = nvidia.Host(driver_version=driver_version())
    return nvidia.discover([(g.index, g.uuid, g.minor) for g in gpus], host)


def mps_edits(daemon: mps.Daemon, shm: mps.Shm) -> ContainerEdits:
    """What makes a container's processes clients of the node's MPS daemon, if one runs: its
    pipe directory at the same path, named in the environment, and its /dev/shm at /dev/shm
    (the server and its clients meet in shared memory there); the shim then gives offline
    tenants their BELOW_NORMAL priority inside too. Nothing without a daemon, nor when its
    /dev/shm is this machine's own (a container would see every process's segments) or has no
    path here (`sharegpu doctor` says how to start one that has): a container then shares the
    GPU by time slices, as before."""
    if daemon.state != "running" or shm.state != "own" or shm.host_path is None:
        return ContainerEdits()
    return ContainerEdits(
        env=[f"{mps.PIPE_ENV}={daemon.pipe_dir}"],
        mounts=[
            _bind(daemon.pipe_dir, str(daemon.pipe_dir), writable=True),
            _bind(shm.host_path, mps.SHM, writable=True),
        ],
    )


def codec_mounts(root: Path, cache_text: str | None = None) -> list[Mount]:
    """The libraries the shim decompresses fatbin entries with (native/shim/fatnames.c), beside
    the shim inside, where it looks first: an image without them (a distroless one, a static
    program's) would otherwise have every compressed fatbin refused, and nvcc compresses every
    program's PTX. Those this process's linker cache lists are copied under <root>/cdi/codecs and
    mounted from there: the runtime directory is the node's at the same path, so the mount names
    a file the node has whether the agent runs on the host or in its container (whose libraries
    are not the node's: another distribution's libzstd has another file name). Those not found
    are left out (the image's own are used then)."""
    text = nvidia.read_linker_cache() if cache_text is None else cache_text
    beside = Path(CONTAINER_SHIM).parent
    found = nvidia.cached_libraries(text, lambda name: name in SHIM_CODECS)
    files = {soname: path.resolve() for soname, path in found.items()}
    return [
        _bind(_keep_copy(path, root / "cdi" / "codecs" / soname), str(beside / soname))
        for soname, path in files.items()
        if path.is_file()
    ]


def _keep_copy(src: Path, dest: Path) -> Path:
    """dest, a copy of src (made atomically, mode 0644, only when its size or time differs): a
    container that mounted the earlier copy keeps it."""
    try:
        have, want = (dest.stat() if dest.exists() else None), src.stat()
        if have is None or (have.st_size, have.st_mtime_ns) != (want.st_size, want.st_mtime_ns):
            dest.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(dest, src.read_bytes(), mode=0o644)
            os.utime(dest, ns=(want.st_atime_ns, want.st_mtime_ns))
    except OSError as err:
        raise ConfigError(f"cannot copy {src} to {dest}: {err.strerror or err}") from err
    return dest


def common_edits(root: Path, driver: nvidia.Driver) -> ContainerEdits:
    edits = driver.edits
    daemon = mps.find(mps.pipe_dir())  # the daemon as this process's environment finds it
    extra = mps_edits(daemon, mps.shm_of(daemon))
    vulkan = vulkan_edits(root)
    return ContainerEdits(
        env=[
            f"{abi.TENANT_ENV}={CONTAINER_TENANT_DIR}",
            *(edits.env or []),
            *(extra.env or []),
            *(vulkan.env or []),
        ],
        deviceNodes=edits.device_nodes or None,
        mounts=[
            _bind(preload_shim(), CONTAINER_SHIM),
            _bind(preload_file(root), "/etc/ld.so.preload"),
            *codec_mounts(root),
            *(edits.mounts or []),
            *(extra.mounts or []),
            *(vulkan.mounts or []),
        ],
    )


def tenant_device(root: Path, tenant_id: str, driver: nvidia.Driver) -> Device:
    """The device of one existing tenant: its GPUs' device nodes, its files and its GPUs'
    arbiter directories."""
    path = tenant_path(tenant_id, root)
    uuids = [dev.uuid for dev in read_device_limits(path)]
    mounts = [_bind(host, inside, writable=w) for host, inside, w in tenant_binds(root, path, uuids)]
    nodes = driver.nodes_for(uuids) or None
    return Device(name=tenant_id, containerEdits=ContainerEdits(deviceNodes=nodes, mounts=mounts))


# What the hooks need of this environment: they run with only the env the spec gives them.
_HOOK_ENV = ("LD_LIBRARY_PATH", simgpu.STATE_ENV, simgpu.CONFIG_ENV, "SHAREGPU_NO_AGENT")
HOOK_TIMEOUT_S = 30


def _hook(root: Path, name: str, *args: str) -> Hook:
    env = [f"{RUNTIME_ENV}={root}", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    env += [f"{k}={os.environ[k]}" for k in _HOOK_ENV if os.environ.get(k)]
    argv = [sys.executable, "-m", "sharegpu.runtime.cdi.hook", *args]  # `sharegpu hook`, lighter
    return Hook(hookName=name, path=sys.executable, args=argv, env=env, timeout=HOOK_TIMEOUT_S)


def shape_device(root: Path, shape: Shape, gpu: Gpu, driver: nvidia.Driver) -> Device:
    """A device named by its shape, on `gpu`: its device node, and the hooks that make (and
    remove) a tenant per container."""
    hooks = [
        _hook(root, "createRuntime", "create", "--shape", shape.name),
        _hook(root, "poststop", "poststop"),
    ]
    nodes = driver.nodes_for([gpu.uuid]) or None
    return Device(name=shape.name, containerEdits=ContainerEdits(deviceNodes=nodes, hooks=hooks))


def check_shapes(shapes: Sequence[Shape], gpus: Sequence[Gpu]) -> None:
    """Every shape names a GPU of this node and fits on it."""
    bad = []
    for shape in shapes:
        if shape.gpu >= len(gpus):
            bad.append(f"{shape.name}: this node has no GPU {shape.gpu} ({len(gpus)} GPUs)")
        elif shape.memory_bytes > gpus[shape.gpu].memory_total:
            have = format_size(gpus[shape.gpu].memory_total)
            bad.append(f"{shape.name}: more memory than GPU {shape.gpu} has ({have})")
    if bad:
        raise CdiSpecError("vGPU shapes this node cannot hold: " + "; ".join(bad))


@dataclass(frozen=True)
class BuiltSpec:
    """A built spec, and the tenants left out of it: {tenant: why} (its files unreadable)."""

    spec: Spec
    left_out: dict[str, str] = field(default_factory=dict)


def build_spec(
    root: Path,
    tenant_ids: Iterable[str] | None = None,
    shapes: Sequence[Shape] | None = None,
    *,
    gpus: Sequence[Gpu] | None = None,
    host: nvidia.Host | None = None,
) -> BuiltSpec:
    """The spec listing the given tenants (default: every tenant of the node) and shapes
    (default: a quarter, a half and all of each GPU), at the lowest cdiVersion its fields
    need, validated. `gpus` (default: NVML's) and `host` (see node_driver) are for tests.

    One damaged tenant affects only itself: of every tenant of the node, one whose files cannot
    be read is left out (and named in `left_out`), and the others are listed, so that the node's
    other containers keep starting. A tenant named in `tenant_ids` that cannot be read is an
    error: the caller asked for it."""
    ids = list(tenant_ids) if tenant_ids is not None else [p.name for p in iter_tenants(root)]
    gpus = list(gpus) if gpus is not None else list_gpus()
    shapes = list(shapes) if shapes is not None else default_shapes([g.memory_total for g in gpus])
    check_shapes(shapes, gpus)
    clash = sorted(set(ids) & {s.name for s in shapes})
    if clash:
        raise CdiSpecError(f"tenant names that are also shape names: {', '.join(clash)}")
    if not ids and not shapes:
        raise TenantNotFound(
            f"no tenant on this node ({root}) and no shape to list as a CDI device: create a "
            "tenant (POST /v1/tenants on the agent's socket, docs/agent.md) or give --shape"
        )
    driver = node_driver(gpus, host)
    devices, left_out = [], {}
    for tenant in ids:
        try:
            devices.append(tenant_device(root, tenant, driver))
        except ConfigError as err:
            if tenant_ids is not None:
                raise
            left_out[tenant] = str(err)
    if not devices and not shapes:
        why = "; ".join(f"{t}: {w}" for t, w in left_out.items())
        raise CdiSpecError(f"no tenant of this node can be listed as a CDI device ({why})")
    devices += [shape_device(root, s, gpus[s.gpu], driver) for s in shapes]
    edits = common_edits(root, driver)
    spec = Spec(cdiVersion="0.3.0", kind=KIND, devices=devices, containerEdits=edits)
    return BuiltSpec(validate(spec.model_copy(update={"cdi_version": minimum_version(spec)})), left_out)


def spec_target(output: Path | None) -> Path:
    """`--output`: a directory (the spec is its sharegpu.json) or a path ending in .json."""
    target = output or DEFAULT_SPEC_DIR
    return target if target.suffix == ".json" else target / SPEC_FILE


def _write_atomically(path: Path, content: str | bytes, *, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_node_spec(root: Path, target: Path, *, gpus: Sequence[Gpu] | None = None) -> BuiltSpec:
    """The node's spec (every readable tenant, the default shapes) built and written under the
    node lock, as the agent's keeper writes it: of two writers at once, the last has seen every
    tenant made before it, so neither drops a tenant the other has just listed."""
    with node_lock(root):
        claim(target, root)  # never another runtime directory's file
        built = build_spec(root, gpus=gpus)
        write_spec(built.spec, target)
    return built


def write_spec(spec: Spec, target: Path) -> Path:
    """Write the (validated) spec to target atomically.  An output that cannot be created or
    written is bad input (SpecError, exit 2), as for every command's --output."""
    validate(spec)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(target, spec.to_json(), mode=0o644)
    except OSError as err:
        raise SpecError(f"cannot write the CDI spec to {target}: {err.strerror or err}") from err
    return target
