"""`sharegpu doctor` (each check on a healthy and a broken node) and `sharegpu support-bundle`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from agentutil import Agent
from conftest import Sim
from sharegpu.ops import doctor
from sharegpu.ops.doctor import Context


def _checks(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in json.loads(proc.stdout)["items"]}


def _line(text: str, name: str) -> tuple[str, str | None]:
    """The check's line and, when it has one, its fix line."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.split()[1:2] == [name]:
            fix = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].lstrip().startswith("fix:") else None
            return line, fix
    raise AssertionError(f"no {name} line:\n{text}")


def test_a_healthy_simulated_node(sim: Sim) -> None:
    sim.runtime.mkdir(parents=True)
    proc = sim.cli("doctor")
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "\x1b[" not in proc.stdout
    names = [line.split()[1] for line in proc.stdout.splitlines() if line.split()[:1] in (["ok"], ["warn"])]
    assert names == [
        "nvml",
        "driver",
        "shim-built",
        "shim-installed",
        "shim-loads",
        "runtime-dir",
        "arbiters",
        "tenants",
        "cdi-spec",
        "agent",
        "ld-so-preload",
        "clocksource",
        "mps",
        "conflicts",
    ]
    for name in (
        "nvml",
        "driver",
        "shim-built",
        "shim-installed",
        "shim-loads",
        "runtime-dir",
        "arbiters",
        "tenants",
    ):
        assert _line(proc.stdout, name)[0].startswith("ok "), proc.stdout
    assert "simgpu/libnvidia-ml.so.1" in _line(proc.stdout, "nvml")[0]
    assert "CUDA 1" in _line(proc.stdout, "driver")[0]
    line, fix = _line(proc.stdout, "agent")  # no agent: a warning with the fix
    assert line.startswith("warn")
    assert fix is not None
    assert "sharegpu agent" in fix
    checks = _checks(sim.cli("doctor", "-o", "json"))
    assert checks["shim-loads"]["status"] == "ok"
    assert checks["agent"]["status"] == "warn"


def test_the_agent_check_passes_when_it_answers(agent: Agent, sim: Sim) -> None:
    checks = _checks(sim.cli("doctor", "-o", "json"))
    assert checks["agent"]["status"] == "ok"
    assert "answers on" in checks["agent"]["message"]


def test_nvml_missing(sim: Sim) -> None:
    sim.runtime.mkdir(parents=True)
    proc = sim.cli("doctor", env=sim.env(LD_LIBRARY_PATH=""))
    print(proc.stdout)
    assert proc.returncode == 1
    line, fix = _line(proc.stdout, "nvml")
    assert line.startswith("FAIL")
    assert fix is not None
    assert "sharegpu simgpu env" in fix
    assert _line(proc.stdout, "driver")[0].startswith("FAIL")  # no libcuda.so.1 either
    assert "failed" in proc.stdout.splitlines()[-1]


def test_a_gpu_nvml_cannot_query_fails_the_nvml_check(sim: Sim) -> None:
    sim.runtime.mkdir(parents=True)
    proc = sim.cli("doctor", env=sim.env(SIMGPU_NVML_FAULTS="1:lost"))
    print(proc.stdout)
    assert proc.returncode == 1
    line, fix = _line(proc.stdout, "nvml")
    assert line.startswith("FAIL")
    assert "1 GPU(s)" in line
    assert "GPU 1: NVML cannot query it (GPU is lost)" in line
    assert fix is not None
    assert "xid" in fix


def test_a_gpu_outside_the_container_is_named_and_passes(sim: Sim) -> None:
    sim.runtime.mkdir(parents=True)
    checks = _checks(sim.cli("doctor", "-o", "json", env=sim.env(SIMGPU_NVML_FAULTS="0:no_permission")))
    assert checks["nvml"]["status"] == "ok"
    assert "1 GPU(s)" in checks["nvml"]["message"]
    assert "GPU(s) 0 outside this process's devices" in checks["nvml"]["message"]


def test_runtime_dir_that_is_not_a_directory(sim: Sim) -> None:
    sim.runtime.parent.mkdir(parents=True, exist_ok=True)
    sim.runtime.write_text("oops")
    proc = sim.cli("doctor", "-o", "json")
    assert proc.returncode == 1
    check = _checks(proc)["runtime-dir"]
    assert check["status"] == "fail"
    assert "not a directory" in check["message"]
    assert "SHAREGPU_RUNTIME_DIR" in check["fix"]


UNWRITABLE_CHECK = """
import sys
from pathlib import Path
from sharegpu.ops import doctor
from sharegpu.ops.doctor import Context
check = doctor.check_runtime_dir(Context(runtime_dir=Path(sys.argv[1])))
print(check.status, check.message, sep="\\n")
"""


def test_runtime_dir_unwritable() -> None:
    """Root writes anywhere, so as root (CI) the check runs as `nobody` (setpriv)."""
    base = Path(tempfile.mkdtemp(prefix="sharegpu-doctor-"))
    try:
        base.chmod(0o755)
        runtime = base / "run"
        runtime.mkdir(mode=0o500)
        cmd = [sys.executable, "-c", UNWRITABLE_CHECK, str(runtime)]
        if os.geteuid() == 0:
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        env = {**os.environ, "PYTHONPATH": str(Path(doctor.__file__).parents[2])}
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        status, message = done.stdout.split("\n", 1)
        assert status == "fail"
        assert "not writable" in message
    finally:
        (base / "run").chmod(0o755)
        shutil.rmtree(base)


def test_a_corrupt_installed_shim(sim: Sim) -> None:
    shim = sim.runtime / "shim"
    shim.mkdir(parents=True)
    bad = shim / "libsharegpu-0.1.0-0123456789ab.so"
    bad.write_bytes(b"\x7fELF" + b"\0" * 60 + b"not a library")
    (shim / "libsharegpu.so").symlink_to(bad.name)
    proc = sim.cli("doctor")
    print(proc.stdout)
    assert proc.returncode == 1
    for name in ("shim-installed", "shim-loads"):
        line, fix = _line(proc.stdout, name)
        assert line.startswith("FAIL"), line
        assert fix is not None
        assert "sharegpu upgrade --shim" in fix
    assert _line(proc.stdout, "shim-built")[0].startswith("ok")


# ---------------------------------------------------------------------------------------------
# support-bundle


def _bundle(sim: Sim, tmp_path: Path, env: dict[str, str]) -> dict[str, bytes]:
    out = tmp_path / "bundle.tar.gz"
    proc = sim.cli("support-bundle", "-o", str(out), env=env)
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout
    with tarfile.open(out) as tar:
        files = {}
        for member in tar.getmembers():
            f = tar.extractfile(member)
            assert f is not None
            files[member.name.split("/", 1)[1]] = f.read()
    return files


def test_support_bundle_through_the_agent(agent: Agent, sim: Sim, tmp_path: Path) -> None:
    with agent.http() as http:
        assert http.post("/v1/tenants", json={"name": "web", "memory": "64MiB"}).status_code == 201
    env = sim.env(
        SHAREGPU_AGENT_LOG=str(agent.log),
        SHAREGPU_API_TOKEN="hunter2",
        OTHER_PASSWORD="swordfish",
        SIMGPU_KERNEL_US="50",
    )
    files = _bundle(sim, tmp_path, env)
    assert sorted(files) == [
        "agent.log",
        "config.json",
        "devices.json",
        "doctor.json",
        "events.json",
        "status.json",
        "tenants.json",
    ]
    assert json.loads(files["tenants.json"])["items"][0]["id"] == "web"
    assert json.loads(files["devices.json"])["kind"] == "DeviceList"
    assert json.loads(files["status.json"])["items"][0]["agent"]["running"] is True
    assert any(e["kind"] == "tenant.created" for e in json.loads(files["events.json"])["items"])
    assert {c["name"] for c in json.loads(files["doctor.json"])["items"]} >= {"nvml", "shim-loads"}
    config = json.loads(files["config.json"])
    assert config["environment"]["SIMGPU_KERNEL_US"] == "50"
    assert config["environment"]["SHAREGPU_API_TOKEN"] == "<redacted>"
    assert "OTHER_PASSWORD" not in config["environment"]
    assert config["versions"]["sharegpu"]
    for name, content in files.items():
        assert b"hunter2" not in content, name
        assert b"swordfish" not in content, name


def test_support_bundle_without_the_agent(sim: Sim, tmp_path: Path) -> None:
    sim.runtime.mkdir(parents=True)
    files = _bundle(sim, tmp_path, sim.env(SHAREGPU_NO_AGENT="1"))
    expected = ["config.json", "devices.json", "doctor.json", "status.json", "tenants.json"]
    if shutil.which("journalctl"):
        # No log file: the agent logs to the journal under the shipped unit (issue 36).
        expected.insert(0, "agent.journal.txt")
    assert sorted(files) == expected
    assert json.loads(files["status.json"])["items"][0]["agent"]["running"] is False


def test_support_bundle_into_a_bad_path_is_one_line_and_exit_2(sim: Sim, tmp_path: Path) -> None:
    env = sim.env(SHAREGPU_NO_AGENT="1")
    (tmp_path / "a-file").write_text("x")
    for output, says in (
        (tmp_path / "missing" / "b.tar.gz", "does not exist"),
        (tmp_path / "a-file" / "b.tar.gz", "is not a directory"),
    ):
        proc = sim.cli("support-bundle", "-o", str(output), env=env)
        assert proc.returncode == 2
        assert says in proc.stderr
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
    # A folder takes the bundle inside it, under the default name.
    proc = sim.cli("support-bundle", "-o", str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr
    assert len(list(tmp_path.glob("sharegpu-support-*.tar.gz"))) == 1


def test_the_cdi_spec_check_names_a_tenant_missing_from_the_spec(sim: Sim, tmp_path: Path) -> None:
    """Issue 36: doctor had no check that the node's CDI spec is current and complete."""
    from sharegpu.runtime.cdi.generate import DEFAULT_SPEC_DIR, SPEC_FILE

    assert Context(runtime_dir=sim.runtime).cdi_spec == DEFAULT_SPEC_DIR / SPEC_FILE  # the agent's default
    spec = tmp_path / "sharegpu.json"
    ctx = Context(runtime_dir=sim.runtime, cdi_spec=spec)
    missing = doctor.check_cdi_spec(ctx)
    assert missing.status == "warn"
    assert "no CDI spec" in missing.message
    web = sim.tenant("web", 64, gpus=[0])
    assert sim.cli("cdi", "generate", "--shape", "none", "--output", str(spec)).returncode == 0
    assert doctor.check_cdi_spec(ctx).status == "ok"
    db = sim.tenant("db", 64, gpus=[0])
    old = time.time() - 60  # made a minute ago: the agent would have listed it by now
    for path in (web, db):
        os.utime(path, (old, old))
    stale = doctor.check_cdi_spec(ctx)
    assert stale.status == "fail"
    assert "does not list tenant(s) db" in stale.message
    assert stale.fix is not None
    assert "sharegpu cdi generate" in stale.fix
    spec.write_text("{not json")
    assert doctor.check_cdi_spec(ctx).status == "fail"
