"""The agent's CPU wake-up latency request (sharegpu.agent.cpulatency): what it refuses, that a
node without the PM QoS device is one clear error, and when the `online` loop holds it. The
request itself is tested against the kernel's device with the real agent
(tests/integration/test_agent_daemon.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharegpu.agent.cpulatency import MAX_US, CpuLatencyRequest, OnlineLatency, online_tenants
from sharegpu.agent.procs import ProcessTable
from sharegpu.agent.snapshot import NodeSnapshot, TenantRead
from sharegpu.errors import AgentError, ConfigError
from sharegpu.regions import abi


def tenant(name: str, *priorities: int) -> TenantRead:
    """A tenant as the sweep read it, with one device per priority (none: a read that failed)."""
    path = Path("/run/sharegpu/tenants") / name
    if not priorities:
        return TenantRead(path, None, None, ConfigError("being created"))
    limits = abi.Limits()
    limits.device_count = len(priorities)
    for i, p in enumerate(priorities):
        limits.devices[i].priority = p
    return TenantRead(path, None, limits, None)


def snapshot(*tenants: TenantRead) -> NodeSnapshot:
    return NodeSnapshot(Path("/run/sharegpu"), 0, list(tenants), [], ProcessTable())


@pytest.mark.parametrize("us", [-1, MAX_US + 1])
def test_a_latency_out_of_the_kernels_range_is_refused(us: int) -> None:
    with pytest.raises(AgentError, match=f"CPU wake-up latency {us} µs: use 0 to {MAX_US}"):
        CpuLatencyRequest(us)


def test_a_node_without_the_device_is_one_clear_error(tmp_path: Path) -> None:
    request = CpuLatencyRequest(0, device=tmp_path / "cpu_dma_latency")
    with pytest.raises(
        AgentError, match=r"cannot request a CPU wake-up latency of 0 µs: .*No such file.*root"
    ):
        request.hold()
    request.release()  # nothing held: nothing to do


def test_the_tenants_with_an_online_share_of_any_gpu_are_found() -> None:
    reads = [
        tenant("batch", abi.PRIORITY_OFFLINE),
        tenant("svc", abi.PRIORITY_NORMAL, abi.PRIORITY_ONLINE),
        tenant("new"),  # not readable yet: not online
        tenant("web", abi.PRIORITY_ONLINE),
    ]
    assert online_tenants(reads) == ["svc", "web"]
    # A device past the count is not the tenant's.
    stale = tenant("stale", abi.PRIORITY_NORMAL)
    assert stale.limits is not None
    stale.limits.devices[1].priority = abi.PRIORITY_ONLINE
    assert online_tenants([stale]) == []


def test_the_online_loop_holds_the_request_while_an_online_tenant_is_there(tmp_path: Path) -> None:
    device = tmp_path / "cpu_dma_latency"
    device.write_bytes(MAX_US.to_bytes(4, "little"))
    loop = OnlineLatency(tmp_path, CpuLatencyRequest(7, device=device))
    assert loop.tick(snapshot(tenant("batch", abi.PRIORITY_OFFLINE))) == []
    assert not loop.request.held
    (held,) = loop.tick(snapshot(tenant("batch", abi.PRIORITY_OFFLINE), tenant("web", abi.PRIORITY_ONLINE)))
    assert held.kind == "agent.cpu_latency"
    assert held.data["held"] is True
    assert held.data["online"] == ["web"]
    assert held.data["in_force_us"] == 7  # what the file says now: our request
    assert loop.request.held
    assert loop.tick(snapshot(tenant("web", abi.PRIORITY_ONLINE))) == []  # still held, said once
    assert loop.tick(snapshot(tenant("web"))) == []  # its limits being written: not let go
    assert loop.request.held
    (withdrawn,) = loop.tick(snapshot(tenant("batch", abi.PRIORITY_OFFLINE)))
    assert withdrawn.data["held"] is False
    assert not loop.request.held


def test_the_online_loop_on_a_node_that_refuses_raises_and_tries_again(tmp_path: Path) -> None:
    loop = OnlineLatency(tmp_path, CpuLatencyRequest(0, device=tmp_path / "missing"))
    with pytest.raises(AgentError, match="No such file"):
        loop.request.check()
    with pytest.raises(AgentError, match="No such file"):
        loop.tick(snapshot(tenant("web", abi.PRIORITY_ONLINE)))
    assert not loop.request.held
