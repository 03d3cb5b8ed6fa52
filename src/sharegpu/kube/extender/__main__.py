"""`python -m sharegpu.kube.extender`: the scheduler extender, until SIGTERM or SIGINT.

With an API server (in a pod, or a kubeconfig): it follows the cluster's nodes and pods
(sync.py), binds through the API server (bindings.py), and leads or waits with the other
replicas (leader.py). With `--dry-run`: it decides and records but writes nothing, learning the
nodes the scheduler passes (shadow scheduling, the benchmark). Errors before serving are one
`sharegpu: error:` line (exit 2).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol

from sharegpu.errors import SharegpuError, SpecError
from sharegpu.kube.apiclient import REQUEST_TIMEOUT_S
from sharegpu.kube.assignment import Assignment
from sharegpu.kube.bindings import ApiBinder, BindError, Fits, PodRef
from sharegpu.kube.extender.core import Binder, Extender
from sharegpu.kube.extender.http import serve
from sharegpu.kube.extender.translate import read_workload
from sharegpu.kube.inventory import STALE_AFTER_S
from sharegpu.kube.leader import LEASE_S, RENEW_S, LeaderElector
from sharegpu.placement import DEFAULT_POLICY, Workload

LEASE_NAME = "sharegpu-extender"


class _Stoppable(Protocol):
    def stop(self) -> None: ...


class DryRunBinder:
    """Decides and records, writes nothing: shadow scheduling next to another scheduler, and
    the benchmark."""

    def __init__(self) -> None:
        self.bound = 0

    def bind(self, pod: PodRef, assignment: Assignment, fits: Fits) -> str:
        why = fits([])
        if why is not None:
            raise BindError(why)
        self.bound += 1
        return ""


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m sharegpu.kube.extender", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=8998)
    ap.add_argument("--policy", default=DEFAULT_POLICY)
    ap.add_argument(
        "--stale-after", type=float, default=STALE_AFTER_S, help="seconds an inventory stays fresh"
    )
    ap.add_argument("--dry-run", action="store_true", help="decide and record, bind nothing (shadow mode)")
    ap.add_argument("--seed", type=int, nargs="+", default=[0], help="of the policy's random tie-breaks")
    ap.add_argument(
        "--workload",
        type=Path,
        help="the cluster's pod mix fragmentation is measured against: JSON [{shape: {count, "
        "compute_milli, memory_mib, cpu_milli, host_memory_mib, models}, weight}] (default: a generic mix)",
    )
    ap.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "sharegpu-system"),
        help="of the leader Lease and the nodes' bind fences (default: $POD_NAMESPACE, else sharegpu-system)",
    )
    ap.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="this replica's name in the Lease (default: $POD_NAME, else the host name)",
    )
    ap.add_argument("--lease-name", default=LEASE_NAME)
    ap.add_argument("--lease-seconds", type=float, default=LEASE_S)
    ap.add_argument("--renew-seconds", type=float, default=RENEW_S)
    ap.add_argument(
        "--preempt",
        action="store_true",
        help="serve the preempt verb: victims trimmed to those whose GPUs make room (preemptVerb: preempt)",
    )
    ap.add_argument("--log-level", default="INFO")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        workload = read_workload(args.workload) if args.workload else None
    except (OSError, ValueError, TypeError, KeyError, SpecError) as err:
        print(f"sharegpu: error: --workload {args.workload}: {err}", file=sys.stderr)
        return 2
    stops: list[_Stoppable] = []
    try:
        if args.dry_run:
            binder: Binder = DryRunBinder()
            extender = Extender(
                binder, policy=args.policy, stale_after_s=args.stale_after, seed=args.seed, workload=workload
            )
        else:
            extender, stops = _connected(args, workload)
        server = serve(extender, args.host, args.port, preempt=args.preempt)
    except (SharegpuError, ValueError, OSError) as err:
        print(f"sharegpu: error: {err}", file=sys.stderr)
        return 2

    def _stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    mode = "dry run" if args.dry_run else f"as {args.identity} in {args.namespace}"
    print(
        f"sharegpu extender on {args.host}:{server.server_address[1]} ({mode})", file=sys.stderr, flush=True
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
        for stop in stops:
            stop.stop()
    return 0


def _connected(args: argparse.Namespace, workload: Workload | None) -> tuple[Extender, list[_Stoppable]]:
    """The extender of a cluster: its state read from the API server, binding through it, leading
    or waiting its turn."""
    from sharegpu.kube.apiclient import api_client, failure
    from sharegpu.kube.events import EventRecorder
    from sharegpu.kube.extender.sync import ClusterSync

    if not 0 < args.renew_seconds < args.lease_seconds:
        raise SharegpuError("--renew-seconds must be above 0 and below --lease-seconds")
    api = api_client("extender")
    elector = LeaderElector(
        api,
        args.namespace,
        args.lease_name,
        args.identity,
        lease_s=args.lease_seconds,
        renew_s=args.renew_seconds,
    )
    binder = ApiBinder(api, args.namespace, args.identity)
    events = EventRecorder(api)
    extender = Extender(
        binder,
        policy=args.policy,
        stale_after_s=args.stale_after,
        seed=args.seed,
        workload=workload,
        leader=lambda: elector.is_leader,
        events=events,
    )
    extender.synced = False
    sync = ClusterSync(extender, api)
    try:
        sync.start()
    except Exception as err:  # the API server refused or did not answer: say which, and stop
        raise SharegpuError(f"cannot read the cluster's nodes and pods: {failure(err, api)}") from err
    leader = _Leader(elector)
    return extender, [sync, leader, events]


class _Leader:
    """The election's thread; stopping it hands the Lease back (elector.run) and waits for that,
    so a replacement leads at once and no request is left running while the process exits."""

    def __init__(self, elector: LeaderElector) -> None:
        self.elector = elector
        self.thread = threading.Thread(target=elector.run, name="leader", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.elector.stop()
        self.thread.join(REQUEST_TIMEOUT_S * 2 + 1)  # the Lease read and its replacement


if __name__ == "__main__":
    sys.exit(main())
