"""The arbiter settings an operator gives the agent (sharegpu.agent.tuning): they land in the GPU's
region, the counters of the region (the ABI 1.5 ones they drive among them) show in the API, the
metrics and `sharegpu devices` after real arbitrated work, and bad settings stop the agent
before it changes any region. Real agent processes and probes on the simulated GPU; the counts
asserted are minimums with wide margins (a loaded 2-core machine)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentutil import Agent, create
from arbiterutil import FIGURES, finish, start_at
from conftest import Sim, parse_kv
from metricsutil import free_port
from sharegpu.agent.tuning import ArbiterTuner, ArbiterTuning
from sharegpu.arbiter import (
    TUNABLES,
    arbiter_path,
    ensure_arbiter,
    read_arbiter,
    rebuild_arbiter,
    tune_arbiter,
)
from sharegpu.errors import SpecError
from sharegpu.regions import abi


def scrape(port: int) -> dict[tuple[str, str], float]:
    """The arbiter counters of a scrape: (sample name, gpu) -> value."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    found = {}
    for family in text_string_to_metric_families(response.text):
        if family.name.startswith("sharegpu_arbiter_"):
            assert family.type in ("counter", "gauge"), family.name
            for s in family.samples:
                found[s.name, s.labels.get("gpu", "")] = float(s.value)
    return found


def tunables(path: Path) -> dict[str, Any]:
    status = read_arbiter(path)
    return {name: getattr(status, name) for name in TUNABLES}


def gpus(agent: Agent) -> dict[str, dict[str, Any]]:
    with agent.http() as http:
        response = http.get("/v1/gpus")
    assert response.status_code == 200, response.text
    return {g["uuid"]: g for g in response.json()["items"]}


def online_next_to_offline(
    sim: Sim, online: Path, offline: Path, *, offline_s: str, offline_us: str, lead_ns: int, bursts: list[str]
) -> str:
    """The online probe's output: `bursts N PERIOD_MS K US` next to an offline job of kernels of
    `offline_us` that starts `lead_ns` before it and runs `offline_s` seconds."""
    at = start_at(0.5)
    off = sim.spawn_probe(
        "saturate", offline_s, offline_us, "kernel", str(at - lead_ns), env=sim.tenant_env(offline)
    )
    on = sim.spawn_probe("bursts", *bursts, str(at), env=sim.tenant_env(online))
    out, err = on.communicate(timeout=60)
    assert on.returncode == 0, err
    finish(off)
    return out


def requests_next_to_long_kernels(sim: Sim, online: Path, offline: Path) -> list[int]:
    """25 requests of one 1 ms kernel every 70 ms next to an offline job of 40 ms kernels (as in
    test_preemption.py): the requests' latencies (µs), sorted."""
    out = online_next_to_offline(
        sim,
        online,
        offline,
        offline_s="1.9",
        offline_us="40000",
        lead_ns=200_000_000,
        bursts=["25", "70", "1", "1000"],
    )
    return sorted(int(v) for k, v in parse_kv(out)[1] if k == "lat_us")


def periodic_requests_next_to_short_kernels(sim: Sim, online: Path, offline: Path) -> None:
    """60 requests of two 1 ms kernels every 25 ms next to an offline job of 1 ms kernels (as in
    test_arbiter.py): once the period is learned, offline launches are held back before each."""
    online_next_to_offline(
        sim,
        online,
        offline,
        offline_s="2.6",
        offline_us="1000",
        lead_ns=300_000_000,
        bursts=["60", "25", "2", "1000"],
    )


def write_config(tmp_path: Path, arbiter: object) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"version": 1, "arbiter": arbiter}))  # JSON is YAML
    return path


@pytest.mark.timing
def test_settings_land_and_the_counters_move_with_real_work(sim: Sim, tmp_path: Path) -> None:
    gpu0, gpu1 = sim.uuids()
    # GPU 1's region exists before the agent (made by `sharegpu run` without it, say): the
    # agent's loop tunes it. GPU 0's is made by the agent's first tenant there: tuned at once.
    ensure_arbiter(sim.runtime, gpu1)
    config = write_config(
        tmp_path,
        {
            # No prediction: every request is a surprise (as in test_preemption.py).
            "default": {"online_preempt": "drain", "holdback_max_ns": 0},
            gpu0: {"online_preempt": "early", "offline_quiet_ns": "5ms"},
        },
    )
    port = free_port()
    agent = Agent(
        sim,
        tmp_path / "state",
        "--config",
        str(config),
        "--metrics-port",
        str(port),
        "--metrics-address",
        "127.0.0.1",
    ).start()
    try:
        tuned1 = agent.wait_event("arbiter.tuned")
        assert tuned1["gpu"] == gpu1
        assert tuned1["data"]["changes"]["online_preempt"] == {"from": "early", "to": "drain"}
        assert tuned1["data"]["changes"]["holdback_max_ns"] == {
            "from": abi.ARB_DEFAULT_HOLDBACK_MAX_NS,
            "to": 0,
        }
        web = create(agent, name="web", memory="256MiB", gpus=["0"], compute="50%", priority="online")
        train = create(agent, name="train", memory="256MiB", gpus=["0"], compute="50%", priority="offline")
        arb = gpus(agent)[gpu0]["arbiter"]  # right after the create (which applies them)
        assert (arb["online_preempt"], arb["offline_quiet_ns"], arb["holdback_max_ns"]) == (
            "early",
            5_000_000,
            0,
        )
        assert (arb["early_preemptions"], arb["quiet_windows"]) == (0, 0)
        assert gpus(agent)[gpu1]["arbiter"]["online_preempt"] == "drain"
        assert tunables(arbiter_path(sim.runtime, gpu0))["offline_quiet_ns"] == 5_000_000  # the region itself

        # How many requests find the offline client holding the token (the others find it handed
        # back while the client waits for its kernel) is the machine's timing: 2 to 12 of 25
        # seen. Rounds of the work until one has been preempted early (the first, nearly always).
        rounds = []
        while len(rounds) < 4 and gpus(agent)[gpu0]["arbiter"]["early_preemptions"] == 0:
            rounds.append(requests_next_to_long_kernels(sim, Path(web["path"]), Path(train["path"])))

        arb = gpus(agent)[gpu0]["arbiter"]
        scraped = scrape(port)
        shown = sim.cli("devices", "-o", "wide", env=sim.env())
        listed = sim.cli("devices", "-o", "json", env=sim.env())
        print(f"latency (ms) {[[x // 1000 for x in lat] for lat in rounds]}; GPU 0 arbiter: {arb}")
        assert arb["early_preemptions"] >= 1
        assert arb["quiet_windows"] >= 5 * len(rounds)  # one after each request (25 a round)
        for lat in rounds:  # early: no request waits out a 40 ms kernel (drained: >= 20 ms)
            assert lat[-3] <= 20_000, lat
        # The agent's loops (QoS among them) left the settings as configured.
        assert (arb["online_preempt"], arb["offline_quiet_ns"]) == ("early", 5_000_000)
        # The metrics say the same as the API (the work is over: the counters are still).
        for name in ("early_preemptions", "quiet_windows"):
            assert scraped[f"sharegpu_arbiter_{name}_total", gpu0] == arb[name]
            assert scraped[f"sharegpu_arbiter_{name}_total", gpu1] == 0
        # And `sharegpu devices`, wide and JSON.
        assert shown.returncode == 0, shown.stderr
        assert "PREEMPT (EARLY)" in shown.stdout
        row = next(line for line in shown.stdout.splitlines() if gpu0 in line)
        assert f"early ({arb['early_preemptions']})" in row
        assert f"5ms ({arb['quiet_windows']})" in row
        assert "drain (0)" in next(line for line in shown.stdout.splitlines() if gpu1 in line)
        assert listed.returncode == 0, listed.stderr
        item = next(g for g in json.loads(listed.stdout)["items"] if g["uuid"] == gpu0)
        assert item["arbiter"]["early_preemptions"] == arb["early_preemptions"]
        assert item["arbiter"]["online_preempt"] == "early"
        assert agent.stop() == 0
    finally:
        agent.close()


def test_the_counters_show_in_the_api_the_metrics_and_devices(sim: Sim, tmp_path: Path) -> None:
    """Hold-backs from real work (periodic requests next to an offline job; the prediction is on by
    default). The counters of rare events, a stopped holder (`stall_reclaims`) and a tenant out of
    client entries (`entry_waits`), take seconds and 130 processes to make for real
    (test_arbiter.py): they are written into the region, as figures distinct from every other, so
    that one shown under another's name fails too."""
    gpu0 = sim.uuids()[0]
    port = free_port()
    agent = Agent(
        sim, tmp_path / "state", "--metrics-port", str(port), "--metrics-address", "127.0.0.1"
    ).start()
    try:
        web = create(agent, name="web", memory="256MiB", gpus=["0"], compute="50%", priority="online")
        train = create(agent, name="train", memory="256MiB", gpus=["0"], compute="50%", priority="offline")
        path = arbiter_path(sim.runtime, gpu0)
        assert gpus(agent)[gpu0]["arbiter"]["holdback_ns"] == 0
        rounds = 0  # how many requests are held back for is the machine's timing: rounds until one
        while rounds < 3 and read_arbiter(path).holdback_ns == 0:
            periodic_requests_next_to_short_kernels(sim, Path(web["path"]), Path(train["path"]))
            rounds += 1
        for name, value in (("stall_reclaims", 7_007), ("entry_waits", 11_011)):
            with path.open("r+b") as f:
                f.seek(getattr(abi.Arbiter, name).offset)
                f.write(value.to_bytes(8, "little"))
        # The work is over: the counters are still, and every reader sees the same figures.
        status = read_arbiter(path)
        arb = gpus(agent)[gpu0]["arbiter"]
        scraped = scrape(port)
        listed = sim.cli("devices", "-o", "json", env=sim.env())
        assert agent.stop() == 0
    finally:
        agent.close()
    print(f"{rounds} round(s); GPU 0 arbiter: {arb}")
    assert status.holdbacks >= 1
    assert status.holdback_ns > 0
    assert (status.stall_reclaims, status.entry_waits) == (7_007, 11_011)
    assert listed.returncode == 0, listed.stderr
    item = next(g for g in json.loads(listed.stdout)["items"] if g["uuid"] == gpu0)
    for name in FIGURES:
        assert arb[name] == getattr(status, name), name
        assert item["arbiter"][name] == getattr(status, name), name
    assert arb["mean_handover_idle_ns"] == pytest.approx(status.mean_handover_idle_ns)
    # The metrics: counters `_total`, times in seconds.
    assert scraped["sharegpu_arbiter_holdback_seconds_total", gpu0] == pytest.approx(status.holdback_ns / 1e9)
    for name in ("holdbacks", "holdback_misses", "reclaims", "stall_reclaims", "entry_waits", "grants"):
        assert scraped[f"sharegpu_arbiter_{name}_total", gpu0] == getattr(status, name), name


# Each tunable's gauge (docs/metrics.md) and its scale from the region's figure.
SETTING_GAUGES = {
    "quantum_ns": ("sharegpu_arbiter_quantum_seconds", 1e-9),
    "offline_inflight_max": ("sharegpu_arbiter_offline_inflight_max", 1),
    "online_window_ns": ("sharegpu_arbiter_online_window_seconds", 1e-9),
    "holdback_max_ns": ("sharegpu_arbiter_holdback_max_seconds", 1e-9),
    "online_preempt": ("sharegpu_arbiter_online_preempt", None),  # the mode's code
    "preempt_min_kernel_ns": ("sharegpu_arbiter_preempt_min_kernel_seconds", 1e-9),
    "offline_quiet_ns": ("sharegpu_arbiter_offline_quiet_seconds", 1e-9),
    "handoff": ("sharegpu_arbiter_handoff", None),
}
MODE_CODES = {
    "online_preempt": {"drain": 0, "early": 1, "by-kernel": 2},
    "handoff": {"drain": 0, "queued": 1},
}


def setting_gauges(port: int, gpu: str) -> dict[str, Any]:
    """The settings of GPU `gpu`'s arbiter as a scrape shows them: tunable -> the region's figure
    (nanoseconds, a count, a mode's name)."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert response.status_code == 200, response.text
    fams = {f.name: f for f in text_string_to_metric_families(response.text)}
    found: dict[str, Any] = {}
    for name, (metric, scale) in SETTING_GAUGES.items():
        assert fams[metric].type == "gauge", metric
        (value,) = [s.value for s in fams[metric].samples if s.labels["gpu"] == gpu]
        if scale is None:
            found[name] = {code: mode for mode, code in MODE_CODES[name].items()}[int(value)]
        else:
            found[name] = round(value / scale)
    return found


def test_the_settings_show_in_the_metrics_and_a_bad_one_changes_nothing(sim: Sim, tmp_path: Path) -> None:
    """GPU 1 has no tenant: neither the QoS loop nor the (unconfigured) settings loop writes its
    region, so the scrape shows exactly what tune_arbiter wrote."""
    gpu1 = sim.uuids()[1]
    path = ensure_arbiter(sim.runtime, gpu1)
    port = free_port()
    agent = Agent(
        sim, tmp_path / "state", "--metrics-port", str(port), "--metrics-address", "127.0.0.1"
    ).start()
    try:
        assert setting_gauges(port, gpu1) == tunables(path)  # the creator's defaults
        assert setting_gauges(port, gpu1)["online_preempt"] == "early"
        # Values distinct from every default and from each other: one shown under another's name fails.
        wanted = {
            "quantum_ns": 7_000_000,
            "offline_inflight_max": 5,
            "online_window_ns": 3_000_000_000,
            "holdback_max_ns": 2_000_000,
            "online_preempt": "by-kernel",
            "preempt_min_kernel_ns": 4_000_000,
            "offline_quiet_ns": 6_000_000,
            "handoff": "queued",
        }
        tune_arbiter(path, **wanted)
        assert tunables(path) == wanted
        assert setting_gauges(port, gpu1) == wanted
        tune_arbiter(path, online_preempt="drain", offline_quiet_ns=0)
        assert setting_gauges(port, gpu1) == wanted | {"online_preempt": "drain", "offline_quiet_ns": 0}
        # A bad value, after a good one: the same one-line error, and neither is written.
        before = tunables(path)
        with pytest.raises(SpecError) as raised:
            tune_arbiter(path, quantum_ns=20_000_000, holdback_max_ns=2 * 10**9)
        assert str(raised.value) == "invalid hold-back limit 2000000000 ns: must be 0 (off) to 1 s"
        assert tunables(path) == before
        assert setting_gauges(port, gpu1) == before
        assert agent.stop() == 0
    finally:
        agent.close()


BAD = [
    pytest.param(
        {"default": {"online_preempt": "sometimes"}}, "invalid online preemption 'sometimes'", id="mode"
    ),
    pytest.param({"default": {"offline_quiet_ns": -1}}, "invalid quiet window -1 ns", id="negative"),
    pytest.param({"default": {"offline_quiet_ns": "2s"}}, "invalid quiet window 2000000000 ns", id="over-1s"),
    pytest.param({"default": {"offline_quiet_ns": 1.5}}, "1.5 is not a time", id="non-integer"),
    pytest.param({"default": {"preempt_min_kernel_ns": "0.5ns"}}, "not a whole number", id="fraction-of-ns"),
    pytest.param({"default": {"offline_quiet_ns": "5 parsecs"}}, "is not a time", id="bad-unit"),
    pytest.param(
        {"default": {"quiet_ns": 5}}, "arbiter.default.quiet_ns .*unknown setting", id="unknown-field"
    ),
    pytest.param(
        {"default": {"offline_inflight_max": 4}}, "offline_inflight_max .*unknown setting", id="qos-owned"
    ),
    pytest.param(
        {"GPU-1": {"online_preempt": "drain"}}, "'GPU-1' is neither 'default' nor a GPU UUID", id="bad-gpu"
    ),
    pytest.param(
        {"default": {"online_preempt": "drain", "quantum_ns": 1}}, "invalid quantum 1 ns", id="quantum"
    ),
]


@pytest.mark.parametrize(("arbiter", "message"), BAD)
def test_bad_settings_stop_the_agent_and_change_nothing(
    sim: Sim, tmp_path: Path, arbiter: object, message: str
) -> None:
    path = ensure_arbiter(sim.runtime, sim.uuids()[0])
    tune_arbiter(path, online_preempt="by-kernel", offline_quiet_ns=7_000_000)  # not the defaults
    before = tunables(path)
    config = write_config(tmp_path, arbiter)
    proc = Agent(sim, tmp_path / "state").refused("--config", str(config))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    assert lines[0].startswith("sharegpu: error: invalid arbiter"), lines[0]
    assert f"file {config}" in lines[0]
    assert re.search(message, lines[0]), lines[0]
    assert tunables(path) == before
    assert not (sim.runtime / "agent.sock").exists()


def test_a_bad_environment_value_stops_the_agent_too(sim: Sim, tmp_path: Path) -> None:
    path = ensure_arbiter(sim.runtime, sim.uuids()[0])
    before = tunables(path)
    for bad, message in (
        ('{"default": {"online_preempt": "never"}}', "env SHAREGPU_ARBITER.*invalid online preemption"),
        ("online_preempt=drain", "must be JSON"),
    ):
        proc = sim.cli(*Agent(sim, tmp_path / "state").command()[3:], env=sim.env(SHAREGPU_ARBITER=bad))
        assert proc.returncode != 0
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert re.search(message, proc.stderr), proc.stderr
    assert tunables(path) == before


# ---------------------------------------------------------------------------------------------
# The loop itself, ticked in-process.


def test_the_tuner_keeps_only_what_is_configured(sim: Sim) -> None:
    gpu0, gpu1 = sim.uuids()
    p0, p1 = ensure_arbiter(sim.runtime, gpu0), ensure_arbiter(sim.runtime, gpu1)
    tuner = ArbiterTuner(
        sim.runtime,
        {gpu0: ArbiterTuning.model_validate({"online_preempt": "by-kernel", "preempt_min_kernel_ns": "2ms"})},
    )
    untouched = tunables(p1)
    (event,) = tuner.tick()
    assert (event.kind, event.gpu) == ("arbiter.tuned", gpu0)
    assert set(event.data["changes"]) == {"online_preempt", "preempt_min_kernel_ns"}
    assert tuner.tick() == []  # nothing differs: nothing written, no event
    assert tunables(p1) == untouched  # no entry for GPU 1 and no default
    # Fields it was not given are the operator's (or the QoS loop's): never written back.
    tune_arbiter(p0, offline_inflight_max=6, offline_quiet_ns=3_000_000)
    assert tuner.tick() == []
    assert (read_arbiter(p0).offline_inflight_max, read_arbiter(p0).offline_quiet_ns) == (6, 3_000_000)
    # A configured field changed behind its back is put back at the next tick.
    tune_arbiter(p0, online_preempt="drain")
    (event,) = tuner.tick()
    assert event.data["changes"] == {"online_preempt": {"from": "drain", "to": "by-kernel"}}
    # A region made anew (the reaper's rebuild after damage) starts at the defaults: tuned again.
    with p0.open("r+b") as f:
        f.write(b"\0" * 8)  # the magic
    assert rebuild_arbiter(sim.runtime, gpu0) is not None
    assert read_arbiter(p0).online_preempt == "early"
    (event,) = tuner.tick()
    assert set(event.data["changes"]) == {"online_preempt", "preempt_min_kernel_ns"}
    status = read_arbiter(p0)
    assert (status.online_preempt, status.preempt_min_kernel_ns) == ("by-kernel", 2_000_000)


def test_no_settings_no_writes(sim: Sim) -> None:
    path = ensure_arbiter(sim.runtime, sim.uuids()[0])
    before = path.read_bytes()
    assert ArbiterTuner(sim.runtime, {}).tick() == []
    assert path.read_bytes() == before


def test_print_config_shows_the_settings_and_their_source(sim: Sim, tmp_path: Path) -> None:
    config = write_config(tmp_path, {"default": {"online_preempt": "drain", "offline_quiet_ns": "2ms"}})
    proc = subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "agent", "--config", str(config), "--print-config"],
        env=sim.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("arbiter:"))
    assert "online_preempt: drain" in line
    assert "offline_quiet_ns: 2000000" in line
    assert f"# file {config}" in line
