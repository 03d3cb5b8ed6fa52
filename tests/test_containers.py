"""vGPUs in real containers: Podman with runc reads the CDI spec of `sharegpu cdi generate` and
runs the driver-API probe, unmodified, in a root filesystem built from files (static busybox,
the probe and the C libraries it needs: no image registry is reachable).

Each test writes its own spec file into /var/run/cdi (Podman 4.3 reads no other directory) under
a name of its own, and removes it. In CI (`CI` set) a missing podman or runc, or a run as
non-root, fails these tests instead of skipping them: `.ci/run` installs them.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentutil import Agent, create
from conftest import Sim, parse_kv
from sharegpu.runtime.rootfs import build_rootfs
from sharegpu.tenant import iter_tenants, read_device_limits

CDI_DIR = Path("/var/run/cdi")
# This sandbox needs these on every `podman run` (no network namespace setup, low rlimits).
RUN_FLAGS = ["--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


def _require_podman() -> None:
    missing = [tool for tool in ("podman", "runc") if shutil.which(tool) is None]
    why = f"{', '.join(missing)} not installed" if missing else ""
    if not why and os.geteuid() != 0:
        why = "containers are run as root"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"{why}: .ci/run installs podman and runc, so this is a broken install")
        pytest.skip(why)


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """busybox, the probe and the libc it needs: the driver and the shim come from the spec."""
    _require_podman()
    if shutil.which("busybox") is None:
        if os.environ.get("CI"):
            pytest.fail("busybox-static is not installed: .ci/run installs it")
        pytest.skip("busybox not installed")
    return build_rootfs(tmp_path_factory.mktemp("rootfs"))


@pytest.fixture
def spec_file(sim: Sim) -> Iterator[Path]:
    path = CDI_DIR / f"sharegpu-test-{uuid.uuid4().hex[:12]}.json"
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def name() -> str:
    """A tenant name no other spec in /var/run/cdi uses: a device named in two spec files of one
    kind is unresolvable."""
    return f"web-{uuid.uuid4().hex[:8]}"


def generate(sim: Sim, spec_file: Path, *shapes: str) -> None:
    """The node's spec into spec_file, with these shapes only (none by default: a shape of a
    default size would clash with the same name in another test's leftover file)."""
    args = [a for shape in shapes or ("none",) for a in ("--shape", shape)]
    proc = sim.cli("cdi", "generate", *args, "--output", str(spec_file))
    assert proc.returncode == 0, proc.stderr


def unique_shape(suffix: str = "30") -> str:
    """A shape no other spec lists (its memory is the random part)."""
    return f"gpu0-{random.randrange(100, 400)}MiB-{suffix}"


def container_tenants(sim: Sim) -> dict[str, Path]:
    return {p.name: p for p in iter_tenants(sim.runtime) if p.name.startswith("ctr-")}


def wait_for(what: str, check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def podman(
    rootfs: Path, device: str, *command: str, detach: bool = False, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    cmd = ["podman", "--runtime", "runc", "run", *RUN_FLAGS, "--device", f"sharegpu.io/vgpu={device}"]
    cmd += ["-d", "--rm"] if detach else ["--rm"]
    cmd += ["--rootfs", str(rootfs), *command]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def test_a_container_sees_its_vgpu_and_is_refused_past_its_cap(
    sim: Sim, rootfs: Path, spec_file: Path, name: str
) -> None:
    sim.tenant(name, 512, gpus=[0])
    generate(sim, spec_file)
    proc = podman(rootfs, name, "/bin/sh", "-c", "sgprobe info; sgprobe alloc plain 400M 200M")
    assert proc.returncode == 0, proc.stderr
    values, lines = parse_kv(proc.stdout)
    assert values["dev0.total"] == str(512 << 20)  # the vGPU, not the 1 GiB card
    assert values["dev1.total"] == "0"  # a GPU the tenant was not given
    assert [v for k, v in lines if k == "alloc"] == ["OK", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert values["free"] == str(112 << 20)


def test_root_in_the_container_can_neither_write_its_limits_nor_point_the_shim_elsewhere(
    sim: Sim, rootfs: Path, spec_file: Path, name: str
) -> None:
    sim.tenant(name, 512, gpus=[0])
    generate(sim, spec_file)
    script = (
        "echo x > /run/sharegpu/tenant/limits && echo wrote=1 || echo wrote=0; "
        "SHAREGPU_TENANT=/tmp sgprobe meminfo"
    )
    proc = podman(rootfs, name, "/bin/sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    values, _ = parse_kv(proc.stdout)
    assert values["wrote"] == "0"
    assert "Read-only file system" in proc.stderr
    assert values["total"] == str(512 << 20)  # the mounted tenant, whatever the environment says


def test_a_killed_container_gives_its_memory_back(sim: Sim, rootfs: Path, spec_file: Path, name: str) -> None:
    web = sim.tenant(name, 512, gpus=[0])
    generate(sim, spec_file)
    started = podman(rootfs, name, "sgprobe", "hold", "plain", "400M", "60", detach=True)
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while (
            "ready=1"
            not in subprocess.run(
                ["podman", "logs", container], capture_output=True, text=True, check=False
            ).stdout
        ):
            assert time.monotonic() < deadline, "the container never allocated"
            time.sleep(0.1)
        host = sim.probe("alloc", "plain", "400M", env=sim.tenant_env(web))
        assert host["alloc"] == "CUDA_ERROR_OUT_OF_MEMORY"  # the container holds it
        subprocess.run(["podman", "kill", container], capture_output=True, check=True, timeout=30)
        killed = time.monotonic()
        while sim.probe("alloc", "plain", "400M", env=sim.tenant_env(web))["alloc"] != "OK":
            assert time.monotonic() - killed < 2, "the killed container's memory did not come back"
            time.sleep(0.05)
    finally:
        remove(container)


def test_two_containers_of_one_shape_are_two_tenants_gone_when_they_stop(
    sim: Sim, rootfs: Path, spec_file: Path
) -> None:
    shape = unique_shape()
    mib = int(shape.split("-")[1].removesuffix("MiB"))
    generate(sim, spec_file, shape)
    script = "sgprobe meminfo; sgprobe hold plain 64M 30"
    ids = []
    for _ in range(2):
        started = podman(rootfs, shape, "/bin/sh", "-c", script, detach=True)
        assert started.returncode == 0, started.stderr
        ids.append(started.stdout.strip())
    try:
        wait_for("both containers hold their memory", lambda: all("ready=1" in logs(c) for c in ids))
        tenants = container_tenants(sim)
        assert sorted(tenants) == sorted(f"ctr-{c[:12]}" for c in ids)
        for path in tenants.values():
            (limit,) = read_device_limits(path)
            assert limit.mem_cap_bytes == mib << 20
            assert limit.uuid == sim.uuids()[0]
        for c in ids:
            assert f"total={mib << 20}" in logs(c)  # each sees the shape, not the card
    finally:
        for c in ids:
            remove(c)
    wait_for("the containers' tenants are removed", lambda: not container_tenants(sim))


def remove(container: str) -> None:
    subprocess.run(["podman", "rm", "-f", container], capture_output=True, check=False, timeout=60)


def logs(container: str) -> str:
    return subprocess.run(["podman", "logs", container], capture_output=True, text=True, check=False).stdout


def test_a_shape_the_card_cannot_admit_fails_the_start_with_one_line_and_leaves_nothing(
    sim: Sim, rootfs: Path, spec_file: Path
) -> None:
    shape = unique_shape("60-cap")  # two 60% guarantees do not fit on one card
    generate(sim, spec_file, shape)
    first = podman(rootfs, shape, "sgprobe", "hold", "plain", "16M", "30", detach=True)
    assert first.returncode == 0, first.stderr
    try:
        wait_for("the first container runs", lambda: "ready=1" in logs(first.stdout.strip()))
        second = podman(rootfs, shape, "sgprobe", "meminfo")
        assert second.returncode != 0
        errors = [line for line in second.stderr.splitlines() if "sharegpu: error:" in line]
        assert len(errors) == 1, second.stderr
        assert "guarantee" in errors[0] or "100%" in errors[0], errors[0]
        assert len(container_tenants(sim)) == 1  # the refused container left no tenant
    finally:
        remove(first.stdout.strip())
    wait_for("the first container's tenant is removed", lambda: not container_tenants(sim))


def test_a_tenant_made_through_the_agent_is_a_device_within_seconds(
    sim: Sim, rootfs: Path, spec_file: Path, name: str, tmp_path: Path
) -> None:
    """The agent keeps the node's spec (`--cdi-spec`): create a tenant through its API and run a
    container of it, no `cdi generate` by hand; delete it and it is no device any more."""
    agent = Agent(sim, tmp_path / "state", "--cdi-spec", str(spec_file)).start()
    try:
        create(agent, name=name, memory="384MiB", gpus=["0"], compute="50%")
        wait_for("the spec lists the tenant", lambda: spec_file.is_file() and name in spec_file.read_text())
        assert any(name in e["data"]["devices"] for e in agent.events(kind="cdi.written"))
        proc = podman(rootfs, name, "sgprobe", "meminfo")
        assert proc.returncode == 0, proc.stderr
        assert parse_kv(proc.stdout)[0]["total"] == str(384 << 20)
        with agent.http() as http:
            assert http.delete(f"/v1/tenants/{name}").status_code == 204
        wait_for("the spec drops the tenant", lambda: f'"{name}"' not in spec_file.read_text())
        gone = podman(rootfs, name, "sgprobe", "meminfo")
        assert gone.returncode != 0
        assert "unresolvable CDI devices" in gone.stderr
    finally:
        agent.close()
