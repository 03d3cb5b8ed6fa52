"""Stream memory operations on the simulated GPU (cuStreamWaitValue*, cuStreamWriteValue*,
cuStreamBatchMemOp), driven by cuda-python in fresh processes: a write on one process's stream
releases another's wait on the GPU, a wait nobody has met yet holds the stream until a later
write meets it, and bad input gets the driver's errors and queues nothing."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from simgpuutil import run_driver as run

# Helpers the scripts share: a device word read back, a memory handle to and from hex.
HELPERS = r"""
import subprocess, sys
W = d.CUstreamWaitValue_flags
mod = ck(d.cuModuleLoadData(PTX))
spin = ck(d.cuModuleGetFunction(mod, b"spin"))

def launch(stream, us):
    ck(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, ((us,), (ctypes.c_uint64,)), 0))

reader = ck(d.cuStreamCreate(1))

def read(ptr, size=4):  # on a stream of its own: a synchronous copy would wait for held streams
    buf = (ctypes.c_uint8 * size)()
    ck(d.cuMemcpyDtoHAsync(buf, ptr, size, reader))
    ck(d.cuStreamSynchronize(reader))
    return int.from_bytes(bytes(buf), "little")

def attributes(*names):  # device attributes into out, by name
    for name in names:
        out[name] = ck(d.cuDeviceGetAttribute(getattr(d.CUdevice_attribute, name), dev))

def mem_handle(hexed):
    h = d.CUipcMemHandle()
    ctypes.memmove(h.getPtr(), bytes.fromhex(hexed), 64)
    return h
"""


def script(body: str) -> str:
    return HELPERS + textwrap.dedent(body)


# The waiter: opens the writer's memory, makes a stream wait for the word to reach 7, then runs
# a 100 ms kernel on it; times the wait from its own events, against a reference recorded on an
# idle stream just before.
WAITER = r"""
ptr = ck(d.cuIpcOpenMemHandle(mem_handle(sys.argv[1]), 1))
stream = ck(d.cuStreamCreate(0))
idle = ck(d.cuStreamCreate(0))
ref, start, end = (ck(d.cuEventCreate(0)) for _ in range(3))
out["ref_at"] = time.monotonic()
ck(d.cuEventRecord(ref, idle))
t = time.monotonic()
ck(d.cuStreamWaitValue32(stream, ptr, 7, W.CU_STREAM_WAIT_VALUE_GEQ))
out["wait_call_ms"] = (time.monotonic() - t) * 1000
out["stream_waiting"] = rc(d.cuStreamQuery(stream))
ck(d.cuEventRecord(start, stream))
launch(stream, 100000)
ck(d.cuEventRecord(end, stream))
ck(d.cuStreamSynchronize(stream))
out["done_at"] = time.monotonic()
out["gate_ms"] = ck(d.cuEventElapsedTime(ref, start))
out["kernel_ms"] = ck(d.cuEventElapsedTime(start, end))
print(json.dumps(out))
"""


@pytest.mark.timing
def test_a_write_on_one_processes_stream_releases_anothers_wait_on_the_gpu(
    sim_env: dict[str, str],
) -> None:
    res = run(
        sim_env,
        script(
            r"""
        word = ck(d.cuMemAlloc(4096))
        ck(d.cuMemsetD32(word, 0, 1024))
        raw = ctypes.string_at(ck(d.cuIpcGetMemHandle(word)).getPtr(), 64)
        stream = ck(d.cuStreamCreate(0))
        launched = out["launched"] = time.monotonic()
        launch(stream, 300000)
        ck(d.cuStreamWriteValue32(stream, word, 7, 0))  # lands when the 300 ms kernel ends
        p = subprocess.run([sys.executable, "-c", PRELUDE_SRC + HELPERS_SRC + WAITER_SRC, raw.hex()],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        kid = out["child"] = json.loads(p.stdout.strip().splitlines()[-1])
        out["child_done_ms"] = (kid["done_at"] - launched) * 1000
        ck(d.cuStreamSynchronize(stream))
        out["word"] = read(word)
        """.replace("HELPERS_SRC", repr(HELPERS)).replace("WAITER_SRC", repr(WAITER))
        ),
    )
    kid = res["child"]
    # The wait does not block the waiter: the GPU holds its kernel until the writer's work ends.
    assert kid["wait_call_ms"] < 150
    assert kid["stream_waiting"] == "CUDA_ERROR_NOT_READY"
    assert res["child_done_ms"] >= 300 + 100 - 5  # never beside the writer's kernel
    gate_open_ms = (kid["ref_at"] - res["launched"]) * 1000 + kid["gate_ms"]
    assert 300 <= gate_open_ms <= 320
    assert 99 <= kid["kernel_ms"] <= 101
    assert res["word"] == 7  # the writer stores the word once it looks at its work


# The waiter on a shared file: maps the file the writer maps, registers the page, and waits on
# the GPU for the word the writer's stream writes after its kernel (no CUDA IPC: processes in
# different containers cannot open each other's IPC handles, but all map the arbiter region).
FILE_WAITER = r"""
import mmap
f = open(sys.argv[1], "r+b")
page = mmap.mmap(f.fileno(), 4096)
base = ctypes.addressof(ctypes.c_char.from_buffer(page))
ck(d.cuMemHostRegister(base, 4096, 2))  # CU_MEMHOSTREGISTER_DEVICEMAP
ptr = ck(d.cuMemHostGetDevicePointer(base + 128, 0))
""" + WAITER.split("\n", 2)[2]


@pytest.mark.timing
def test_a_word_of_a_shared_file_orders_two_processes_work_without_ipc_handles(
    sim_env: dict[str, str], tmp_path: Any
) -> None:
    shared = tmp_path / "region"
    shared.write_bytes(bytes(4096))
    res = run(
        sim_env,
        script(
            r"""
        import mmap
        f = open(SHARED, "r+b")
        page = mmap.mmap(f.fileno(), 4096)
        base = ctypes.addressof(ctypes.c_char.from_buffer(page))
        ck(d.cuMemHostRegister(base, 4096, 2))
        word = ck(d.cuMemHostGetDevicePointer(base + 128, 0))
        stream = ck(d.cuStreamCreate(0))
        launched = out["launched"] = time.monotonic()
        launch(stream, 300000)
        ck(d.cuStreamWriteValue32(stream, word, 7, 0))  # lands when the 300 ms kernel ends
        p = subprocess.run([sys.executable, "-c", PRELUDE_SRC + HELPERS_SRC + WAITER_SRC, SHARED],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        kid = out["child"] = json.loads(p.stdout.strip().splitlines()[-1])
        out["child_done_ms"] = (kid["done_at"] - launched) * 1000
        ck(d.cuStreamSynchronize(stream))
        out["word"] = ctypes.c_uint32.from_address(base + 128).value
        """.replace("HELPERS_SRC", repr(HELPERS))
            .replace("WAITER_SRC", repr(FILE_WAITER))
            .replace("SHARED", repr(str(shared)))
        ),
    )
    kid = res["child"]
    assert kid["stream_waiting"] == "CUDA_ERROR_NOT_READY"
    assert res["child_done_ms"] >= 300 + 100 - 5  # never beside the writer's kernel
    gate_open_ms = (kid["ref_at"] - res["launched"]) * 1000 + kid["gate_ms"]
    assert 300 <= gate_open_ms <= 320
    assert res["word"] == 7
    assert shared.read_bytes()[128:132] == (7).to_bytes(4, "little")  # in the file itself


@pytest.mark.timing
def test_a_wait_nobody_met_holds_the_stream_until_a_write_meets_it(sim_env: dict[str, str]) -> None:
    res = run(
        sim_env,
        script(
            r"""
        word = ck(d.cuMemAlloc(4096))
        ck(d.cuMemsetD32(word, 0, 1024))
        held, writer = ck(d.cuStreamCreate(0)), ck(d.cuStreamCreate(0))
        ref, start, end = (ck(d.cuEventCreate(0)) for _ in range(3))
        ck(d.cuEventRecord(ref, writer))
        ck(d.cuStreamWaitValue32(held, word, 5, W.CU_STREAM_WAIT_VALUE_EQ))
        ck(d.cuEventRecord(start, held))
        launch(held, 50000)
        ck(d.cuEventRecord(end, held))
        time.sleep(0.2)
        out["held"] = rc(d.cuStreamQuery(held))
        ck(d.cuStreamWriteValue32(writer, word, 4, 0))  # an idle stream: lands now, not 5
        time.sleep(0.1)
        out["still_held"] = rc(d.cuStreamQuery(held))
        out["word_4"] = read(word)
        written = time.monotonic()
        ck(d.cuStreamWriteValue32(writer, word, 5, 0))
        ck(d.cuStreamSynchronize(held))
        out["sync_ms"] = (time.monotonic() - written) * 1000
        out["gate_ms"] = ck(d.cuEventElapsedTime(ref, start))
        out["kernel_ms"] = ck(d.cuEventElapsedTime(start, end))
        # 64-bit words and the other conditions, in one batch whose waits are all met.
        big = int(word) + 8
        ops = [d.CUstreamBatchMemOpParams() for _ in range(4)]
        ops[0].writeValue.operation = d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_64
        ops[0].writeValue.address = big
        ops[0].writeValue.value64 = 1 << 40
        ops[1].waitValue.operation = d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_64
        ops[1].waitValue.address = big
        ops[1].waitValue.value64 = 1 << 40
        ops[2].waitValue.operation = d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
        ops[2].waitValue.address = word
        ops[2].waitValue.value = 1
        ops[2].waitValue.flags = W.CU_STREAM_WAIT_VALUE_AND
        ops[3].waitValue.operation = d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32
        ops[3].waitValue.address = int(word) + 4
        ops[3].waitValue.value = 0
        ops[3].waitValue.flags = W.CU_STREAM_WAIT_VALUE_NOR
        ck(d.cuStreamBatchMemOp(writer, len(ops), ops, 0))
        out["batch_stream"] = rc(d.cuStreamQuery(writer))
        out["big"] = read(big, 8)
        out["word"] = read(word)
        """
        ),
    )
    assert res["held"] == "CUDA_ERROR_NOT_READY"
    assert res["still_held"] == "CUDA_ERROR_NOT_READY"  # 4 is not 5
    assert res["word_4"] == 4
    assert 45 <= res["sync_ms"] <= 150  # the 50 ms kernel ran only once the word was 5
    assert 300 <= res["gate_ms"] <= 450
    assert 49 <= res["kernel_ms"] <= 51
    assert res["batch_stream"] == "CUDA_SUCCESS"
    assert res["big"] == 1 << 40
    assert res["word"] == 5


def test_bad_stream_memory_operations_get_the_drivers_errors_and_queue_nothing(
    sim_env: dict[str, str],
) -> None:
    res = run(
        sim_env,
        script(
            r"""
        attributes("CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS",
                   "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR",
                   "CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES")
        word = int(ck(d.cuMemAlloc(4096)))
        ck(d.cuMemsetD32(word, 0, 1024))
        s = ck(d.cuStreamCreate(0))
        host = ctypes.create_string_buffer(64)
        gone = ck(d.cuMemAlloc(4096))
        ck(d.cuMemFree(gone))
        out["unaligned_wait"] = rc(d.cuStreamWaitValue32(s, word + 2, 1, 0))
        out["unaligned_write64"] = rc(d.cuStreamWriteValue64(s, word + 4, 1, 0))
        out["host_memory"] = rc(d.cuStreamWriteValue32(s, ctypes.addressof(host), 1, 0))
        out["freed"] = rc(d.cuStreamWaitValue32(s, gone, 1, 0))
        out["past_the_end"] = rc(d.cuStreamWriteValue64(s, word + 4096, 1, 0))
        out["wait_flags"] = rc(d.cuStreamWaitValue32(s, word, 1, 4))
        out["flush"] = rc(d.cuStreamWaitValue32(s, word, 1, W.CU_STREAM_WAIT_VALUE_FLUSH))
        out["write_flags"] = rc(d.cuStreamWriteValue32(s, word, 1, 2))

        def op(kind, address, value=9):
            o = d.CUstreamBatchMemOpParams()
            o.writeValue.operation = kind
            o.writeValue.address = address
            o.writeValue.value = value
            return o

        T = d.CUstreamBatchMemOpType
        good = op(T.CU_STREAM_MEM_OP_WRITE_VALUE_32, word)
        out["batch_flags"] = rc(d.cuStreamBatchMemOp(s, 1, [good], 1))
        out["batch_empty"] = rc(d.cuStreamBatchMemOp(s, 0, [], 0))
        out["batch_one_bad"] = rc(d.cuStreamBatchMemOp(
            s, 2, [good, op(T.CU_STREAM_MEM_OP_WRITE_VALUE_32, word + 1)], 0))
        flush = d.CUstreamBatchMemOpParams()
        flush.flushRemoteWrites.operation = T.CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES
        out["batch_flush"] = rc(d.cuStreamBatchMemOp(s, 2, [good, flush], 0))
        unknown = d.CUstreamBatchMemOpParams()
        ctypes.c_uint32.from_address(unknown.getPtr()).value = 99
        out["batch_unknown"] = rc(d.cuStreamBatchMemOp(s, 2, [good, unknown], 0))
        out["word"] = read(word)  # none of the refused batches wrote its good first op
        barrier = d.CUstreamBatchMemOpParams()
        barrier.memoryBarrier.operation = T.CU_STREAM_MEM_OP_BARRIER
        out["batch_barrier"] = rc(d.cuStreamBatchMemOp(s, 2, [good, barrier], 0))
        out["word_after"] = read(word)
        """
        ),
    )
    assert res["CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS"] == 1
    assert res["CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR"] == 1
    assert res["CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES"] == 0
    for case in ("unaligned_wait", "unaligned_write64", "host_memory", "freed", "past_the_end"):
        assert res[case] == "CUDA_ERROR_INVALID_VALUE", case
    assert res["wait_flags"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["flush"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert res["write_flags"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["batch_flags"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["batch_empty"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["batch_one_bad"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["batch_flush"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert res["batch_unknown"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["word"] == 0
    assert res["batch_barrier"] == "CUDA_SUCCESS"
    assert res["word_after"] == 9


# A writer whose write waits behind a 3 s kernel: prints its memory handle and waits to be killed.
DOOMED_WRITER = r"""
word = ck(d.cuMemAlloc(4096))
ck(d.cuMemsetD32(word, 0, 1024))
raw = ctypes.string_at(ck(d.cuIpcGetMemHandle(word)).getPtr(), 64)  # shared before the write
stream = ck(d.cuStreamCreate(0))
launch(stream, 3000000)
ck(d.cuStreamWriteValue32(stream, word, 1, 0))
print(raw.hex(), flush=True)
time.sleep(60)
"""


def test_a_wait_behind_a_killed_writers_work_ends_when_its_work_is_dropped(
    sim_env: dict[str, str],
) -> None:
    res = run(
        sim_env,
        script(
            r"""
        writer = subprocess.Popen([sys.executable, "-c", PRELUDE_SRC + HELPERS_SRC + DOOMED_SRC],
                                  stdout=subprocess.PIPE, text=True)
        ptr = ck(d.cuIpcOpenMemHandle(mem_handle(writer.stdout.readline().strip()), 1))
        stream = ck(d.cuStreamCreate(0))
        ck(d.cuStreamWaitValue32(stream, ptr, 1, W.CU_STREAM_WAIT_VALUE_EQ))
        launch(stream, 10000)
        time.sleep(0.2)
        out["gated"] = rc(d.cuStreamQuery(stream))  # held behind the writer's 3 s kernel
        writer.kill()
        writer.wait()
        t = time.monotonic()
        ck(d.cuStreamSynchronize(stream))
        out["sync_s"] = time.monotonic() - t
        """.replace("HELPERS_SRC", repr(HELPERS)).replace("DOOMED_SRC", repr(DOOMED_WRITER))
        ),
    )
    assert res["gated"] == "CUDA_ERROR_NOT_READY"
    assert res["sync_s"] < 2.0  # the dead writer's work is dropped at the next sweep (0.1 s)


# A holder: records its interprocess event after a kernel of argv[1] µs, prints the event's
# handle and when it launched the kernel, and waits until its stdin ends.
HOLDER = r"""
F = d.CUevent_flags
ev = ck(d.cuEventCreate(F.CU_EVENT_INTERPROCESS | F.CU_EVENT_DISABLE_TIMING))
stream = ck(d.cuStreamCreate(0))
launched = time.monotonic()
launch(stream, int(sys.argv[1]))
ck(d.cuEventRecord(ev, stream))
print(ctypes.string_at(ck(d.cuIpcGetEventHandle(ev)).getPtr(), 64).hex(), launched, flush=True)
sys.stdin.read()
"""

# The next holder's relay: a stream of its own waits for the holder's event and then writes a
# word of this process's memory, which its main stream waits for; a third stream's kernel is
# queued between the two (the main stream's wait holds the process's whole channel, the model's
# simplification: README "Stream memory operations"). With argv[2], a watcher writes the word
# itself from an idle stream that many ms after the reference (the holder's event came too late).
RELAY = r"""
holder = subprocess.Popen([sys.executable, "-c", PRELUDE_SRC + HELPERS_SRC + HOLDER_SRC, sys.argv[1]],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
hexed, launched = holder.stdout.readline().split()
h = d.CUipcEventHandle()
ctypes.memmove(h.getPtr(), bytes.fromhex(hexed), 64)
theirs = ck(d.cuIpcOpenEventHandle(h))
word = ck(d.cuMemAlloc(4096))
ck(d.cuMemsetD32(word, 0, 1024))
relay, main, other, watcher = (ck(d.cuStreamCreate(1)) for _ in range(4))
ref, start, end, other_end = (ck(d.cuEventCreate(0)) for _ in range(4))
out["ref_at"] = time.monotonic()
ck(d.cuEventRecord(ref, watcher))
ck(d.cuStreamWaitEvent(relay, theirs, 0))
ck(d.cuStreamWriteValue32(relay, word, 1, 0))
launch(other, 100000)
ck(d.cuEventRecord(other_end, other))
ck(d.cuStreamWaitValue32(main, word, 1, W.CU_STREAM_WAIT_VALUE_GEQ))
ck(d.cuEventRecord(start, main))
launch(main, 100000)
ck(d.cuEventRecord(end, main))
ck(d.cuStreamSynchronize(other))
out["other_ms"] = ck(d.cuEventElapsedTime(ref, other_end))
out["main_held"] = rc(d.cuStreamQuery(main))
if len(sys.argv) > 2:
    time.sleep(max(0.0, out["ref_at"] + int(sys.argv[2]) / 1000 - time.monotonic()))
    ck(d.cuStreamWriteValue32(watcher, word, 1, 0))
ck(d.cuStreamSynchronize(main))
out["relay"] = rc(d.cuStreamQuery(relay))  # a look at the awaited kernel: it gates nothing
out["gate_ms"] = ck(d.cuEventElapsedTime(ref, start))
out["kernel_ms"] = ck(d.cuEventElapsedTime(start, end))
out["ref_after_launch_ms"] = (out["ref_at"] - float(launched)) * 1000
holder.stdin.close()
holder.wait()
"""


def relay(sim_env: dict[str, str], *argv: str) -> dict[str, Any]:
    """RELAY's figures, run with `argv` (the holder's kernel in µs, the watcher's delay in ms)."""
    body = f"import sys\nsys.argv = {['-', *argv]!r}\n" + RELAY
    return run(sim_env, script(body), HELPERS_SRC=HELPERS, HOLDER_SRC=HOLDER)


@pytest.mark.timing
def test_a_relay_stream_holds_only_itself_and_its_word_opens_the_waiter_when_the_holders_work_ends(
    sim_env: dict[str, str],
) -> None:
    res = relay(sim_env, "1000000")
    # The third stream's kernel ran beside the holder's (the GPU's time-slicing: about 200 ms),
    # not after its 1 s kernel, though the relay, queued before it, waited for that kernel.
    assert res["other_ms"] < 600
    assert res["main_held"] == "CUDA_ERROR_NOT_READY"
    # The relay's write landed as the holder's kernel ended: 1 s of its own and the 100 ms the
    # third stream's kernel took from it.
    gate_open_ms = res["ref_after_launch_ms"] + res["gate_ms"]
    assert 1100 <= gate_open_ms <= 1130
    assert 99 <= res["kernel_ms"] <= 101
    assert res["relay"] == "CUDA_SUCCESS"


@pytest.mark.timing
def test_a_watchers_write_opens_the_waiter_while_the_relay_stays_stuck_behind_the_holder(
    sim_env: dict[str, str],
) -> None:
    res = relay(sim_env, "3000000", "400")
    assert res["main_held"] == "CUDA_ERROR_NOT_READY"
    assert 400 <= res["gate_ms"] <= 500  # the watcher's write, not the holder's 3 s kernel
    assert res["ref_after_launch_ms"] + res["gate_ms"] + res["kernel_ms"] < 2000
    assert 99 <= res["kernel_ms"] <= 300  # beside the holder's kernel: time-sliced
    assert res["relay"] == "CUDA_ERROR_NOT_READY"  # still behind the holder's kernel


def test_page_locked_host_memory_holds_a_word_and_bad_registrations_get_the_drivers_errors(
    sim_env: dict[str, str],
) -> None:
    res = run(
        sim_env,
        script(
            r"""
        import mmap
        attributes("CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED",
                   "CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM",
                   "CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED")
        page = mmap.mmap(-1, 2 * 4096)  # the program's own memory, as a usage region would be
        base = ctypes.addressof(ctypes.c_char.from_buffer(page))
        out["unregistered_pointer"] = rc(d.cuMemHostGetDevicePointer(base, 0))
        out["unregistered_word"] = rc(d.cuStreamWriteValue32(reader, base, 1, 0))
        ck(d.cuMemHostRegister(base, 4096, 2))  # CU_MEMHOSTREGISTER_DEVICEMAP
        out["flags"] = ck(d.cuMemHostGetFlags(base + 100))
        word = int(ck(d.cuMemHostGetDevicePointer(base + 64, 0)))
        out["same_address"] = word == base + 64
        out["overlap"] = rc(d.cuMemHostRegister(base + 2048, 4096, 0))
        out["io_memory"] = rc(d.cuMemHostRegister(base + 4096, 4096, 4))
        out["bad_flags"] = rc(d.cuMemHostRegister(base + 4096, 4096, 16))
        gone = mmap.mmap(-1, 4096)
        hole = ctypes.addressof(ctypes.c_char.from_buffer(gone))
        del gone  # unmapped
        out["unmapped"] = rc(d.cuMemHostRegister(hole, 4096, 0))
        out["unregister_inside"] = rc(d.cuMemHostUnregister(base + 64))
        # A stream waits for the word in host memory and another stream's write opens it.
        held, writer = ck(d.cuStreamCreate(1)), ck(d.cuStreamCreate(1))
        ck(d.cuStreamWaitValue32(held, word, 3, W.CU_STREAM_WAIT_VALUE_GEQ))
        launch(held, 10000)
        time.sleep(0.1)
        out["held"] = rc(d.cuStreamQuery(held))
        ck(d.cuStreamWriteValue32(writer, word, 3, 0))
        ck(d.cuStreamSynchronize(held))
        out["host_sees"] = ctypes.c_uint32.from_address(base + 64).value
        ro = base + 4096
        ck(d.cuMemHostRegister(ro, 4096, 8))  # CU_MEMHOSTREGISTER_READ_ONLY
        out["read_only_write"] = rc(d.cuStreamWriteValue32(writer, ro, 1, 0))
        out["read_only_wait"] = rc(d.cuStreamWaitValue32(writer, ro, 0, W.CU_STREAM_WAIT_VALUE_EQ))
        ck(d.cuMemHostUnregister(ro))
        ck(d.cuMemHostUnregister(base))
        out["after_unregister"] = rc(d.cuMemHostGetDevicePointer(base, 0))
        out["unregister_twice"] = rc(d.cuMemHostUnregister(base))
        out["free_not_allocated"] = rc(d.cuMemFreeHost(base))
        pinned = ck(d.cuMemHostAlloc(4096, 1))  # CU_MEMHOSTALLOC_PORTABLE
        out["alloc_flags"] = ck(d.cuMemHostGetFlags(pinned))
        out["alloc_then_register"] = rc(d.cuMemHostRegister(pinned, 4096, 0))
        ck(d.cuMemFreeHost(pinned))
        """
        ),
    )
    assert res["CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED"] == 1
    assert res["CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM"] == 1
    assert res["CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED"] == 1
    assert res["unregistered_pointer"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["unregistered_word"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["flags"] == 2
    assert res["same_address"] is True
    assert res["overlap"] == "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
    assert res["io_memory"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert res["bad_flags"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["unmapped"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["unregister_inside"] == "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"
    assert res["held"] == "CUDA_ERROR_NOT_READY"
    assert res["host_sees"] == 3
    assert res["read_only_write"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["read_only_wait"] == "CUDA_SUCCESS"  # reading it is what read-only allows
    assert res["after_unregister"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["unregister_twice"] == "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"
    assert res["free_not_allocated"] == "CUDA_ERROR_INVALID_VALUE"
    assert res["alloc_flags"] == 1
    assert res["alloc_then_register"] == "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
