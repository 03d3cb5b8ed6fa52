"""Fixtures of the integration tests (processes on the simulated GPU), beside tests/conftest.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentutil import Agent
from conftest import Sim


@pytest.fixture
def agent(sim: Sim, tmp_path: Path) -> Iterator[Agent]:
    """The node agent, running on the test's simulated node, with its state under tmp_path."""
    running = Agent(sim, tmp_path / "state").start()
    try:
        yield running
    finally:
        running.close()
