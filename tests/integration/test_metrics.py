"""The agent's Prometheus metrics: a real agent on the simulated GPU, scraped over HTTP.

Names, types, units and labels follow Prometheus' conventions, and the figures agree with the
API's. Tolerances are meant to hold on a loaded 2-core machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from agentutil import promtool
from conftest import Sim
from metricsutil import api, busy_node, families, free_port, running_agent, scrape_text, value, wait_for
from sharegpu import __version__
from sharegpu.agent import metrics
from sharegpu.agent.config import AgentConfig
from sharegpu.arbiter import ensure_arbiter
from sharegpu.devices import Gpu
from sharegpu.spec import MIB

# Names a scrape of a node with tenants must have (docs/metrics.md lists them all).
EXPECTED = {
    "sharegpu_build_info": "gauge",
    "sharegpu_agent_loop_cpu_seconds": "counter",
    "sharegpu_gpu_info": "gauge",
    "sharegpu_tenant_memory_cap_bytes": "gauge",
    "sharegpu_tenant_memory_used_bytes": "gauge",
    "sharegpu_tenant_memory_overhead_bytes": "gauge",
    "sharegpu_tenant_compute_share_ratio": "gauge",
    "sharegpu_tenant_compute_ceiling_ratio": "gauge",
    "sharegpu_tenant_compute_guaranteed_ratio": "gauge",
    "sharegpu_tenant_gpu_busy_seconds": "counter",
    "sharegpu_tenant_gpu_held_seconds": "counter",
    "sharegpu_tenant_gpu_wait_seconds": "counter",
    "sharegpu_tenant_gpu_throttled_seconds": "counter",
    "sharegpu_tenant_preemptions": "counter",
    "sharegpu_tenant_oom_refusals": "counter",
    "sharegpu_tenant_online_wait_seconds": "histogram",
    "sharegpu_gpu_memory_total_bytes": "gauge",
    "sharegpu_gpu_memory_used_bytes": "gauge",
    "sharegpu_gpu_busy_ratio": "gauge",
    "sharegpu_gpu_tenants": "gauge",
    "sharegpu_gpu_memory_allocated_bytes": "gauge",
    "sharegpu_gpu_compute_guaranteed_ratio": "gauge",
    "sharegpu_audit_events": "counter",
    "sharegpu_qos_decisions": "counter",
    "sharegpu_reaped_processes": "counter",
    "sharegpu_arbiter_rebuilds": "counter",
    "sharegpu_arbiter_handovers": "counter",
    "sharegpu_arbiter_holdbacks": "counter",
    "sharegpu_arbiter_holdback_misses": "counter",
    "sharegpu_arbiter_early_preemptions": "counter",
    "sharegpu_cdi_tenant_left_out": "gauge",
    "sharegpu_arbiter_quiet_windows": "counter",
    "sharegpu_arbiter_online_stalls": "counter",
    "sharegpu_arbiter_online_relearns": "counter",
    "sharegpu_arbiter_loans": "counter",
    "sharegpu_arbiter_queued_handovers": "counter",
    "sharegpu_arbiter_gates_opened": "counter",
    "sharegpu_arbiter_gate_wait_seconds": "counter",
    "sharegpu_arbiter_handoff": "gauge",
    "sharegpu_arbiter_stall_reclaims": "counter",
    "sharegpu_arbiter_entry_waits": "counter",
    "sharegpu_arbiter_quantum_seconds": "gauge",
    "sharegpu_arbiter_offline_inflight_max": "gauge",
    "sharegpu_arbiter_online_window_seconds": "gauge",
    "sharegpu_arbiter_holdback_max_seconds": "gauge",
    "sharegpu_arbiter_online_preempt": "gauge",
    "sharegpu_arbiter_preempt_min_kernel_seconds": "gauge",
    "sharegpu_arbiter_offline_quiet_seconds": "gauge",
}
K8S = ("namespace", "pod", "container")


def _online_observed(fams: dict[str, Metric]) -> bool:
    return value(fams, "sharegpu_tenant_online_wait_seconds", "_count", tenant="web") > 0


@pytest.mark.timing
def test_a_scrape_agrees_with_the_api(sim: Sim, tmp_path: Path) -> None:
    port = free_port()
    with (
        running_agent(sim, tmp_path, "--metrics-port", str(port), "--metrics-address", "127.0.0.1") as agent,
        busy_node(sim, agent),
    ):
        fams = wait_for(port, _online_observed)
        text = scrape_text(port)
        first = families(text)
        tenants = {t["id"]: t for t in api(agent, "/v1/tenants")["items"]}
        gpus = {g["uuid"]: g for g in api(agent, "/v1/gpus")["items"]}
        health = api(agent, "/v1/health")
        time.sleep(1.5)
        later = families(scrape_text(port))

    # Names and types.
    for name, kind in EXPECTED.items():
        assert name in fams, f"{name} missing"
        assert fams[name].type == kind, f"{name} is a {fams[name].type}, not {kind}"
    for family in first.values():
        assert family.name.startswith(("sharegpu_", "process_")), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name
        assert not family.name.endswith(("_ms", "_milliseconds", "_mib", "_percent", "_pct")), family.name
        # Bounded labels: never a pid, one label set per family.
        keys = {frozenset(k for k in s.labels if k != "le") for s in family.samples}
        assert len(keys) <= 1, f"{family.name}: label sets {keys}"
        assert not any("pid" in k for k in keys for k in k), family.name
        if family.name.endswith("_ratio"):
            assert all(0 <= s.value <= 1 for s in family.samples), family.name
    assert set(first["sharegpu_tenant_memory_used_bytes"].samples[0].labels) == {"tenant", "gpu", *K8S}

    # Build and GPU info, for joins.
    build = first["sharegpu_build_info"].samples[0]
    assert build.labels["version"] == __version__
    assert build.value == 1
    for uuid, gpu in gpus.items():
        info = value(first, "sharegpu_gpu_info", gpu=uuid, name=gpu["name"], index=str(gpu["index"]))
        assert info == 1
        assert value(first, "sharegpu_gpu_memory_total_bytes", gpu=uuid) == gpu["memory_total_bytes"]
        assert value(first, "sharegpu_gpu_memory_allocated_bytes", gpu=uuid) == gpu["memory_allocated_bytes"]
        assert value(first, "sharegpu_gpu_tenants", gpu=uuid) == len(gpu["tenants"])
    assert all(s.labels["driver"] for s in first["sharegpu_gpu_info"].samples)

    # The tenants' figures are the API's.
    for tid, view in tenants.items():
        for dev in view["devices"]:
            sel = {"tenant": tid, "gpu": dev["uuid"]}
            assert value(first, "sharegpu_tenant_memory_cap_bytes", **sel) == dev["memory_cap_bytes"]
            assert value(first, "sharegpu_tenant_memory_used_bytes", **sel) == dev["memory_used_bytes"]
            share = value(first, "sharegpu_tenant_compute_share_ratio", **sel)
            assert share == pytest.approx(dev["compute_share_ratio"])
    holder = tenants["holder"]["devices"][0]
    assert holder["memory_used_bytes"] == 100 * MIB
    labels = {"tenant": "holder", "gpu": holder["uuid"], "namespace": "ml", "pod": "h-0", "container": ""}
    assert value(first, "sharegpu_tenant_memory_used_bytes", **labels) == 100 * MIB
    batch = tenants["batch"]["devices"][0]["uuid"]
    assert value(first, "sharegpu_tenant_compute_guaranteed_ratio", tenant="batch") == pytest.approx(0.3)
    assert value(first, "sharegpu_tenant_compute_guaranteed_ratio", tenant="web") == 0

    # Busy seconds grow for a running tenant, by no more than the time that passed.
    busy = "sharegpu_tenant_gpu_busy_seconds"
    b0 = value(first, busy, "_total", tenant="batch", gpu=batch)
    b1 = value(later, busy, "_total", tenant="batch", gpu=batch)
    print(f"batch busy {b0:.3f} s -> {b1:.3f} s")
    assert 0 < b1 - b0 <= 3.0
    # The online wait histogram: cumulative buckets ending in +Inf == count.
    samples = [s for s in fams["sharegpu_tenant_online_wait_seconds"].samples if s.labels["tenant"] == "web"]
    buckets = [s.value for s in samples if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets)
    count = next(s.value for s in samples if s.name.endswith("_count"))
    assert buckets[-1] == count > 0
    web = {s.labels["pod"] for s in samples}
    assert web == {"web-0"}

    # Each periodic loop's own CPU: the API's figure lies between the two scrapes'; the jobs
    # that run on the event loop (gpus, sync) are not measured, so have none.
    cpu = "sharegpu_agent_loop_cpu_seconds"
    measured = {name: loop["cpu_seconds"] for name, loop in health["loops"].items()}
    assert {"reaper", "reconcile", "audit", "stalls", "qos", "metrics"} <= {
        name for name, spent in measured.items() if spent is not None
    }
    assert measured["gpus"] is None
    assert measured["sync"] is None
    for name, spent in measured.items():
        if spent is None:
            assert not [s for s in first[cpu].samples if s.labels["loop"] == name]
            continue
        before, after = value(first, cpu, "_total", loop=name), value(later, cpu, "_total", loop=name)
        assert before <= spent + 1e-6, (name, before, spent)
        assert spent <= after + 1e-6, (name, spent, after)
    assert value(later, cpu, "_total", loop="reaper") > 0

    # promtool's own lint of the exposition (required in CI, see agentutil.promtool).
    lint = subprocess.run(
        [str(promtool()), "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_port_zero_disables_and_the_endpoint_stops_with_the_agent(sim: Sim, tmp_path: Path) -> None:
    with running_agent(sim, tmp_path, "--metrics-port", "0") as agent:
        started = agent.wait_event("agent.started")
        assert started["data"]["metrics_port"] is None
        assert agent.stop() == 0
    port = free_port()
    with running_agent(sim, tmp_path, "--metrics-port", str(port), "--metrics-address", "127.0.0.1") as agent:
        assert agent.wait_event("agent.started")["data"]["metrics_port"] == port
        assert "sharegpu_build_info" in scrape_text(port)
        # The API answers while a scrape is served (it runs on its own thread).
        assert api(agent, "/v1/health")["status"] == "ok"
        assert agent.stop() == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)


def test_a_taken_port_is_logged_and_the_agent_runs_on(sim: Sim, tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with running_agent(
            sim, tmp_path, "--metrics-port", str(port), "--metrics-address", "127.0.0.1"
        ) as agent:
            assert agent.wait_event("agent.started")["data"]["metrics_port"] is None
            assert agent.stop() == 0
        assert "no metrics: cannot serve metrics" in agent.log.read_text()


def test_the_cli_default_port_is_documented() -> None:
    assert metrics.DEFAULT_PORT not in (9100, 9400, 9835)  # node_exporter, dcgm-exporter, nvidia_gpu_exporter
    defaults = AgentConfig.model_fields
    assert defaults["metrics_port"].default == metrics.DEFAULT_PORT
    assert defaults["metrics_address"].default == metrics.DEFAULT_ADDRESS
    shown = subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "agent", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    ).stdout
    assert str(metrics.DEFAULT_PORT) in shown
    doc = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    assert str(metrics.DEFAULT_PORT) in doc
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name in EXPECTED:
        assert f"`{name}" in doc, f"{name} is not documented in docs/metrics.md"
        assert f"`{name}" in readme, f"{name} is not documented in README.md"


# ---------------------------------------------------------------------------------------------
# In-process: the cost of a scrape (the event counters: tests/unit/test_metrics.py).


@pytest.mark.timing
def test_a_scrape_of_fifty_tenants_is_cheap(sim: Sim, tmp_path: Path) -> None:
    uuids = sim.uuids()
    for i in range(50):
        sim.tenant(f"t{i:02d}", 64, gpus=[i % len(uuids)])
    for uuid in uuids:
        ensure_arbiter(sim.runtime, uuid)
    gpus = [
        Gpu(index=i, uuid=u, name="sim", memory_total=1024 * MIB, memory_used=0, utilization_pct=0)
        for i, u in enumerate(uuids)
    ]
    sampler = metrics.OnlineWaitSampler(sim.runtime)
    sampler.tick()
    collector = metrics.SharegpuCollector(sim.runtime, dict, lambda: gpus, sampler=sampler)
    registry = metrics.build_registry(collector)
    generate_latest(registry)  # warm: imports, caches
    runs = 5
    began = time.process_time()
    for _ in range(runs):
        text = generate_latest(registry).decode()
    cpu = (time.process_time() - began) / runs
    print(f"one scrape of 50 tenants: {cpu * 1000:.1f} ms of CPU")
    assert cpu < 0.1
    fams = families(text)
    assert len(fams["sharegpu_tenant_memory_cap_bytes"].samples) == 50
    assert value(fams, "sharegpu_tenants", state="idle") == 50
