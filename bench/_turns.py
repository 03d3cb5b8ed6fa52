"""One of two cuda-python programs that take turns on the card themselves, with no sharegpu:
what a hand-over between exclusive holds costs, by how the next holder is told (bench/handover.py).

    python bench/_turns.py ROLE MODE SHARE BURST US HOST_US TURNS SECONDS FD_IN FD_OUT

ROLE 0 or 1; SHARE: role 0's part of the turns, in percent. Each turn is a burst of BURST launches of the
spin kernel (US µs each) and a stream sync, then HOST_US of host time. MODE:
  bare     no turns: loop for SECONDS (the GPU time-slices the two programs)
  drained  TURNS turns in the order `owner` gives; a holder tells the next one (a byte on FD_OUT)
           after its sync returned: the hand-over sharegpu makes today
  queued   the same turns, told as the holder enters its sync, and the next holder's stream waits
           (cuStreamWaitEvent) for the holder's interprocess event: the GPU starts the next burst
           when the last one ends, with no host wake-up between
  word     as queued, but the next holder's stream waits (cuStreamWaitValue32) for a word in its
           own device memory, which the holder's stream writes (cuStreamWriteValue32, through
           cuIpcGetMemHandle) after its burst: a gate the waiter owns and could open itself
  relay    as queued, but through a word only the next holder writes: a relay stream of its own
           waits for the holder's event and then writes the word its main stream waits for (the
           design docs/design/arbitration.md chose for sharegpu's hand-over)
  relayctx as relay, the relay stream in a context of its own and the word in page-locked host
           memory (cuMemHostAlloc, portable), so that the program's cuCtxSynchronize never waits
           for the relay; on a GPU the second context's time slice may cost a switch more per
           hand-over
  shared   each program's word is in a file both map ($TURNS_SHARED_FILE) and page-lock
           (cuMemHostRegister): the holder's stream writes its own word after its burst, the next
           holder's stream waits for it (what the shim does with the arbiter region's done words)
First the two exchange their event and memory handles over FD_OUT/FD_IN; each prints `ready` and
waits for a go byte on FD_IN. Then prints `bursts=N seconds=S start=T` (T: its CLOCK_MONOTONIC start,
in seconds).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

from cuda.bindings import driver as cu

from _pyclient import PTX, check, host_gap


def owner(turn: int, share: int) -> int:
    """Who holds turn `turn` (0 or 1) when role 0 gets `share` % of the turns, spread as virtual
    time spreads them: role 0 takes a turn whenever its count falls a whole turn behind."""
    return 0 if (turn + 1) * share // 100 - turn * share // 100 == 1 else 1


def read_exactly(fd: int, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise SystemExit("fail=the other program went away")
        data += chunk
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 10:
        print(__doc__.strip().splitlines()[3], file=sys.stderr)
        return 2
    role, mode, share = int(argv[0]), argv[1], int(argv[2])
    burst, us, host_us, turns = int(argv[3]), int(argv[4]), int(argv[5]), int(argv[6])
    seconds, fd_in, fd_out = float(argv[7]), int(argv[8]), int(argv[9])
    check(cu.cuInit(0))
    (dev,) = check(cu.cuDeviceGet(0))
    (ctx,) = check(cu.cuDevicePrimaryCtxRetain(dev))
    check(cu.cuCtxSetCurrent(ctx))
    (mod,) = check(cu.cuModuleLoadData(PTX))
    (spin,) = check(cu.cuModuleGetFunction(mod, b"spin"))
    (stream,) = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    (relay,) = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    if mode == "relayctx":  # the relay in a context of its own, its word in host memory
        check(cu.cuCtxCreate(None, 0, dev))
        (relay,) = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        check(cu.cuCtxSetCurrent(ctx))
        (host_word,) = check(cu.cuMemHostAlloc(4, 1 | 2))  # CU_MEMHOSTALLOC_PORTABLE | DEVICEMAP
        ctypes.c_uint32.from_address(host_word).value = 0
        (own_gate,) = check(cu.cuMemHostGetDevicePointer(host_word, 0))
    flags = cu.CUevent_flags.CU_EVENT_INTERPROCESS | cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    (mine,) = check(cu.cuEventCreate(flags))
    (exported,) = check(cu.cuIpcGetEventHandle(mine))
    (gate,) = check(cu.cuMemAlloc(4096))  # the word other programs' work opens this one's gate by
    check(cu.cuMemsetD32(gate, 0, 1024))
    (gate_handle,) = check(cu.cuIpcGetMemHandle(gate))
    if mode == "shared":  # the words of a file both map: no interprocess handle needed
        import mmap

        shared_file = open(os.environ["TURNS_SHARED_FILE"], "r+b")  # noqa: SIM115 (lives with the run)
        page = mmap.mmap(shared_file.fileno(), 4096)
        base = ctypes.addressof(ctypes.c_char.from_buffer(page))
        check(cu.cuMemHostRegister(base, 4096, 1 | 2))  # CU_MEMHOSTREGISTER_PORTABLE | DEVICEMAP
        (words,) = check(cu.cuMemHostGetDevicePointer(base, 0))
        my_word, their_word = int(words) + 128 * role, int(words) + 128 * (1 - role)
    os.write(fd_out, ctypes.string_at(exported.getPtr(), 64) + ctypes.string_at(gate_handle.getPtr(), 64))
    handle, their_handle = cu.CUipcEventHandle(), cu.CUipcMemHandle()
    ctypes.memmove(handle.getPtr(), read_exactly(fd_in, 64), 64)
    ctypes.memmove(their_handle.getPtr(), read_exactly(fd_in, 64), 64)
    (theirs,) = check(cu.cuIpcOpenEventHandle(handle))
    flag = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    (their_gate,) = check(cu.cuIpcOpenMemHandle(their_handle, flag))
    geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
    given = received = 0  # hand-overs made and taken: the words count them
    args = ((us,), (ctypes.c_uint64,))
    print("ready", flush=True)

    def run_burst() -> None:
        for _ in range(burst):
            check(cu.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, stream, args, 0))

    if read_exactly(fd_in, 1) != b"g":
        raise SystemExit("fail=no go")
    start = time.monotonic()
    done = 0
    if mode == "bare":
        while time.monotonic() - start < seconds:
            run_burst()
            check(cu.cuStreamSynchronize(stream))
            done += 1
            host_gap(host_us * 1000)
    for turn in range(turns if mode != "bare" else 0):
        if owner(turn, share) != role:
            continue
        if turn and owner(turn - 1, share) != role:
            if read_exactly(fd_in, 1) != b"t":
                raise SystemExit("fail=out of turn")
            received += 1
            if mode == "queued":
                check(cu.cuStreamWaitEvent(stream, theirs, 0))
            elif mode == "word":
                check(cu.cuStreamWaitValue32(stream, gate, received, geq))
            elif mode == "shared":
                check(cu.cuStreamWaitValue32(stream, their_word, received, geq))
            elif mode in ("relay", "relayctx"):
                word = gate if mode == "relay" else own_gate
                check(cu.cuStreamWaitEvent(relay, theirs, 0))
                check(cu.cuStreamWriteValue32(relay, word, received, 0))
                check(cu.cuStreamWaitValue32(stream, word, received, geq))
        run_burst()
        hand_on = turn + 1 < turns and owner(turn + 1, share) != role
        if mode in ("queued", "relay", "relayctx"):
            check(cu.cuEventRecord(mine, stream))
        if mode == "word" and hand_on:
            given += 1
            check(cu.cuStreamWriteValue32(stream, their_gate, given, 0))
        if mode == "shared" and hand_on:
            given += 1
            check(cu.cuStreamWriteValue32(stream, my_word, given, 0))
        if mode in ("queued", "word", "relay", "relayctx", "shared") and hand_on:
            os.write(fd_out, b"t")
        check(cu.cuStreamSynchronize(stream))
        if mode == "drained" and hand_on:
            os.write(fd_out, b"t")
        done += 1
        host_gap(host_us * 1000)
    print(f"bursts={done} seconds={time.monotonic() - start:.6f} start={start:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
