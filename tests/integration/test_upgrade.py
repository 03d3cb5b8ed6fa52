"""Hot upgrade of the shim (sharegpu.agent.upgrade): install, validate, swap, collect.

Tenant processes preload the stable link <runtime>/shim/libsharegpu.so; these tests start real
probes on the simulated GPU through it before and after an upgrade and read /proc/<pid>/maps to
see which build each one runs.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from conftest import Sim, parse_kv
from sharegpu import native
from sharegpu.agent.upgrade import (
    collect_old_shims,
    current_shim,
    install_shim,
    shim_dir,
    stable_path,
)
from sharegpu.spec import MIB
from sharegpu.tenant import read_usage


def variant(tmp_path: Path, n: int) -> Path:
    """Another build of the shim: the same code with different bytes (so another hash)."""
    path = tmp_path / f"variant{n}" / "libsharegpu.so"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(native.shim_path().read_bytes() + f"\0variant {n}\0".encode())
    return path


def mapped_shim(pid: int) -> str:
    """The libsharegpu file process pid has mapped (by name)."""
    names = {
        line.split(maxsplit=5)[5]
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
        if "libsharegpu" in line and len(line.split(maxsplit=5)) == 6
    }
    assert len(names) == 1, names
    return Path(names.pop()).name


def preload_env(sim: Sim, tenant: Path) -> dict[str, str]:
    return sim.env(LD_PRELOAD=str(stable_path(sim.runtime)), SHAREGPU_TENANT=str(tenant))


def wait_ready(proc: subprocess.Popen[str], key: str = "ready") -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if key in parse_kv(line)[0]:
            return
    raise AssertionError(f"probe ended without {key}=: {proc.stderr.read() if proc.stderr else ''}")


def test_upgrade_under_running_tenant_processes(sim: Sim, tmp_path: Path) -> None:
    tenant = sim.tenant("a", 256, gpus=[0])
    old = install_shim(native.shim_path(), sim.runtime)
    before = sim.spawn_probe("hold", "plain", "100M", "60", env=preload_env(sim, tenant))
    after: subprocess.Popen[str] | None = None
    try:
        wait_ready(before)
        assert mapped_shim(before.pid) == old.name
        new = install_shim(variant(tmp_path, 1), sim.runtime)
        assert new != old
        # The running process keeps its build, unchanged on disk, and keeps its charge.
        assert before.poll() is None
        assert mapped_shim(before.pid) == old.name
        assert old.exists()
        assert read_usage(tenant).devices[0].mem_used_bytes == 100 * MIB
        # A process started now loads the new build, and shares the one ledger: the cap still
        # covers both (256 - 100 = 156 MiB left, in 16 MiB chunks: 9).
        after = sim.spawn_probe("fill", "plain", "16M", "30", env=preload_env(sim, tenant))
        wait_ready(after, "held")
        assert mapped_shim(after.pid) == new.name
        assert read_usage(tenant).devices[0].mem_used_bytes == 100 * MIB + 9 * 16 * MIB
        probe = sim.probe("alloc", "plain", "16M", env=preload_env(sim, tenant))
        assert probe["alloc"] == "CUDA_ERROR_OUT_OF_MEMORY"
        # The old build's process dies: the next call of the new build reclaims its charge.
        before.send_signal(signal.SIGKILL)
        before.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while read_usage(tenant).devices[0].mem_used_bytes != 9 * 16 * MIB:
            assert time.monotonic() < deadline
            sim.probe("meminfo", env=preload_env(sim, tenant))  # a call reclaims the dead slot
            time.sleep(0.05)
    finally:
        for proc in (before, after):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                proc.communicate(timeout=30)


def test_old_builds_are_collected_once_no_process_maps_them(sim: Sim, tmp_path: Path) -> None:
    tenant = sim.tenant("a", 256, gpus=[0])
    v1 = install_shim(variant(tmp_path, 1), sim.runtime)
    holder = sim.spawn_probe("hold", "plain", "10M", "60", env=preload_env(sim, tenant))
    try:
        wait_ready(holder)
        v2 = install_shim(variant(tmp_path, 2), sim.runtime)
        v3 = install_shim(variant(tmp_path, 3), sim.runtime)
        # v1 is neither current nor previous, but still mapped: kept.
        assert v1.exists()
        assert v2.exists()
        assert collect_old_shims(sim.runtime) == []
        holder.kill()
        holder.communicate(timeout=30)
        assert collect_old_shims(sim.runtime) == [v1]
        assert not v1.exists()
        assert v2.exists()  # the previous build is always kept
        assert current_shim(sim.runtime) == v3
        v4 = install_shim(variant(tmp_path, 4), sim.runtime)  # collects v2 on the way
        assert sorted(p.name for p in shim_dir(sim.runtime).glob("libsharegpu-*")) == sorted(
            [v3.name, v4.name]
        )
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.communicate(timeout=30)


def test_sharegpu_run_preloads_the_installed_build(sim: Sim, tmp_path: Path) -> None:
    maps = "grep -o '[^ ]*libsharegpu[^ ]*' /proc/self/maps | sort -u"
    # No build installed on the node: the package's own shim.
    plain = sim.cli("run", "-m", "64MiB", "--", "sh", "-c", maps, env=sim.env(SHAREGPU_NO_AGENT="1"))
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split() == [str(native.shim_path().resolve())]
    # After `sharegpu upgrade`: the stable link's build, which the next upgrade replaces.
    up = sim.cli("upgrade", "--shim", str(variant(tmp_path, 3)))
    assert up.returncode == 0, up.stderr
    installed = current_shim(sim.runtime)
    assert installed is not None
    got = sim.cli("run", "-m", "64MiB", "--", "sh", "-c", maps, env=sim.env(SHAREGPU_NO_AGENT="1"))
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == [str(installed)]
