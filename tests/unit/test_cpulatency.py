"""The agent's CPU wake-up latency request (sharegpu.agent.cpulatency): what it refuses, and
that a node without the PM QoS device is one clear error. The request itself is tested against
the kernel's device with the real agent (tests/integration/test_agent_daemon.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sharegpu.agent.cpulatency import MAX_US, CpuLatencyRequest
from sharegpu.errors import AgentError


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
