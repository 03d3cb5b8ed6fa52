"""Which container a process is in, from its cgroup: what the agent names in the audit, the
tenant listings, `top` and the metrics' `container`/`pod` labels.

Every runtime puts a container's processes in a cgroup named after the container's id (64 hex
digits), and the kubelet nests those under one per pod, named after the pod's UID:

    podman          /machine.slice/libpod-<id>.scope            /libpod_parent/libpod-<id>
    docker          /system.slice/docker-<id>.scope              /docker/<id>
    containerd      .../cri-containerd-<id>.scope                /<namespace>/<id>
    CRI-O           .../crio-<id>.scope
    Kubernetes      /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/...
                    /kubepods/burstable/pod<uid>/<id>

(systemd cgroup driver on the left, cgroupfs on the right.) A process may sit in a cgroup below
its container's (systemd inside the container, podman's `container` leaf), so the path is read
from the leaf up. Monitors (`libpod-conmon-`, `crio-conmon-`) are not containers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CONTAINER = re.compile(r"^(?:(docker|libpod|cri-containerd|crio)-)?([0-9a-f]{64})(?:\.scope)?$")
_POD = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$"
)
_RUNTIMES = {"docker": "docker", "libpod": "podman", "cri-containerd": "containerd", "crio": "cri-o"}
SHORT_ID = 12  # how runtimes print an id


@dataclass(frozen=True)
class Container:
    id: str  # 64 hex digits
    runtime: str  # podman, docker, containerd, cri-o; "" when the name does not say
    pod_uid: str = ""  # the Kubernetes pod's UID, "" outside a pod

    @property
    def short_id(self) -> str:
        return self.id[:SHORT_ID]


def parse_cgroup_path(path: str) -> Container | None:
    """The container a cgroup path belongs to, or None (a host process, a monitor)."""
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) - 1, -1, -1):
        match = _CONTAINER.match(parts[i])
        if match is None:
            continue
        pod = next((m.group(1) for p in parts[:i] if (m := _POD.search(p))), "")
        return Container(
            id=match.group(2), runtime=_RUNTIMES.get(match.group(1) or "", ""), pod_uid=pod.replace("_", "-")
        )
    return None


def cgroup_paths(pid: int) -> list[str]:
    """The cgroup paths of process `pid` (/proc/<pid>/cgroup), the unified (v2) one first."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    paths = [line.split(":", 2)[2] for line in lines if line.count(":") >= 2]
    unified = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    return unified + [p for p in paths if p not in unified]


def unified_path(pid: int) -> str | None:
    """The process's cgroup v2 path, None on a v1-only host or when it is gone."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="ascii", errors="replace") as f:
            return next((line.split(":", 2)[2].strip() for line in f if line.startswith("0::")), None)
    except OSError:
        return None


def container_of(pid: int) -> Container | None:
    """The container process `pid` (a pid of this namespace) runs in, or None."""
    for path in cgroup_paths(pid):
        found = parse_cgroup_path(path)
        if found is not None:
            return found
    return None


_known: dict[tuple[int, int], Container | None] = {}


def container_of_process(pid: int, start_time: int) -> Container | None:
    """container_of, remembered for the process (pid and start time: never a reused pid's).
    A process does not leave its container's cgroup, and the agent asks for every process of
    every tenant several times a second."""
    key = (pid, start_time)
    if key not in _known:
        if len(_known) >= 4096:
            _known.clear()
        _known[key] = container_of(pid)
    return _known[key]
