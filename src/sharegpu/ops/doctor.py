"""`sharegpu doctor`: ordered preflight checks of a node, one line each, with the fix.

Every check is a small function of a `Context` (the paths it reads, so tests can point them at
files of their own) returning a `Check`: status ok / warn / fail, one line saying what was found,
and for anything not ok the fix. `run_checks` runs them in order; a check that crashes is a
failure of that check, never of the doctor.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.markup import escape

from sharegpu import __version__, mps, native

Status = Literal["ok", "warn", "fail"]

SIMGPU_HINT = 'for the simulated GPU: eval "$(sharegpu simgpu env)"'
MIN_CUDA = 12000  # cuGetProcAddress_v2 and the per-thread-stream entry points


@dataclass
class Check:
    name: str
    status: Status
    message: str
    fix: str | None = None


@dataclass
class Context:
    """What the checks look at; the defaults are the node's real paths."""

    runtime_dir: Path
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    package_shim: Path = native.LIB_DIR / "libsharegpu.so"
    etc_preload: Path = Path("/etc/ld.so.preload")
    clocksource: Path = Path("/sys/devices/system/clocksource/clocksource0")
    proc: Path = Path("/proc")
    vgpu_dir: Path = Path("/usr/local/vgpu")
    mps_pipe_dir: Path = field(default_factory=mps.pipe_dir)
    # The node's CDI spec: the agent's default --cdi-spec (sharegpu.runtime.cdi.generate).
    cdi_spec: Path = Path("/var/run/cdi/sharegpu.json")


def _mapped(fragment: str) -> str | None:
    """The path of the first library mapped in this process whose name contains `fragment`."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and fragment in parts[5].rsplit("/", 1)[-1]:
            return parts[5]
    return None


# -- the checks ------------------------------------------------------------------------------------


def check_nvml(ctx: Context) -> Check:
    from sharegpu.devices import scan_gpus
    from sharegpu.errors import SharegpuError

    try:
        listing = scan_gpus()
    except SharegpuError as err:
        return Check(
            "nvml",
            "fail",
            str(err),
            "install the NVIDIA driver so that libnvidia-ml.so.1 is on the library path "
            f"(ldconfig -p | grep nvidia-ml); {SIMGPU_HINT}",
        )
    library = _mapped("libnvidia-ml") or "libnvidia-ml.so.1"
    gpus = listing.gpus
    failing = [f for f in listing.faults if not f.no_permission]
    outside = [f.index for f in listing.faults if f.no_permission]
    names = ", ".join(sorted({g.name for g in gpus}))
    seen = f"NVML loads from {library}: {len(gpus)} GPU(s)" + (f" ({names})" if names else "")
    if outside:  # a container given some of the node's GPUs: routine, said for the record
        seen += f"; GPU(s) {', '.join(map(str, outside))} outside this process's devices"
    if failing:
        return Check(
            "nvml",
            "fail",
            f"{seen}; " + "; ".join(f.describe() for f in failing),
            "a GPU that NVML cannot query is left out of every listing: see nvidia-smi and the "
            "kernel log (dmesg | grep -i xid); a GPU that fell off the bus needs a reset or a reboot",
        )
    if not gpus:
        return Check("nvml", "warn", f"{seen}, so none to share", "check nvidia-smi")
    return Check("nvml", "ok", seen)


def check_driver(ctx: Context) -> Check:
    from sharegpu.devices import driver_version
    from sharegpu.errors import SharegpuError

    try:
        nvml_driver = driver_version()
    except SharegpuError:
        nvml_driver = "unknown"
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as err:
        return Check(
            "driver",
            "fail",
            f"driver {nvml_driver}; libcuda.so.1 cannot be loaded: {err}",
            f"install the NVIDIA driver's CUDA library (libcuda.so.1); {SIMGPU_HINT}",
        )
    version = ctypes.c_int(0)
    if cuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return Check(
            "driver", "fail", f"driver {nvml_driver}; cuDriverGetVersion failed", "reinstall the driver"
        )
    major, minor = version.value // 1000, version.value % 1000 // 10
    library = _mapped("libcuda.so") or "libcuda.so.1"
    message = f"driver {nvml_driver}, CUDA {major}.{minor} ({library})"
    if version.value < MIN_CUDA:
        return Check(
            "driver",
            "warn",
            message + ": older than CUDA 12, no cuGetProcAddress_v2",
            "upgrade the driver to R525 or newer (CUDA 12)",
        )
    return Check("driver", "ok", message)


def check_shim_built(ctx: Context) -> Check:
    from sharegpu.agent.upgrade import inspect_shim
    from sharegpu.errors import SharegpuError

    try:
        info = inspect_shim(ctx.package_shim)
    except SharegpuError as err:
        return Check(
            "shim-built",
            "fail",
            str(err),
            "build the C parts (make -C native) or reinstall sharegpu",
        )
    return Check("shim-built", "ok", f"{ctx.package_shim} (version {info.version})")


def check_shim_installed(ctx: Context) -> Check:
    from sharegpu.agent.upgrade import current_shim, inspect_shim, stable_path
    from sharegpu.errors import SharegpuError

    link = stable_path(ctx.runtime_dir)
    installed = current_shim(ctx.runtime_dir)
    if installed is None:
        if link.is_symlink() or link.exists():
            return Check(
                "shim-installed",
                "fail",
                f"{link} names nothing usable: new tenant processes would fail to preload it",
                f"sharegpu upgrade --shim {ctx.package_shim}",
            )
        return Check("shim-installed", "ok", "no node build installed: tenants load the package's build")
    try:
        info = inspect_shim(installed)
    except SharegpuError as err:
        return Check("shim-installed", "fail", str(err), f"sharegpu upgrade --shim {ctx.package_shim}")
    return Check("shim-installed", "ok", f"{installed} (version {info.version})")


_LOAD = """
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError:
    print("cuinit=nodriver")
else:
    print("cuinit=%d" % cuda.cuInit(0))
"""


def tenant_shim(ctx: Context) -> Path:
    """The shim a new tenant process preloads: the node's installed build, else the package's."""
    from sharegpu.agent.upgrade import current_shim, stable_path

    return stable_path(ctx.runtime_dir) if current_shim(ctx.runtime_dir) is not None else ctx.package_shim


def check_shim_loads(ctx: Context) -> Check:
    shim = tenant_shim(ctx)
    env = {k: v for k, v in ctx.env.items() if k not in ("SHAREGPU_TENANT", "LD_PRELOAD")}
    env["LD_PRELOAD"] = str(shim)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _LOAD, str(shim)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Check("shim-loads", "fail", f"a process preloading {shim} hung", "report a bug")
    fix = f"reinstall the shim: sharegpu upgrade --shim {ctx.package_shim} (or rebuild: make -C native)"
    last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
    if proc.returncode != 0:
        return Check("shim-loads", "fail", f"{shim} does not load: {last}", fix)
    result = proc.stdout.strip().rsplit("=", 1)[-1]
    if result == "nodriver":
        return Check(
            "shim-loads", "warn", f"{shim} loads; no libcuda.so.1 to try cuInit", "install the driver"
        )
    if result != "0":
        return Check(
            "shim-loads",
            "fail",
            f"{shim} loads but cuInit fails ({result}) with no tenant configured: {last}",
            fix,
        )
    return Check("shim-loads", "ok", f"{shim} loads and is inert without a tenant (cuInit succeeds)")


def check_runtime_dir(ctx: Context) -> Check:
    root = ctx.runtime_dir
    fix = f"create it writable by the agent (mkdir -p {root}; chmod 755 {root}) or set SHAREGPU_RUNTIME_DIR"
    try:
        st = root.stat()
    except FileNotFoundError:
        parent = root.parent
        if parent.is_dir() and os.access(parent, os.W_OK | os.X_OK):
            return Check(
                "runtime-dir", "warn", f"{root} does not exist yet (made with the first tenant)", None
            )
        return Check("runtime-dir", "fail", f"{root} does not exist and {parent} is not writable", fix)
    except OSError as err:
        return Check("runtime-dir", "fail", f"{root}: {err.strerror}", fix)
    if not stat.S_ISDIR(st.st_mode):
        return Check("runtime-dir", "fail", f"{root} is not a directory", fix)
    if not os.access(root, os.W_OK | os.X_OK):
        return Check("runtime-dir", "fail", f"{root} is not writable by uid {os.geteuid()}", fix)
    mode = stat.S_IMODE(st.st_mode)
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        return Check(
            "runtime-dir",
            "warn",
            f"{root} is world-writable ({mode:o}): anyone can create or remove tenants",
            f"chmod o-w {root}",
        )
    return Check("runtime-dir", "ok", f"{root} (mode {mode:o}, owner uid {st.st_uid})")


def check_arbiters(ctx: Context) -> Check:
    """Every GPU's arbiter region is one the shim accepts: a damaged one makes every launch of
    every tenant on that GPU fail."""
    from sharegpu.arbiter import arbiter_damage, iter_arbiters

    paths = list(iter_arbiters(ctx.runtime_dir)) if ctx.runtime_dir.is_dir() else []
    damaged = [(p, d) for p in paths if (d := arbiter_damage(p, p.parent.name)) is not None]
    if damaged:
        path, damage = damaged[0]
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        return Check(
            "arbiters",
            "fail",
            f"{damage}{more}: every launch of the tenants on that GPU fails",
            f"start the agent, which rebuilds a damaged region within a second, or move it aside "
            f"(mv {path} {path}.damaged) and restart the GPU's tenant processes",
        )
    from sharegpu.access import world_writable

    open_to_all = [p for p in paths if world_writable(p)]
    if open_to_all:
        return Check(
            "arbiters",
            "warn",
            f"{open_to_all[0]} is writable by every local user (the filesystem has no POSIX ACLs): "
            "anyone can disturb the GPU's arbitration",
            f"put the runtime directory on a filesystem with POSIX ACLs (tmpfs has them), or chmod 600 "
            f"{open_to_all[0]} and run the GPU's tenants as its owner",
        )
    return Check("arbiters", "ok", f"{len(paths)} GPU arbiter region(s), all usable, not world-writable")


def check_tenants(ctx: Context) -> Check:
    """Every tenant's files can be read: a damaged tenant's processes fail at cuInit, and it is
    left out of the node's CDI spec (its containers cannot start)."""
    from sharegpu.tenant import iter_tenants, tenant_status

    statuses = [tenant_status(p) for p in iter_tenants(ctx.runtime_dir)] if ctx.runtime_dir.is_dir() else []
    damaged = [s for s in statuses if s.error is not None]
    if damaged:
        first = damaged[0]
        more = (
            f" (and {len(damaged) - 1} more: {', '.join(s.id for s in damaged[1:4])})"
            if len(damaged) > 1
            else ""
        )
        return Check(
            "tenants",
            "fail",
            f"tenant {first.id} cannot be read: {first.error}{more}; its processes cannot use the GPU "
            "and it is left out of the CDI spec",
            f"remove it (DELETE /v1/tenants/{first.id}?force=true on the agent's socket, or "
            f"rm -r {first.path} with no agent) and create it again",
        )
    return Check("tenants", "ok", f"{len(statuses)} tenant(s), every one readable")


CDI_GRACE_S = 5.0  # the agent lists a new tenant within a second or two


def check_cdi_spec(ctx: Context) -> Check:
    """The node's CDI spec lists every readable tenant: one missing from it is a device no
    container can ask for (a stopped agent, a spec another writer replaced)."""
    import json

    from sharegpu.tenant import iter_tenants, tenant_status

    fix = "start the agent (it keeps the spec), or run `sharegpu cdi generate`"
    try:
        doc = json.loads(ctx.cdi_spec.read_text())
        listed = {str(d["name"]) for d in doc["devices"]}
    except FileNotFoundError:
        return Check(
            "cdi-spec",
            "warn",
            f"no CDI spec at {ctx.cdi_spec}: containers cannot ask for a vGPU (`sharegpu run` works)",
            fix,
        )
    except (OSError, ValueError, KeyError, TypeError) as err:
        return Check("cdi-spec", "fail", f"{ctx.cdi_spec} is not a CDI spec sharegpu wrote: {err}", fix)
    paths = list(iter_tenants(ctx.runtime_dir)) if ctx.runtime_dir.is_dir() else []
    now = time.time()
    missing = []
    for path in paths:
        # Only a tenant the spec leaves out is read: it is missing unless it is new or damaged.
        with contextlib.suppress(OSError):
            if path.name in listed or now - path.stat().st_mtime <= CDI_GRACE_S:
                continue
            if tenant_status(path).error is None:
                missing.append(path.name)
    if missing:
        return Check(
            "cdi-spec",
            "fail",
            f"{ctx.cdi_spec} does not list tenant(s) {', '.join(sorted(missing)[:5])}: containers cannot "
            "use them",
            fix,
        )
    return Check("cdi-spec", "ok", f"{ctx.cdi_spec} lists every readable tenant ({len(listed)} devices)")


def check_agent(ctx: Context) -> Check:
    from sharegpu.agent.client import socket_path
    from sharegpu.doors import agent_client, tenant_service

    sock = socket_path(ctx.runtime_dir)
    service = tenant_service(ctx.runtime_dir, timeout=2.0)
    client = agent_client(service)
    if client is None:
        what = "a socket with nothing behind it" if sock.exists() else "no socket"
        return Check(
            "agent",
            "warn",
            f"no agent answers on {sock} ({what}): no reaping, overhead accounting, audit or events",
            f"start it: sharegpu agent --runtime-dir {ctx.runtime_dir} (or its service / DaemonSet)",
        )
    with service:
        health = client.health()
    message = f"agent {health.version} (pid {health.pid}, up {health.uptime_seconds:.0f} s) answers on {sock}"
    if health.version != __version__:
        return Check("agent", "warn", f"{message}; this CLI is {__version__}", "upgrade the agent or the CLI")
    return Check("agent", "ok", message)


def check_preload(ctx: Context) -> Check:
    try:
        lines = [ln.strip() for ln in ctx.etc_preload.read_text().splitlines()]
    except FileNotFoundError:
        lines = []
    except OSError as err:
        return Check("ld-so-preload", "warn", f"{ctx.etc_preload}: {err.strerror}", None)
    ours = [ln for ln in lines if "libsharegpu" in ln]
    if ours:
        missing = [ln for ln in ours if not Path(ln).exists()]
        if missing:
            return Check(
                "ld-so-preload",
                "fail",
                f"{ctx.etc_preload} names {missing[0]}, which does not exist: every process warns",
                f"remove the line or install the shim there (sharegpu upgrade --shim {ctx.package_shim})",
            )
        return Check("ld-so-preload", "ok", f"{ctx.etc_preload} preloads {ours[0]}")
    return Check(
        "ld-so-preload",
        "warn",
        f"{ctx.etc_preload} does not name the shim: on this host only `sharegpu run` tenants are controlled",
        "containers get it as a read-only mount of /etc/ld.so.preload from their CDI spec "
        "(sharegpu.io/vgpu devices); on a bare host start tenants with `sharegpu run`",
    )


def check_clocksource(ctx: Context) -> Check:
    current = ctx.clocksource / "current_clocksource"
    try:
        source = current.read_text().strip()
    except OSError:
        return Check("clocksource", "warn", f"{current} cannot be read", None)
    if source == "tsc":
        return Check("clocksource", "ok", "tsc")
    try:
        available = (ctx.clocksource / "available_clocksource").read_text().split()
    except OSError:
        available = []
    fix = (
        f"echo tsc > {current} (and clocksource=tsc on the kernel command line)"
        if "tsc" in available
        else "a host whose TSC is stable (a launch reads the clock: other sources cost a syscall)"
    )
    return Check("clocksource", "warn", f"{source}: clock reads are slower than with tsc", fix)


MPS_SHM_DIR = "/run/sharegpu/mps-shm"  # the suggested home of a daemon's own /dev/shm (tmpfs)


def check_mps(ctx: Context) -> Check:
    """Whether an MPS control daemon serves this node's pipe directory: only under one does the
    GPU itself serve an online request before offline work (the shim makes offline tenants
    BELOW_NORMAL clients; docs/design/arbitration.md)."""
    daemon = mps.find(ctx.mps_pipe_dir, ctx.proc)
    pipe = ctx.mps_pipe_dir
    if daemon.state == "running":
        shm = mps.shm_of(daemon, ctx.proc)
        if shm.state == "own":
            return Check(
                "mps",
                "ok",
                f"an MPS daemon (pid {daemon.pid}) at {pipe}, its {mps.SHM} at {shm.host_path}: offline "
                "tenants are BELOW_NORMAL clients, in containers too",
            )
        return Check(
            "mps",
            "warn",
            f"an MPS daemon (pid {daemon.pid}) at {pipe}: offline tenants are BELOW_NORMAL clients, but "
            f"containers are not made its clients: {shm.detail}"
            + (" (a container would see every process's shared memory)" if shm.state == "host" else ""),
            f"start the daemon with a {mps.SHM} of its own at a directory of this machine: "
            f"mkdir -p {MPS_SHM_DIR} && unshare --mount sh -c 'mount --bind {MPS_SHM_DIR} {mps.SHM} && "
            f"exec {mps.CONTROL} -d', then run `sharegpu cdi generate` again",
        )
    if daemon.state == "stale":
        return Check(
            "mps",
            "warn",
            f"{daemon.detail}: clients find no MPS daemon",
            f"remove {pipe} and start {mps.CONTROL} -d again",
        )
    if daemon.state == "unreadable":
        return Check("mps", "warn", daemon.detail, f"check {pipe}")
    if daemon.state == "untrusted":
        return Check(
            "mps",
            "warn",
            f"{daemon.detail}: not used (the CDI spec would mount it into every container)",
            f"run the daemon with {mps.PIPE_ENV} set to a directory of its own, mode 0755 or tighter",
        )
    elsewhere = mps.running_elsewhere(ctx.proc)
    if elsewhere:
        return Check(
            "mps",
            "warn",
            f"{mps.CONTROL} runs (pid {elsewhere[0]}) but not at {pipe}: tenants with this "
            "environment are not its clients",
            f"set {mps.PIPE_ENV} to its pipe directory for the agent and the tenants",
        )
    return Check(
        "mps",
        "ok",
        f"no MPS daemon ({pipe}): an online request the arbiter did not predict waits for up to "
        f"the GPU's time slice next to offline work; under `{mps.CONTROL} -d` the GPU serves it first",
    )


CONFLICT_MODULES = ("cgpu", "qgpu")  # Alibaba cGPU (cgpu_km), Tencent qGPU


def check_conflicts(ctx: Context) -> Check:
    found: list[tuple[Status, str]] = []
    try:
        preload = ctx.etc_preload.read_text()
    except OSError:
        preload = ""
    if "libvgpu.so" in preload:
        found.append(("fail", f"HAMi-core's libvgpu.so is in {ctx.etc_preload}"))
    if ctx.vgpu_dir.exists():
        found.append(("warn", f"{ctx.vgpu_dir} exists (HAMi-core installed)"))
    try:
        modules = (ctx.proc / "modules").read_text().splitlines()
    except OSError:
        modules = []
    for line in modules:
        name = line.split(" ", 1)[0]
        if name.startswith(CONFLICT_MODULES):
            found.append(("fail", f"kernel module {name} is loaded (cGPU/qGPU)"))
    if not found:  # an MPS daemon is no conflict: the `mps` check reports it
        return Check("conflicts", "ok", "no HAMi, cGPU or qGPU found")
    status: Status = "fail" if any(s == "fail" for s, _ in found) else "warn"
    return Check(
        "conflicts",
        status,
        "; ".join(text for _, text in found),
        "use one GPU-sharing layer per node: remove the other one (its preload, its daemon, its "
        "kernel module) before running sharegpu tenants",
    )


CHECKS: list[Callable[[Context], Check]] = [
    check_nvml,
    check_driver,
    check_shim_built,
    check_shim_installed,
    check_shim_loads,
    check_runtime_dir,
    check_arbiters,
    check_tenants,
    check_cdi_spec,
    check_agent,
    check_preload,
    check_clocksource,
    check_mps,
    check_conflicts,
]


def run_checks(ctx: Context | None = None) -> list[Check]:
    if ctx is None:
        from sharegpu.tenant import runtime_dir

        ctx = Context(runtime_dir=runtime_dir())
    results = []
    for check in CHECKS:
        try:
            results.append(check(ctx))
        except Exception as err:  # a check that crashes fails, the doctor goes on
            name = check.__name__.removeprefix("check_").replace("_", "-")
            results.append(
                Check(name, "fail", f"the check crashed: {type(err).__name__}: {err}", "report a bug")
            )
    return results


def report_document(results: list[Check]) -> dict[str, Any]:
    return {"version": 1, "kind": "DoctorReport", "items": [asdict(r) for r in results]}


_STYLE = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "red")}


def print_report(results: list[Check], console: Console) -> None:
    for r in results:
        word, style = _STYLE[r.status]
        console.print(
            f"[{style}]{word:<4}[/{style}]  {r.name:<15} {escape(r.message)}", highlight=False, soft_wrap=True
        )
        if r.fix and r.status != "ok":
            console.print(f"{'':<21}fix: {escape(r.fix)}", highlight=False, soft_wrap=True)
    fails = sum(r.status == "fail" for r in results)
    warns = sum(r.status == "warn" for r in results)
    console.print(f"{fails} failed, {warns} warnings, {len(results) - fails - warns} ok", highlight=False)
