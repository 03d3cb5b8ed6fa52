"""A real single-node Kubernetes for the end-to-end tests (issue 37): `scripts/kube-node.sh --hold`
started once, kept running while the tests use it, stopped (and torn down by the script) at the
end. The script owns every process, mount and host setting; this only reads its READY line and
closes its stdin to stop it.

`make test` runs the tests that use it (they need root, the binaries of `make kube`, containerd 2
among them, and Debian's runc, CNI plugins and busybox-static: a missing one fails the start).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "kube-node.sh"
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 120.0


def kube_bin() -> Path:
    """Where `make kube` puts the binaries it builds (whether they are there or not)."""
    out = subprocess.run(
        ["bash", str(SCRIPT.parent / "build-kube.sh"), "--bin-dir"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


# The host-wide sysctls the kubelet needs; the script sets them while it runs and puts them back.
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")


def _sysctls() -> dict[str, str]:
    return {name: (Path("/proc/sys") / name).read_text().strip() for name in SYSCTLS}


@dataclass
class KubeNode:
    """The running node: its kubeconfig, kubectl, node name, test image and CDI spec directory,
    and the script's
    output so far (printed when a test fails)."""

    kubeconfig: Path
    kubectl_bin: Path
    node: str
    image: str
    dir: Path
    cdi: Path  # containerd's CDI spec directory
    start_s: float
    output: list[str] = field(default_factory=list)
    script: subprocess.Popen[str] | None = None

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's --root-dir (its plugins_registry and plugins are under it)."""
        return self.dir / "kubelet"

    def ctr(self, namespace: str) -> list[str]:
        """containerd 2's own client, on this node's containerd, in `namespace` (k8s.io: the
        kubelet's)."""
        return [
            str(self.kubectl_bin.parent / "ctr"),
            "--address",
            str(self.dir / "containerd.sock"),
            "-n",
            namespace,
        ]

    def restart_kubelet(self, timeout: float = 150.0) -> float:
        """Stop the kubelet and start it again with the same flags and state (the script does
        it at SIGUSR1); the seconds until it is healthy and the node Ready again."""
        assert self.script is not None
        done = "kube-node: KUBELET-RESTARTED"
        before = sum(1 for line in self.output if line.startswith(done))
        t0 = time.monotonic()
        self.script.send_signal(signal.SIGUSR1)
        while sum(1 for line in self.output if line.startswith(done)) == before:
            if time.monotonic() - t0 > timeout or self.script.poll() is not None:
                pytest.fail("the kubelet did not come back:\n" + "\n".join(self.output[-20:]))
            time.sleep(0.1)
        return time.monotonic() - t0

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60.0, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.kubectl_bin), "--kubeconfig", str(self.kubeconfig), *args],
            check=False,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc


class _Output:
    """The script's stdout, read by a thread, so that waiting for a line never blocks forever."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.done = False
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def wait_for(self, prefix: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    if line.startswith(prefix):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self.done or left <= 0:
                    return None
                self.cond.wait(left)


@dataclass
class ApiServer:
    """etcd and kube-apiserver alone (`kube-node.sh --hold --api-only`): certificates, RBAC and
    an audit log of every request, for the tests of sharegpu's API clients. Nothing runs pods."""

    kubeconfig: Path
    kubectl_bin: Path
    dir: Path
    audit: Path  # one JSON object per request, written before the answer (the log's blocking mode)
    start_s: float
    output: list[str] = field(default_factory=list)


@contextmanager
def _held_script(*flags: str) -> Iterator[tuple[dict[str, str], _Output, subprocess.Popen[str], float]]:
    """kube-node.sh run with --hold and `flags` until the block ends: its READY line's fields, its
    output, the process and its start time; checked torn down (and the sysctls back) after."""
    if os.geteuid() != 0:
        pytest.fail("the kube node needs root (containerd, runc, the kubelet)")
    sysctls_before = _sysctls()
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), "--hold", *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a ^C at the terminal reaches pytest, which then closes stdin
    )
    out = _Output(proc)
    try:
        ready = out.wait_for("kube-node: READY ", START_TIMEOUT_S)
        if ready is None:
            pytest.fail("kube-node.sh did not become ready:\n" + "\n".join(out.lines[-40:]))
        yield dict(kv.split("=", 1) for kv in ready.split()[2:]), out, proc, t0
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the script tears everything down when its stdin ends
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # its trap still tears down
            proc.wait(timeout=STOP_TIMEOUT_S)
        out.thread.join(timeout=5)
        assert proc.stdout is not None
        proc.stdout.close()
        torn = [line for line in out.lines if "torn down" in line or "left under" in line]
        tail = "\n".join(out.lines[-20:])
        assert torn, f"kube-node.sh did not say it tore down:\n{tail}"
        assert "torn down" in torn[-1], f"kube-node.sh left mounts behind:\n{tail}"
        assert _sysctls() == sysctls_before, f"kube-node.sh did not put the sysctls back:\n{tail}"


@contextmanager
def running_kube_node() -> Iterator[KubeNode]:
    """The node, started (about 15-30 s), and torn down when the block ends; a session fixture
    of the tests that use it wraps this."""
    with _held_script() as (info, out, proc, t0):
        yield KubeNode(
            kubeconfig=Path(info["kubeconfig"]),
            kubectl_bin=Path(info["kubectl"]),
            node=info["node"],
            image=info["image"],
            dir=Path(info["dir"]),
            cdi=Path(info["cdi"]),
            start_s=time.monotonic() - t0,
            output=out.lines,
            script=proc,
        )


@contextmanager
def running_api_server() -> Iterator[ApiServer]:
    """etcd and the API server (about 5-10 s to start), stopped when the block ends."""
    with _held_script("--api-only") as (info, out, _proc, t0):
        yield ApiServer(
            kubeconfig=Path(info["kubeconfig"]),
            kubectl_bin=Path(info["kubectl"]),
            dir=Path(info["dir"]),
            audit=Path(info["audit"]),
            start_s=time.monotonic() - t0,
            output=out.lines,
        )


# The User-Agents of the clients under test: sharegpu's components (sharegpu.kube.apiclient) and
# the clients the tests build of the `kubernetes` package.
PYTHON_CLIENTS = ("sharegpu-", "OpenAPI-Generator/")

# The resources the API tests read and write: where each lives, and whether it is namespaced.
RESOURCES = {
    "nodes": ("/api/v1", False),
    "pods": ("/api/v1", True),
    "events": ("/api/v1", True),
    "serviceaccounts": ("/api/v1", True),
    "namespaces": ("/api/v1", False),
    "leases": ("/apis/coordination.k8s.io/v1", True),
}


class ApiObjects:
    """Plain reads and writes of objects on a real API server as JSON dicts, by the stand-in's
    names (tests/apiserver_standin.py), so one test reads the same against either; and the
    writes its audit log saw."""

    def __init__(self, server: ApiServer) -> None:
        self.server = server
        self.client = config.new_client_from_config(str(server.kubeconfig))
        self._audit_from = 0

    def api_client(self) -> client.ApiClient:
        return config.new_client_from_config(str(self.server.kubeconfig))

    def kubeconfig(self, _path: Path | None = None) -> Path:
        return self.server.kubeconfig

    def _path(self, resource: str, namespace: str | None, name: str | None = None) -> str:
        prefix, namespaced = RESOURCES[resource]
        path = (
            f"{prefix}/namespaces/{namespace}/{resource}"
            if namespaced and namespace
            else f"{prefix}/{resource}"
        )
        return f"{path}/{name}" if name else path

    def request(self, method: str, path: str, body: Any = None, **query: Any) -> Any:
        """The decoded answer; a refusal raised as the client's ApiException."""
        url = self.client.configuration.host + path + (f"?{urlencode(query)}" if query else "")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        answer = self.client.call_api(method, url, header_params=headers, body=body)
        answer.read()
        if answer.status >= 400:
            raise client.ApiException(http_resp=answer)
        return json.loads(answer.data)

    def create(self, resource: str, obj: Any) -> Any:
        namespace = obj["metadata"].get("namespace")
        return self.request("POST", self._path(resource, namespace), obj)

    def get(self, resource: str, namespace: str | None, name: str) -> Any:
        try:
            return self.request("GET", self._path(resource, namespace, name))
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise

    def objects(self, resource: str) -> list[Any]:
        return list(self.request("GET", self._path(resource, None))["items"])

    def edit(
        self,
        resource: str,
        namespace: str | None,
        name: str,
        change: Callable[[Any], None],
        *,
        status: bool = False,
    ) -> Any:
        """Another writer's change: read, changed by `change`, replaced (the stand-in's bump); with
        status, of the object's status (its own subresource on a real server)."""
        obj = self.get(resource, namespace, name)
        change(obj)
        path = self._path(resource, namespace, name) + ("/status" if status else "")
        return self.request("PUT", path, obj)

    def delete_all(self, resource: str, namespace: str | None = None) -> None:
        """Every object of `resource` (in `namespace`) gone at once: pods without the grace a
        kubelet would honour (no kubelet runs)."""
        self.request("DELETE", self._path(resource, namespace), gracePeriodSeconds=0)

    def mark(self) -> None:
        """requests() and writes() from here on."""
        self._audit_from = self.server.audit.stat().st_size

    def requests(self, agent: tuple[str, ...] = PYTHON_CLIENTS) -> list[tuple[str, str]]:
        """(HTTP method, path) of each request the API server answered since mark(), in order, of
        the clients whose User-Agent starts with one of `agent`. Not the API server's own (its
        loopback client fetches /openapi/v3 now and then), nor a kubectl's."""
        methods = {"get": "GET", "list": "GET", "watch": "GET", "create": "POST", "update": "PUT"}
        methods |= {"patch": "PATCH", "delete": "DELETE", "deletecollection": "DELETE"}
        with self.server.audit.open("rb") as f:
            f.seek(self._audit_from)
            # Whole lines only: another request's may be half written as this reads.
            lines = f.read().split(b"\n")[:-1]
            entries = [json.loads(line) for line in lines if line.strip()]
        return [
            (methods[e["verb"]], e["requestURI"].split("?", 1)[0])
            for e in entries
            if e.get("stage") == "ResponseComplete" and str(e.get("userAgent", "")).startswith(agent)
        ]

    def writes(self) -> list[tuple[str, str]]:
        """The requests() that wrote."""
        return [(method, path) for method, path in self.requests() if method != "GET"]

    def close(self) -> None:
        self.client.close()
