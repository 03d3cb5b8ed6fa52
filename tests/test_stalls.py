"""The stall breaker, through the running agent: a process stopped inside a region's critical
section is killed so that the others run again; a stopped process that holds no lock is not.

The stopped holder is a real process that takes the region's robust mutex the way the shim
does (pthread_mutex_lock on the shared mapping) and stops itself while holding it, as a
process frozen at the wrong instant by SIGSTOP, a debugger or `docker pause` would be.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from agentutil import Agent
from conftest import Sim, parse_kv
from sharegpu import abi
from sharegpu.arbiter import arbiter_path, ensure_arbiter
from sharegpu.spec import MIB
from sharegpu.tenant import DeviceLimit, create_tenant, read_usage

HOLDER = textwrap.dedent(
    """
    import ctypes, mmap, os, signal, sys
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(sys.argv[1], os.O_RDWR)
    region = mmap.mmap(fd, os.fstat(fd).st_size)
    mutex = (ctypes.c_char * 64).from_buffer(region, int(sys.argv[2]))
    print("locked=%d" % libc.pthread_mutex_lock(ctypes.byref(mutex)), flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen inside the critical section
    libc.pthread_mutex_unlock(ctypes.byref(mutex))
    """
)


def stopped_holder(region: Path, offset: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(region), str(offset)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "locked=0"
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the holder never stopped"
        time.sleep(0.01)
    return proc


def wait_killed(proc: subprocess.Popen[str], timeout: float) -> float:
    start = time.monotonic()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the stopped holder was not killed within {timeout} s") from None
    assert proc.returncode == -signal.SIGKILL
    return time.monotonic() - start


def finish(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.communicate(timeout=30)


def test_a_holder_stopped_in_the_usage_lock_is_killed_and_allocations_resume(
    sim: Sim, tmp_path: Path
) -> None:
    tenant = sim.tenant("t", 64, gpus=[0])
    agent = Agent(sim, tmp_path / "state").start()
    holder = stopped_holder(tenant / abi.USAGE_FILE, abi.Usage.lock.offset)
    try:
        recoveries = read_usage(tenant).recoveries
        took = wait_killed(holder, timeout=15)
        assert took < 10
        res = sim.probe("alloc", "plain", "32M", env=sim.tenant_env(tenant))
        assert res.all("alloc") == ["OK"]  # the lock is free again: the region was repaired
        assert read_usage(tenant).recoveries == recoveries + 1  # EOWNERDEAD: totals recomputed
        (event,) = agent.events(kind="process.lock_holder_killed")
        assert event["pid"] == holder.pid
        assert event["tenant"] == "t"
        assert event["data"]["region"] == "usage"
        assert event["data"]["stopped_s"] >= 2.0
    finally:
        finish(holder)
        agent.close()


def test_a_holder_stopped_in_the_arbiter_lock_no_longer_blocks_other_tenants(
    sim: Sim, tmp_path: Path
) -> None:
    """Another tenant's first launch needs the arbiter's lock: it waits until the agent has
    killed the stopped holder, then runs."""
    uuid = sim.uuids()[0]
    limit = DeviceLimit(
        uuid=uuid, mem_cap_bytes=256 * MIB, policy=abi.POLICY_SHARE, share_permille=500, ceiling_permille=500
    )
    tenant = create_tenant("b", [limit], root=sim.runtime)
    ensure_arbiter(sim.runtime, uuid)
    agent = Agent(sim, tmp_path / "state").start()
    holder = stopped_holder(arbiter_path(sim.runtime, uuid), abi.Arbiter.lock.offset)
    launcher = sim.spawn_probe("launch", "3", "100", env=sim.tenant_env(tenant))
    try:
        wait_killed(holder, timeout=15)
        out, err = launcher.communicate(timeout=30)
        assert launcher.returncode == 0, err
        assert parse_kv(out)[0]["kernels"] == "3"
        (event,) = agent.events(kind="process.lock_holder_killed")
        assert event["pid"] == holder.pid
        assert event["gpu"] == uuid
        assert event["data"]["region"] == "arbiter"
    finally:
        finish(holder, launcher)
        agent.close()


def test_a_stopped_process_outside_the_locks_is_left_alone(sim: Sim, tmp_path: Path) -> None:
    """The usual `docker pause`: frozen between calls, holding memory but no lock."""
    tenant = sim.tenant("t", 64, gpus=[0])
    paused = sim.spawn_probe("hold", "plain", "16M", "60", env=sim.tenant_env(tenant))
    agent = Agent(sim, tmp_path / "state").start()
    try:
        assert paused.stdout is not None
        assert paused.stdout.readline().strip() == "ready=1"
        paused.send_signal(signal.SIGSTOP)
        time.sleep(4)  # two stall windows of the breaker
        assert paused.poll() is None
        assert agent.events(kind="process.lock_holder_killed") == []
        res = sim.probe("alloc", "plain", "32M", env=sim.tenant_env(tenant))
        assert res.all("alloc") == ["OK"]  # nobody waits on a paused process
    finally:
        finish(paused)
        agent.close()
