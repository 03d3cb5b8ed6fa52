"""The node agent as a daemon: live resize under running tenant processes, hot restart (SIGTERM
and SIGKILL) with tenants running, recovery and adoption, one agent per node.

Real processes on the simulated GPU. Tolerances are meant to hold on a loaded 2-core machine.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agentutil import Agent, allocator, create, step
from conftest import Sim, parse_kv, wait_for
from sharegpu import native
from sharegpu.agent.cpulatency import effective_us
from sharegpu.regions import abi
from sharegpu.spec import MIB
from sharegpu.tenant import read_limits, remove_tenant


def patch(agent: Agent, tenant: str, **changes: Any) -> dict[str, Any]:
    with agent.http() as http:
        response = http.patch(f"/v1/tenants/{tenant}", json=changes)
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def get(agent: Agent, tenant: str) -> dict[str, Any]:
    with agent.http() as http:
        response = http.get(f"/v1/tenants/{tenant}")
    assert response.status_code == 200, response.text
    view: dict[str, Any] = response.json()
    return view


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exited {proc.returncode}\n{out}\n{err}"
    return parse_kv(out)[0]


# ---------------------------------------------------------------------------------------------
# Live resize.


def test_live_memory_resize_under_a_running_process(agent: Agent, sim: Sim) -> None:
    view = create(agent, name="train", memory="256MiB", gpus=["0"])
    proc = allocator(sim, Path(view["path"]))
    try:
        assert step(proc, 200) == (["OK"], 256)
        # Shrink below what it holds: nothing is killed, new allocations are refused.
        shrunk = patch(agent, "train", memory="128MiB")
        assert shrunk["over_cap"] is True
        assert shrunk["devices"][0]["over_cap"] is True
        assert "new allocations are refused" in shrunk["note"]
        assert step(proc, 1) == (["OOM"], 128)
        assert proc.poll() is None
        view = get(agent, "train")
        assert (view["state"], view["over_cap"]) == ("running", True)
        assert view["devices"][0]["memory_used_bytes"] == 200 * MIB
        table = sim.cli("tenants").stdout
        assert "over cap" in table
        assert "new allocations are refused" in table
        # Grow again: the very next allocation succeeds (the shim re-reads the limits when their
        # generation moves, at its next allocation).
        patch(agent, "train", memory="512MiB")
        began = time.monotonic()
        assert step(proc, 300) == (["OK"], 512)
        print(f"first allocation after the resize answered in {(time.monotonic() - began) * 1000:.1f} ms")
        assert get(agent, "train")["over_cap"] is False
    finally:
        proc.communicate(timeout=60)  # closes its stdin: it exits
    assert proc.returncode == 0
    resized = agent.events(kind="tenant.resized", tenant="train")
    assert [e["severity"] for e in resized] == ["warning", "info"]
    assert resized[0]["data"]["over_cap"] is True


def _gpu_seconds(sim: Sim, tenant: str) -> float:
    """The tenant's GPU time as its shims charge it in the arbiter region, to the nanosecond
    (the API's figure is NVML's, integrated once a second: too coarse for a 2 s window)."""
    return next(t for t in _arbiter_tenants(sim) if t.id == tenant).gpu_time_ns / 1e9


def _achieved(sim: Sim, tenant: str, seconds: float) -> float:
    """Percent of the GPU the tenant held over the next `seconds` (the arbiter's counters)."""
    t0, g0 = time.monotonic(), _gpu_seconds(sim, tenant)
    time.sleep(seconds)
    return (_gpu_seconds(sim, tenant) - g0) / (time.monotonic() - t0) * 100


@pytest.mark.timing
def test_a_compute_resize_is_followed(agent: Agent, sim: Sim) -> None:
    view = create(agent, name="cap", memory="64MiB", gpus=["0"], policy="cap", compute="20%")
    proc = sim.spawn_probe("saturate", "6", "500", env=sim.tenant_env(Path(view["path"])))
    try:
        time.sleep(0.7)
        before = _achieved(sim, "cap", 1.5)
        patch(agent, "cap", compute="50%")
        time.sleep(0.3)
        after = _achieved(sim, "cap", 2.0)
        print(f"cap 20%: {before:.1f}%, then cap 50%: {after:.1f}%")
        assert 10 <= before <= 28
        assert 36 <= after <= 60
        entry = next(t for t in _arbiter_tenants(sim) if t.id == "cap")
        assert (entry.policy, entry.share_permille) == ("cap", 500)
    finally:
        finish(proc)


def _arbiter_tenants(sim: Sim) -> list[Any]:
    from sharegpu.arbiter import arbiter_path, read_arbiter

    return read_arbiter(arbiter_path(sim.runtime, sim.uuids()[0])).tenants


# ---------------------------------------------------------------------------------------------
# Hot restart.


@pytest.mark.timing
def test_sigkill_and_restart_while_tenants_run(agent: Agent, sim: Sim) -> None:
    capped = create(agent, name="capped", memory="64MiB", gpus=["0"], policy="cap", compute="30%")
    holder = create(agent, name="holder", memory="128MiB", gpus=["1"], labels={"pod": "h-0"})
    busy = sim.spawn_probe("saturate", "5", "500", env=sim.tenant_env(Path(capped["path"])))
    held = sim.spawn_probe(
        "-d", "1", "hold", "plain", str(100 * MIB), "60", env=sim.tenant_env(Path(holder["path"]))
    )
    try:
        assert held.stdout is not None
        assert held.stdout.readline().strip() == "ready=1"
        time.sleep(0.5)
        agent.kill()
        assert agent.sock.exists()  # left behind: the next agent replaces it
        time.sleep(1.0)
        assert busy.poll() is None
        assert held.poll() is None
        # While the agent is down the CLI works directly, and the caps still hold.
        doc = json.loads(sim.cli("tenants", "-o", "json").stdout)
        assert sorted(t["id"] for t in doc["items"]) == ["capped", "holder"]
        over = sim.probe("-d", "1", "alloc", "plain", str(64 * MIB), env=sim.tenant_env(Path(holder["path"])))
        assert over["alloc"] == "CUDA_ERROR_OUT_OF_MEMORY"
        agent.start()
        with agent.client() as client:
            views = {t.id: t for t in client.list_tenants()}
        assert sorted(views) == ["capped", "holder"]
        assert all(v.managed for v in views.values())
        assert views["holder"].labels == {"pod": "h-0"}
        assert views["holder"].state == "running"
        assert views["holder"].devices[0].memory_used_bytes == 100 * MIB
        recovered = agent.events(kind="tenant.recovered")
        assert sorted(e["tenant"] for e in recovered) == ["capped", "holder"]
        assert not any(e["data"]["adopted"] for e in recovered)
        assert [e["kind"] for e in agent.events(kind="agent")] == ["agent.started", "agent.started"]
        # The compute tenant stayed capped through the restart.
        x = float(finish(busy)["achieved"]) * 100
        print(f"cap 30% across an agent SIGKILL and restart: {x:.1f}%")
        assert x <= 38
        assert held.poll() is None
    finally:
        for proc in (busy, held):
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def test_sigterm_stops_cleanly_and_the_state_survives(agent: Agent, sim: Sim) -> None:
    create(agent, name="web", memory="64MiB", gpus=["0"])
    assert agent.stop(signal.SIGTERM) == 0
    assert not agent.sock.exists()
    assert (sim.runtime / "tenants" / "web").is_dir()  # tenants outlive the agent
    agent.start()
    kinds = [e["kind"] for e in agent.events() if e["kind"].startswith(("agent.", "tenant."))]
    assert kinds == ["agent.started", "tenant.created", "agent.stopped", "tenant.recovered", "agent.started"]
    stopped = agent.events(kind="agent.stopped")[0]
    assert "SIGTERM" in stopped["message"]


def test_a_tenant_made_without_the_agent_is_adopted(agent: Agent, sim: Sim) -> None:
    assert agent.stop() == 0
    probe = str(native.probe_path())
    run = subprocess.Popen(
        [sys.executable, "-m", "sharegpu.cli", "run", "--name", "late", "-m", "64MiB", "--gpu", "0", "--",
         probe, "hold", "plain", str(MIB), "4"],
        env=sim.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert run.stdout is not None
        assert run.stdout.readline().strip() == "ready=1"
        agent.start()
        view = get(agent, "late")
        assert (view["managed"], view["state"], view["supervisor_pid"]) == (True, "running", run.pid)
        (adopted,) = agent.events(kind="tenant.recovered", tenant="late")
        assert adopted["data"]["adopted"] is True
        assert adopted["message"].startswith("tenant late adopted")
        assert run.wait(timeout=30) == 0
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate()
    # `sharegpu run` removes its tenant on exit through the tenant service it finds then: the
    # agent's, which came up meanwhile (sharegpu.doors), so the agent records the deletion.
    gone = agent.wait_event("tenant.deleted", "late")
    assert (gone["message"], gone["data"]["forced"]) == ("tenant late deleted", True)
    with agent.http() as http:
        assert http.get("/v1/tenants/late").status_code == 404


def test_a_vanished_tenant_is_dropped_and_a_half_written_one_repaired(agent: Agent, sim: Sim) -> None:
    gone = create(agent, name="gone", memory="64MiB", gpus=["0"])
    torn = create(agent, name="torn", memory="64MiB", gpus=["1"])
    patch(agent, "torn", memory="96MiB")
    agent.kill()
    remove_tenant(Path(gone["path"]))
    # An agent killed in the middle of a resize leaves the generation odd: the shim refuses the
    # GPU until someone finishes the write. The next agent does, from its record.
    limits = Path(torn["path"]) / abi.LIMITS_FILE
    limits.chmod(0o644)
    fd = os.open(limits, os.O_RDWR)
    try:
        with mmap.mmap(fd, ctypes.sizeof(abi.Limits)) as view:
            region = abi.Limits.from_buffer(view)
            region.generation += 1
            region.devices[0].mem_cap_bytes = 1  # half-written garbage
            del region
    finally:
        os.close(fd)
        limits.chmod(0o444)
    agent.start()
    (dropped,) = agent.events(kind="tenant.deleted", tenant="gone")
    assert "vanished" in dropped["message"]
    with agent.http() as http:
        assert http.get("/v1/tenants/gone").status_code == 404
    (recovered,) = agent.events(kind="tenant.recovered", tenant="torn")
    assert "half-written" in recovered["message"]
    region = read_limits(Path(torn["path"]))
    assert region.generation % 2 == 0
    assert region.devices[0].mem_cap_bytes == 96 * MIB
    meminfo = sim.probe("-d", "1", "meminfo", env=sim.tenant_env(Path(torn["path"])))
    assert int(meminfo["total"]) == 96 * MIB


def test_a_gpu_that_falls_off_is_reported_with_nvmls_words_and_comes_back(sim: Sim, tmp_path: Path) -> None:
    """The simulated NVML loses GPU 1 while the agent runs (a fault file it reads at every
    nvmlInit): the agent says so with NVML's error, lists GPU 0 alone, and sees GPU 1 return."""
    faults = tmp_path / "nvml-faults"
    agent = Agent(sim, tmp_path / "state", env={"SIMGPU_NVML_FAULTS": f"@{faults}"}).start()
    try:
        gpu0, gpu1 = sim.uuids()
        faults.write_text("1:lost\n")
        removed = agent.wait_event("gpu.removed")
        assert removed["gpu"] == gpu1
        assert removed["message"].endswith("is gone: NVML cannot query it (GPU is lost)"), removed
        assert removed["data"]["nvml_error"] == "GPU is lost"
        with agent.client() as client:
            assert [g.uuid for g in client.list_gpus()] == [gpu0]
        faults.unlink()
        added = agent.wait_event("gpu.added")
        assert added["gpu"] == gpu1
        with agent.client() as client:
            assert [g.uuid for g in client.list_gpus()] == [gpu0, gpu1]
        assert agent.stop() == 0
    finally:
        agent.close()


def test_one_agent_per_node(agent: Agent, sim: Sim, tmp_path: Path) -> None:
    other = Agent(sim, tmp_path / "state2").refused()
    assert other.returncode == 1
    lines = other.stderr.strip().splitlines()
    assert len(lines) == 1, other.stderr
    assert lines[0].startswith("sharegpu: error: another agent")
    assert str(agent.proc.pid if agent.proc else "") in lines[0]
    # The first one is undisturbed.
    with agent.client() as client:
        assert client.health().status == "ok"


@pytest.mark.timing
def test_gpu_list_and_events_follow(agent: Agent, sim: Sim) -> None:
    create(agent, name="a", memory="256MiB", gpus=["0"], policy="burst", compute="20%", ceiling="60%")
    hold = sim.spawn_probe(
        "hold", "plain", str(64 * MIB), "30", env=sim.tenant_env(sim.runtime / "tenants" / "a")
    )
    try:
        assert hold.stdout is not None
        assert hold.stdout.readline().strip() == "ready=1"
        with agent.client() as client:
            gpus = client.list_gpus()
            assert [g.index for g in gpus] == [0, 1]
            assert gpus[0].memory_allocated_bytes == 256 * MIB
            assert gpus[0].memory_tenants_used_bytes >= 64 * MIB
            assert gpus[0].compute_guaranteed_ratio == pytest.approx(0.2)
            assert gpus[0].memory_used_bytes >= 64 * MIB  # NVML's view of the card
            assert gpus[0].arbiter is not None
            assert gpus[1].arbiter is None
            # A reader waiting for new events gets one as soon as it is recorded.
            _items, last = client.events(kind="tenant")
            later = threading.Timer(0.5, patch, args=(agent, "a"), kwargs={"weight": 5})
            began = time.monotonic()
            later.start()
            items, _ = client.events(since=last, kind="tenant", wait=20)
            waited = time.monotonic() - began
            later.join()
            assert [e.kind for e in items] == ["tenant.resized"]
            assert 0.4 <= waited < 10
    finally:
        hold.kill()
        hold.communicate()


def test_a_database_removed_under_the_running_agent_is_written_again(sim: Sim, tmp_path: Path) -> None:
    """Issue 36: deleting agent.db under a running agent raised nothing (its connection keeps the
    old file), and after a restart its own tenants were adopted as made without it.  The agent
    writes the file again from its open copy and says so; a restart then recovers its tenants."""
    state = tmp_path / "state"
    agent = Agent(sim, state).start()
    try:
        create(agent, name="web", memory="64MiB", gpus=["0"])
        for name in ("agent.db", "agent.db-wal", "agent.db-shm"):
            (state / name).unlink(missing_ok=True)
        restored = agent.wait_event("agent.store_restored")
        assert restored["severity"] == "error"
        assert "was removed while it ran" in restored["message"]
        assert (state / "agent.db").is_file()
        create(agent, name="db", memory="64MiB", gpus=["0"])  # written to the new file
        assert agent.stop() == 0
        agent.start()
        recovered = {e["tenant"]: e for e in agent.events(kind="tenant.recovered")}
        assert recovered["web"]["data"]["adopted"] is False
        assert recovered["db"]["data"]["adopted"] is False
    finally:
        agent.close()


def test_a_cpu_wakeup_latency_request_lasts_as_long_as_the_agent(sim: Sim, tmp_path: Path) -> None:
    """--cpu-wakeup-latency-us: the kernel's PM QoS device reports the request while the agent
    runs, and the request goes with the agent however it ends (the kernel drops it when the
    agent's file closes, a SIGKILL included)."""
    before = effective_us()
    assert before > 17, "another process holds a lower request: this test would prove nothing"
    agent = Agent(sim, tmp_path / "state", "--cpu-wakeup-latency-us", "17").start()
    try:
        assert effective_us() == 17
        started = agent.events(kind="agent.started")[-1]
        assert started["data"]["cpu_wakeup_latency_us"] == 17
        assert agent.stop(signal.SIGTERM) == 0
        assert effective_us() == before
        agent.start()
        assert effective_us() == 17
        agent.kill()
        assert effective_us() == before
    finally:
        agent.close()
    bad = Agent(sim, tmp_path / "state").refused("--cpu-wakeup-latency-us", "-3")
    assert bad.returncode != 0
    assert "cpu_wakeup_latency_us" in bad.stderr
    assert effective_us() == before


def test_a_cpu_wakeup_latency_request_while_online_follows_the_online_tenants(
    sim: Sim, tmp_path: Path
) -> None:
    """--cpu-wakeup-latency-while online: the request is held only while a tenant of priority
    online is on the node (the sweep looks each second), withdrawn when the last one goes, and
    gone with the agent however it ends."""
    before = effective_us()
    assert before > 17, "another process holds a lower request: this test would prove nothing"
    agent = Agent(
        sim, tmp_path / "state", "--cpu-wakeup-latency-us", "17", "--cpu-wakeup-latency-while", "online"
    )
    agent.start()
    try:
        started = agent.events(kind="agent.started")[-1]
        assert started["data"]["cpu_wakeup_latency_while"] == "online"
        batch = {"name": "batch", "memory": "64MiB", "gpus": ["0"], "compute": "50%", "priority": "offline"}
        with agent.client() as client:
            client.create_tenant(batch)
            time.sleep(2.5)  # two sweeps or more
            assert effective_us() == before  # a node of batch jobs pays no power for it
            client.create_tenant(batch | {"name": "web", "priority": "online"})
            wait_for(lambda: effective_us() == 17, "the request held for the online tenant", 10)
            (held,) = agent.events(kind="agent.cpu_latency")
            assert held["data"]["held"] is True
            assert held["data"]["online"] == ["web"]
            client.delete_tenant("web")
            wait_for(lambda: effective_us() == before, "the request withdrawn with the tenant", 10)
            assert agent.events(kind="agent.cpu_latency")[-1]["data"]["held"] is False
            client.create_tenant(batch | {"name": "web2", "priority": "online"})
            wait_for(lambda: effective_us() == 17, "the request held again", 10)
        agent.kill()
        assert effective_us() == before
    finally:
        agent.close()
    bad = Agent(sim, tmp_path / "state").refused("--cpu-wakeup-latency-while", "sometimes")
    assert bad.returncode != 0
    assert "cpu_wakeup_latency_while" in bad.stderr
