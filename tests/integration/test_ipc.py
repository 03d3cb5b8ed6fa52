"""Legacy CUDA IPC (issue 34): memory one process allocates and another opens by handle.

On the simulated GPU first (no shim), as the Driver API reference documents it: the bytes are
shared, a second open by the same context returns the same pointer and needs its own close, the
opened pointer is not cuMemFree's, a process cannot open its own handle, and the memory stays
with the importer after the exporter frees it (the card keeps counting it).

Then under a 1000 MiB cap: the import is charged to the importer, so "allocate, export, let a
second process open it, free, allocate again" cannot grow a tenant past its cap, an open past the
cap is refused with CUDA_ERROR_OUT_OF_MEMORY and leaves nothing mapped, and a handle opened twice
is charged once.

Both ends are native/shim/tests/ipcpeer.c, driven line by line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Sim
from ipcpeer import Peer, build, handle_of, peer
from sharegpu.spec import MIB

CAP_MIB = 1000
SUCCESS, INVALID_VALUE, OUT_OF_MEMORY = 0, 1, 2
INVALID_CONTEXT, INVALID_HANDLE = 201, 400


@pytest.fixture
def sim(sim_factory) -> Sim:  # type: ignore[no-untyped-def]
    return sim_factory(gpus=1, memory_mib=8 * 1024)  # type: ignore[no-any-return]


@pytest.fixture
def peer_binary(tmp_path: Path) -> Path:
    return build(tmp_path)


# ---------------------------------------------------------------------------------------------
# the simulated GPU, as the reference documents IPC


def test_simulated_ipc_shares_the_bytes_and_counts_references(sim: Sim, peer_binary: Path) -> None:
    with peer(peer_binary, sim.env()) as exporter, peer(peer_binary, sim.env()) as importer:
        p = exporter.alloc(64)
        assert exporter.rc("write", p, "1234") == SUCCESS
        handle = handle_of(exporter, p)
        assert handle_of(exporter, p) == handle  # the same allocation, the same handle

        opened = importer("open", handle)
        assert opened["rc"] == "0", opened
        q = opened["ptr"]
        assert importer("read", q) == {"rc": "0", "value": "1234"}
        assert importer.rc("write", q, "beef") == SUCCESS
        assert exporter("read", p) == {"rc": "0", "value": "beef"}  # one memory, both ways

        assert importer("open", handle) == {"rc": "0", "ptr": q}  # same context: same pointer
        assert importer("open1", handle) == {"rc": "0", "ptr": q}  # the CUDA 4.1 entry point
        assert importer.rc("free", q) == INVALID_VALUE  # closed, not freed
        assert importer.rc("close", q) == SUCCESS
        assert importer.rc("close", q) == SUCCESS
        assert importer("read", q)["rc"] == "0"  # one reference left
        assert importer.rc("close", q) == SUCCESS
        assert importer.rc("close", q) == INVALID_VALUE


def test_simulated_ipc_refuses_what_the_driver_refuses(sim: Sim, peer_binary: Path) -> None:
    with peer(peer_binary, sim.env()) as exporter, peer(peer_binary, sim.env()) as importer:
        p = exporter.alloc(8)
        handle = handle_of(exporter, p)
        assert exporter.rc("open", handle) == INVALID_CONTEXT  # a process's own handle
        assert importer.rc("open", "00" * 64) == INVALID_HANDLE
        assert importer.rc("open", handle, 2) == INVALID_VALUE  # an unknown flag
        forged = handle[:24] + "00000000" + handle[32:]  # the exporter's descriptor 0 instead
        assert importer.rc("open", forged) == INVALID_HANDLE
        inner = f"{int(p, 16) + 512:x}"
        assert exporter.rc("handle", inner) == INVALID_VALUE  # not the base of an allocation
        assert exporter.rc("free", p) == SUCCESS
        assert importer.rc("open", handle) == INVALID_HANDLE  # freed before it was opened


def test_simulated_ipc_memory_outlives_the_exporters_free(sim: Sim, peer_binary: Path) -> None:
    """The importer keeps the memory (and the card counts it) after the exporter frees it."""
    with (
        peer(peer_binary, sim.env()) as exporter,
        peer(peer_binary, sim.env()) as importer,
        peer(peer_binary, sim.env()) as observer,
    ):
        before = observer.used()
        p = exporter.alloc(256)
        assert exporter.rc("write", p, "77") == SUCCESS
        q = importer("open", handle_of(exporter, p))["ptr"]
        assert observer.used() - before == 512 * MIB  # each process holding it is counted
        assert exporter.rc("free", p) == SUCCESS
        assert observer.used() - before == 256 * MIB
        assert importer("read", q) == {"rc": "0", "value": "77"}
        assert importer.rc("close", q) == SUCCESS
        assert observer.used() == before


# ---------------------------------------------------------------------------------------------
# under a cap: the importer pays


def test_ipc_imports_cannot_grow_a_tenant_past_its_cap(sim: Sim, peer_binary: Path) -> None:
    """Allocate 400 MiB, export it, open it in a second process, free it; again and again.

    Without a charge for the import each round ends with the tenant's count back at zero while
    the importer holds another 400 MiB; with it the second open no longer fits."""
    tenant = sim.tenant("t", CAP_MIB, gpus=[0])
    env = sim.tenant_env(tenant)
    with peer(peer_binary, env) as exporter, peer(peer_binary, env) as importer:
        opens = []
        for _ in range(4):
            p = exporter.alloc(400)
            opens.append(importer.rc("open", handle_of(exporter, p)))
            assert exporter.used() <= CAP_MIB * MIB
            assert exporter.rc("free", p) == SUCCESS
        assert opens[0] == SUCCESS
        assert opens[1:] == [OUT_OF_MEMORY] * 3, opens  # 400 held + 400 allocated: no room
        assert importer.used() == 400 * MIB  # the one import the importer holds


def test_ipc_refused_open_leaves_nothing_and_a_reopen_is_charged_once(sim: Sim, peer_binary: Path) -> None:
    tenant = sim.tenant("t", CAP_MIB, gpus=[0])
    env = sim.tenant_env(tenant)
    with (
        peer(peer_binary, env) as exporter,
        peer(peer_binary, env) as importer,
        peer(peer_binary, sim.env()) as card,
    ):
        card_before = card.used()
        p = exporter.alloc(600)
        handle = handle_of(exporter, p)
        assert importer.rc("open", handle) == OUT_OF_MEMORY  # 600 + 600 > 1000
        assert importer.used() == 600 * MIB
        assert card.used() - card_before == 600 * MIB  # the refused mapping was closed again
        assert exporter.rc("free", p) == SUCCESS

        p = exporter.alloc(300)
        handle = handle_of(exporter, p)
        q = importer("open", handle)["ptr"]
        assert importer("open", handle) == {"rc": "0", "ptr": q}
        assert importer("open1", handle) == {"rc": "0", "ptr": q}
        assert importer.used() == 600 * MIB  # 300 allocated + 300 opened, once
        assert importer.rc("close", q) == SUCCESS
        assert importer.rc("close", q) == SUCCESS
        assert importer.used() == 600 * MIB  # one reference still open
        assert importer.rc("close", q) == SUCCESS
        assert importer.used() == 300 * MIB
        assert exporter.rc("free", p) == SUCCESS
        assert importer.used() == 0


# ---------------------------------------------------------------------------------------------
# pools exported by descriptor, their pointers one by one


def import_pool(exporter: Peer, importer: Peer) -> tuple[str, str]:
    """A pool made exportable in the exporter and imported by the importer: (theirs, ours)."""
    made = exporter("pool")
    assert made["rc"] == "0", made
    exported = exporter("pexport", made["pool"])
    assert exported["rc"] == "0", exported
    imported = importer("pimport", exported["pid"], exported["fd"])
    assert imported["rc"] == "0", imported
    return made["pool"], imported["pool"]


def pool_alloc(exporter: Peer, pool: str, mib: int) -> tuple[str, str]:
    """An allocation of pool and its export data."""
    got = exporter("palloc", pool, mib)
    assert got["rc"] == "0", got
    data = exporter("pptr", got["ptr"])
    assert data["rc"] == "0", data
    return got["ptr"], data["data"]


def test_simulated_pool_pointers_are_shared_and_freed_by_the_importer(sim: Sim, peer_binary: Path) -> None:
    with (
        peer(peer_binary, sim.env()) as exporter,
        peer(peer_binary, sim.env()) as importer,
        peer(peer_binary, sim.env()) as observer,
    ):
        theirs, ours = import_pool(exporter, importer)
        before = observer.used()
        p, data = pool_alloc(exporter, theirs, 128)
        assert exporter.rc("write", p, "5150") == SUCCESS
        got = importer("pget", ours, data)
        assert got["rc"] == "0", got
        q = got["ptr"]
        assert importer("read", q) == {"rc": "0", "value": "5150"}
        assert importer.rc("write", q, "abc") == SUCCESS
        assert exporter("read", p) == {"rc": "0", "value": "abc"}
        assert observer.used() - before == 256 * MIB

        assert importer.rc("palloc", ours, 1) == INVALID_VALUE  # an imported pool allocates nothing
        assert exporter.rc("handle", p) == INVALID_VALUE  # pool memory has no legacy handle
        assert importer.rc("close", q) == INVALID_VALUE  # freed, not closed
        assert exporter.rc("freeasync", p) == SUCCESS
        assert importer("read", q) == {"rc": "0", "value": "abc"}  # the importer keeps it
        assert observer.used() - before == 128 * MIB
        assert importer.rc("freeasync", q) == SUCCESS
        assert observer.used() == before
        assert importer.rc("pget", ours, data) == INVALID_HANDLE  # freed everywhere

        plain = exporter.alloc(8)
        assert exporter.rc("pptr", plain) == INVALID_VALUE  # not pool memory
        other, _ = import_pool(exporter, importer)
        _, foreign = pool_alloc(exporter, other, 8)
        assert importer.rc("pget", ours, foreign) == INVALID_VALUE  # a pointer of another pool


def test_pool_pointer_imports_are_charged_to_the_importer(sim: Sim, peer_binary: Path) -> None:
    """The pool version of the IPC round trip: allocate, export the pointer, import it in the
    second process, free it in the first; the imports fill the cap and are then refused."""
    tenant = sim.tenant("t", CAP_MIB, gpus=[0])
    env = sim.tenant_env(tenant)
    with (
        peer(peer_binary, env) as exporter,
        peer(peer_binary, env) as importer,
        peer(peer_binary, sim.env()) as card,
    ):
        theirs, ours = import_pool(exporter, importer)
        card_before = card.used()
        results, imported = [], []
        for _ in range(3):
            p, data = pool_alloc(exporter, theirs, 300)
            got = importer("pget", ours, data)
            results.append(int(got["rc"]))
            if got["rc"] == "0":
                imported.append(got["ptr"])
            assert exporter.used() <= CAP_MIB * MIB
            assert exporter.rc("freeasync", p) == SUCCESS
        assert results == [SUCCESS, SUCCESS, OUT_OF_MEMORY], results  # 600 imported + 300 + 300 > 1000
        assert importer.used() == 600 * MIB
        assert card.used() - card_before == 600 * MIB  # the refused import was freed again
        for q in imported:
            assert importer.rc("free", q) == SUCCESS
        assert importer.used() == 0
