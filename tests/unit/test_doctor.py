"""`sharegpu doctor` (each check on a healthy and a broken node) and `sharegpu support-bundle`."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import Sim
from sharegpu import mps, native
from sharegpu.ops import doctor
from sharegpu.ops.doctor import Context


def test_runtime_dir_checks(tmp_path: Path) -> None:
    missing = doctor.check_runtime_dir(Context(runtime_dir=tmp_path / "later"))
    assert (missing.status, "does not exist yet" in missing.message) == ("warn", True)
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    open_dir = doctor.check_runtime_dir(Context(runtime_dir=tmp_path / "open"))
    assert open_dir.status == "warn"
    assert open_dir.fix == f"chmod o-w {tmp_path / 'open'}"
    (tmp_path / "fine").mkdir(mode=0o755)
    assert doctor.check_runtime_dir(Context(runtime_dir=tmp_path / "fine")).status == "ok"


def test_a_dangling_installed_shim_link(sim: Sim) -> None:
    shim = sim.runtime / "shim"
    shim.mkdir(parents=True)
    (shim / "libsharegpu.so").symlink_to("libsharegpu-gone-0123456789ab.so")
    check = doctor.check_shim_installed(Context(runtime_dir=sim.runtime))
    assert check.status == "fail"
    assert "names nothing usable" in check.message


def test_a_missing_package_shim(tmp_path: Path) -> None:
    check = doctor.check_shim_built(Context(runtime_dir=tmp_path, package_shim=tmp_path / "libsharegpu.so"))
    assert check.status == "fail"
    assert check.fix is not None
    assert "make -C native" in check.fix


def test_a_stale_agent_socket_is_a_warning(sim: Sim) -> None:
    sim.runtime.mkdir(parents=True)
    (sim.runtime / "agent.sock").write_text("")
    check = doctor.check_agent(Context(runtime_dir=sim.runtime))
    assert check.status == "warn"
    assert "nothing behind it" in check.message


def test_ld_so_preload(tmp_path: Path) -> None:
    preload = tmp_path / "ld.so.preload"
    ctx = Context(runtime_dir=tmp_path, etc_preload=preload)
    bare = doctor.check_preload(ctx)
    assert bare.status == "warn"  # a bare host: not a failure, but explained
    assert bare.fix is not None
    assert "sharegpu run" in bare.fix
    preload.write_text(f"{native.LIB_DIR / 'libsharegpu.so'}\n")
    assert doctor.check_preload(ctx).status == "ok"
    preload.write_text("/run/sharegpu/shim/libsharegpu.so-gone\n")
    assert doctor.check_preload(ctx).status == "fail"


def test_clock_source(tmp_path: Path) -> None:
    (tmp_path / "current_clocksource").write_text("tsc\n")
    ctx = Context(runtime_dir=tmp_path, clocksource=tmp_path)
    assert doctor.check_clocksource(ctx).status == "ok"
    (tmp_path / "current_clocksource").write_text("hpet\n")
    (tmp_path / "available_clocksource").write_text("tsc hpet acpi_pm\n")
    slow = doctor.check_clocksource(ctx)
    assert slow.status == "warn"
    assert slow.fix is not None
    assert "echo tsc" in slow.fix


def test_mps_daemon(tmp_path: Path) -> None:
    """No daemon is fine and says what it would buy; a live one is named; a pid file whose
    process is gone or is something else, or a directory others may write, is a warning."""
    pipe, proc = tmp_path / "mps", tmp_path / "proc"
    ctx = Context(runtime_dir=tmp_path, mps_pipe_dir=pipe, proc=proc)
    none = doctor.check_mps(ctx)
    assert none.status == "ok"
    assert "no MPS daemon" in none.message
    pipe.mkdir(mode=0o755)
    (pipe / mps.PID_FILE).write_text("4242\n")
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "comm").write_text("nvidia-cuda-mps\n")  # the kernel's 15 characters of the name
    shm = tmp_path / "daemon shm"  # its /dev/shm: a directory of this machine, bind-mounted there
    shm.mkdir()
    dev = f"{os.major(shm.stat().st_dev)}:{os.minor(shm.stat().st_dev)}"
    escaped = str(shm).replace(" ", "\\040")
    (proc / "self").mkdir()
    (proc / "self" / "mountinfo").write_text(
        f"21 1 {dev} / / rw - ext4 /dev/vda rw\n25 21 0:27 / /dev/shm rw - tmpfs tmpfs rw\n"
    )
    (proc / "4242" / "mountinfo").write_text(
        f"21 1 {dev} / / rw - ext4 /dev/vda rw\n25 21 0:27 / /dev/shm rw - tmpfs tmpfs rw\n"
        f"63 25 {dev} {escaped} /dev/shm rw - ext4 /dev/vda rw\n"
    )
    live = doctor.check_mps(ctx)
    assert live.status == "ok"
    assert "pid 4242" in live.message
    assert f"at {shm}" in live.message
    (proc / "4242" / "mountinfo").write_text("25 21 0:27 / /dev/shm rw - tmpfs tmpfs rw\n")
    host_shm = doctor.check_mps(ctx)  # the daemon's /dev/shm is everyone's: no container gets it
    assert host_shm.status == "warn"
    assert "containers are not made its clients" in host_shm.message
    assert host_shm.fix is not None
    assert "unshare --mount" in host_shm.fix
    (proc / "4242" / "mountinfo").write_text("25 21 0:99 / /dev/shm rw - tmpfs tmpfs rw\n")
    private_shm = doctor.check_mps(ctx)  # a tmpfs of the daemon's own mount namespace: no path here
    assert private_shm.status == "warn"
    assert "mounted nowhere here" in private_shm.message
    (proc / "4242" / "mountinfo").write_text(f"63 25 {dev} {escaped} /dev/shm rw - ext4 /dev/vda rw\n")
    pipe.chmod(0o777)  # the default directory is under /tmp: anyone could have made it
    untrusted = doctor.check_mps(ctx)
    assert untrusted.status == "warn"
    assert "not used" in untrusted.message
    pipe.chmod(0o755)
    (proc / "4242" / "comm").write_text("sleep\n")  # the pid was reused
    assert doctor.check_mps(ctx).status == "warn"
    shutil.rmtree(proc / "4242")
    stale = doctor.check_mps(ctx)
    assert stale.status == "warn"
    assert stale.fix is not None
    assert "nvidia-cuda-mps-control -d" in stale.fix
    (pipe / mps.PID_FILE).write_text("not a pid")
    assert doctor.check_mps(ctx).status == "warn"
    (pipe / mps.PID_FILE).unlink()
    (proc / "77").mkdir()
    (proc / "77" / "comm").write_text("nvidia-cuda-mps\n")  # a daemon of another pipe directory
    elsewhere = doctor.check_mps(ctx)
    assert elsewhere.status == "warn"
    assert "pid 77" in elsewhere.message


def test_conflicting_gpu_sharing_software(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "modules").write_text("nvidia 100 0 - Live 0x0\n")
    (proc / "4242" / "comm").write_text("bash\n")
    ctx = Context(
        runtime_dir=tmp_path, etc_preload=tmp_path / "preload", proc=proc, vgpu_dir=tmp_path / "vgpu"
    )
    assert doctor.check_conflicts(ctx).status == "ok"
    (proc / "4242" / "comm").write_text("nvidia-cuda-mps\n")
    assert doctor.check_conflicts(ctx).status == "ok"  # MPS is the `mps` check's business
    (tmp_path / "preload").write_text("/usr/local/vgpu/libvgpu.so\n")
    (tmp_path / "vgpu").mkdir()
    (proc / "modules").write_text("cgpu_km 200 0 - Live 0x0\nnvidia 100 0 - Live 0x0\n")
    found = doctor.check_conflicts(ctx)
    assert found.status == "fail"
    for text in ("libvgpu.so", "cgpu_km", "HAMi-core installed"):
        assert text in found.message
    assert found.fix is not None


def test_a_crashing_check_is_a_failure_not_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ctx: Context) -> doctor.Check:
        raise RuntimeError("boom")

    monkeypatch.setattr(doctor, "CHECKS", [broken, doctor.check_clocksource])
    results = doctor.run_checks(Context(runtime_dir=tmp_path))
    assert (results[0].name, results[0].status) == ("broken", "fail")
    assert "boom" in results[0].message
    assert len(results) == 2
