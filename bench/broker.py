"""What a grant broker would cost per handover, beside what a handover costs today.

Today a GPU's token moves between tenants through the shared arbiter region: the releaser
writes the grant under the region's lock and wakes the next holder's futex word. Every tenant
of the GPU can write that region, so a hostile one can disturb the token passing (issue 34;
docs/design/arbitration.md, "Who may write the grants"). A broker the tenants cannot write
(the agent) would instead receive "I release" and send "you hold" over a Unix socket.

This measures both round trips between two processes on this machine, interleaved, with a C
program (bench/broker_pingpong.c, built here with the system compiler):
  * futex     — A wakes B's futex word, B wakes A's: today's wake-up of a granted waiter, twice;
  * socket    — A sends a request on a SOCK_SEQPACKET Unix socket, B answers: one broker
                round trip (release and grant folded into one request, as a broker would).
A broker handover costs at least one socket round trip more than a futex wake; the table shows
the difference beside the arbiter's measured idle time per handover on the simulated GPU
(docs/design/arbitration.md). CPU-only: nothing here touches a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "broker_pingpong.c"


def build(out: Path) -> Path:
    binary = out / "broker_pingpong"
    subprocess.run(["cc", "-O2", "-o", str(binary), str(SOURCE)], check=True, capture_output=True, text=True)
    return binary


def run(binary: Path, mode: str, trips: int) -> tuple[float, float]:
    """Median and p99 of one round trip in µs."""
    done = subprocess.run([str(binary), mode, str(trips)], check=True, capture_output=True, text=True)
    ns = sorted(int(line) for line in done.stdout.split())
    return statistics.median(ns) / 1e3, ns[int(len(ns) * 0.99)] / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=20000, help="round trips per run")
    parser.add_argument("--runs", type=int, default=5, help="interleaved runs per mode")
    args = parser.parse_args(argv)
    if args.trips < 100 or args.runs < 1:
        parser.error("--trips must be >= 100 and --runs >= 1")
    with tempfile.TemporaryDirectory() as tmp:
        binary = build(Path(tmp))
        results: dict[str, list[tuple[float, float]]] = {"futex": [], "socket": []}
        for _ in range(args.runs):
            for mode, runs in results.items():
                runs.append(run(binary, mode, args.trips))
    print(f"Round trip between two processes on this machine (CPU only), median of {args.runs} runs")
    print(f"{'path':<32}{'median µs':>10}{'p99 µs':>10}")
    rows = {
        mode: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for mode, runs in results.items()
    }
    print(f"{'futex wake, both ways (today)':<32}{rows['futex'][0]:>10.1f}{rows['futex'][1]:>10.1f}")
    print(f"{'Unix socket request (broker)':<32}{rows['socket'][0]:>10.1f}{rows['socket'][1]:>10.1f}")
    # Today a handover is one futex wake (half the futex round trip); through a broker it is the
    # release to the broker and the grant from it (one socket round trip), with no work between.
    added = rows["socket"][0] - rows["futex"][0] / 2
    print(f"a broker adds about {added:.1f} µs (median) to each handover")
    return 0


if __name__ == "__main__":
    sys.exit(main())
