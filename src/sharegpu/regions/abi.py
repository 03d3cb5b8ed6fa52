"""Python mirror of ``native/include/sharegpu/abi.h`` (ctypes).

Every structure here has the same fields, in the same order, as its C twin; ``tests/integration/test_abi.py``
compiles a C program that prints each offset and size and compares them with these. Change both
files together, append only within one major version, and read abi.h for who writes what.
"""

from __future__ import annotations

import ctypes
import uuid as uuidlib

ABI_MAJOR = 1
ABI_MINOR = 13

MAGIC_LIMITS = 0x4D4C4753  # "SGLM"
MAGIC_USAGE = 0x53554753  # "SGUS"
MAGIC_ARBITER = 0x52414753  # "SGAR"

ENTRY_LIVE_LOCK = 1  # entry flag (1.3): the owner holds the entry's liveness lock (liveness.py)
LIVE_LOCK_BASE = 1 << 40  # byte offset of entry 0's liveness lock in the region's file

MAX_DEVICES = 16
MAX_PROCS = 256
SLOT_CTX_ENTRIES = 6  # SG_SLOT_CTX_ENTRIES: devices a slot remembers context memory for (1.9)
TENANT_ID_LEN = 64

LIMITS_FILE = "limits"
USAGE_FILE = "usage"
GPUS_DIR = "gpus"
ARBITER_FILE = "arbiter"
CONTAINER_TENANT_DIR = "/run/sharegpu/tenant"
TENANT_ENV = "SHAREGPU_TENANT"

POLICY_SHARE, POLICY_CAP, POLICY_BURST, POLICY_NATIVE = 0, 1, 2, 3
PRIORITY_OFFLINE, PRIORITY_NORMAL, PRIORITY_ONLINE = 0, 1, 2

POLICY_NAMES = {
    POLICY_SHARE: "share",
    POLICY_CAP: "cap",
    POLICY_BURST: "burst",
    POLICY_NATIVE: "native",
}
ARB_MAX_TENANTS = 64
ARB_MAX_CLIENTS = 256
ARB_TENANT_MAX_CLIENTS = 32  # client entries one tenant may hold on a GPU (1.3)
ARB_STALL_NS = 1_000_000_000  # a holder this long past its quantum loses the token (1.3)
ARB_LOCK_DEADLINE_NS = 200_000_000  # the longest a client waits for the region's lock (1.7)
ARB_DEFAULT_QUANTUM_NS = 10_000_000
ARB_MIN_QUANTUM_NS = 500_000
ARB_MAX_QUANTUM_NS = 1_000_000_000
ARB_DEFAULT_OFFLINE_INFLIGHT = 1
ARB_DEFAULT_ONLINE_WINDOW_NS = 5_000_000_000
ARB_DEFAULT_HOLDBACK_MAX_NS = 10_000_000
# online_preempt (1.5): how a higher class takes the card from a lower-class holder (abi.h)
ARB_PREEMPT_DRAIN, ARB_PREEMPT_EARLY, ARB_PREEMPT_BY_KERNEL = 0, 1, 2
ARB_PREEMPT_NAMES = {
    ARB_PREEMPT_DRAIN: "drain",
    ARB_PREEMPT_EARLY: "early",
    ARB_PREEMPT_BY_KERNEL: "by-kernel",
}
ARB_DEFAULT_ONLINE_PREEMPT = ARB_PREEMPT_EARLY
ARB_DEFAULT_PREEMPT_MIN_KERNEL_NS = 1_000_000
ARB_DEFAULT_OFFLINE_QUIET_NS = 0
# handoff (1.12): how the token moves within a class at a sync that covers the holder's work
ARB_HANDOFF_DRAIN, ARB_HANDOFF_QUEUED = 0, 1
ARB_HANDOFF_NAMES = {ARB_HANDOFF_DRAIN: "drain", ARB_HANDOFF_QUEUED: "queued"}
ARB_DEFAULT_HANDOFF = ARB_HANDOFF_DRAIN
ARB_HO_WAITS = 1  # sg_arb_handoff.flags: the owner's streams can wait for the done words
ARB_HO_LENDS = 2  # (1.13) the owner's offer lends its gap when it keeps the card
ARB_HO_SEVERAL = 4  # (1.13) the owner's last burst had several kernels
# sg_arb_client.yield: why a waiter asks the holder to give the card up (abi.h)
ARB_YIELD_CLASS, ARB_YIELD_TURN, ARB_YIELD_LOAN = 1, 2, 3
ARB_FREE, ARB_IDLE, ARB_WAITING, ARB_HOLDING = 0, 1, 2, 3
ARB_STATE_NAMES = {ARB_FREE: "free", ARB_IDLE: "idle", ARB_WAITING: "waiting", ARB_HOLDING: "holding"}


def token_holder(token: int) -> int:
    """The client index a token word names, or -1 when the token is free."""
    return (token & 0xFFFF) - 1


PRIORITY_NAMES = {PRIORITY_OFFLINE: "offline", PRIORITY_NORMAL: "normal", PRIORITY_ONLINE: "online"}

u8, u16, u32, u64, i32 = (
    ctypes.c_uint8,
    ctypes.c_uint16,
    ctypes.c_uint32,
    ctypes.c_uint64,
    ctypes.c_int32,
)


class RegionHeader(ctypes.Structure):
    _fields_ = (
        ("magic", u32),
        ("abi_major", u16),
        ("abi_minor", u16),
        ("header_size", u32),
        ("total_size", u32),
        ("created_ns", u64),
        ("reserved", u8 * 40),
    )


class LimitsDevice(ctypes.Structure):
    _fields_ = (
        ("uuid", u8 * 16),
        ("mem_cap_bytes", u64),
        ("policy", u32),
        ("priority", u32),
        ("share_permille", u32),
        ("ceiling_permille", u32),
        ("weight", u32),
        ("flags", u32),
        ("reserved", u8 * 16),
    )


class Limits(ctypes.Structure):
    _fields_ = (
        ("hdr", RegionHeader),
        ("generation", u64),
        ("tenant_id", ctypes.c_char * TENANT_ID_LEN),
        ("device_count", u32),
        ("flags", u32),
        ("incarnation", u64),
        ("reserved", u8 * 40),
        ("devices", LimitsDevice * MAX_DEVICES),
    )


class UsageProcDev(ctypes.Structure):
    _fields_ = (
        ("mem_bytes", u64),
        ("gpu_time_ns", u64),
        ("wait_ns", u64),
        ("throttled_ns", u64),
        ("preemptions", u64),
        ("oom_events", u64),
        ("alloc_count", u64),
        ("spare_bytes", u64),  # 1.4: part of mem_bytes charged but not allocated
    )


class UsageProc(ctypes.Structure):
    _fields_ = (
        ("pid", i32),
        ("host_pid", i32),
        ("start_time", u64),
        ("attached_ns", u64),
        ("flags", u32),
        ("pad", u32),
        ("pidns", u64),
        ("ctx_mib", u32 * SLOT_CTX_ENTRIES),  # (1.9) device index << 24 | MiB of its contexts
        ("dev", UsageProcDev * MAX_DEVICES),
    )


class UsageDevice(ctypes.Structure):
    _fields_ = (
        ("mem_used_bytes", u64),
        ("overhead_bytes", u64),
        ("mem_peak_bytes", u64),
        ("oom_events", u64),
        ("reserved", u8 * 32),
    )


class Usage(ctypes.Structure):
    _fields_ = (
        ("hdr", RegionHeader),
        ("lock", u8 * 64),  # robust process-shared pthread_mutex_t, opaque here
        ("slot_count", u32),
        ("device_count", u32),
        ("recoveries", u64),
        ("reserved", u8 * 48),
        ("devices", UsageDevice * MAX_DEVICES),
        ("procs", UsageProc * MAX_PROCS),
    )


class ArbTenant(ctypes.Structure):
    _fields_ = (
        ("tenant_id", ctypes.c_char * TENANT_ID_LEN),
        ("policy", u32),
        ("priority", u32),
        ("share_permille", u32),
        ("ceiling_permille", u32),
        ("weight", u32),
        ("clients", u32),
        ("limits_generation", u64),
        ("vtime", u64),
        ("bucket_ns", ctypes.c_int64),
        ("bucket_ts_ns", u64),
        ("last_active_ns", u64),
        ("gpu_time_ns", u64),
        ("wait_ns", u64),
        ("throttled_ns", u64),
        ("preemptions", u64),
        ("grants", u64),
        ("incarnation", u64),
        ("reserved", u8 * 16),
    )


class ArbClient(ctypes.Structure):
    _fields_ = (
        ("pid", i32),
        ("tenant", u32),
        ("start_time", u64),
        ("state", u32),
        ("priority", u32),
        ("wake", u32),
        ("yield", u32),  # a keyword in Python: getattr(client, "yield")
        ("watch", u32),
        ("flags", u32),
        ("wait_since_ns", u64),
        ("grant_ns", u64),
        ("gpu_time_ns", u64),
        ("wait_ns", u64),
        ("throttled_ns", u64),
        ("preemptions", u64),
        ("pidns", u64),
        ("reserved", u8 * 32),
    )


class Arbiter(ctypes.Structure):
    _fields_ = (
        ("hdr", RegionHeader),
        ("lock", u8 * 64),  # robust process-shared pthread_mutex_t, opaque here
        ("uuid", u8 * 16),
        ("quantum_ns", u64),
        ("tenant_slots", u32),
        ("client_slots", u32),
        ("token", u64),
        ("quantum_end_ns", u64),
        ("grant_ns", u64),
        ("waiting", u32),
        ("offline_inflight_max", u32),
        ("online_window_ns", u64),
        ("online_active_until_ns", u64),
        ("last_release_ns", u64),
        ("grants", u64),
        ("handovers", u64),
        ("handover_idle_ns", u64),
        ("reclaims", u64),
        ("recoveries", u64),
        ("holdback_max_ns", u64),  # ABI 1.2: predicted online requests
        ("online_period_ns", u64),
        ("online_jitter_ns", u64),
        ("online_last_arrival_ns", u64),
        ("online_samples", u32),
        ("online_outliers", u32),
        ("offline_hold_until_ns", u64),
        ("holdbacks", u64),
        ("holdback_ns", u64),
        ("holdback_misses", u64),
        ("misses_in_row", u32),
        ("pad0", u32),
        ("stall_reclaims", u64),
        ("entry_waits", u64),
        ("online_preempt", u32),  # ABI 1.5: unpredicted online requests
        ("pad1", u32),
        ("preempt_min_kernel_ns", u64),
        ("offline_quiet_ns", u64),
        ("offline_quiet_until_ns", u64),
        ("early_preemptions", u64),
        ("quiet_windows", u64),
        ("lock_timeouts", u64),  # ABI 1.7: the lock's deadline
        ("broken_since_ns", u64),
        ("online_cand_period_ns", u64),  # ABI 1.8: a stall told from a changed pattern
        ("online_cand_last_ns", u64),
        ("online_cand_samples", u32),
        ("pad2", u32),
        ("online_stalls", u64),
        ("online_relearns", u64),
        ("loans", u64),  # 1.10
        ("online_last_end_ns", u64),  # 1.11: a closed-loop service's host time
        ("online_gap_ns", u64),
        ("online_gap_jitter_ns", u64),
        ("online_gap_samples", u32),
        ("pad3", u32),
        ("handoff", u32),  # 1.12: queued hand-overs
        ("queued_by", u32),
        ("queued_seq", u32),
        ("pad4", u32),
        ("tenants", ArbTenant * ARB_MAX_TENANTS),
        ("clients", ArbClient * ARB_MAX_CLIENTS),
    )


class ArbHandoff(ctypes.Structure):
    """One client entry's hand-over record (1.12), in the file from ARB_HANDOFFS_OFFSET."""

    _fields_ = (
        ("done", u32),
        ("seq", u32),
        ("behind", u32),
        ("behind_seq", u32),
        ("offer", u32),
        ("taken", u32),
        ("flags", u32),
        ("pad", u32),
        ("queued", u64),
        ("gated", u64),
        ("gates_opened", u64),
        ("gate_wait_ns", u64),
        ("tail_ns", u64),
        ("reserved", u8 * 56),
    )


class ArbHandoffs(ctypes.Structure):
    _fields_ = (("h", ArbHandoff * ARB_MAX_CLIENTS),)


# Where the records start (a page after the region) and the whole file of ABI 1.12 and later
# (SG_ARB_HANDOFFS_OFFSET, SG_ARB_FILE_SIZE); 1.11's file is the Arbiter alone.
ARB_HANDOFFS_OFFSET = 49152
ARB_FILE_SIZE = ARB_HANDOFFS_OFFSET + ctypes.sizeof(ArbHandoffs)


STRUCTS: dict[str, type[ctypes.Structure]] = {
    "sg_region_header": RegionHeader,
    "sg_limits_device": LimitsDevice,
    "sg_limits": Limits,
    "sg_usage_proc_dev": UsageProcDev,
    "sg_usage_proc": UsageProc,
    "sg_usage_device": UsageDevice,
    "sg_usage": Usage,
    "sg_arb_tenant": ArbTenant,
    "sg_arb_client": ArbClient,
    "sg_arbiter": Arbiter,
    "sg_arb_handoff": ArbHandoff,
    "sg_arb_handoffs": ArbHandoffs,
}


def uuid_to_bytes(gpu_uuid: str) -> bytes:
    """'GPU-5a1e...' (NVML form) → the 16 raw bytes cuDeviceGetUuid returns."""
    return uuidlib.UUID(gpu_uuid.removeprefix("GPU-")).bytes


def bytes_to_uuid(raw: bytes) -> str:
    """16 raw bytes → 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx'."""
    return "GPU-" + str(uuidlib.UUID(bytes=bytes(raw)))
