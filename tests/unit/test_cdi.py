"""CDI specs: the rules of the CDI specification (sharegpu.runtime.cdi.model) on specs built here,
shape names, and the pieces of the hooks that need no process. The node's spec through `sharegpu
cdi generate` on the simulated GPU is tests/integration/test_cdi.py; what a container does with
it, tests/e2e/test_containers.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sharegpu.errors import CdiSpecError, ConfigError
from sharegpu.runtime.cdi.hook import mount_point
from sharegpu.runtime.cdi.model import (
    ContainerEdits,
    Device,
    DeviceNode,
    Hook,
    Mount,
    Spec,
    minimum_version,
    problems,
    validate,
)
from sharegpu.runtime.cdi.shapes import parse_shape


def spec(*devices: Device, kind: str = "sharegpu.io/vgpu", version: str = "0.3.0", **kw: object) -> Spec:
    return Spec(cdiVersion=version, kind=kind, devices=list(devices), **kw)  # type: ignore[arg-type]


def device(name: str = "web", **edits: object) -> Device:
    return Device(name=name, containerEdits=ContainerEdits(**edits))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# the rules


def test_the_lowest_version_follows_the_fields_a_spec_uses() -> None:
    bind = Mount(hostPath="/a", containerPath="/b", options=["ro", "bind"])
    assert minimum_version(spec(device(mounts=[bind]))) == "0.3.0"
    typed = bind.model_copy(update={"type": "bind"})
    assert minimum_version(spec(device(mounts=[typed]))) == "0.4.0"
    assert minimum_version(spec(device("4gib"))) == "0.5.0"  # a name starting with a digit
    node = DeviceNode(path="/dev/nvidia0", hostPath="/dev/nvidia0")
    assert minimum_version(spec(device(deviceNodes=[node]))) == "0.5.0"
    assert minimum_version(spec(device(), kind="sharegpu.io/v.gpu")) == "0.6.0"
    assert minimum_version(spec(device(), annotations={"a": "b"})) == "0.6.0"
    assert minimum_version(spec(device(additionalGids=[44]))) == "0.7.0"


def test_a_spec_older_than_its_fields_is_refused() -> None:
    found = problems(spec(device("4gib")))
    assert found == ["cdiVersion 0.3.0: the fields used need 0.5.0 or later"]
    assert problems(spec(device("4gib"), version="0.5.0")) == []
    assert problems(spec(device(), version="0.5")) == [
        "cdiVersion '0.5': must be a semantic version like 0.5.0"
    ]


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("vgpu", "must be <vendor domain>/<name>"),
        ("sharegpu.io/vgpu/", "must be <vendor domain>/<name>"),
        ("sharegpu.io/a/b", "must be <vendor domain>/<name>"),
        ("Sharegpu.IO/vgpu", "the prefix must be a DNS subdomain"),
        ("sharegpu..io/vgpu", "the prefix must be a DNS subdomain"),
        ("sharegpu.io/-vgpu", "the name must be 1-63"),
        ("sharegpu.io/" + "v" * 64, "the name must be 1-63"),
    ],
)
def test_bad_kinds_are_refused_with_the_rule_they_break(kind: str, why: str) -> None:
    found = problems(spec(device(), kind=kind, version="0.6.0"))
    assert any(why in p for p in found), found


@pytest.mark.parametrize("name", ["-web", "web-", "web/1", "we b", "", "wéb"])
def test_bad_device_names_are_refused(name: str) -> None:
    found = problems(spec(device(name), version="0.5.0"))
    assert found == [
        f"devices[0]: device name {name!r}: use letters, digits, '-', '_' or '.', "
        "starting and ending with a letter or digit"
    ]


def test_every_problem_is_reported_at_once_naming_its_field() -> None:
    bad = spec(
        device(
            "web",
            env=["NOVALUE"],
            mounts=[Mount(hostPath="", containerPath="relative")],
            hooks=[Hook(hookName="postStop", path="sharegpu", timeout=0)],
            deviceNodes=[DeviceNode(path="dev/x", permissions="rx")],
        ),
        device("web"),
    )
    with pytest.raises(CdiSpecError) as err:
        validate(bad)
    text = str(err.value)
    for part in (
        "devices[0].containerEdits.env[0] 'NOVALUE': must be NAME=VALUE",
        "devices[0].containerEdits.mounts[0].hostPath: must not be empty",
        "devices[0].containerEdits.mounts[0].containerPath 'relative': must be absolute",
        "devices[0].containerEdits.hooks[0].hookName 'postStop'",
        "devices[0].containerEdits.hooks[0].path 'sharegpu': must be absolute",
        "devices[0].containerEdits.hooks[0].timeout 0: must be greater than zero",
        "devices[0].containerEdits.deviceNodes[0].path 'dev/x': must be absolute",
        "devices[0].containerEdits.deviceNodes[0].permissions 'rx'",
        "devices[1]: device name 'web' is listed twice",
    ):
        assert part in text, (part, text)
    assert problems(spec()) == ["devices: a spec must list at least one device"]


def test_unknown_fields_are_refused_when_a_spec_is_read() -> None:
    doc = {"cdiVersion": "0.3.0", "kind": "sharegpu.io/vgpu", "devices": [{"name": "web", "extra": 1}]}
    with pytest.raises(ValueError, match="extra"):
        Spec.model_validate(doc)


# ---------------------------------------------------------------------------------------------
# shapes


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("gpu0-4GiB-30", (0, 4096, "share", "normal", 300)),
        ("gpu1-512MiB-5-online", (1, 512, "share", "online", 50)),
        ("gpu0-1.5GiB-50-offline-cap", (0, 1536, "cap", "offline", 500)),
        ("gpu12-80GiB-100-burst", (12, 80 * 1024, "burst", "normal", 1000)),
    ],
)
def test_a_shape_name_says_its_gpu_memory_and_compute(name: str, want: tuple[object, ...]) -> None:
    shape = parse_shape(name)
    compute = shape.compute
    got = (shape.gpu, shape.memory_bytes >> 20, compute.policy, compute.priority, compute.share_permille)
    assert got == want
    assert shape.name == name  # canonical names come back unchanged


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("gpu0-4GiB", "use gpu<index>-<memory>-<compute>"),
        ("gpu0-4GiB-0", "must be between 1% and 100%"),
        ("gpu0-4GiB-130", "must be between 1% and 100%"),
        ("gpu0-4.5MiB-30", "whole number of MiB"),
        ("gpu0-4GiB-30-cap-online", "use gpu<index>-<memory>-<compute>"),
        ("gpu01-4GiB-30", "use gpu<index>-<memory>-<compute>"),
        ("gpu0-4gib-30", "use gpu<index>-<memory>-<compute>"),
    ],
)
def test_bad_shapes_are_refused_with_the_reason(name: str, why: str) -> None:
    with pytest.raises(CdiSpecError, match="invalid vGPU shape") as err:
        parse_shape(name)
    assert why in str(err.value)


def test_the_hook_never_mounts_through_a_link_of_the_image(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    made = mount_point(rootfs, "/run/sharegpu/tenant/limits", directory=False)
    assert made == rootfs / "run/sharegpu/tenant/limits"
    assert made.is_file()
    assert mount_point(rootfs, "/run/sharegpu/tenant/gpus/GPU-1", directory=True).is_dir()
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "rootfs").mkdir()
    (evil / "rootfs" / "run").symlink_to(tmp_path / "host-etc")
    with pytest.raises(ConfigError, match="the container's /run is a symbolic link"):
        mount_point(evil / "rootfs", "/run/sharegpu/tenant/limits", directory=False)
    assert not (tmp_path / "host-etc").exists()  # nothing was made through it


def test_the_doors_find_the_agent_by_the_clients_own_names() -> None:
    """sharegpu.doors mirrors two names of the agent's client so that hooks need not import it
    when no agent runs: they must stay the client's."""
    from sharegpu import doors
    from sharegpu.agent import client

    assert (doors._SOCKET_NAME, doors._NO_AGENT_ENV) == (client.SOCKET_NAME, client.NO_AGENT_ENV)
