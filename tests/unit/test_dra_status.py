"""The claim's status.devices that the DRA plugin writes for a prepared claim (kube/dra/status.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from sharegpu.kube.dra.claims import AllocatedDevice, ClaimPlan, ClaimRef
from sharegpu.kube.dra.status import device_statuses
from sharegpu.spec import MIB, ComputeSpec


def plan(*devices: tuple[str, str | None]) -> ClaimPlan:
    return ClaimPlan(
        ref=ClaimRef("team-a", "serve-gpu-x7k2p", "0f3c2a9e-1111-2222-3333-444455556666"),
        devices=tuple(
            AllocatedDevice(
                request="gpu",
                pool="node-1",
                device=name,
                gpu_index=int(name.removeprefix("gpu-")),
                share_id=share,
                memory_bytes=4096 * MIB,
                compute_pct=30,
            )
            for name, share in devices
        ),
        compute=ComputeSpec.parse(compute="30%", policy="cap", priority="online"),
        pod="serve",
    )


def test_each_gpu_of_the_claim_gets_an_entry_naming_its_share_and_the_tenants_limits() -> None:
    now = datetime(2026, 12, 4, 23, 30, 5, tzinfo=UTC)
    entries = device_statuses(plan(("gpu-0", "5e0f-share"), ("gpu-1", None)), now)
    assert [(e["driver"], e["pool"], e["device"], e.get("shareID")) for e in entries] == [
        ("sharegpu.io", "node-1", "gpu-0", "5e0f-share"),
        ("sharegpu.io", "node-1", "gpu-1", None),
    ]
    data = {
        "tenant": "claim-0f3c2a9e-serve-gpu-x7k2p",
        "memoryMiB": 4096,
        "computePercent": 30,
        "policy": "cap",
        "priority": "online",
    }
    for entry in entries:
        assert entry["data"] == data
        (ready,) = entry["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "TenantReady")
        assert ready["lastTransitionTime"] == "2026-12-04T23:30:05Z"
        assert ready["message"] == "tenant claim-0f3c2a9e-serve-gpu-x7k2p: 4096 MiB, 30% (cap, online)"
