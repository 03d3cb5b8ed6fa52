"""The per-GPU arbiter region as files: made once and race-free, its tunables checked and written
in place. No process and no simulated GPU: the region of a GPU named by its UUID under a runtime
directory of the test's own (the compute tests with real processes are
tests/integration/test_arbiter.py).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import pytest

from sharegpu.arbiter import (
    TUNABLES,
    Tunables,
    arbiter_path,
    check_tunables,
    ensure_arbiter,
    read_arbiter,
    tune_arbiter,
)
from sharegpu.errors import ConfigError, SpecError
from sharegpu.regions import abi

# Two GPUs in NVML's form (lower-case hex, so that the upper-case spelling is another string).
UUIDS = ("GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d", "GPU-5d4c3b2a-1f0e-9d8c-7b6a-5f4e3d2c1b0a")

# ---------------------------------------------------------------------------------------------
# the region


def test_ensure_arbiter_is_idempotent_and_race_free(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    uuid = UUIDS[0]
    paths: list[Path] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            paths.append(ensure_arbiter(runtime, uuid, quantum_ns=4_000_000))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(paths)) == 1
    path = paths[0]
    assert path == runtime / "gpus" / uuid / "arbiter"
    assert [p.name for p in path.parent.iterdir()] == ["arbiter"]  # no temporary file left
    inode = path.stat().st_ino
    assert ensure_arbiter(runtime, "GPU-" + uuid[4:].upper()) == path  # canonical form
    assert path.stat().st_ino == inode  # never rewritten
    status = read_arbiter(path)
    assert status.uuid == uuid
    assert status.quantum_ns == 4_000_000  # the creator's quantum
    assert status.offline_inflight_max == abi.ARB_DEFAULT_OFFLINE_INFLIGHT
    assert status.holder_pid is None
    assert status.tenants == []
    assert status.clients == []
    region = abi.Arbiter.from_buffer_copy(path.read_bytes())
    assert (region.hdr.magic, region.hdr.abi_major, region.hdr.abi_minor) == (
        abi.MAGIC_ARBITER,
        abi.ABI_MAJOR,
        abi.ABI_MINOR,
    )
    # The hand-over records follow from a page boundary (1.12).
    assert (
        region.hdr.total_size == abi.ARB_FILE_SIZE == abi.ARB_HANDOFFS_OFFSET + ctypes.sizeof(abi.ArbHandoffs)
    )
    assert abi.ARB_HANDOFFS_OFFSET % 4096 == 0
    assert ctypes.sizeof(abi.Arbiter) <= abi.ARB_HANDOFFS_OFFSET
    kind = int.from_bytes(bytes(region.lock)[16:20], "little")  # glibc __kind
    assert kind & (16 | 128) == 16 | 128, "robust + process-shared"
    assert path.stat().st_mode & 0o777 == 0o600  # its creator; tenant owners get ACL entries


def test_ensure_arbiter_default_quantum_and_bad_input(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    uuid = UUIDS[1]
    assert read_arbiter(ensure_arbiter(runtime, uuid)).quantum_ns == abi.ARB_DEFAULT_QUANTUM_NS
    with pytest.raises(SpecError, match="quantum"):
        ensure_arbiter(runtime, UUIDS[0], quantum_ns=10)
    with pytest.raises(SpecError, match="invalid GPU UUID"):
        ensure_arbiter(runtime, "GPU-nope")
    path = arbiter_path(runtime, uuid)
    path.chmod(0o644)
    with path.open("r+b") as f:
        f.write(b"XXXX")
    with pytest.raises(ConfigError, match="not a sharegpu arbiter region"):
        ensure_arbiter(runtime, uuid)
    with pytest.raises(ConfigError, match="not a sharegpu arbiter region"):
        read_arbiter(path)
    with pytest.raises(ConfigError, match="No such file"):
        tune_arbiter(path.parent / "missing", quantum_ns=abi.ARB_DEFAULT_QUANTUM_NS)
    good = ensure_arbiter(runtime, UUIDS[0])
    with pytest.raises(SpecError, match="quantum"):
        tune_arbiter(good, quantum_ns=1)
    with pytest.raises(SpecError, match="hold-back"):
        tune_arbiter(good, holdback_max_ns=-1)
    assert read_arbiter(good).holdback_max_ns == abi.ARB_DEFAULT_HOLDBACK_MAX_NS
    tune_arbiter(
        good, quantum_ns=5_000_000, offline_inflight_max=2, online_window_ns=10**9, holdback_max_ns=0
    )
    status = read_arbiter(good)
    assert (status.quantum_ns, status.offline_inflight_max, status.online_window_ns) == (5_000_000, 2, 10**9)
    assert status.holdback_max_ns == 0


def test_a_new_region_holds_the_default_tunables(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    region = abi.Arbiter.from_buffer_copy(ensure_arbiter(runtime, UUIDS[0]).read_bytes())
    assert {name: getattr(region, name) for name in TUNABLES} == {
        "quantum_ns": abi.ARB_DEFAULT_QUANTUM_NS,
        "offline_inflight_max": abi.ARB_DEFAULT_OFFLINE_INFLIGHT,
        "online_window_ns": abi.ARB_DEFAULT_ONLINE_WINDOW_NS,
        "holdback_max_ns": abi.ARB_DEFAULT_HOLDBACK_MAX_NS,
        "online_preempt": abi.ARB_PREEMPT_EARLY,
        "preempt_min_kernel_ns": abi.ARB_DEFAULT_PREEMPT_MIN_KERNEL_NS,
        "handoff": abi.ARB_HANDOFF_DRAIN,
        "offline_quiet_ns": abi.ARB_DEFAULT_OFFLINE_QUIET_NS,
    }


BAD_TUNABLES = [
    # The first bad one in the table's order (quantum first), whatever the keywords' order.
    (
        {"offline_quiet_ns": 2 * 10**9, "quantum_ns": 1},
        "invalid quantum 1 ns: must be between 500000 ns and 1000000000 ns",
    ),
    (
        {"quantum_ns": 5_000_000, "offline_quiet_ns": 2 * 10**9},
        "invalid quiet window 2000000000 ns: must be 0 (off) to 1 s",
    ),
    ({"offline_inflight_max": 0}, "invalid offline in-flight bound 0: must be 1 to 1048576"),
    ({"online_window_ns": 61 * 10**9}, "invalid online window 61000000000 ns: must be 0 to 60 s"),
    ({"holdback_max_ns": -1}, "invalid hold-back limit -1 ns: must be 0 (off) to 1 s"),
    (
        {"holdback_max_ns": 0, "online_preempt": "sometimes"},
        "invalid online preemption 'sometimes': one of drain, early, by-kernel",
    ),
    ({"preempt_min_kernel_ns": 10**9 + 1}, "invalid preemption threshold 1000000001 ns: must be 0 to 1 s"),
    ({"handoff": "eventually"}, "invalid hand-over 'eventually': one of drain, queued"),
    ({"quantum_ns": "5ms"}, "invalid quantum '5ms': must be between 500000 ns and 1000000000 ns"),
]


def test_each_tunable_lands_in_its_field_and_a_bad_one_changes_nothing(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    path = ensure_arbiter(runtime, UUIDS[0])
    values = {
        "quantum_ns": 6_000_000,
        "offline_inflight_max": 3,
        "online_window_ns": 2 * 10**9,
        "holdback_max_ns": 4_000_000,
        "online_preempt": "by-kernel",
        "preempt_min_kernel_ns": 3_000_000,
        "handoff": "queued",
        "offline_quiet_ns": 1_000_000,
    }
    assert set(values) == set(TUNABLES) == set(Tunables.__annotations__)  # the keywords are the table's
    tune_arbiter(path, **values)  # type: ignore[arg-type]
    status = read_arbiter(path)
    assert {name: getattr(status, name) for name in values} == values  # no two names share a field
    assert abi.Arbiter.from_buffer_copy(path.read_bytes()).online_preempt == abi.ARB_PREEMPT_BY_KERNEL
    before = path.read_bytes()
    for given, message in BAD_TUNABLES:
        with pytest.raises(SpecError) as raised:
            tune_arbiter(path, **given)  # type: ignore[arg-type]
        assert str(raised.value) == message
        with pytest.raises(SpecError) as raised:
            check_tunables(**given)  # type: ignore[arg-type]
        assert str(raised.value) == message
        assert path.read_bytes() == before, given
    with pytest.raises(TypeError, match="unexpected keyword argument 'quantum'"):
        tune_arbiter(path, quantum=5_000_000)  # type: ignore[call-arg]
    assert path.read_bytes() == before
    tune_arbiter(path, quantum_ns=None, offline_quiet_ns=0)  # None: not given
    status = read_arbiter(path)
    assert (status.quantum_ns, status.offline_quiet_ns) == (6_000_000, 0)
