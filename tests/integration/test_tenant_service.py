"""The tenant service (sharegpu.service, sharegpu.doors): every door makes the same tenant for the
same request, with and without an agent, and a delete names the incarnation it means."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentutil import Agent
from conftest import Sim, python
from sharegpu import access
from sharegpu.arbiter import TUNABLES, arbiter_path, read_arbiter
from sharegpu.devices import Gpu
from sharegpu.doors import AgentTenantService, tenant_service
from sharegpu.errors import TenantNotFound
from sharegpu.service import LocalTenantService, TenantRequest
from sharegpu.spec import MIB, ComputeSpec, GpuSelector
from sharegpu.tenant import iter_tenants, read_device_limits, read_meta

SETTINGS = {"default": {"online_preempt": "early", "offline_quiet_ns": "5ms"}}
SHAPE = "gpu0-300MiB-30"  # the CDI door's request; the others ask the same in their words
COMPUTE = ComputeSpec.parse(compute="30%")


def tenant_state(root: Path, name: str) -> dict[str, Any]:
    """What a door's tenant is on the node: its files, the arbiter grant and tuning of its GPU."""
    path = root / "tenants" / name
    limits = read_device_limits(path)
    region = arbiter_path(root, limits[0].uuid)
    status = read_arbiter(region)
    meta = read_meta(path)
    files = {}
    for file in ("limits", "usage", "meta.json"):
        st = (path / file).stat()
        files[file] = (oct(stat.S_IMODE(st.st_mode)), st.st_uid)
    return {
        "limits": [dataclasses.asdict(d) for d in limits],
        "files": files,
        "gpus": sorted(os.listdir(path / "gpus")),
        "supervisor": sorted(meta.get("supervisor", {})),  # pid and start time, whoever it is
        "grant": (sorted(access.acl_users(region)), access.world_writable(region)),
        "tuning": {field: getattr(status, field) for field in TUNABLES if field != "offline_inflight_max"},
    }


def fresh(sim: Sim) -> None:
    """No tenant and no arbiter region: the next door makes both."""
    assert list(iter_tenants(sim.runtime)) == []
    for region in (sim.runtime / "gpus").glob("*/arbiter"):
        region.unlink()


def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps({"version": 1, "arbiter": SETTINGS}))  # JSON is YAML
    return path


def request(supervisor: int) -> TenantRequest:
    return TenantRequest("web", 300 * MIB, [GpuSelector(index=0)], COMPUTE, supervisor_pid=supervisor)


LOCAL_DOOR = """
import sys
from sharegpu.service import LocalTenantService, TenantRequest
from sharegpu.spec import MIB, ComputeSpec, GpuSelector
from sharegpu.tenant import runtime_dir
request = TenantRequest("web", 300 * MIB, [GpuSelector(index=0)], ComputeSpec.parse(compute="30%"),
                        supervisor_pid=int(sys.argv[1]))
print(f"incarnation={LocalTenantService(runtime_dir()).create(request).incarnation}")
"""

WAIT_FOR_GO = """
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("ready")
while not pathlib.Path(sys.argv[2]).exists():
    time.sleep(0.05)
"""


RUN = [sys.executable, "-m", "sharegpu.cli", "run", "--name", "web", "--memory", "300MiB", "--gpu", "0"]
RUN += ["--compute", "30%"]


def run_door(sim: Sim, tmp_path: Path) -> dict[str, Any]:
    """`sharegpu run`'s tenant, read while its command runs."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    run = subprocess.Popen(
        [*RUN, "--", sys.executable, "-c", WAIT_FOR_GO, str(ready), str(go)],
        env=sim.env(SHAREGPU_NO_AGENT="1"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert run.poll() is None, run.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        state = tenant_state(sim.runtime, "web")
    finally:
        go.write_text("")
        _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert list(iter_tenants(sim.runtime)) == []  # removed at the command's exit
    return state


def cdi_door(sim: Sim, tmp_path: Path, holder: int) -> dict[str, Any]:
    """The CDI createRuntime hook's tenant, for the container whose process is `holder`."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    state = json.dumps(
        {"ociVersion": "1.0.2", "id": "feedbeef00112233", "pid": holder, "bundle": str(bundle)}
    )
    hook = [sys.executable, "-m", "sharegpu.cli", "hook"]
    made = subprocess.run(
        [*hook, "create", "--shape", SHAPE],
        input=state,
        env=sim.env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    found = tenant_state(sim.runtime, "ctr-feedbeef0011")
    gone = subprocess.run(
        [*hook, "poststop"], input=state, env=sim.env(), capture_output=True, text=True, check=False
    )
    assert gone.returncode == 0, gone.stderr
    return found


@pytest.fixture
def holders() -> Iterator[Callable[[], int]]:
    """Processes in mount namespaces of their own: a CDI door's container each (and a door's
    supervisor, so that every tenant has the same owner)."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "120"])
        started.append(proc)
        ours = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/ns/mnt") == ours:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        return proc.pid

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_every_door_makes_the_same_tenant_with_and_without_an_agent(
    sim: Sim, tmp_path: Path, holders: Callable[[], int]
) -> None:
    holder = holders()
    agent = Agent(sim, tmp_path / "state", "--config", str(config(tmp_path)))
    agent.start()  # writes the node's arbiter settings, which the doors without it apply too
    agent.stop()
    states: dict[str, dict[str, Any]] = {}

    fresh(sim)
    values, proc = python(sim.env(), LOCAL_DOOR.replace("sys.argv[1]", str(holder)))
    assert proc.returncode == 0, proc.stderr
    states["local service"] = tenant_state(sim.runtime, "web")
    LocalTenantService(sim.runtime).delete("web", incarnation=int(values["incarnation"]))

    fresh(sim)
    states["sharegpu run"] = run_door(sim, tmp_path)

    fresh(sim)
    states["cdi hook"] = cdi_door(sim, tmp_path, holders())

    fresh(sim)
    agent.start()
    try:
        with tenant_service(sim.runtime) as service:
            assert isinstance(service, AgentTenantService)
            tenant = service.create(request(holder))
            states["agent"] = tenant_state(sim.runtime, "web")
            service.delete("web", incarnation=tenant.incarnation)
        fresh(sim)
        states["cdi hook through the agent"] = cdi_door(sim, tmp_path, holders())
    finally:
        agent.close()

    reference = states["local service"]
    assert reference["tuning"]["online_preempt"] == "early"  # the settings did apply
    assert reference["tuning"]["offline_quiet_ns"] == 5_000_000
    assert reference["limits"][0]["mem_cap_bytes"] == 300 * MIB
    for door, state in states.items():
        assert state == reference, door


@pytest.mark.parametrize("with_agent", [False, True], ids=["local", "agent"])
def test_a_delete_of_a_stale_incarnation_removes_nothing(sim: Sim, tmp_path: Path, with_agent: bool) -> None:
    agent = Agent(sim, tmp_path / "state").start() if with_agent else None
    try:
        with tenant_service(sim.runtime) as service:
            assert isinstance(service, AgentTenantService) == with_agent
            if isinstance(service, LocalTenantService):  # this process has no NVML: the sim's GPUs
                gpus = [Gpu(i, uuid, "sim", sim.memory_mib * MIB, 0, 0) for i, uuid in enumerate(sim.uuids())]
                service.gpu_source = lambda: gpus
            first = service.create(request(os.getpid()))
            service.delete("web", incarnation=first.incarnation)
            second = service.create(request(os.getpid()))  # the same name: another tenant
            assert second.incarnation != first.incarnation
            with pytest.raises(TenantNotFound, match="is now another tenant"):
                service.delete("web", incarnation=first.incarnation)
            (kept,) = service.list_tenants()
            assert (kept.name, kept.incarnation) == ("web", second.incarnation)
            service.delete("web", incarnation=second.incarnation)
            assert service.list_tenants() == []
    finally:
        if agent is not None:
            agent.close()


@pytest.mark.parametrize("with_agent", [False, True], ids=["direct", "agent"])
def test_create_get_and_delete_one_tenant_from_the_command_line(
    sim: Sim, tmp_path: Path, with_agent: bool
) -> None:
    """Issue 36: no command made or removed a tenant for a container (the docs used curl, and a
    broken tenant could only be removed with curl).  The same commands, with and without an
    agent, through the one tenant service; each bad request one line, nothing changed."""
    agent = Agent(sim, tmp_path / "state").start() if with_agent else None
    try:
        made = sim.cli(
            "create", "web", "--memory", "256MiB", "--gpu", "0", "--compute", "30%", "--owner", "1000"
        )
        assert made.returncode == 0, made.stderr
        assert "created web" in made.stdout
        assert "sharegpu.io/vgpu=web" in made.stdout
        shown = sim.cli("get", "web", "-o", "json")
        assert shown.returncode == 0, shown.stderr
        (view,) = json.loads(shown.stdout)["items"]
        assert view["devices"][0]["memory_cap_bytes"] == 256 * MIB
        assert view["devices"][0]["policy"] == "share"
        assert view["managed"] is with_agent  # the agent made it and keeps it
        path = Path(view["path"])
        assert (path / "usage").stat().st_uid == 1000  # the owner's processes write it
        for bad, why in (
            (["create", "web", "--memory", "256MiB"], "exists"),
            (["create", "db", "--memory", "4Gi"], "4Gi"),
            (["create", "db", "--memory", "256MiB", "--owner", "-1"], "--owner"),
            (["get", "nope"], "nope"),
            (["delete", "nope"], "nope"),
            (["delete", "web", "--incarnation", str(view["incarnation"] + 2)], "incarnation"),
        ):
            proc = sim.cli(*bad)
            assert proc.returncode != 0, bad
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert why in proc.stderr, proc.stderr
        assert path.is_dir()  # nothing removed by the refused delete
        gone = sim.cli("delete", "web", "--incarnation", str(view["incarnation"]))
        assert gone.returncode == 0, gone.stderr
        assert not path.exists()
        if agent is not None:
            kinds = [e["kind"] for e in agent.events(tenant="web")]
            assert "tenant.created" in kinds
            assert "tenant.deleted" in kinds
    finally:
        if agent is not None:
            agent.close()
