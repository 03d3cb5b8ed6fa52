"""`sharegpu agent`: recover, serve the API on the Unix socket, run the periodic loops.

Start-up: one agent per runtime directory and per state directory (flocks); a socket file left
by an agent that died is replaced, one that answers is not (another agent runs: refuse). Then
GPU discovery, recovery (the store against the tenant directories), the socket (bound under a
temporary name with mode 0660, then renamed into place), the loops, the server.

The loops: GPU discovery every few seconds (gpu.added / gpu.removed), the store sync every
couple of seconds (tenants made by `sharegpu run` without the agent are adopted), and whatever
`sharegpu.agent.loops.build_loops` returns (the sweep, which runs the reaper, reconciler, audit,
QoS and GPU-time loops on one read of the node; the stall breaker), each tick in a worker thread
every `interval_s`, an exception logged and the loop continued.

SIGTERM or SIGINT stops it cleanly (event "agent.stopped"). Nothing a tenant needs depends on
the agent: SIGKILL stops it just as well, and the next start recovers every tenant.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from sharegpu import __version__
from sharegpu.agent.api import build_app
from sharegpu.agent.busy import BusyMeter
from sharegpu.agent.client import SOCKET_NAME
from sharegpu.agent.cpulatency import LATENCY_WHILE, CpuLatencyRequest, OnlineLatency
from sharegpu.agent.events import Event, Loop
from sharegpu.agent.loops import build_loops
from sharegpu.agent.notify import Notifier
from sharegpu.agent.service import AgentService, LoopStats
from sharegpu.agent.store import Store
from sharegpu.agent.sweep import Sweep
from sharegpu.agent.tuning import ArbiterTuner, ArbiterTuning
from sharegpu.agent.upgrade import current_shim, ensure_installed
from sharegpu.errors import AgentError
from sharegpu.service.settings import write_arbiter_settings
from sharegpu.tenant import write_admission_policy

log = logging.getLogger("sharegpu.agent")

ENFORCE_MODES = ("report", "kill")
_UDS_PATH_MAX = 107  # sun_path is 108 bytes with the NUL


@dataclass(frozen=True)
class Settings:
    runtime_dir: Path
    state_dir: Path
    enforce: str = "report"
    allow_overcommit: bool = False
    gpu_scan_interval_s: float = 3.0
    sync_interval_s: float = 2.0
    metrics_port: int = 0  # 0: no metrics endpoint (the CLI's default is metrics.DEFAULT_PORT)
    metrics_address: str = "0.0.0.0"
    qos_target_wait_ms: float = 2.0
    # A PM QoS request (sharegpu.agent.cpulatency); None: none. Held while the agent runs
    # ("agent") or while a tenant of priority online is on the node ("online").
    cpu_wakeup_latency_us: int | None = None
    cpu_wakeup_latency_while: str = "agent"
    # Arbiter settings per GPU UUID or "default" (sharegpu.agent.tuning), kept by a loop.
    arbiter: Mapping[str, ArbiterTuning] = field(default_factory=dict)
    # Loops of the layers above the agent (the CDI spec keeper), built by the CLI.
    extra_loops: tuple[Loop, ...] = ()


def run_agent(settings: Settings) -> int:
    """Run the agent until SIGTERM/SIGINT; returns the exit status (0 after a clean stop)."""
    if settings.enforce not in ENFORCE_MODES:
        raise AgentError(f"invalid --enforce {settings.enforce!r}: use report or kill")
    if settings.cpu_wakeup_latency_while not in LATENCY_WHILE:
        raise AgentError(
            f"invalid cpu_wakeup_latency_while {settings.cpu_wakeup_latency_while!r}: use agent or online"
        )
    # The region readers import numpy on first use (the container hooks import them and never
    # read a region): the agent pays for it now, not in its first API request (it was the
    # 100 ms of the create p99).
    import numpy  # noqa: F401

    return asyncio.run(_main(settings))


# ---------------------------------------------------------------------------------------------
# Start-up checks.


@contextlib.contextmanager
def _exclusive(path: Path, what: str) -> Iterator[None]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise AgentError(f"cannot use {path.parent}: {err.strerror}") from err
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            holder = ""
            with contextlib.suppress(OSError, ValueError):
                holder = f" (pid {int(os.pread(fd, 32, 0).decode().strip())})"
            raise AgentError(f"another agent{holder} already uses {what}") from err
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _answers(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError as err:
            return err.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    return True


def _bind(path: Path) -> socket.socket:
    """Listen on `path` with mode 0660: bound under a temporary name, then renamed into place,
    so the socket never exists with looser permissions."""
    if len(str(path).encode()) > _UDS_PATH_MAX:
        raise AgentError(
            f"the socket path {path} is longer than {_UDS_PATH_MAX} bytes: use a shorter --runtime-dir"
        )
    if path.exists() or path.is_symlink():
        if not path.is_socket():
            raise AgentError(f"{path} exists and is not a socket: move it away")
        if _answers(path):
            raise AgentError(f"another agent answers on {path}: stop it first")
        path.unlink()  # left by an agent that died
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(tmp))
        os.chmod(tmp, 0o660)
        sock.listen(128)
        os.replace(tmp, path)
    except OSError as err:
        sock.close()
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise AgentError(f"cannot listen on {path}: {err.strerror}") from err
    sock.setblocking(False)
    return sock


# ---------------------------------------------------------------------------------------------
# Loops.


def _loops(settings: Settings, store: Store) -> list[Loop]:
    """The reaper, reconciler, audit and QoS loops (sharegpu.agent.loops), and the extra ones."""
    try:
        built = list(
            build_loops(
                settings.runtime_dir,
                enforce=settings.enforce,
                store=store,
                qos_target_wait_ms=settings.qos_target_wait_ms,
            )
        )
    except Exception as err:  # the API and recovery still work without the loops
        log.error("no periodic loops: building them failed: %s: %s", type(err).__name__, err)
        built = []
    return built + list(settings.extra_loops)


def _sweep_of(loops: list[Loop], root: Path) -> Sweep:
    """The sweep among `loops` (the agent adds its GPU-time loop to it); a new one, added to
    `loops`, when building the loops failed."""
    for loop in loops:
        if isinstance(loop, Sweep):
            return loop
    sweep = Sweep(root)
    loops.append(sweep)
    return sweep


class Stop:
    """The agent's stop flag, with a sleep that ends early when it is set.

    Cheaper than `asyncio.wait_for(event.wait(), t)`, which makes a task and cancels it at every
    wake: the periodic jobs and uvicorn's own 10 Hz timer woke an idle agent's event loop about
    60 times a second, most of its idle CPU. Here a sleep is one timer and one future."""

    def __init__(self) -> None:
        self._set = False
        self._sleepers: set[asyncio.Future[None]] = set()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        for woke in self._sleepers:
            if not woke.done():
                woke.set_result(None)

    async def sleep(self, seconds: float) -> None:
        """Sleep `seconds`, or until set (at once when already set)."""
        if self._set:
            return
        woke: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = asyncio.get_running_loop().call_later(seconds, _wake, woke)
        self._sleepers.add(woke)
        try:
            await woke
        finally:
            timer.cancel()
            self._sleepers.discard(woke)


def _wake(woke: asyncio.Future[None]) -> None:
    if not woke.done():
        woke.set_result(None)


async def _every(
    name: str,
    interval_s: float,
    step: Callable[[], Awaitable[None]],
    stats: LoopStats,
    stop: Stop,
) -> None:
    while not stop.is_set():
        began = time.monotonic()
        try:
            await step()
            stats.ticks += 1
            stats.last_tick = time.time()
        except Exception as err:
            stats.errors += 1
            stats.last_error = f"{type(err).__name__}: {err}"
            log.warning("loop %s failed (retried in %.1f s): %s", name, interval_s, stats.last_error)
        await stop.sleep(max(interval_s - (time.monotonic() - began), 0.01))


def _schedule(
    service: AgentService,
    settings: Settings,
    loops: list[Loop],
    stop: Stop,
    on_events: Callable[[list[Event]], None] | None = None,
) -> list[asyncio.Task[None]]:
    jobs: list[tuple[str, float, Callable[[], Awaitable[None]]]] = []

    async def scan() -> None:
        await service.scan_gpus()

    async def sync() -> None:
        await service.sync()

    jobs.append(("gpus", settings.gpu_scan_interval_s, scan))
    jobs.append(("sync", settings.sync_interval_s, sync))
    for loop in loops:
        if isinstance(loop, Sweep):
            # Its loops' figures are its members' own (and the snapshot's): the sweep's entry
            # counts its ticks, not a CPU figure that would count them twice.
            service.loops.update(loop.stats)
            stats = service.loops.setdefault(loop.name, LoopStats(interval_s=loop.interval_s))
        else:
            stats = service.loops.setdefault(
                loop.name, LoopStats(interval_s=loop.interval_s, cpu_seconds=0.0)
            )

        def timed(loop: Loop = loop, stats: LoopStats = stats) -> list[Event]:
            began = time.thread_time()  # this worker thread's CPU: the loop's own cost
            try:
                return list(loop.tick())
            finally:
                if stats.cpu_seconds is not None:
                    stats.cpu_seconds += time.thread_time() - began

        async def tick(timed: Callable[[], list[Event]] = timed) -> None:
            stored = await service.record(await asyncio.to_thread(timed))
            if on_events is not None:
                on_events(stored)

        jobs.append((loop.name, loop.interval_s, tick))
    tasks = []
    for name, interval, step in jobs:
        stats = service.loops.setdefault(name, LoopStats(interval_s=interval))
        tasks.append(asyncio.create_task(_every(name, interval, step, stats, stop), name=f"loop-{name}"))
    return tasks


# ---------------------------------------------------------------------------------------------
# The metrics endpoint.


def _start_metrics(
    settings: Settings, service: AgentService, sweep: Sweep
) -> tuple[Any, Callable[[list[Event]], None] | None]:
    """Serve metrics if asked (adds the online-wait sampler to `sweep`): the server (or None)
    and what counts the loops' events. A port that cannot be bound is logged, not fatal: the
    tenants need the agent, not its metrics (and Prometheus's `up` says the scrape failed)."""
    if not settings.metrics_port:
        return None, None
    from sharegpu.agent import metrics
    from sharegpu.devices import driver_version

    counts = metrics.EventCounts()
    sampler = metrics.OnlineWaitSampler(settings.runtime_dir)
    collector = metrics.SharegpuCollector(
        settings.runtime_dir,
        service.store.tenants,
        service.gpu_source,
        loops=service.loops,
        counts=counts,
        sampler=sampler,
        driver=driver_version,
        gpu_time=service.meter.snapshot if service.meter else None,
    )
    try:
        server = metrics.MetricsServer(
            metrics.build_registry(collector), settings.metrics_address, settings.metrics_port
        )
    except AgentError as err:
        log.error("no metrics: %s", err)
        return None, None
    sweep.add(sampler)
    log.info("metrics on http://%s:%d/metrics", settings.metrics_address, server.port)
    return server, counts.observe


# ---------------------------------------------------------------------------------------------
# systemd (Type=notify): READY once serving, STATUS now and then, WATCHDOG from the event loop.


def _status_line(service: AgentService) -> str:
    gpus = len(service.known_gpus or [])
    return f"{service.tenant_count()} tenant(s) on {gpus} GPU(s)"


async def _keep_notifying(notifier: Notifier, service: AgentService, stop: Stop) -> None:
    if not notifier.enabled:
        return
    # From the event loop itself, so a wedged loop stops the pings and systemd restarts the agent.
    period = min(notifier.watchdog_s or 10.0, 10.0)
    while not stop.is_set():
        notifier.send(status=_status_line(service), **({"watchdog": 1} if notifier.watchdog_s else {}))
        await stop.sleep(period)


# ---------------------------------------------------------------------------------------------
# The server.


class _Server(uvicorn.Server):
    """uvicorn, minus its signal handling: the agent handles SIGTERM/SIGINT itself (uvicorn's
    would re-raise the signal after shutdown, and the agent would not exit 0)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.woken = Stop()  # set with should_exit, so that main_loop sees it at once

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def exit(self) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True
        self.woken.set()

    async def main_loop(self) -> None:
        # uvicorn's own wakes every 0.1 s to look at should_exit; exit() wakes this one, so once
        # a second is enough (on_tick refreshes the Date header at every 10th count).
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000
            await self.woken.sleep(1.0)
            should_exit = await self.on_tick(counter)


async def _main(settings: Settings) -> int:
    root = settings.runtime_dir
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as err:
        raise AgentError(f"cannot create the runtime directory {root}: {err.strerror}") from err
    sock_path = root / SOCKET_NAME
    with (
        _exclusive(root / "agent.lock", f"the runtime directory {root}"),
        _exclusive(settings.state_dir / "agent.lock", f"the state directory {settings.state_dir}"),
    ):
        store = Store(settings.state_dir)
        us = settings.cpu_wakeup_latency_us
        cpu_latency = CpuLatencyRequest(us) if us is not None else None
        try:
            if cpu_latency and settings.cpu_wakeup_latency_while == "agent":
                in_force = cpu_latency.hold()
                log.info("CPUs wake within %d µs while the agent runs (requested %d µs)", in_force, us)
            elif cpu_latency:
                cpu_latency.check()  # a node that cannot take it stops the agent now, not later
                log.info("CPUs will wake within %d µs while a tenant of priority online is on the node", us)
            # Tenant processes preload <runtime>/shim/libsharegpu.so, a link that `sharegpu
            # upgrade` swaps; the first agent on a node installs the package's own build there.
            shim = ensure_installed(root)
            log.info("tenant processes load %s -> %s", shim, current_shim(root))
            return await _serve(settings, store, sock_path, cpu_latency)
        finally:
            if cpu_latency:
                cpu_latency.release()
            store.close()


async def _serve(
    settings: Settings, store: Store, sock_path: Path, cpu_latency: CpuLatencyRequest | None = None
) -> int:
    root = settings.runtime_dir
    service = AgentService(root, store, allow_overcommit=settings.allow_overcommit, enforce=settings.enforce)
    write_admission_policy(root, allow_overcommit=settings.allow_overcommit)
    service.tuner = ArbiterTuner(root, settings.arbiter)
    # The same settings for tenants created without the agent (sharegpu.service.settings).
    write_arbiter_settings(root, service.tuner.settings())
    await service.scan_gpus()
    recovered = await service.sync(initial=True)
    sock = _bind(sock_path)
    bound = os.stat(sock_path).st_ino
    config = uvicorn.Config(
        build_app(service),
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=3,
    )
    server = _Server(config)
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        service.release_waiters()
        server.exit()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    stop = Stop()
    loops = _loops(settings, store)
    sweep = _sweep_of(loops, root)
    service.meter = BusyMeter(root)  # GPU time per tenant, integrated from NVML
    sweep.add(service.meter)
    if cpu_latency is not None and settings.cpu_wakeup_latency_while == "online":
        sweep.add(OnlineLatency(root, cpu_latency))  # held from the first sweep that sees one
    loops.append(service.tuner)  # its first tick: at once, below
    metrics_server, on_events = _start_metrics(settings, service, sweep)
    tasks = _schedule(service, settings, loops, stop, on_events)
    gpus = service.known_gpus or []
    adopted = sum(1 for e in recovered if e.kind == "tenant.recovered" and e.data.get("adopted"))
    dropped = sum(1 for e in recovered if e.kind == "tenant.deleted")
    tenants = service.tenant_count()
    await service.record(
        [
            Event(
                kind="agent.started",
                message=f"agent {__version__} started (pid {os.getpid()}) on {sock_path}: "
                f"{len(gpus)} GPU(s), {tenants} tenant(s) ({adopted} adopted, {dropped} forgotten)",
                data={
                    "pid": os.getpid(),
                    "version": __version__,
                    "socket": str(sock_path),
                    "state_dir": str(settings.state_dir),
                    "gpus": [g.uuid for g in gpus],
                    "tenants": tenants,
                    "adopted": adopted,
                    "forgotten": dropped,
                    "loops": list(service.loops),
                    "enforce": settings.enforce,
                    "allow_overcommit": settings.allow_overcommit,
                    "arbiter": {k: t.model_dump() for k, t in service.tuner.tunings.items()},
                    "metrics_port": metrics_server.port if metrics_server else None,
                    "cpu_wakeup_latency_us": settings.cpu_wakeup_latency_us,
                    "cpu_wakeup_latency_while": settings.cpu_wakeup_latency_while,
                },
            )
        ]
    )
    notifier = Notifier()
    notifier.ready(_status_line(service))  # state recovered, socket bound and listening
    tasks.append(asyncio.create_task(_keep_notifying(notifier, service, stop), name="sd-notify"))
    try:
        await server.serve(sockets=[sock])
    finally:
        notifier.stopping(f"stopping ({signal.Signals(received[0]).name})" if received else "stopping")
        notifier.close()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if metrics_server is not None:
            await asyncio.to_thread(metrics_server.stop)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        why = f"signal {signal.Signals(received[0]).name}" if received else "shutdown"
        await service.record(
            [Event(kind="agent.stopped", message=f"agent stopped ({why})", data={"pid": os.getpid()})]
        )
        sock.close()
        with contextlib.suppress(OSError):
            if os.stat(sock_path).st_ino == bound:
                sock_path.unlink()
    return 0
