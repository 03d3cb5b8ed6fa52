"""A rendering container is a tenant like any other (issue 39): Podman runs a plain Vulkan
program (native/vklayer/tests/vkprobe.c) on Mesa's lavapipe in a root filesystem built from
files, with the tenant's CDI device and nothing else sharegpu-specific; the spec brings the shim,
the Vulkan layer and its manifest (/etc/vulkan/implicit_layer.d) and enables it.

The simulated node's GPU 0 carries lavapipe's deviceUUID (tests/vkutil.py), so the tenant of
GPU 0 is the tenant of the Vulkan device.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import vkutil
from conftest import Sim, parse_kv
from e2e.test_containers import generate, name, podman, rootfs, spec_file  # noqa: F401 (fixtures)
from sharegpu.spec import MIB

CAP_MIB = 256


@pytest.fixture(scope="module")
def vulkan_rootfs(rootfs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """What a rendering image holds (tests/vkutil.py); `rootfs` first, for its checks of Podman."""
    return vkutil.build_vulkan_rootfs(
        tmp_path_factory.mktemp("vkroot") / "rootfs", tmp_path_factory.mktemp("vk")
    )


@pytest.fixture
def sim(sim_factory, tmp_path_factory: pytest.TempPathFactory) -> Sim:  # type: ignore[no-untyped-def]
    vkprobe = vkutil.build_vkprobe(tmp_path_factory.mktemp("uuidprobe"))
    uuid0 = vkutil.lavapipe_uuid(vkprobe, tmp_path_factory.mktemp("uuid"))
    node: Sim = sim_factory(gpus=2, memory_mib=8 * 1024, uuid0=uuid0)
    return node


def test_a_vulkan_container_sees_its_vgpu_and_is_refused_past_its_cap(
    sim: Sim,
    vulkan_rootfs: Path,
    spec_file: Path,  # noqa: F811
    name: str,  # noqa: F811
) -> None:
    sim.tenant(name, CAP_MIB, gpus=[0])
    generate(sim, spec_file)
    flags = ("--env", "XDG_RUNTIME_DIR=/tmp")
    proc = podman(vulkan_rootfs, name, "/bin/sh", "-c", "vkprobe info 13; vkprobe fill 64", flags=flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    values = parse_kv(proc.stdout)[0]
    assert values["devices"] == "1"
    assert values["heap2"] == str(CAP_MIB * MIB)  # the vGPU's heap, not lavapipe's
    assert values["allocated"] == str(CAP_MIB // 64)
    assert values["refused"] == "-2"  # VK_ERROR_OUT_OF_DEVICE_MEMORY
    assert values["again"] == "0"

    other = f"{name}-gpu1"
    sim.tenant(other, CAP_MIB, gpus=[1])
    generate(sim, spec_file)
    proc = podman(vulkan_rootfs, other, "vkprobe", "info", "13", flags=flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert parse_kv(proc.stdout)[0]["devices"] == "0"  # the tenant of GPU 1 has no Vulkan device
