"""What a hand-over between exclusive holds costs the card, by how the next holder is told
(issue 33; docs/design/arbitration.md, "Turns"), on the simulated GPU, with no sharegpu.

    python bench/handover.py [--share 30] [--seconds 2.5] [--cases 1x100,4x500]

Two cuda-python programs (bench/_turns.py) take turns on the card in the order virtual time
gives at the split, each turn a burst then a stream sync and 20 µs of host time, and the card's
busy share (kernel time run / wall time) is printed for three ways of running them side by side:
  bare     no turns: the GPU time-slices the two programs (any split runs about 50/50)
  drained  the next holder is told after the holder's sync returned: today's hand-over
  queued   the next holder is told as the holder enters its sync and its stream waits for the
           holder's interprocess event: the GPU starts its burst when the last one ends
  word     as queued, but the next holder's stream waits for a word of its own memory that the
           holder's stream writes after its burst (cuStreamWaitValue32 / cuStreamWriteValue32):
           the gate a waiter owns
  relay    as queued, through a word only the next holder writes: its relay stream waits for
           the holder's event, then writes the word its main stream waits for (the design
           chosen for sharegpu's hand-over: its watcher could open the word itself)
  relayctx as relay, the relay stream in a context of its own and the word in page-locked host
           memory (the program's cuCtxSynchronize never waits for the relay); on a GPU the
           relay's context may cost a switch more per hand-over
  shared   the next holder's stream waits for a word of a file both programs map and page-lock
           (cuMemHostRegister), which the holder's stream writes after its burst: sharegpu's
           hand-over (ABI 1.12: the done words of the arbiter region), with no CUDA
           interprocess handle, which opens only between processes that see each other's pids
At 50/50 every turn is a hand-over, so queued against bare is the hand-over's whole cost. At an
uneven split some turns follow their own program's, and each of those leaves that program's gap
(its sync's return, host time and launch) idle however the hand-overs are made.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from _node import simulated_node

HERE = Path(__file__).resolve().parent
MODES = ("bare", "drained", "queued", "word", "relay", "relayctx", "shared")
HOST_US = 20
DEFAULT_CASES = "1x100,1x500,4x200,4x500,1x2000"


@dataclass(frozen=True)
class Result:
    card: float  # % of the card busy
    split: tuple[float, float]  # each program's %


def run_case(env: dict[str, str], mode: str, *, share: int, burst: int, us: int, seconds: float) -> Result:
    """The two programs for about `seconds`, with pipes between them for handles and turns."""
    turns = max(10, int(seconds * 1e6 / (burst * us + 30)))
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None  # a tmpfs, as a runtime directory is
    with tempfile.NamedTemporaryFile(prefix="sg-turns-", dir=shm) as shared:
        shared.write(bytes(4096))
        shared.flush()
        env = env | {"TURNS_SHARED_FILE": shared.name}
        return run_programs(env, mode, share=share, burst=burst, us=us, seconds=seconds, turns=turns)


def run_programs(
    env: dict[str, str], mode: str, *, share: int, burst: int, us: int, seconds: float, turns: int
) -> Result:
    zero_to_one, one_to_zero = os.pipe(), os.pipe()
    ends = [(one_to_zero[0], zero_to_one[1]), (zero_to_one[0], one_to_zero[1])]
    procs = []
    for role, (fd_in, fd_out) in enumerate(ends):
        argv = [
            sys.executable,
            str(HERE / "_turns.py"),
            str(role),
            mode,
            str(share),
            str(burst),
            str(us),
            str(HOST_US),
            str(turns),
            str(seconds),
            str(fd_in),
            str(fd_out),
        ]
        procs.append(
            subprocess.Popen(argv, env=env, pass_fds=(fd_in, fd_out), stdout=subprocess.PIPE, text=True)
        )
    os.close(zero_to_one[0])  # the programs' read ends
    os.close(one_to_zero[0])
    for p in procs:  # both have made their contexts and exchanged handles
        if p.stdout is None or p.stdout.readline().strip() != "ready":
            raise RuntimeError("bench/_turns.py did not start")
    for fd in (zero_to_one[1], one_to_zero[1]):
        os.write(fd, b"g")
        os.close(fd)
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120 + 4 * seconds)
        if p.returncode != 0:
            raise RuntimeError(f"bench/_turns.py failed ({p.returncode}): {out.strip()}")
        outs.append(dict(kv.split("=", 1) for kv in out.split()))
    bursts = [int(o["bursts"]) for o in outs]
    spans = [float(o["seconds"]) for o in outs]
    if mode == "bare":  # both loop for `seconds`: the card is shared while both run
        wall = min(spans)
        ran = [b * wall / s for b, s in zip(bursts, spans, strict=True)]
    else:
        starts = [float(o["start"]) for o in outs]
        wall = max(s + t for s, t in zip(starts, spans, strict=True)) - min(starts)
        ran = [float(b) for b in bursts]
    shares = tuple(100 * r * burst * us / 1e6 / wall for r in ran)
    return Result(card=sum(shares), split=(shares[0], shares[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--share", type=int, default=30, help="the first program's %% of the turns (1-99)")
    ap.add_argument("--seconds", type=float, default=2.5, help="length of each run")
    ap.add_argument("--cases", default=DEFAULT_CASES, help="bursts x kernel µs, comma-separated")
    args = ap.parse_args(argv)
    if not 1 <= args.share <= 99:
        ap.error("--share must be between 1 and 99")
    try:
        cases = [tuple(int(x) for x in c.split("x")) for c in args.cases.split(",")]
        if any(len(c) != 2 or min(c) < 1 for c in cases):
            raise ValueError
    except ValueError:
        ap.error(f"--cases: expected BURSTxUS[,BURSTxUS...] with positive numbers, got {args.cases!r}")
    print(
        f"Hand-overs between programs that take turns themselves, {args.share}/{100 - args.share}, "
        f"{HOST_US} µs of host time, {args.seconds:g} s per run — simulated GPU, no sharegpu"
    )
    print("card % (the two programs' %):")
    print(f"{'case':<14}" + "".join(f"{m:>22}" for m in MODES))
    with simulated_node() as node:
        for burst, us in cases:
            row = f"{f'{burst} x {us} µs':<14}"
            for mode in MODES:
                r = run_case(node.base_env, mode, share=args.share, burst=burst, us=us, seconds=args.seconds)
                row += f"{f'{r.card:.1f} ({r.split[0]:.1f}/{r.split[1]:.1f})':>22}"
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
