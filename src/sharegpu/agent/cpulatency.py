"""A CPU wake-up latency request held while the agent runs (Linux PM QoS, /dev/cpu_dma_latency).

When a tenant's burst ends and another tenant of its class waits, the arbiter hands the card on:
the holder grants the token and wakes the waiter's thread, asleep on a futex. How soon that
thread runs is the node's business: a CPU in a shallow idle state wakes in a microsecond or two,
one in a deep idle state, or a virtual CPU whose host descheduled it when it halted, in tens of
microseconds. With bursts under a millisecond a card changes hands hundreds to thousands of times
a second and pays that wake-up each time (docs/design/arbitration.md, "Turns": on the 2-vCPU VM
of the simulated GPU a hand-over took 16 µs on average where its median was 8 µs).

Linux lets a process ask every CPU to wake within N µs: it writes N to /dev/cpu_dma_latency and
keeps the file open. The kernel honours the lowest request any process holds and drops a request
when its file is closed, so an agent that exits, however it exits, withdraws its own. 0 keeps
idle CPUs polling. It is off unless the operator asks (``cpu_wakeup_latency_us``): shallow idle
states draw more power, which is the operator's trade (tuned's latency-performance profile makes
the same request for the whole node).

The request is held for as long as the agent runs, or (``cpu_wakeup_latency_while: online``)
only while a tenant of priority online is on the node: an online request pays a halted vCPU's
late return however its sync waits (docs/design/arbitration.md, "Periodic repeats without MPS"),
and a node of batch jobs alone need not pay the power. `OnlineLatency` is that loop, one member
of the agent's sweep: each second it looks at the tenants' limits in the sweep's snapshot.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path

from sharegpu.agent.events import Event
from sharegpu.agent.snapshot import NodeSnapshot, TenantRead
from sharegpu.errors import AgentError
from sharegpu.regions import abi

DEVICE = Path("/dev/cpu_dma_latency")
# When the request is held: for the agent's whole run, or while an online tenant is on the node.
LATENCY_WHILE = ("agent", "online")
# The largest value the kernel takes (2000 s): no constraint at all.
MAX_US = 2_000_000_000
_VALUE = struct.Struct("=i")


def effective_us(device: Path = DEVICE) -> int:
    """The latency the node's CPUs keep to now: the lowest request held, MAX_US if none."""
    with device.open("rb") as f:
        raw = f.read(_VALUE.size)
    if len(raw) != _VALUE.size:
        raise AgentError(f"{device}: read {len(raw)} bytes, expected {_VALUE.size}")
    return int(_VALUE.unpack(raw)[0])


class CpuLatencyRequest:
    """One request, held from `hold()` until `release()` (or the process's end)."""

    def __init__(self, us: int, device: Path = DEVICE) -> None:
        if not 0 <= us <= MAX_US:
            raise AgentError(f"CPU wake-up latency {us} µs: use 0 to {MAX_US}")
        self.us = us
        self.device = device
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def check(self) -> None:
        """Fail now, as hold() would, where the node cannot take the request: opening the file
        without writing to it asks nothing of the CPUs."""
        try:
            os.close(os.open(self.device, os.O_WRONLY | os.O_CLOEXEC))
        except OSError as err:
            raise _refused(self.us, self.device, err) from err

    def hold(self) -> int:
        """Make the request; returns the latency now in force (ours, or a lower one another
        process holds). A node that cannot take it is an error: the operator asked for it."""
        if self._fd is not None:
            return effective_us(self.device)
        try:
            fd = os.open(self.device, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as err:
            raise _refused(self.us, self.device, err) from err
        try:
            os.write(fd, _VALUE.pack(self.us))
        except OSError as err:
            os.close(fd)
            raise AgentError(f"cannot request a CPU wake-up latency of {self.us} µs: {err.strerror}") from err
        self._fd = fd
        return effective_us(self.device)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> CpuLatencyRequest:
        self.hold()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _refused(us: int, device: Path, err: OSError) -> AgentError:
    return AgentError(
        f"cannot request a CPU wake-up latency of {us} µs: {device}: {err.strerror} "
        "(it takes root and a kernel with PM QoS; or leave cpu_wakeup_latency_us unset)"
    )


def online_tenants(tenants: Iterable[TenantRead]) -> list[str]:
    """The tenants with an online share of some GPU, by their limits as read. Pure."""
    found = []
    for t in tenants:
        if t.limits is None:
            continue
        devices = t.limits.devices[: min(t.limits.device_count, abi.MAX_DEVICES)]
        if any(d.priority == abi.PRIORITY_ONLINE for d in devices):
            found.append(t.id)
    return found


class OnlineLatency:
    """Holds the request while a tenant of priority online is on the node (a sweep member)."""

    name = "cpu-latency"

    def __init__(self, root: Path, request: CpuLatencyRequest, *, interval_s: float = 1.0) -> None:
        self.root = root
        self.request = request
        self.interval_s = interval_s

    def tick(self, snapshot: NodeSnapshot | None = None) -> list[Event]:
        """Hold or withdraw the request by `snapshot`'s tenants (the sweep's; read now when not
        given). A request the node refuses now raises: the sweep logs and counts it, and the
        next tick tries again."""
        tenants = (snapshot or NodeSnapshot.take(self.root)).tenants
        online = online_tenants(tenants)
        if online and not self.request.held:
            in_force = self.request.hold()
            return [
                Event(
                    kind="agent.cpu_latency",
                    message=f"CPUs wake within {in_force} µs while online tenants run "
                    f"({', '.join(online)}; requested {self.request.us} µs)",
                    data={
                        "held": True,
                        "requested_us": self.request.us,
                        "in_force_us": in_force,
                        "online": online,
                    },
                )
            ]
        # A tenant whose limits did not read (being written) may be the online one: keep it.
        if not online and self.request.held and all(t.limits is not None for t in tenants):
            self.request.release()
            return [
                Event(
                    kind="agent.cpu_latency",
                    message="no online tenant left: the CPU wake-up latency request is withdrawn",
                    data={"held": False, "requested_us": self.request.us},
                )
            ]
        return []
