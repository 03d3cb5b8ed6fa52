"""`python -m sharegpu.kube.dra --node NAME [...]`: sharegpu's DRA driver on one node, until SIGTERM
or SIGINT: the kubelet plugin (prepare and unprepare claims as tenants) and the publisher of the
node's ResourceSlice. Errors before serving are one `sharegpu: error:` line (exit 2)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from sharegpu.errors import SharegpuError
from sharegpu.kube.apiclient import api_client, failure
from sharegpu.kube.dra.checkpoint import FILE, Checkpoint
from sharegpu.kube.dra.claims import ClaimRef
from sharegpu.kube.dra.health import HealthService
from sharegpu.kube.dra.prepare import Preparer
from sharegpu.kube.dra.publisher import CHECK_S, SlicePublisher
from sharegpu.kube.dra.registration import DEFAULT_KUBELET_DIR, PluginServer
from sharegpu.kube.dra.service import DraService
from sharegpu.kube.dra.slices import check_partitions
from sharegpu.kube.dra.status import ClaimStatus
from sharegpu.kube.serving import run_until_signalled
from sharegpu.runtime.cdi.generate import DEFAULT_SPEC_DIR, SPEC_FILE
from sharegpu.tenant import runtime_dir

DEFAULT_STATE_DIR = Path("/var/lib/sharegpu")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sharegpu.kube.dra", description=__doc__)
    p.add_argument(
        "--node", default=os.environ.get("NODE_NAME"), help="this node's name (default: $NODE_NAME)"
    )
    p.add_argument(
        "--kubelet-dir",
        type=Path,
        default=DEFAULT_KUBELET_DIR,
        help="the kubelet's root directory (its plugins_registry and plugins are under it)",
    )
    p.add_argument(
        "--state-dir", type=Path, default=DEFAULT_STATE_DIR, help=f"where the checkpoint ({FILE}) is kept"
    )
    p.add_argument(
        "--cdi-spec",
        default=str(DEFAULT_SPEC_DIR / SPEC_FILE),
        help="the CDI spec rewritten at each prepare, or 'none'",
    )
    p.add_argument(
        "--partitions",
        default="",
        help="publish each GPU whole and in these numbers of equal parts (e.g. 1,2,4), for clusters "
        "without consumable capacity; default: each GPU one shared device",
    )
    p.add_argument(
        "--publish-interval",
        type=float,
        default=CHECK_S,
        help="seconds between checks of the GPUs, for the ResourceSlice and the devices' health",
    )
    p.add_argument("--check-interval", type=float, default=1.0, help="seconds between plugin socket checks")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if not args.node:
            raise SharegpuError(
                "give --node NAME (or set NODE_NAME): the node whose claims this plugin prepares"
            )
        if args.publish_interval <= 0 or args.check_interval <= 0:
            raise SharegpuError("--publish-interval and --check-interval must be above 0")
        try:
            partitions = check_partitions([int(k) for k in args.partitions.split(",") if k.strip()])
        except ValueError as err:
            raise SharegpuError(f"--partitions {args.partitions}: a list of numbers, like 1,2,4") from err
        from kubernetes.client import CoreV1Api, CustomObjectsApi

        api = api_client("dra")
        objects, core = CustomObjectsApi(api), CoreV1Api(api)

        def read_claim(ref: ClaimRef) -> Any:
            return objects.get_namespaced_custom_object(
                "resource.k8s.io", "v1", ref.namespace, "resourceclaims", ref.name
            )

        def read_pod(namespace: str, name: str) -> Any:
            return api.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))

        preparer = Preparer(
            node=args.node,
            root=runtime_dir(),
            checkpoint=Checkpoint(args.state_dir / FILE),
            read_claim=read_claim,
            read_pod=read_pod,
            cdi_spec=None if args.cdi_spec == "none" else Path(args.cdi_spec),
            partitions=partitions,
            status=ClaimStatus(api),
            explain=lambda err: failure(err, api),
        )
        preparer.recover()
        publisher = SlicePublisher(args.node, api, partitions=partitions, check_s=args.publish_interval)
        health = HealthService(args.node, partitions, check_s=args.publish_interval)
        server = PluginServer(
            DraService(preparer), args.kubelet_dir, health=health, check_s=args.check_interval
        )
    except (SharegpuError, ValueError) as err:
        print(f"sharegpu: error: {err}", file=sys.stderr)
        return 2

    run_until_signalled(server, [publisher])
    return 0


if __name__ == "__main__":
    sys.exit(main())
