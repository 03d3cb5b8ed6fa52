"""Fixtures of the end-to-end tests (containers, Kubernetes), beside tests/conftest.py's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apiserver_standin import ApiServerStandIn


@pytest.fixture
def api() -> Iterator[ApiServerStandIn]:
    """A fresh API-server stand-in (tests/apiserver_standin.py), stopped after the test."""
    with ApiServerStandIn() as server:
        yield server
