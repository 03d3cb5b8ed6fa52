"""Which container a process is in, from the cgroup path each runtime gives it; and the labels
the metrics take from it when the tenant's own labels do not name one."""

from __future__ import annotations

import os

import pytest

from sharegpu.agent.metrics import _k8s
from sharegpu.agent.models import ContainerView, TenantView
from sharegpu.cgroup import container_of, parse_cgroup_path

ID = "5edb61a4e38c51dc3e0ee0ac4f2a879db1c5f6579ac133b9bf34aaf561a39828"
UID = "0b6e2c1a-7a1d-4d7e-9f43-3c1f5ab2e9d0"


@pytest.mark.parametrize(
    ("path", "runtime", "pod"),
    [
        (f"/machine.slice/libpod-{ID}.scope", "podman", ""),
        (f"/machine.slice/libpod-{ID}.scope/container", "podman", ""),  # a leaf below it
        (f"/libpod_parent/libpod-{ID}", "podman", ""),
        (f"/system.slice/docker-{ID}.scope", "docker", ""),
        (f"/docker/{ID}", "", ""),
        (f"/default/{ID}", "", ""),  # containerd outside Kubernetes: its namespace, then the id
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{UID.replace('-', '_')}.slice/cri-containerd-{ID}.scope",
            "containerd",
            UID,
        ),
        (f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{ID}.scope", "cri-o", UID),
        (f"/kubepods/besteffort/pod{UID}/{ID}", "", UID),
    ],
)
def test_each_runtimes_cgroup_names_its_container(path: str, runtime: str, pod: str) -> None:
    found = parse_cgroup_path(path)
    assert found is not None
    assert (found.id, found.runtime, found.pod_uid, found.short_id) == (ID, runtime, pod, ID[:12])


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/user.slice/user-0.slice/session-3.scope",
        f"/machine.slice/libpod-conmon-{ID}.scope",  # podman's monitor, not the container
        f"/system.slice/crio-conmon-{ID}.scope",
        "/docker/5edb61a4e38c",  # a short id is not a runtime's cgroup name
        f"/kubepods/besteffort/pod{UID}",  # the pod's own cgroup holds no process of a container
    ],
)
def test_a_host_cgroup_or_a_monitor_is_no_container(path: str) -> None:
    assert parse_cgroup_path(path) is None


def test_this_process_is_not_in_a_container_and_a_gone_one_has_none() -> None:
    assert container_of(os.getpid()) is None  # the tests run on the host
    assert container_of(2**22 + 1) is None  # above pid_max: no such process


def _view(labels: dict[str, str], containers: list[ContainerView]) -> TenantView:
    return TenantView(
        id="t",
        path="/t",
        state="running",
        error=None,
        stale=False,
        over_cap=False,
        age_seconds=1.0,
        labels=labels,
        containers=containers,
    )


def test_the_metrics_name_the_container_and_pod_from_the_cgroup_unless_labelled() -> None:
    seen = [ContainerView(id=ID, runtime="containerd", pod_uid=UID)]
    assert _k8s(_view({}, seen)) == ["", UID, ID]
    named = {"namespace": "ml", "pod": "serve-0", "container": "serve"}
    assert _k8s(_view(named, seen)) == ["ml", "serve-0", "serve"]  # the integration's names win
    assert _k8s(_view({}, [])) == ["", "", ""]
