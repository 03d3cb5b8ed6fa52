"""Helpers of the tests that scrape a running agent's metrics (test_metrics.py, test_accounting.py,
test_damaged.py, test_deploy.py): a free port, a scrape parsed into families, one sample's value,
the agent's API, and a node with tenants at work."""

from __future__ import annotations

import contextlib
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from agentutil import Agent
from conftest import Sim
from sharegpu.spec import MIB


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def scrape_text(port: int) -> str:
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    return response.text


def families(text: str) -> dict[str, Metric]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Metric], name: str, suffix: str = "", /, **labels: str) -> float:
    family = fams[name]
    found = [
        s.value
        for s in family.samples
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, f"{name}{suffix} {labels}: {found}"
    return float(found[0])


def api(agent: Agent, path: str, method: str = "GET", **body: Any) -> Any:
    with agent.http() as http:
        response = http.request(method, path, json=body or None)
    assert response.status_code in (200, 201), response.text
    return response.json()


@contextlib.contextmanager
def running_agent(sim: Sim, tmp_path: Path, *args: str) -> Iterator[Agent]:
    agent = Agent(sim, tmp_path / "state", *args).start()
    try:
        yield agent
    finally:
        agent.close()


@contextlib.contextmanager
def busy_node(sim: Sim, agent: Agent) -> Iterator[dict[str, dict[str, Any]]]:
    """Three tenants: an online one and a capped offline one running kernels on GPU 0, and one
    holding 100 MiB on GPU 1 (with Kubernetes labels)."""
    views = {
        "web": api(
            agent,
            "/v1/tenants",
            "POST",
            name="web",
            memory="64MiB",
            gpus=["0"],
            priority="online",
            labels={"namespace": "shop", "pod": "web-0", "container": "app"},
        ),
        "batch": api(
            agent,
            "/v1/tenants",
            "POST",
            name="batch",
            memory="64MiB",
            gpus=["0"],
            policy="cap",
            compute="30%",
            priority="offline",
        ),
        "holder": api(
            agent,
            "/v1/tenants",
            "POST",
            name="holder",
            memory="256MiB",
            gpus=["1"],
            labels={"namespace": "ml", "pod": "h-0"},
        ),
    }
    procs = [
        sim.spawn_probe("saturate", "8", "500", env=sim.tenant_env(Path(views["batch"]["path"]))),
        sim.spawn_probe("bursts", "400", "20", "4", "300", env=sim.tenant_env(Path(views["web"]["path"]))),
        sim.spawn_probe(
            "-d",
            "1",
            "hold",
            "plain",
            str(100 * MIB),
            "60",
            env=sim.tenant_env(Path(views["holder"]["path"])),
        ),
    ]
    try:
        held = procs[2]
        assert held.stdout is not None
        assert held.stdout.readline().strip() == "ready=1"
        yield views
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)


def wait_for(port: int, check: Any, timeout: float = 20) -> dict[str, Metric]:
    deadline = time.monotonic() + timeout
    while True:
        fams = families(scrape_text(port))
        with contextlib.suppress(KeyError, AssertionError):
            if check(fams):
                return fams
        assert time.monotonic() < deadline, "the scrape never showed what was expected"
        time.sleep(0.3)
