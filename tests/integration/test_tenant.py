"""Tenant directories: atomic creation, read-back, robust usage mutex, corrupt files reported."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sharegpu.errors import ConfigError, SpecError, TenantError
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import (
    DeviceLimit,
    create_tenant,
    iter_tenants,
    process_start_time,
    read_limits,
    read_usage,
    remove_tenant,
    tenant_status,
)

UUID0 = "GPU-5a1e0000-0000-4000-8000-000000000000"
UUID1 = "GPU-5a1e0000-0000-4000-8000-000000000001"


def _make(tmp_path: Path, name: str = "t1") -> Path:
    return create_tenant(
        name,
        [
            DeviceLimit(uuid=UUID0, mem_cap_bytes=512 * MIB),
            DeviceLimit(uuid=UUID1, mem_cap_bytes=256 * MIB),
        ],
        root=tmp_path,
        meta={"command": ["true"]},
    )


def test_create_and_read_back(tmp_path: Path) -> None:
    path = _make(tmp_path)
    limits = read_limits(path)
    assert limits.tenant_id == b"t1"
    assert limits.device_count == 2
    assert abi.bytes_to_uuid(bytes(limits.devices[0].uuid)) == UUID0
    assert limits.devices[1].mem_cap_bytes == 256 * MIB
    assert limits.generation % 2 == 0
    usage = read_usage(path)
    assert usage.hdr.magic == abi.MAGIC_USAGE
    assert usage.slot_count == abi.MAX_PROCS
    assert stat.S_IMODE((path / "limits").stat().st_mode) == 0o444
    assert not list(path.glob(".*")), "temporary files left behind"
    status = tenant_status(path)
    assert status.error is None
    assert [d.mem_cap_bytes for d in status.devices] == [512 * MIB, 256 * MIB]
    assert status.meta["command"] == ["true"]
    assert [p.name for p in iter_tenants(tmp_path)] == ["t1"]
    remove_tenant(path)
    assert list(iter_tenants(tmp_path)) == []


_WATCHER = """
import os, sys, time
from pathlib import Path
from sharegpu.tenant import iter_tenants
root, seconds = Path(sys.argv[1]), float(sys.argv[2])
seen = half = 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for path in iter_tenants(root):
        seen += 1
        try:
            os.stat(path / "limits"); os.stat(path / "usage"); os.stat(path / "meta.json")
        except FileNotFoundError:
            if path.exists():  # the tenant is listed and still there, but not whole
                half += 1
print(seen, half)
"""


def test_a_reader_sees_a_whole_tenant_or_none_while_tenants_come_and_go(tmp_path: Path) -> None:
    """Another process listing tenants while this one creates and removes them never finds one
    that is listed but lacks its limits, usage or meta (creation and removal are one rename each)."""
    _make(tmp_path, "warmup")  # the runtime directory exists before the watcher starts
    watcher = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, str(tmp_path), "3"], stdout=subprocess.PIPE, text=True
    )
    made = 0
    while watcher.poll() is None:
        remove_tenant(_make(tmp_path, f"churn{made % 4}"))
        made += 1
    seen, half = map(int, watcher.communicate(timeout=10)[0].split())
    assert made > 20, made
    assert seen > made // 4, (made, seen)  # the watcher did look while tenants churned
    assert half == 0, f"{half} of {seen} listings found a tenant without its files"
    assert [p.name for p in iter_tenants(tmp_path)] == ["warmup"]
    assert not [p for p in (tmp_path / "tenants").glob(".*") if p.is_dir()], "a hidden directory is left"


def test_what_a_killed_creator_or_remover_left_is_swept_by_the_next_creation(tmp_path: Path) -> None:
    """A creator or remover killed between its steps leaves a hidden directory: never listed as a
    tenant, and deleted under the node lock by the next creation."""
    path = _make(tmp_path, "kept")
    base = path.parent
    (base / ".half.new.99999").mkdir()
    (base / ".half.new.99999" / "limits").write_bytes(b"")
    (base / ".old.gone.99999.1").mkdir()
    (base / ".old.gone.99999.1" / "usage").write_bytes(b"")
    assert [p.name for p in iter_tenants(tmp_path)] == ["kept"]
    _make(tmp_path, "next")
    assert sorted(p.name for p in base.iterdir() if p.is_dir()) == ["kept", "next"]
    remove_tenant(path)
    remove_tenant(path)  # twice: the second finds nothing, and says nothing
    assert [p.name for p in iter_tenants(tmp_path)] == ["next"]


def test_duplicate_and_bad_names(tmp_path: Path) -> None:
    _make(tmp_path)
    with pytest.raises(TenantError, match="already exists"):
        _make(tmp_path)
    with pytest.raises(SpecError):
        _make(tmp_path, name="Bad Name")
    with pytest.raises(TenantError, match="at least one GPU"):
        create_tenant("empty", [], root=tmp_path)
    # A failed creation leaves nothing behind.
    assert [p.name for p in iter_tenants(tmp_path)] == ["t1"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(lambda b: b"\0" * len(b), "bad magic", id="zeroed"),
        pytest.param(lambda b: b[:100], "truncated", id="truncated"),
        pytest.param(lambda b: b[:4] + (9).to_bytes(2, "little") + b[6:], "ABI 9", id="other-major"),
        pytest.param(lambda b: b"", "truncated", id="empty"),
    ],
)
def test_corrupt_limits_reported_not_raised(tmp_path: Path, damage, message: str) -> None:  # type: ignore[no-untyped-def]
    path = _make(tmp_path)
    limits = path / "limits"
    data = limits.read_bytes()
    limits.chmod(0o644)
    limits.write_bytes(damage(data))
    with pytest.raises(ConfigError, match=message):
        read_limits(path)
    status = tenant_status(path)
    assert status.error is not None
    assert message in status.error


def test_usage_mutex_is_robust_and_shared(tmp_path: Path) -> None:
    """A process that dies holding the usage lock leaves it recoverable (EOWNERDEAD), not stuck."""
    path = _make(tmp_path)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    fd = os.open(path / "usage", os.O_RDWR)
    view = mmap.mmap(fd, 0)
    os.close(fd)
    region = abi.Usage.from_buffer(view)
    lock = ctypes.c_void_p(ctypes.addressof(region) + abi.Usage.lock.offset)
    pid = os.fork()
    if pid == 0:  # child: take the lock and die without releasing it
        os._exit(0 if libc.pthread_mutex_lock(lock) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert libc.pthread_mutex_lock(lock) == errno.EOWNERDEAD
    assert libc.pthread_mutex_consistent(lock) == 0
    assert libc.pthread_mutex_unlock(lock) == 0
    assert libc.pthread_mutex_lock(lock) == 0
    assert libc.pthread_mutex_unlock(lock) == 0
    del region, lock
    view.close()


_LOCK_HOLDER = """
import fcntl, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
lock = struct.pack("hh4xqqi4x", fcntl.F_WRLCK, os.SEEK_SET, int(sys.argv[2]), 1, 0)
fcntl.fcntl(fd, getattr(fcntl, "F_OFD_SETLK", 37), lock)
print("ready", flush=True)
time.sleep(60)
"""


def test_a_live_process_behind_freed_slots_is_judged_by_its_own_liveness_lock(tmp_path: Path) -> None:
    """Slots are freed as processes exit, so a live process may sit in slot 3 with 0-2 empty: its
    liveness lock is byte LIVE_LOCK_BASE + 3, and that lock, not slot 0's, says it lives."""
    path = _make(tmp_path)
    slot = 3
    holder = subprocess.Popen(
        [sys.executable, "-c", _LOCK_HOLDER, str(path / "usage"), str(abi.LIVE_LOCK_BASE + slot)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        fd = os.open(path / "usage", os.O_RDWR)
        view = mmap.mmap(fd, 0)
        os.close(fd)
        region = abi.Usage.from_buffer(view)
        entry = region.procs[slot]
        entry.pid, entry.start_time = holder.pid, process_start_time(holder.pid) or 0
        entry.flags = abi.ENTRY_LIVE_LOCK
        entry.pidns = 1  # not ours: only the lock can tell
        entry.dev[0].mem_bytes = 64 * MIB
        del region, entry
        view.close()
        (proc,) = tenant_status(path).processes
        assert proc.alive
        assert tenant_status(path).devices[0].mem_used_bytes == 64 * MIB
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    (proc,) = tenant_status(path).processes
    assert not proc.alive  # the kernel dropped its lock: dead, from any namespace


def test_start_time_identifies_processes() -> None:
    mine = process_start_time(os.getpid())
    assert mine is not None
    assert mine > 0
    time.sleep(0.05)  # start times tick at 100 Hz: a later process must differ
    later = subprocess.Popen(["sleep", "5"])
    try:
        assert (process_start_time(later.pid) or 0) > mine
    finally:
        later.kill()
        later.wait()
    assert process_start_time(later.pid) is None
    assert process_start_time(2**22 + 12345) is None


def test_region_files_are_for_the_tenant_owner_and_the_agent_only() -> None:
    """The usage region is its owner's (0600), the GPU's arbiter its creator's plus an ACL entry
    per tenant owner: the owner's processes run; any other user's fail closed."""
    import shutil
    import subprocess
    import tempfile

    from conftest import Sim
    from sharegpu import access, native
    from sharegpu.arbiter import arbiter_path, ensure_arbiter, grant_arbiter

    if os.geteuid() != 0:
        pytest.fail("this test gives files to other users: run it as root (CI does)")
    # Everything the tenant's processes load, where any user can read it (a checkout under
    # /root is not).
    public = Path(tempfile.mkdtemp(prefix="sharegpu-access-"))
    try:
        public.chmod(0o755)
        lib = public / "lib"
        shutil.copytree(native.LIB_DIR, lib)
        sim = Sim(public / "node")
        uuid = sim.uuids()[0]
        sim.state.chmod(0o666)  # the simulated GPU's device node, as /dev/nvidia* is
        sim.root.chmod(0o755)
        owner, stranger = 65534, 65533
        ensure_arbiter(sim.runtime, uuid)
        tenant = create_tenant(
            "t",
            [DeviceLimit(uuid=uuid, mem_cap_bytes=64 * MIB, policy=abi.POLICY_SHARE)],
            root=sim.runtime,
            owner=owner,
        )
        assert grant_arbiter(sim.runtime, uuid, owner)
        usage, arbiter = os.stat(tenant / abi.USAGE_FILE), arbiter_path(sim.runtime, uuid)
        assert (usage.st_uid, usage.st_mode & 0o777) == (owner, 0o600)
        assert os.stat(arbiter).st_mode & 0o007 == 0
        assert access.acl_users(arbiter) == {owner}

        def run_as(uid: int, *args: str) -> subprocess.CompletedProcess[str]:
            env = sim.env(
                LD_PRELOAD=str(lib / "libsharegpu.so"),
                LD_LIBRARY_PATH=str(lib / "simgpu"),
                SHAREGPU_TENANT=str(tenant),
            )
            cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", str(lib / "sgprobe")]
            cmd += args
            return subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=60)

        mine = run_as(owner, "alloc", "plain", "1M")
        assert mine.returncode == 0, mine.stderr
        assert "alloc=OK" in mine.stdout
        launched = run_as(owner, "launch", "2", "100")  # through the GPU's arbiter (its ACL)
        assert launched.returncode == 0, launched.stderr
        assert access.acl_users(arbiter) == {owner}
        theirs = run_as(stranger, "alloc", "plain", "1M")
        assert theirs.returncode != 0
        (line,) = [x for x in theirs.stderr.splitlines() if x.strip()]
        assert line.startswith("sharegpu: ")
        assert "Permission denied" in line
    finally:
        shutil.rmtree(public, ignore_errors=True)
