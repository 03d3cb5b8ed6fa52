"""CDI specs: the rules of the CDI specification, and the spec sharegpu writes for a node.

The rules (sharegpu.runtime.cdi.model) are checked on specs built here; the node's spec through
`sharegpu cdi generate` in a real process on the simulated GPU. What a container does with the
spec is tests/test_containers.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import Sim
from sharegpu.arbiter import ensure_arbiter
from sharegpu.errors import CdiSpecError
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
    doc = generate(sim)
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
    only = generate(sim, "--tenant", "batch")
    assert [d["name"] for d in only["devices"]] == ["batch"]


def test_the_spec_file_is_written_whole_and_replaced_atomically(sim: Sim, tmp_path: Path) -> None:
    sim.tenant("web", 512, gpus=[0])
    out = tmp_path / "cdi"
    proc = sim.cli("cdi", "generate", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    target = out / "sharegpu.json"
    assert proc.stdout.strip() == f"wrote {target} (cdiVersion 0.3.0): sharegpu.io/vgpu=web"
    first = target.stat().st_ino
    sim.tenant("batch", 256, gpus=[0])
    assert sim.cli("cdi", "generate", "--output", str(out)).returncode == 0
    assert target.stat().st_ino != first  # renamed over, never rewritten in place
    assert sorted(d["name"] for d in json.loads(target.read_text())["devices"]) == ["batch", "web"]
    assert [p.name for p in out.iterdir()] == ["sharegpu.json"]  # no temporary file left
    named = tmp_path / "other.json"
    assert sim.cli("cdi", "generate", "--output", str(named)).returncode == 0
    assert json.loads(named.read_text())["kind"] == "sharegpu.io/vgpu"


def test_bad_requests_get_one_clear_line(sim: Sim, tmp_path: Path) -> None:
    proc = sim.cli("cdi", "generate", "--output", str(tmp_path))
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
