"""The stall breaker: a process stopped inside a shared region's critical section is killed.

Each tenant's usage region and each GPU's arbiter region is guarded by a robust process-shared
mutex whose critical sections last microseconds. A process stopped inside one (SIGSTOP, a
debugger, a frozen cgroup: `docker pause`) keeps it for as long as it stays stopped, and every
process that needs it waits: the tenant's allocations (refused after 2 s), every launch on that
GPU that takes the arbiter's slow path, whichever tenant it belongs to. The kernel gives a
robust mutex back only when its owner dies, so the agent ends such a stall the one way that
leaves the region consistent: it kills the stopped owner (SIGKILL); the next locker gets
EOWNERDEAD and repairs the region, exactly as after a crash.

A lock is judged stalled only when, at every look over at least ``stall_s``, the same thread
holds it and is not running: stopped (state T or t in /proc), asleep (S, D: no critical section
sleeps; a tenant that takes the lock and waits is attacking its neighbours) or in a frozen
cgroup. A process that is merely busy (running at a look), or stopped anywhere but inside a
critical section (the usual `docker pause`), is never touched; nor is the agent itself.

The owner is found from the mutex's futex word: glibc keeps the owner's thread id there, as the
owner's own pid namespace numbers it. Among the processes that have the region file mapped (by
device and inode, whatever path their mount namespace shows it at), the owner is the thread
whose innermost NSpid is that id.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sharegpu.agent.events import Event
from sharegpu.arbiter import iter_arbiters
from sharegpu.cgroup import unified_path
from sharegpu.errors import ConfigError
from sharegpu.regions import abi
from sharegpu.regions.mapping import mapped
from sharegpu.tenant import gpus_dir, iter_tenants, tenants_dir

log = logging.getLogger(__name__)

FUTEX_TID_MASK = 0x3FFFFFFF  # the owner's thread id in a robust futex word (linux/futex.h)
STALL_S = 2.0  # how long a stopped owner may hold a region lock
REGIONS_REFRESH_S = 5.0  # the list of regions is made again at least this often


@dataclass(frozen=True)
class Holder:
    pid: int  # host pid of the owning process
    tid: int  # host thread id of the owning thread


@dataclass(frozen=True)
class Suspect:
    """A region lock's owner under watch."""

    tid: int  # the owner as the futex word names it (its waiters bit may come and go)
    holder: Holder | None = None  # found (a pass over /proc) from the second look on
    since: float = 0.0  # when the holder was first seen stalled


def judge(
    suspect: Suspect | None,
    tid: int,
    now: float,
    *,
    stall_s: float,
    find: Callable[[int], Holder | None],
    is_stalled: Callable[[Holder], bool],
) -> tuple[Suspect | None, Holder | None]:
    """One look at a region lock whose futex word names owner `tid` (0: free): the suspect to
    keep (None: nothing to watch) and the holder to kill (None: none). A lock held at one look
    is usually a busy one: only an owner seen at two looks in a row is looked for (`find`, a
    pass over /proc), and only one stalled (`is_stalled`: stopped, or asleep) for `stall_s`
    from then is killed.  Pure, given `find` and `is_stalled` (the tests pass fakes)."""
    if not tid:
        return None, None
    if suspect is None or suspect.tid != tid:
        return Suspect(tid=tid), None
    if suspect.holder is None:
        holder = find(tid)
        if holder is None or not is_stalled(holder):
            return None, None
        return Suspect(tid, holder, now), None
    if not is_stalled(suspect.holder):
        return None, None  # it runs: the lock will be given back
    if now - suspect.since < stall_s:
        return suspect, None
    return None, suspect.holder


def lock_word(path: Path, offset: int) -> int:
    """The futex word of the region's mutex (0: free). Read through the cached mapping (two
    looks a second at every region: a stat, not an open, a read and a close)."""
    return int.from_bytes(mapped(path)[offset : offset + 4], "little")


def counter(path: Path, offset: int) -> int:
    """A region's 64-bit counter at `offset` (written atomically: a read sees a whole value)."""
    return int.from_bytes(mapped(path)[offset : offset + 8], "little")


def _mapping_pids(dev: int, inode: int) -> list[int]:
    """Processes that have the file (device, inode) mapped."""
    want = f"{os.major(dev):02x}:{os.minor(dev):02x} {inode} "
    pids = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/maps", encoding="ascii", errors="replace") as f:
                    if any(want in line for line in f):
                        pids.append(int(entry.name))
            except OSError:
                continue  # gone, or not ours to read
    return pids


def _innermost_tid(pid: int, tid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        return None
    return None


def find_holder(path: Path, owner_tid: int) -> Holder | None:
    """The thread, among the processes mapping `path`, whose own namespace calls it owner_tid."""
    try:
        st = path.stat()
    except OSError:
        return None
    for pid in _mapping_pids(st.st_dev, st.st_ino):
        with contextlib.suppress(OSError):
            for task in os.scandir(f"/proc/{pid}/task"):
                if task.name.isdigit() and _innermost_tid(pid, int(task.name)) == owner_tid:
                    return Holder(pid=pid, tid=int(task.name))
    return None


def _frozen(pid: int) -> bool:
    """The process's cgroup (v2) is frozen: `docker pause`, `podman pause`, the kubelet."""
    unified = unified_path(pid)
    if unified is None:
        return False
    try:
        return "frozen 1" in (Path("/sys/fs/cgroup") / unified.lstrip("/") / "cgroup.events").read_text()
    except OSError:
        return False


def stalled(holder: Holder) -> bool:
    """The owning thread is not running: stopped by a signal (T) or a tracer (t), asleep (S, D),
    or in a frozen cgroup."""
    try:
        stat = Path(f"/proc/{holder.pid}/task/{holder.tid}/stat").read_text()
    except OSError:
        return False
    state = stat[stat.rfind(")") + 2 : stat.rfind(")") + 3]
    return state in ("T", "t", "S", "D") or _frozen(holder.pid)


class StallBreaker:
    """Kills a process that stays stopped (or asleep) while it holds a region's lock."""

    name = "stalls"

    def __init__(self, root: Path, *, interval_s: float = 0.5, stall_s: float = STALL_S) -> None:
        self.root = root
        self.interval_s = interval_s
        self.stall_s = stall_s
        self._suspects: dict[Path, Suspect] = {}
        self._token_stalls: dict[tuple[int, int], int] = {}  # an arbiter file's stall_reclaims seen
        self._listed: tuple[int, ...] | None = None
        self._found: list[tuple[Path, int, str | None, str | None]] = []

    def _listing_key(self) -> tuple[int, ...]:
        """What says the list of regions may have changed: the mtimes of the tenants' and the
        GPUs' directories (a tenant or a GPU made or removed changes an entry there), and a
        REGIONS_REFRESH_S bucket of time for what they do not show (an arbiter file made in a GPU
        directory already there, two changes within the clock's tick)."""
        stamps = []
        for directory in (tenants_dir(self.root), gpus_dir(self.root)):
            try:
                stamps.append(os.stat(directory).st_mtime_ns)
            except OSError:
                stamps.append(0)
        return (*stamps, int(time.monotonic() // REGIONS_REFRESH_S))

    def _regions(self) -> list[tuple[Path, int, str | None, str | None]]:
        """(file, mutex offset, tenant, gpu) of every region with a lock: listed again only when
        the directories changed (two looks a second at 50 tenants spent a third of their time
        listing them and making their paths)."""
        key = self._listing_key()
        if key != self._listed:
            found: list[tuple[Path, int, str | None, str | None]] = [
                (tenant / abi.USAGE_FILE, abi.Usage.lock.offset, tenant.name, None)
                for tenant in iter_tenants(self.root)
            ]
            found += [
                (path, abi.Arbiter.lock.offset, None, path.parent.name) for path in iter_arbiters(self.root)
            ]
            self._found, self._listed = found, key
        return self._found

    def tick(self) -> list[Event]:
        events = []
        now = time.monotonic()
        seen = set()
        for path, offset, tenant, gpu in self._regions():
            seen.add(path)
            try:
                word = lock_word(path, offset)
            except (OSError, ConfigError):
                continue
            suspect, kill = judge(
                self._suspects.get(path),
                word & FUTEX_TID_MASK,
                now,
                stall_s=self.stall_s,
                find=functools.partial(self._find_other, path),
                is_stalled=stalled,
            )
            if kill is not None:
                since = self._suspects[path].since
                events.append(self._kill(path, kill, now - since, tenant, gpu))
            if suspect is None:
                self._suspects.pop(path, None)
            else:
                self._suspects[path] = suspect
        for gone in set(self._suspects) - seen:
            del self._suspects[gone]
        return events + self._token_stall_events()

    @staticmethod
    def _find_other(path: Path, tid: int) -> Holder | None:
        """The lock's owner, unless it is this agent itself."""
        holder = find_holder(path, tid)
        return None if holder is None or holder.pid == os.getpid() else holder

    def _token_stall_events(self) -> list[Event]:
        """An event for each GPU whose token the waiters took back from a holder stopped past its
        quantum since the last look (SIGSTOP, `docker pause`): the card stood idle for up to a
        second, which only the region's counter said (issue 36).  The first look at a region
        only learns its count."""
        events, seen = [], {}
        for path, _, _, gpu in self._regions():
            if gpu is None:
                continue  # a tenant's usage region
            try:
                st = path.stat()
                count = counter(path, abi.Arbiter.stall_reclaims.offset)
            except (OSError, ConfigError):
                continue
            key = (st.st_dev, st.st_ino)  # a rebuilt region counts from 0 again
            seen[key] = count
            before = self._token_stalls.get(key)
            if before is None or count <= before:
                continue
            message = (
                f"GPU {gpu}: the token was taken back from a holder stopped past its quantum "
                f"{count - before} time(s) (the card idled until then; {count} in all)"
            )
            log.warning("%s", message)
            events.append(
                Event(
                    kind="gpu.token_stall_reclaimed",
                    severity="warning",
                    gpu=gpu,
                    message=message,
                    data={"new": count - before, "total": count},
                )
            )
        self._token_stalls = seen
        return events

    def _kill(
        self, path: Path, holder: Holder, stalled_s: float, tenant: str | None, gpu: str | None
    ) -> Event:
        pid = holder.pid
        region = "usage" if tenant else "arbiter"
        held_s = round(stalled_s, 1)
        try:
            os.kill(pid, signal.SIGKILL)
            outcome = "killed it"
        except ProcessLookupError:
            outcome = "it was already gone"
        except PermissionError as err:
            outcome = f"could not kill it ({err})"
        where = f"tenant {tenant}'s usage region" if tenant else f"GPU {gpu}'s arbiter region"
        message = (
            f"process {pid} held the lock of {where} for {held_s} s without running, blocking "
            f"every process that needs it: {outcome}"
        )
        log.warning("%s", message)
        return Event(
            kind="process.lock_holder_killed",
            severity="warning",
            tenant=tenant,
            gpu=gpu,
            pid=pid,
            message=message,
            data={"region": region, "path": str(path), "tid": holder.tid, "stopped_s": held_s},
        )
