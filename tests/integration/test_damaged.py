"""A damaged GPU arbiter region is an event, not a silent wall.

Every launch of every tenant on a GPU whose arbiter region the shim refuses fails closed
(tests/integration/test_arbiter.py). Here: `doctor` fails on it and says how to fix it, the agent
moves it aside and makes it anew within a second (an event and a metric), the tenants of the
other GPU are never blocked, and `top` shows a tenant whose files cannot be read instead of
hiding it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from arbiterutil import patch_file
from conftest import Sim, parse_kv
from metricsutil import api, families, free_port, running_agent, scrape_text, value
from sharegpu.arbiter import arbiter_damage, arbiter_path, ensure_arbiter, read_arbiter
from sharegpu.regions import abi

DAMAGE = [
    pytest.param(lambda p: patch_file(p, 0, b"XXXX"), "bad magic", id="magic"),
    pytest.param(lambda p: patch_file(p, abi.Arbiter.lock.offset, bytes(64)), "robust", id="mutex"),
    pytest.param(
        lambda p: patch_file(p, abi.Arbiter.quantum_ns.offset, (1).to_bytes(8, "little")),
        "quantum",
        id="quantum",
    ),
]


@pytest.mark.parametrize(("breakage", "message"), DAMAGE)
def test_doctor_fails_on_a_damaged_arbiter_region_with_its_fix(sim: Sim, breakage, message) -> None:  # type: ignore[no-untyped-def]
    path = ensure_arbiter(sim.runtime, sim.uuids()[0])
    ensure_arbiter(sim.runtime, sim.uuids()[1])
    healthy = {c["name"]: c for c in json.loads(sim.cli("doctor", "-o", "json").stdout)["items"]}
    assert healthy["arbiters"]["status"] == "ok"
    breakage(path)
    assert message in (arbiter_damage(path, sim.uuids()[0]) or "")
    proc = sim.cli("doctor", "-o", "json")
    assert proc.returncode == 1
    check = {c["name"]: c for c in json.loads(proc.stdout)["items"]}["arbiters"]
    assert check["status"] == "fail"
    assert message in check["message"]
    assert "mv " in check["fix"]
    assert "agent" in check["fix"]


@pytest.mark.timing
def test_the_agent_rebuilds_a_damaged_region_and_other_gpus_never_block(sim: Sim, tmp_path: Path) -> None:
    port = free_port()
    u0, u1 = sim.uuids()[:2]
    with running_agent(sim, tmp_path, "--metrics-port", str(port), "--metrics-address", "127.0.0.1") as agent:
        for name, gpu in (("zero", "0"), ("one", "1")):
            api(agent, "/v1/tenants", "POST", name=name, memory="64MiB", gpus=[gpu], compute="50%")
        one = sim.runtime / "tenants" / "one"
        steady = sim.spawn_probe("-d", "1", "saturate", "4", "500", env=sim.tenant_env(one))
        time.sleep(0.8)
        damaged = arbiter_path(sim.runtime, u0)
        patch_file(damaged, 0, b"XXXX")
        event = agent.wait_event("gpu.arbiter_rebuilt", timeout=10)
        assert event["gpu"] == u0
        assert "bad magic" in event["data"]["damage"]
        assert Path(event["data"]["moved_to"]).read_bytes()[:4] == b"XXXX"  # kept for a post-mortem
        assert read_arbiter(damaged).holder_pid is None  # a fresh, usable region
        zero = sim.runtime / "tenants" / "zero"
        res = sim.probe("launch", "2", "100", env=sim.tenant_env(zero))  # GPU 0 works again
        assert res["launched"] == "1"
        out, err = steady.communicate(timeout=60)
        assert steady.returncode == 0, err
        assert int(parse_kv(out)[0]["max_gap_us"]) < 500_000  # GPU 1's tenant never waited on it
        fams = families(scrape_text(port))
        assert value(fams, "sharegpu_arbiter_rebuilds", "_total", gpu=u0) == 1
        assert arbiter_damage(arbiter_path(sim.runtime, u1), u1) is None


def test_top_shows_a_tenant_it_cannot_read(sim: Sim) -> None:
    good = sim.tenant("good", 64, gpus=[0])
    bad = sim.tenant("bad", 64, gpus=[0])
    patch_file(bad / abi.LIMITS_FILE, 0, b"XXXX")
    out = sim.cli("top", "--once", "--sample", "0").stdout
    rows = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.split() and line.split()[0] in ("good", "bad")
    }
    assert set(rows) == {"good", "bad"}
    assert "unreadable" in rows["bad"]
    assert good.is_dir()
