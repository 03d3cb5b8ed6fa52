"""Hot upgrade of the shim (sharegpu.agent.upgrade): the build's version and ABI read from the
file, install and the link swapped, bad files refused. Under running tenant processes on the
simulated GPU: tests/integration/test_upgrade.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import Sim
from sharegpu import native
from sharegpu.agent.upgrade import (
    current_shim,
    ensure_installed,
    inspect_shim,
    install_shim,
    shim_dir,
    stable_path,
    upgrade_event,
)
from sharegpu.errors import ConfigError


def variant(tmp_path: Path, n: int) -> Path:
    """Another build of the shim: the same code with different bytes (so another hash)."""
    path = tmp_path / f"variant{n}" / "libsharegpu.so"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(native.shim_path().read_bytes() + f"\0variant {n}\0".encode())
    return path


def listing(directory: Path) -> dict[str, str]:
    """Every entry of the shim directory (hidden ones too) and what each is."""
    if not directory.exists():
        return {}
    return {
        p.name: (f"-> {os.readlink(p)}" if p.is_symlink() else str(p.stat().st_size))
        for p in directory.iterdir()
    }


def test_the_shim_carries_its_version_and_abi() -> None:
    info = inspect_shim(native.shim_path())
    assert info.version not in ("", "unknown")
    assert info.abi is not None
    assert len(info.sha256) == 64


def test_install_names_the_build_and_swaps_the_link(sim: Sim, tmp_path: Path) -> None:
    assert current_shim(sim.runtime) is None
    stable = ensure_installed(sim.runtime)  # the package's own shim
    assert stable == stable_path(sim.runtime)
    first = current_shim(sim.runtime)
    assert first is not None
    info = inspect_shim(native.shim_path())
    assert first.name == f"libsharegpu-{info.version}-{info.sha256[:12]}.so"
    assert first.read_bytes() == native.shim_path().read_bytes()
    assert os.readlink(stable) == first.name  # relative: the directory can be mounted anywhere
    assert first.stat().st_mode & 0o777 == 0o444
    assert ensure_installed(sim.runtime) == stable  # installed already: nothing happens
    assert install_shim(native.shim_path(), sim.runtime) == first  # the same build again
    assert current_shim(sim.runtime) == first
    second = install_shim(variant(tmp_path, 1), sim.runtime)
    assert second != first
    assert current_shim(sim.runtime) == second
    event = upgrade_event(second, first)
    assert event.kind == "shim.upgraded"
    assert event.data["version"] == info.version
    assert first.name in event.message
    assert not [p for p in shim_dir(sim.runtime).iterdir() if p.name.startswith(".libsharegpu")]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.so", "no such file"),
        (lambda d: _write(d / "text.so", b"#!/bin/sh\necho hi\n"), "not an ELF file"),
        (lambda d: native.agent_lib_path(), "does not export cuInit"),
        (lambda d: native.simgpu_dir() / "libcuda.so.1", "does not export dlsym"),
        (lambda d: _write(d / "abi.so", _other_abi()), "this node speaks"),
        (lambda d: _write(d / "short.so", native.shim_path().read_bytes()[:200]), "malformed"),
    ],
    ids=["missing", "text", "not-a-shim", "a-driver", "other-abi", "truncated"],
)
def test_a_bad_file_is_refused_and_nothing_changes(sim: Sim, tmp_path: Path, make, message) -> None:  # type: ignore[no-untyped-def]
    ensure_installed(sim.runtime)
    before = listing(shim_dir(sim.runtime))
    with pytest.raises(ConfigError, match=message):
        install_shim(make(tmp_path), sim.runtime)
    assert listing(shim_dir(sim.runtime)) == before


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _other_abi() -> bytes:
    data = native.shim_path().read_bytes()
    marker = data.index(b"sharegpu-shim: version=")
    abi_at = data.index(b" abi=", marker) + len(b" abi=")
    return data[:abi_at] + b"9" + data[abi_at + 1 :]
