"""`python -m sharegpu.kube.deviceplugin --node NAME [...]`: the device plugin of one node, until
SIGTERM or SIGINT. Errors before serving are one `sharegpu: error:` line (exit 2).

Beside the plugin, two threads: the inventory publisher (the node's GPUs on its Node object,
kube/publisher.py; `--no-publish`) and the pod reaper (the tenants of pods that are gone,
podwatch.py; `--no-reap`). With `--pods-file` there is no API server: nothing is published and
the reaper reconciles with the file."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from sharegpu.devices import list_gpus
from sharegpu.errors import SharegpuError
from sharegpu.kube.apiclient import api_client
from sharegpu.kube.deviceplugin.allocate import Allocator
from sharegpu.kube.deviceplugin.pods import FilePodSource, KubePodSource, PodSource
from sharegpu.kube.deviceplugin.podwatch import FilePodReaper, PodReaper
from sharegpu.kube.deviceplugin.registration import DEFAULT_DIR, Registrar
from sharegpu.kube.deviceplugin.service import DevicePluginService
from sharegpu.kube.deviceplugin.slots import SLOTS_PER_GPU, Inventory
from sharegpu.kube.inventory import PUBLISH_INTERVAL_S, STALE_AFTER_S
from sharegpu.kube.publisher import InventoryPublisher
from sharegpu.kube.request import RESOURCE_VGPU
from sharegpu.kube.serving import run_until_signalled
from sharegpu.runtime.cdi.generate import DEFAULT_SPEC_DIR, SPEC_FILE
from sharegpu.tenant import runtime_dir


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sharegpu.kube.deviceplugin", description=__doc__)
    p.add_argument(
        "--node", default=os.environ.get("NODE_NAME"), help="this node's name (default: $NODE_NAME)"
    )
    p.add_argument(
        "--kubelet-dir", type=Path, default=DEFAULT_DIR, help="the kubelet's device plugin directory"
    )
    p.add_argument("--slots-per-gpu", type=int, default=SLOTS_PER_GPU, help="device IDs advertised per GPU")
    p.add_argument("--health-interval", type=float, default=5.0, help="seconds between NVML health polls")
    p.add_argument("--check-interval", type=float, default=1.0, help="seconds between kubelet restart checks")
    p.add_argument(
        "--cdi-spec",
        default=str(DEFAULT_SPEC_DIR / SPEC_FILE),
        help="the CDI spec rewritten at each allocation, or 'none'",
    )
    p.add_argument("--pods-file", type=Path, help="read pods from this JSON file, not the API server")
    p.add_argument("--cdi-only", action="store_true", help="answer with the CDI device name only")
    p.add_argument(
        "--no-publish", action="store_true", help="do not publish the node's GPU inventory and labels"
    )
    p.add_argument(
        "--publish-interval",
        type=float,
        default=PUBLISH_INTERVAL_S,
        help="seconds between publications of the GPU inventory (the extender's liveness signal)",
    )
    p.add_argument("--no-reap", action="store_true", help="do not remove the tenants of pods that are gone")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if not args.node:
            raise SharegpuError(
                "give --node NAME (or set NODE_NAME): the node whose pods this plugin allocates"
            )
        if not 0 < args.publish_interval < STALE_AFTER_S:
            raise SharegpuError(
                f"--publish-interval must be above 0 and below {STALE_AFTER_S:g} s, when the extender "
                f"takes a node's inventory for stale; not {args.publish_interval:g}"
            )
        pods: PodSource
        helpers: list[InventoryPublisher | PodReaper | FilePodReaper] = []
        if args.pods_file:
            pods = FilePodSource(args.pods_file)
            if not args.no_reap:
                helpers.append(FilePodReaper(args.node, pods, runtime_dir()))
        else:
            from kubernetes.client import CoreV1Api

            api = CoreV1Api(api_client("deviceplugin"))
            pods = KubePodSource(api.api_client)
            if not args.no_publish:
                helpers.append(
                    InventoryPublisher(
                        args.node,
                        api,
                        interval_s=args.publish_interval,
                        check_s=args.health_interval,
                    )
                )
            if not args.no_reap:
                helpers.append(PodReaper(args.node, api, runtime_dir()))
        allocator = Allocator(
            node=args.node,
            pods=pods,
            root=runtime_dir(),
            cdi_spec=None if args.cdi_spec == "none" else Path(args.cdi_spec),
            legacy_edits=not args.cdi_only,
        )
        inventory = Inventory(list_gpus, args.slots_per_gpu)
        service = DevicePluginService(inventory, allocator, health_interval_s=args.health_interval)
        registrar = Registrar(service, RESOURCE_VGPU, args.kubelet_dir, check_s=args.check_interval)
    except (SharegpuError, ValueError) as err:
        print(f"sharegpu: error: {err}", file=sys.stderr)
        return 2

    run_until_signalled(registrar, helpers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
