"""The CDI spec on a real NVIDIA driver, without one: a fake /dev of character devices and a fake
`ldconfig -p` naming fake library files, all under tmp_path (sharegpu.runtime.cdi.nvidia).

The simulated GPU's spec is tests/integration/test_cdi.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import Sim, python
from nvidiautil import UUIDS, VERSION, FakeNode, fake_node
from sharegpu.devices import Gpu
from sharegpu.runtime.cdi import nvidia
from sharegpu.runtime.cdi.generate import build_spec
from sharegpu.runtime.cdi.model import Spec, validate
from sharegpu.runtime.cdi.shapes import parse_shape
from sharegpu.spec import MIB
from sharegpu.tenant import DeviceLimit, create_tenant


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return fake_node(tmp_path)


def gpus(*minors: int | None) -> list[Gpu]:
    return [
        Gpu(
            index=i,
            uuid=UUIDS[i],
            name="fake",
            memory_total=8192 * MIB,
            memory_used=0,
            utilization_pct=0,
            minor=m,
        )
        for i, m in enumerate(minors)
    ]


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "run"
    monkeypatch.setenv("SHAREGPU_RUNTIME_DIR", str(root))
    create_tenant("web", [DeviceLimit(uuid=UUIDS[1], mem_cap_bytes=512 * MIB)], root=root)
    return root


def edits_of(doc: dict, name: str | None = None) -> dict:  # type: ignore[type-arg]
    if name is None:
        return doc["containerEdits"]  # type: ignore[no-any-return]
    return next(d["containerEdits"] for d in doc["devices"] if d["name"] == name)  # type: ignore[no-any-return]


def test_a_real_driver_gives_each_vgpu_the_control_nodes_and_each_device_its_gpus_node(
    node: FakeNode, runtime: Path
) -> None:
    spec = build_spec(runtime, ["web"], [parse_shape("gpu0-1GiB-30")], gpus=gpus(3, 7), host=node.host()).spec
    doc = json.loads(spec.to_json())
    common = edits_of(doc)["deviceNodes"]
    assert common == [
        {"path": f"/dev/{name}", "hostPath": str(node.root / "dev" / name), "permissions": "rw"}
        for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
    ]
    # the tenant is on GPU 1, minor 7; the shape on GPU 0, minor 3: the minor, not the index
    web = edits_of(doc, "web")
    assert web["deviceNodes"] == [
        {"path": "/dev/nvidia7", "hostPath": str(node.root / "dev/nvidia7"), "permissions": "rw"}
    ]
    assert len(web["mounts"]) == 2  # its limits and usage, as on the simulated GPU
    shape = edits_of(doc, "gpu0-1GiB-30")
    assert [n["path"] for n in shape["deviceNodes"]] == ["/dev/nvidia3"]
    assert [h["hookName"] for h in shape["hooks"]] == ["createRuntime", "poststop"]
    # hostPath on device nodes is what needs 0.5.0 here; the spec says so and reads back
    assert doc["cdiVersion"] == "0.5.0"
    validate(Spec.model_validate(doc))


def test_libraries_are_mounted_as_their_resolved_files_at_their_soname_paths(
    node: FakeNode, runtime: Path
) -> None:
    doc = json.loads(build_spec(runtime, ["web"], [], gpus=gpus(3, 7), host=node.host()).spec.to_json())
    mounts = {m["containerPath"]: m for m in edits_of(doc)["mounts"]}
    lib = node.libdir
    driver = {p: m["hostPath"] for p, m in mounts.items() if p.startswith(str(node.root))}
    assert driver == {
        f"{lib}/libcuda.so.1": f"{lib}/libcuda.so.{VERSION}",
        f"{lib}/libnvidia-ml.so.1": f"{lib}/libnvidia-ml.so.{VERSION}",
        f"{lib}/libnvidia-nvvm.so.4": f"{lib}/libnvidia-nvvm.so.{VERSION}",
        f"{lib}/libnvidia-gpucomp.so.{VERSION}": f"{lib}/libnvidia-gpucomp.so.{VERSION}",
        # no i386 copy, no libcuda.so, no CUDA runtime, no non-compute library, no stale entry
    }
    assert all(set(mounts[p]["options"]) >= {"ro", "bind", "nodev"} for p in driver)
    assert not any("i386" in m["hostPath"] for m in mounts.values())
    smi = mounts[str(node.bindir / "nvidia-smi")]  # at the path PATH found it, its file resolved
    assert smi["hostPath"] == str(node.root.parent / "opt/nvidia/nvidia-smi")
    assert "ro" in smi["options"]
    assert str(node.bindir / "nvidia-debugdump") not in mounts  # not executable: not a tool
    firmware = mounts[f"/lib/firmware/nvidia/{VERSION}"]
    assert firmware["hostPath"] == str(node.root / "lib/firmware/nvidia" / VERSION)
    assert "/usr/lib/sharegpu/libsharegpu.so" in mounts  # the shim, as on the simulated GPU
    assert "LD_LIBRARY_PATH" not in "".join(edits_of(doc)["env"])  # the loader finds the driver itself


def test_optional_pieces_may_be_absent(node: FakeNode, runtime: Path) -> None:
    (node.root / "dev/nvidia-modeset").unlink()
    (node.root / "dev/nvidia-uvm-tools").unlink()
    (node.bindir / "nvidia-smi").unlink()
    (node.root / "lib/firmware/nvidia" / VERSION).rmdir()
    node.cache = [line for line in node.cache if "nvvm" not in line and "gpucomp" not in line]
    doc = json.loads(build_spec(runtime, ["web"], [], gpus=gpus(3, 7), host=node.host()).spec.to_json())
    assert [n["path"] for n in edits_of(doc)["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm"]
    inside = {m["containerPath"] for m in edits_of(doc)["mounts"]}
    assert {Path(p).name for p in inside if p.startswith(str(node.root))} == {
        "libcuda.so.1",
        "libnvidia-ml.so.1",
    }
    assert not any("firmware" in p or "nvidia-smi" in p for p in inside)


def test_on_the_hosts_own_root_nodes_carry_no_host_path_and_the_spec_stays_at_0_3_0(
    node: FakeNode, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This host has no NVIDIA device: pretend /dev's nvidia entries are character devices.
    real = nvidia._char_device
    monkeypatch.setattr(nvidia, "_char_device", lambda p: str(p).startswith("/dev/nvidia") or real(p))
    host = nvidia.Host(root=Path("/"), linker_cache=node.host().linker_cache, path=str(node.bindir))
    doc = json.loads(build_spec(runtime, ["web"], [], gpus=gpus(3, 7), host=host).spec.to_json())
    assert edits_of(doc)["deviceNodes"][0] == {"path": "/dev/nvidiactl", "permissions": "rw"}
    assert edits_of(doc, "web")["deviceNodes"] == [{"path": "/dev/nvidia7", "permissions": "rw"}]
    assert doc["cdiVersion"] == "0.3.0"  # what podman 4.3.1 and every CDI runtime read


def test_the_linker_cache_of_this_host_is_read() -> None:
    text = nvidia.read_linker_cache()
    assert "libc.so.6 (libc6,x86-64) => /" in text  # every glibc host has it


def test_the_simulated_gpu_has_no_minor_number(sim: Sim) -> None:
    values, proc = python(
        sim.env(),
        """
        from sharegpu.devices import list_gpus
        print("minors=" + ",".join(str(g.minor) for g in list_gpus()))
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert values["minors"] == "None,None"
