"""The agent's server loop and its stop, in process: a stop ends the main loop and every sleep at
once. The daemon as a process on the simulated GPU is tests/integration/test_agent_daemon.py.
"""

from __future__ import annotations

import time

import pytest


@pytest.mark.timing
def test_the_servers_main_loop_ends_when_told_not_at_its_next_second() -> None:
    """uvicorn's loop is made to wake once a second (not ten times); exit() must wake it."""
    import asyncio

    import uvicorn

    from sharegpu.agent.daemon import _Server

    async def scenario() -> float:
        server = _Server(uvicorn.Config(lambda *_: None, lifespan="off", log_config=None))
        running = asyncio.create_task(server.main_loop())
        await asyncio.sleep(0.2)
        began = time.monotonic()
        server.exit()
        await asyncio.wait_for(running, 10)
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 0.5


@pytest.mark.timing
def test_a_stop_ends_every_sleep_at_once_and_later_ones_do_not_sleep() -> None:
    import asyncio

    from sharegpu.agent.daemon import Stop

    async def scenario() -> tuple[float, float, float]:
        stop = Stop()
        began = time.monotonic()
        await stop.sleep(0.05)  # not set: the whole time
        slept = time.monotonic() - began
        sleepers = [asyncio.create_task(stop.sleep(60)) for _ in range(3)]
        await asyncio.sleep(0.05)
        began = time.monotonic()
        stop.set()
        await asyncio.gather(*sleepers)
        woken = time.monotonic() - began
        began = time.monotonic()
        await stop.sleep(60)  # already set
        return slept, woken, time.monotonic() - began

    slept, woken, after = asyncio.run(scenario())
    assert slept >= 0.045
    assert woken < 1.0
    assert after < 1.0
