"""CDI specs: the spec sharegpu writes for a node, through `sharegpu cdi generate` in a real
process on the simulated GPU, and the hooks that make a tenant per container. The rules of the
CDI specification (sharegpu.runtime.cdi.model) are tests/unit/test_cdi.py; what a container does
with the spec is tests/e2e/test_containers.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agentutil import Agent, create
from conftest import Sim
from mpsutil import mps_stand_in
from sharegpu.arbiter import ensure_arbiter
from sharegpu.tenant import iter_tenants

# ---------------------------------------------------------------------------------------------
# the node's spec


def generate(sim: Sim, *args: str) -> dict:  # type: ignore[type-arg]
    proc = sim.cli("cdi", "generate", "--output", "-", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def options(mount: dict) -> set[str]:  # type: ignore[type-arg]
    return set(mount["options"])


def test_a_tenant_is_a_device_with_its_limits_read_only_and_its_usage_and_arbiter_writable(
    sim: Sim,
) -> None:
    web = sim.tenant("web", 512, gpus=[0])
    sim.tenant("batch", 256, gpus=[1])
    uuid = sim.uuids()[0]
    ensure_arbiter(sim.runtime, uuid)
    doc = generate(sim, "--shape", "none")
    assert doc["cdiVersion"] == "0.3.0"  # the lowest its fields need: podman 4.3.1 reads it
    assert doc["kind"] == "sharegpu.io/vgpu"
    assert sorted(d["name"] for d in doc["devices"]) == ["batch", "web"]
    mine = next(d for d in doc["devices"] if d["name"] == "web")
    mounts = {m["containerPath"]: m for m in mine["containerEdits"]["mounts"]}
    limits = mounts["/run/sharegpu/tenant/limits"]
    assert limits["hostPath"] == str(web / "limits")
    assert {"ro", "bind"} <= options(limits)
    usage = mounts["/run/sharegpu/tenant/usage"]
    assert usage["hostPath"] == str(web / "usage")
    assert {"rw", "bind"} <= options(usage)
    arbiter = mounts[f"/run/sharegpu/tenant/gpus/{uuid}"]
    assert arbiter["hostPath"] == str(sim.runtime / "gpus" / uuid)
    assert "rw" in options(arbiter)
    assert len(mounts) == 3  # nothing of the other tenant, nor of the other GPU
    common = doc["containerEdits"]
    shared = {m["containerPath"]: m for m in common["mounts"]}
    preload = Path(shared["/etc/ld.so.preload"]["hostPath"])
    assert preload.read_text() == "/usr/lib/sharegpu/libsharegpu.so\n"
    assert "ro" in options(shared["/usr/lib/sharegpu/libsharegpu.so"])
    assert Path(shared["/usr/lib/sharegpu/simgpu"]["hostPath"], "libcuda.so.1").is_file()
    assert str(sim.state) in shared
    env = dict(e.split("=", 1) for e in common["env"])
    assert env["SHAREGPU_TENANT"] == "/run/sharegpu/tenant"
    assert not any("512" in v or "MIB" in k.upper() for k, v in env.items())  # no limits in it
    only = generate(sim, "--tenant", "batch", "--shape", "none")
    assert [d["name"] for d in only["devices"]] == ["batch"]


def test_under_a_live_mps_daemon_containers_get_its_pipe_directory_and_shm(sim: Sim, tmp_path: Path) -> None:
    """A pipe directory whose pid file names a live control daemon is mounted into every
    container at the same path and named in its environment, and the daemon's /dev/shm at
    /dev/shm; none is when the daemon is gone, when the directory is one that others may write
    (/tmp/nvidia-mps is anyone's to make), or when the daemon's /dev/shm is the machine's own."""
    sim.tenant("web", 512, gpus=[0])
    pipe, shm = tmp_path / "mps", tmp_path / "mps-shm"
    pipe.mkdir(mode=0o755)
    shm.mkdir()

    def common() -> tuple[dict[str, str], dict[str, dict]]:  # type: ignore[type-arg]
        env = sim.env(CUDA_MPS_PIPE_DIRECTORY=str(pipe))
        proc = sim.cli("cdi", "generate", "--output", "-", "--shape", "none", env=env)
        assert proc.returncode == 0, proc.stderr
        edits = json.loads(proc.stdout)["containerEdits"]
        return dict(e.split("=", 1) for e in edits["env"]), {m["containerPath"]: m for m in edits["mounts"]}

    env, mounts = common()
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env
    assert str(pipe) not in mounts
    stand_in = mps_stand_in(tmp_path, None)  # in this mount namespace: /dev/shm is everyone's
    try:
        (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{stand_in.pid}\n")
        env, mounts = common()
        assert "CUDA_MPS_PIPE_DIRECTORY" not in env
        assert "/dev/shm" not in mounts
    finally:
        stand_in.kill()
        stand_in.wait()
    stand_in = mps_stand_in(tmp_path, shm)
    try:
        (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{stand_in.pid}\n")
        env, mounts = common()
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
        assert mounts[str(pipe)]["hostPath"] == str(pipe)
        assert {"rw", "bind"} <= options(mounts[str(pipe)])
        assert mounts["/dev/shm"]["hostPath"] == str(shm)
        assert {"rw", "bind"} <= options(mounts["/dev/shm"])
        pipe.chmod(0o777)
        env, mounts = common()
        assert "CUDA_MPS_PIPE_DIRECTORY" not in env
        pipe.chmod(0o755)
        (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{os.getpid()}\n")  # alive, not a daemon
        env, mounts = common()
        assert "CUDA_MPS_PIPE_DIRECTORY" not in env
    finally:
        stand_in.kill()
        stand_in.wait()
    (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{stand_in.pid}\n")  # gone
    env, mounts = common()
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env
    assert "/dev/shm" not in mounts


def test_the_spec_file_is_written_whole_and_replaced_atomically(sim: Sim, tmp_path: Path) -> None:
    sim.tenant("web", 512, gpus=[0])
    out = tmp_path / "cdi"
    proc = sim.cli("cdi", "generate", "--shape", "none", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    target = out / "sharegpu.json"
    assert proc.stdout.strip() == f"wrote {target} (cdiVersion 0.3.0): sharegpu.io/vgpu=web"
    first = target.stat().st_ino
    sim.tenant("batch", 256, gpus=[0])
    assert sim.cli("cdi", "generate", "--shape", "none", "--output", str(out)).returncode == 0
    assert target.stat().st_ino != first  # renamed over, never rewritten in place
    assert sorted(d["name"] for d in json.loads(target.read_text())["devices"]) == ["batch", "web"]
    assert sorted(p.name for p in out.iterdir()) == [
        ".sharegpu.json.owner",
        "sharegpu.json",
    ]  # no temporary file left
    named = tmp_path / "other.json"
    assert sim.cli("cdi", "generate", "--output", str(named)).returncode == 0
    assert json.loads(named.read_text())["kind"] == "sharegpu.io/vgpu"


def test_bad_requests_get_one_clear_line(sim: Sim, tmp_path: Path) -> None:
    proc = sim.cli("cdi", "generate", "--shape", "none", "--output", str(tmp_path))
    assert proc.returncode == 1
    assert "no tenant on this node" in proc.stderr
    assert "Traceback" not in proc.stderr
    sim.tenant("web", 512, gpus=[0])
    proc = sim.cli("cdi", "generate", "--tenant", "nosuch", "--output", "-")
    assert proc.returncode == 1
    assert "no tenant 'nosuch'" in proc.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = sim.cli("cdi", "generate", "--output", str(blocker / "cdi"))
    assert proc.returncode == 2  # an output that cannot be written is bad input
    assert proc.stderr.startswith(
        f"sharegpu: error: cannot write the CDI spec to {blocker}/cdi/sharegpu.json"
    )
    assert "Traceback" not in proc.stderr


def test_shape_devices_carry_the_hooks_that_make_a_tenant_per_container(sim: Sim) -> None:
    doc = generate(sim)
    names = [d["name"] for d in doc["devices"]]
    assert names == [
        f"gpu{g}-{m}-{c}" for g in (0, 1) for m, c in (("256MiB", 25), ("512MiB", 50), ("1GiB", 100))
    ]
    hooks = doc["devices"][0]["containerEdits"]["hooks"]
    assert [h["hookName"] for h in hooks] == ["createRuntime", "poststop"]
    create = hooks[0]
    assert create["args"][1:] == ["-m", "sharegpu.runtime.cdi.hook", "create", "--shape", "gpu0-256MiB-25"]
    assert Path(create["path"]).is_absolute()
    assert f"SHAREGPU_RUNTIME_DIR={sim.runtime}" in create["env"]  # hooks get no other environment
    assert create["timeout"] > 0
    assert "mounts" not in doc["devices"][0]["containerEdits"]  # the hook mounts the tenant it makes
    custom = generate(sim, "--shape", "gpu1-300MiB-40-online-cap")
    assert [d["name"] for d in custom["devices"]] == ["gpu1-300MiB-40-online-cap"]


def test_shapes_the_node_cannot_hold_are_refused(sim: Sim) -> None:
    proc = sim.cli("cdi", "generate", "--shape", "gpu0-2GiB-30", "--shape", "gpu5-1GiB-30", "--output", "-")
    assert proc.returncode == 2
    assert "gpu0-2GiB-30: more memory than GPU 0 has (1GiB)" in proc.stderr
    assert "gpu5-1GiB-30: this node has no GPU 5 (2 GPUs)" in proc.stderr
    proc = sim.cli("cdi", "generate", "--shape", "gpu0-4GiB", "--output", "-")
    assert proc.returncode == 2
    assert proc.stderr.startswith("sharegpu: error: invalid vGPU shape 'gpu0-4GiB'")


# ---------------------------------------------------------------------------------------------
# the hooks, called as a runtime calls them, with bad input


def hook(sim: Sim, state: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sharegpu.cli", "hook", *args],
        input=state,
        env=sim.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def oci_state(tmp_path: Path, container_id: str, pid: int) -> str:
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    return json.dumps({"ociVersion": "1.0.2", "id": container_id, "pid": pid, "bundle": str(bundle)})


def test_a_hook_that_fails_leaves_no_tenant_and_says_why_in_one_line(sim: Sim, tmp_path: Path) -> None:
    sim.uuids()  # the simulated GPU exists
    state = oci_state(tmp_path, "abc123def4567890", os.getpid())
    (tmp_path / "bundle" / "config.json").unlink()  # the mounts fail after the tenant is made
    proc = hook(sim, state, "create", "--shape", "gpu0-300MiB-30")
    assert proc.returncode == 1
    assert proc.stderr.count("sharegpu: error:") == 1, proc.stderr
    assert "container abc123def4567890" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(iter_tenants(sim.runtime)) == []  # made, then removed again
    dead = subprocess.Popen(["true"])
    dead.wait()  # a container whose process is gone: refused before anything is made
    proc = hook(sim, oci_state(tmp_path, "abc123def4567890", dead.pid), "create", "--shape", "gpu0-300MiB-30")
    assert (proc.returncode, proc.stderr.strip()) == (
        2,
        f"sharegpu: error: supervisor process {dead.pid} does not exist",
    )
    assert list(iter_tenants(sim.runtime)) == []


def test_hooks_refuse_bad_input_and_poststop_is_idempotent(sim: Sim, tmp_path: Path) -> None:
    state = oci_state(tmp_path, "abc123def4567890", os.getpid())
    proc = hook(sim, state, "create", "--shape", "gpu0-4GiB")
    assert (proc.returncode, proc.stderr.splitlines()[0][:45]) == (
        2,
        "sharegpu: error: invalid vGPU shape 'gpu0-4Gi",
    )
    proc = hook(sim, "not json", "create", "--shape", "gpu0-300MiB-30")
    assert proc.returncode == 1
    assert "the hook's stdin is not an OCI container state" in proc.stderr
    proc = hook(sim, oci_state(tmp_path, "abc123def4567890", 0), "create", "--shape", "gpu0-300MiB-30")
    assert proc.returncode == 1
    assert "has no pid" in proc.stderr
    assert list(iter_tenants(sim.runtime)) == []
    sim.tenant("ctr-abc123def456", 64, gpus=[0])
    first = hook(sim, state, "poststop")
    assert (first.returncode, first.stderr.strip()) == (
        0,
        "sharegpu: removed tenant ctr-abc123def456 of container abc123def4567890",
    )
    again = hook(sim, state, "poststop")
    assert again.returncode == 0
    assert "removed already" in again.stderr


def test_a_second_create_hook_for_one_container_is_refused_and_the_first_tenant_is_untouched(
    sim: Sim, tmp_path: Path
) -> None:
    """A runtime that runs createRuntime twice (or a hook run by hand): the second says the
    container has its tenant already and leaves it, its limits and its mounts as they were."""
    holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    try:
        ours = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{holder.pid}/ns/mnt") == ours:  # a mount namespace of its own
            assert time.monotonic() < deadline
            time.sleep(0.01)
        state = oci_state(tmp_path, "feedbeef00112233", holder.pid)
        first = hook(sim, state, "create", "--shape", "gpu0-300MiB-30")
        assert first.returncode == 0, first.stderr
        (tenant,) = iter_tenants(sim.runtime)
        limits = (tenant / "limits").read_bytes()
        second = hook(sim, state, "create", "--shape", "gpu0-500MiB-50")
        assert second.returncode == 1
        assert second.stderr.count("sharegpu: error:") == 1, second.stderr
        assert "ctr-feedbeef0011" in second.stderr, second.stderr
        assert "exists" in second.stderr, second.stderr
        assert list(iter_tenants(sim.runtime)) == [tenant]
        assert (tenant / "limits").read_bytes() == limits  # not the second shape's
        mounts = Path(f"/proc/{holder.pid}/mountinfo").read_text()
        assert mounts.count("/run/sharegpu/tenant/limits") == 1  # mounted once, by the first
        assert hook(sim, state, "poststop").returncode == 0
        assert list(iter_tenants(sim.runtime)) == []
    finally:
        holder.kill()
        holder.wait()


def test_the_agent_reports_a_spec_it_cannot_write_once_and_keeps_running(sim: Sim, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    agent = Agent(sim, tmp_path / "state", "--cdi-spec", str(blocker / "cdi")).start()
    try:
        failed = agent.wait_event("cdi.failed")
        assert failed["severity"] == "warning"
        assert f"cannot write the CDI spec to {blocker}/cdi/sharegpu.json" in failed["message"]
        create(agent, name="web", memory="64MiB", gpus=["0"])
        time.sleep(2.5)  # two more ticks fail the same way: not reported again
        assert len(agent.events(kind="cdi.failed")) == 1
        with agent.http() as http:
            assert http.get("/v1/tenants/web").status_code == 200  # the agent is unharmed
    finally:
        agent.close()


def test_one_damaged_tenant_is_left_out_and_every_other_listed(sim: Sim, tmp_path: Path) -> None:
    """Issue 36: after one tenant's limits were truncated, the agent stopped writing the node's
    spec, so every container started afterwards found its device unresolvable.  The damaged
    tenant is left out (an event, the metric, `doctor`, `cdi generate`'s exit status name it);
    every other is listed, a new one too."""
    from sharegpu.agent.events import Event
    from sharegpu.agent.metrics import EventCounts

    spec_file = tmp_path / "cdi" / "sharegpu.json"
    agent = Agent(sim, tmp_path / "state", "--cdi-spec", str(spec_file)).start()

    def listed() -> set[str]:
        return {d["name"] for d in json.loads(spec_file.read_text())["devices"]}

    def wait_listed(name: str) -> None:
        deadline = time.monotonic() + 20
        while not (spec_file.is_file() and name in listed()):
            assert time.monotonic() < deadline, f"{name} never listed"
            time.sleep(0.1)

    try:
        for name in ("web", "db"):
            create(agent, name=name, memory="64MiB", gpus=["0"])
        wait_listed("db")
        os.truncate(sim.runtime / "tenants" / "db" / "limits", 100)
        create(agent, name="new", memory="64MiB", gpus=["0"])
        wait_listed("new")
        assert {"web", "new"} <= listed()
        assert "db" not in listed()
        left = agent.wait_event("cdi.tenant_left_out", tenant="db")
        assert left["severity"] == "warning"
        assert "limits" in left["message"]
        written = agent.wait_event("cdi.written")
        assert written["data"]["left_out"] == ["db"]
        time.sleep(2.5)  # later ticks leave it out the same way: not reported again
        assert len(agent.events(kind="cdi.tenant_left_out")) == 1
    finally:
        agent.close()
    counts = EventCounts()  # what the metric `sharegpu_cdi_tenant_left_out` is made of
    counts.observe([Event(kind=written["kind"], message="", data=written["data"])])
    assert counts.left_out() == ["db"]

    out = tmp_path / "generated.json"
    gen = sim.cli("cdi", "generate", "--output", str(out))
    assert gen.returncode == 1
    assert "tenant db left out of the spec" in gen.stderr
    assert {"web", "new"} <= {d["name"] for d in json.loads(out.read_text())["devices"]}
    doctor = sim.cli("doctor", "-o", "json")
    (tenants,) = [c for c in json.loads(doctor.stdout)["items"] if c["name"] == "tenants"]
    assert tenants["status"] == "fail"
    assert "tenant db cannot be read" in tenants["message"]


def test_a_spec_file_belongs_to_one_runtime_directory_and_its_agent_keeps_it(
    sim: Sim, tmp_path: Path
) -> None:
    """Issue 36: a second agent started for a test with another --runtime-dir overwrote the
    node's spec; the node's tenant devices became unresolvable until the real agent happened to
    write it again.  Now the file is the first runtime directory's while its agent lives: a
    second agent and `cdi generate` for another directory are refused and leave it alone, and a
    file someone else changes or removes is written again at the agent's next tick."""
    spec_file = tmp_path / "cdi" / "sharegpu.json"
    other = tmp_path / "other-runtime"
    agent = Agent(sim, tmp_path / "state", "--cdi-spec", str(spec_file)).start()

    def lists_web() -> bool:
        try:
            return "web" in {d["name"] for d in json.loads(spec_file.read_text())["devices"]}
        except (OSError, ValueError):
            return False

    def wait(what: Callable[[], bool], why: str) -> None:
        deadline = time.monotonic() + 20
        while not what():
            assert time.monotonic() < deadline, why
            time.sleep(0.1)

    second = Agent(sim, tmp_path / "state2", "--cdi-spec", str(spec_file), runtime=other)
    try:
        create(agent, name="web", memory="64MiB", gpus=["0"])
        wait(lists_web, "web never listed")
        mine = spec_file.read_text()
        gen = sim.cli(
            "cdi",
            "generate",
            "--output",
            str(spec_file),
            env=sim.env() | {"SHAREGPU_RUNTIME_DIR": str(other)},
        )
        assert gen.returncode == 2
        assert gen.stderr.count("\n") == 1, gen.stderr
        assert f"is the CDI spec of the sharegpu of {sim.runtime.resolve()}" in gen.stderr
        second.start()
        failed = second.wait_event("cdi.failed")
        assert f"{spec_file} is the CDI spec of the sharegpu of {sim.runtime.resolve()}" in failed["message"]
        assert spec_file.read_text() == mine
        second.close()

        spec_file.write_text('{"cdiVersion": "0.3.0", "kind": "sharegpu.io/vgpu", "devices": []}\n')
        wait(lists_web, "an edited spec was never written again")
        restored = agent.wait_event("cdi.restored")
        assert restored["severity"] == "warning"
        spec_file.unlink()
        wait(lists_web, "a removed spec was never written again")
        assert len(agent.events(kind="cdi.restored")) == 2
    finally:
        second.close()
        agent.close()
    # Its agent gone, the file is free: the other directory's sharegpu takes it over.
    taken = sim.cli(
        "cdi", "generate", "--output", str(spec_file), env=sim.env() | {"SHAREGPU_RUNTIME_DIR": str(other)}
    )
    assert taken.returncode == 0, taken.stderr
    assert not lists_web()
