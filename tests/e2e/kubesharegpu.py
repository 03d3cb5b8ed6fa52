"""sharegpu installed on the real node of `kubenode.py` (issue 37): `deploy/kubernetes` applied with
kubectl, then its components started as host processes under their ServiceAccounts' own tokens,
so the API server's RBAC judges every request they make as it would in the cluster:

* the node DaemonSet's two containers on a simulated GPU: the agent, and the device plugin,
  registering with the real kubelet at its fixed socket,
  /var/lib/kubelet/device-plugins/kubelet.sock. Both keep the CDI spec in containerd's spec
  directory, and the plugin answers with the CDI device name only (`--cdi-only`), so a
  container gets its vGPU through containerd 2's CDI or not at all;
* the extender (the extender Deployment's command);
* a second kube-scheduler (the scheduler Deployment's binary, built by `make kube`) with
  `deploy/kubernetes/base/scheduler-config.yaml` as it is, but for two lines a host process
  needs: the extender's URL (no cluster DNS here: 127.0.0.1 and its port) and the kubeconfig
  holding the ServiceAccount's token (a pod gets it mounted).

The Deployments and the DaemonSet are applied and accepted, then scaled to none / left without a
matching node: these tests stop, restart and read each component on its own, run the DRA plugin
beside the device plugin on a simulated GPU of their own, and run two extenders on one host. The
same components as pods of the project's image, deployed by the manifests, are
`kubedeployed.py`'s (tests/e2e/test_kube_deployed.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import yaml

import vkutil
from conftest import Sim
from e2e.kubenode import ROOT, KubeNode
from metricsutil import free_port
from sharegpu.agent.client import AgentClient
from sharegpu.kube.dra.claims import ClaimRef
from sharegpu.runtime.rootfs import build_rootfs
from sharegpu.tenant import read_device_limits

NAMESPACE = "sharegpu-system"
DEPLOY = ROOT / "deploy" / "kubernetes"
SCHEDULER_CONFIG = DEPLOY / "base" / "scheduler-config.yaml"
KUBELET_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")
START_TIMEOUT_S = 60.0
PROBE_IMAGE = "sharegpu.local/probe:1"
VULKAN_IMAGE = "sharegpu.local/vkprobe:1"  # import_vulkan_image
APP_NS = "default"  # where the tests' pods run


class Cluster(Protocol):
    """sharegpu on the node, however it runs (host processes here, pods in kubedeployed.py)."""

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]: ...
    def get(self, *args: str) -> Any: ...
    def tail(self, lines: int = 30) -> str: ...


def allocatable_vgpus(node: dict[str, Any]) -> int:
    """The vGPUs a Node object says its kubelet offers (its allocatable sharegpu.io/vgpu)."""
    return int(node["status"].get("allocatable", {}).get("sharegpu.io/vgpu", "0"))


@dataclass
class Sharegpu:
    """The node with sharegpu on it: the simulated GPU, where each component logs, and what the
    API server accepted from the manifests."""

    node: KubeNode
    sim: Sim
    logs: dict[str, Path]
    applied: list[str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    extender_port: int = field(default_factory=free_port)
    probe_tar: Path = Path()  # the probe image's OCI archive (import_probe_image)
    node_env: dict[str, str] = field(default_factory=dict)  # the node DaemonSet's containers'

    @property
    def cdi_spec(self) -> str:
        """The node's CDI spec, in containerd's spec directory."""
        return str(self.node.cdi / "sharegpu.json")

    def node_vgpus(self) -> int:
        """The vGPUs the kubelet offers on the node: 0 while the device plugin is not registered."""
        return allocatable_vgpus(self.get("node", self.node.node))

    def extender_ready(self, port: int | None = None) -> bool:
        """The extender's readiness probe, as deploy/kubernetes sets it: the leader, synced."""
        try:
            url = f"http://127.0.0.1:{port or self.extender_port}/readyz"
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        """Run one component, appending to logs[name]."""
        self.commands[name] = (argv, env)
        self.logs.setdefault(name, next(iter(self.logs.values())).with_name(f"{name}.log"))
        with self.logs[name].open("ab") as out:
            self.procs[name] = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def stop(self, name: str) -> int | None:
        """SIGTERM (SIGKILL after 30 s); the exit status."""
        proc = self.procs[name]
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def wait_for_agent(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while (client := AgentClient.connect(self.sim.runtime)) is None:
            if self.procs["agent"].poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the agent does not answer:\n{self.tail()}")
            time.sleep(0.1)
        client.close()

    def stop_if_started(self, name: str) -> None:
        if name in self.procs:
            self.stop(name)

    def restart(self, name: str) -> None:
        """Stopped and started again with the same command, as a pod's container is."""
        code = self.stop(name)
        assert code == 0, f"{name} exited {code} at SIGTERM:\n" + self.logs[name].read_text()[-3000:]
        self.start(name, *self.commands[name])
        if name == "agent":
            self.wait_for_agent()

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.node.kubectl(*args, **kwargs)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(
            f"--- {name}:\n" + "\n".join(path.read_text().splitlines()[-lines:])
            for name, path in self.logs.items()
        )


def vgpu_pod(
    name: str, memory_mib: int, compute: int, command: str, image: str = PROBE_IMAGE, **annotations: str
) -> dict[str, Any]:
    """A pod that asks for a vGPU the way docs/kubernetes.md tells users to."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": APP_NS, "annotations": annotations},
        "spec": {
            "schedulerName": "sharegpu-scheduler",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    "resources": {
                        "limits": {
                            "sharegpu.io/vgpu": 1,
                            "sharegpu.io/vgpu-memory": memory_mib,
                            "sharegpu.io/vgpu-compute": compute,
                        }
                    },
                }
            ],
        },
    }


def tenant_limits(path: Path) -> tuple[int, int, int]:
    """The memory cap (bytes), share (permille) and priority of a tenant of one vGPU."""
    (limit,) = read_device_limits(path)
    return limit.mem_cap_bytes, limit.share_permille, limit.priority


def wait_phase(gpu: Cluster, name: str, phases: tuple[str, ...], timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pod: dict[str, Any] = gpu.get("pod", "-n", APP_NS, name)
        if pod["status"].get("phase") in phases:
            return pod
        if time.monotonic() > deadline:
            describe = gpu.kubectl("-n", APP_NS, "describe", "pod", name, check=False).stdout
            pytest.fail(f"pod {name} not {'/'.join(phases)} after {timeout:.0f} s:\n{describe}\n{gpu.tail()}")
        time.sleep(0.2)


def lease_holder(gpu: Cluster) -> str:
    """Which extender replica holds the leader Lease."""
    args = ("-n", NAMESPACE, "get", "lease", "sharegpu-extender", "-o", "jsonpath={.spec.holderIdentity}")
    return str(gpu.kubectl(*args).stdout)


def failed_scheduling(gpu: Cluster, name: str) -> list[str]:
    events = gpu.get("events", "-n", APP_NS, "--field-selector", f"involvedObject.name={name}")["items"]
    return [e["message"] for e in events if e["reason"] == "FailedScheduling"]


def audit_denials(audit_log: Path) -> list[str]:
    """Every request of a sharegpu ServiceAccount that the API server refused (401/403), one
    line each: who, verb, resource, the status."""
    denied = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        code = event.get("responseStatus", {}).get("code", 0)
        if code in (401, 403):
            ref = event.get("objectRef", {})
            what = "/".join(p for p in (ref.get("resource"), ref.get("subresource"), ref.get("name")) if p)
            denied.append(
                f"{event['user']['username']} {event['verb']} {what or event['requestURI']}: {code}"
            )
    return denied


def _token_kubeconfig(
    node: KubeNode, account: str, path: Path, bound_pod: dict[str, Any] | None = None
) -> Path:
    """A kubeconfig that authenticates as ServiceAccount `account` with a token the API server
    issues for it (what a pod of that account has mounted); bound to `bound_pod`, it carries
    that pod's node, as a DaemonSet pod's token does."""
    bound = []
    if bound_pod is not None:
        meta = bound_pod["metadata"]
        bound = ["--bound-object-kind", "Pod", "--bound-object-name", meta["name"]]
        bound += ["--bound-object-uid", meta["uid"]]
    token = node.kubectl(
        "-n", NAMESPACE, "create", "token", account, "--duration", "2h", *bound
    ).stdout.strip()
    admin = yaml.safe_load(node.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "node", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "node", "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def scheduler_config(extender_port: int, kubeconfig: Path, path: Path) -> Path:
    """deploy's scheduler configuration with the two lines a host process needs changed."""
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    (extender,) = config["extenders"]
    assert extender["urlPrefix"] == f"http://sharegpu-extender.{NAMESPACE}.svc:8998", extender
    extender["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    path.write_text(yaml.safe_dump(config))
    return path


def import_probe_image(node: KubeNode, root: Path) -> Path:
    """An image with busybox, the CUDA probe and the C libraries they need (the driver and the
    shim come from the device plugin's answer), built from files and imported into the node's
    containerd: the pods' CUDA program."""
    return import_image(node, build_rootfs(root / "probe-rootfs"), PROBE_IMAGE, root / "probe.tar")


def import_vulkan_image(node: KubeNode, root: Path) -> Path:
    """A rendering image: a plain Vulkan program on Mesa's lavapipe (tests/vkutil.py), no sharegpu
    file in it."""
    (root / "vkprobe").mkdir(exist_ok=True)
    rootfs = vkutil.build_vulkan_rootfs(root / "vulkan-rootfs", root / "vkprobe")
    return import_image(node, rootfs, VULKAN_IMAGE, root / "vulkan.tar")


def import_image(node: KubeNode, rootfs: Path, name: str, archive: Path) -> Path:
    """rootfs as the image `name` (scripts/oci-image.py), imported into the node's containerd."""
    import_archive(node, oci_archive(rootfs, name, archive))
    return archive


def oci_archive(rootfs: Path, name: str, archive: Path) -> Path:
    """rootfs as the image `name`, written to `archive` (scripts/oci-image.py: an OCI layout in a
    tar, no registry)."""
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "oci-image.py"),
            "--name",
            name,
            "--rootfs",
            str(rootfs),
            "--out",
            str(archive),
            "--cmd",
            "/bin/sh",
        ],
        check=True,
        capture_output=True,
    )
    return archive


def import_archive(node: KubeNode, archive: Path) -> None:
    """An OCI archive imported into the node's containerd, in the namespace the kubelet uses."""
    subprocess.run(
        [*node.ctr("k8s.io"), "images", "import", str(archive)], check=True, capture_output=True, timeout=300
    )


def apply_manifests(node: KubeNode, directory: Path = DEPLOY) -> list[str]:
    """`kubectl apply -k <directory>`: the objects it created (every line), failing on any
    object the server refused."""
    applied = node.kubectl("apply", "-k", str(directory), check=False, timeout=120)
    assert applied.returncode == 0, (
        f"the API server refused part of {directory}:\n{applied.stderr}{applied.stdout}"
    )
    # The components run as host processes here (the module's docstring): no pod of them.
    if any(line.startswith("deployment.apps/") for line in applied.stdout.splitlines()):
        node.kubectl("-n", NAMESPACE, "scale", "deployment", "--all", "--replicas=0")
    return applied.stdout.splitlines()


def node_identity_pod(node: KubeNode) -> dict[str, Any]:
    """A pod of the node DaemonSet's ServiceAccount on this node, Running: a token bound to it
    carries the node, as the DaemonSet pod's own does (the API server checks it for DRA status
    writes, `associated-node:`). It stands for the DaemonSet's pod, whose image is not built."""
    name = "sharegpu-node-identity"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "serviceAccountName": "sharegpu-node",
            "nodeName": node.node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "identity",
                    "image": PROBE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "86400"],
                }
            ],
        },
    }
    node.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    deadline = time.monotonic() + START_TIMEOUT_S
    while (got := json.loads(node.kubectl("-n", NAMESPACE, "get", "pod", name, "-o", "json").stdout))[
        "status"
    ].get("phase") != "Running":
        if time.monotonic() > deadline:
            pytest.fail(f"the node identity pod is not Running: {got['status']}")
        time.sleep(0.2)
    return dict(got)


def _start_node_agent(gpu: Sharegpu, root: Path, bound_pod: dict[str, Any] | None = None) -> dict[str, str]:
    """The node DaemonSet's agent, with its ServiceAccount (its flags but for the simulated GPU's
    paths and no metrics port), answering; the environment of the DaemonSet's containers."""
    node, sim = gpu.node, gpu.sim
    kubeconfig = _token_kubeconfig(node, "sharegpu-node", root / "node.kubeconfig", bound_pod)
    env = sim.env(PYTHONFAULTHANDLER="1", NODE_NAME=node.node, KUBECONFIG=str(kubeconfig))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    agent = [sys.executable, "-m", "sharegpu.cli", "agent", "--runtime-dir", str(sim.runtime)]
    agent += ["--state-dir", str(root / "agent-state"), "--metrics-port", "0", "--cdi-spec", gpu.cdi_spec]
    gpu.start("agent", agent, env)
    gpu.wait_for_agent()
    gpu.node_env = env
    return env


@contextmanager
def sharegpu_on(node: KubeNode, root: Path, uuid0: str | None = None) -> Iterator[Sharegpu]:
    """sharegpu's components on the node, on a simulated GPU (whose UUID is uuid0 when given: a
    Vulkan device's, tests/vkutil.py)."""
    if not KUBELET_SOCKET.is_socket():
        pytest.fail(f"the kubelet's device-plugin socket {KUBELET_SOCKET} is not there")
    applied = apply_manifests(node)
    probe_tar = import_probe_image(node, root)
    sim = Sim(root / "sim", gpus=1, memory_mib=8192, uuid0=uuid0)
    base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    base["PYTHONFAULTHANDLER"] = "1"  # a crash of a component leaves its traceback in its log
    logs = {name: root / f"{name}.log" for name in ("agent", "device-plugin", "extender", "scheduler")}
    gpu = Sharegpu(node, sim, logs, applied, probe_tar=probe_tar)
    extender_port, scheduler_port = gpu.extender_port, free_port()
    with ExitStack() as stack:
        for name in [*logs, "dra-plugin"]:
            stack.callback(gpu.stop_if_started, name)
        # The node DaemonSet's two containers: the agent, then the device plugin, whose
        # allocations go through the agent's tenant service.
        plugin_env = _start_node_agent(gpu, root)
        gpu.start(
            "device-plugin",
            [
                sys.executable,
                "-m",
                "sharegpu.kube.deviceplugin",
                "--node",
                node.node,
                "--cdi-spec",
                gpu.cdi_spec,
                "--cdi-only",
                "--publish-interval",
                "1",
            ],
            plugin_env,
        )
        extender_env = dict(
            base,
            KUBECONFIG=str(_token_kubeconfig(node, "sharegpu-extender", root / "extender.kubeconfig")),
            POD_NAME="extender-e2e",
            POD_NAMESPACE=NAMESPACE,
        )
        gpu.start(
            "extender",
            [
                sys.executable,
                "-m",
                "sharegpu.kube.extender",
                "--host",
                "127.0.0.1",
                "--port",
                str(extender_port),
            ],
            extender_env,
        )
        sched_kubeconfig = _token_kubeconfig(node, "sharegpu-scheduler", root / "scheduler.kubeconfig")
        gpu.start(
            "scheduler",
            [
                str(node.kubectl_bin.parent / "kube-scheduler"),
                "--config",
                str(scheduler_config(extender_port, sched_kubeconfig, root / "scheduler-config.yaml")),
                "--authentication-kubeconfig",
                str(sched_kubeconfig),
                "--authorization-kubeconfig",
                str(sched_kubeconfig),
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(scheduler_port),
            ],
            base,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            dead = [name for name, proc in gpu.procs.items() if proc.poll() is not None]
            if dead:
                pytest.fail(f"{', '.join(dead)} exited:\n{gpu.tail()}")
            if gpu.node_vgpus() > 0:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the node shows no sharegpu.io/vgpu after {START_TIMEOUT_S:.0f} s:\n{gpu.tail()}")
        yield gpu


def dra_plugin_command(node: KubeNode, root: Path, *extra: str) -> list[str]:
    """The DRA DaemonSet's plugin container (deploy/kubernetes/dra/node.yaml), with the node's
    kubelet and CDI directories and a state directory of its own."""
    return [
        sys.executable,
        "-m",
        "sharegpu.kube.dra",
        "--node",
        node.node,
        "--kubelet-dir",
        str(node.kubelet_dir),
        "--state-dir",
        str(root / "dra-state"),
        "--cdi-spec",
        str(node.cdi / "sharegpu.json"),
        "--publish-interval",
        "1",
        *extra,
    ]


def start_dra_plugin(gpu: Sharegpu, root: Path, **env: str) -> None:
    """The DRA plugin started beside the agent (`deploy/kubernetes/dra` applied: its classes and
    permissions); back once the kubelet registered it and the node's ResourceSlice lists its GPUs."""
    node = gpu.node
    gpu.logs["dra-plugin"] = root / "dra-plugin.log"
    gpu.start("dra-plugin", dra_plugin_command(node, root), {**gpu.node_env, **env})
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        dead = [name for name, proc in gpu.procs.items() if proc.poll() is not None]
        if dead:
            pytest.fail(f"{', '.join(dead)} exited:\n{gpu.tail()}")
        slices = gpu.get("resourceslices", "--field-selector", f"spec.nodeName={node.node}")["items"]
        registered = "registered DRA driver" in gpu.logs["dra-plugin"].read_text()
        if registered and any(s["spec"].get("devices") for s in slices):
            return
        time.sleep(0.2)
    pytest.fail(f"no DRA plugin registered and slice after {START_TIMEOUT_S:.0f} s:\n{gpu.tail()}")


@contextmanager
def dra_on(node: KubeNode, root: Path) -> Iterator[Sharegpu]:
    """sharegpu in DRA mode (`deploy/kubernetes/dra`): the agent and the DRA plugin as host
    processes under the node's ServiceAccount, on a simulated node of two 8 GiB GPUs; the
    default scheduler places the claims."""
    applied = apply_manifests(node, DEPLOY / "dra")
    probe_tar = import_probe_image(node, root)
    sim = Sim(root / "sim", gpus=2, memory_mib=8192)
    gpu = Sharegpu(node, sim, {"agent": root / "agent.log"}, applied, probe_tar=probe_tar)
    with ExitStack() as stack:
        stack.callback(gpu.stop_if_started, "dra-plugin")
        stack.callback(gpu.stop_if_started, "agent")
        _start_node_agent(gpu, root, node_identity_pod(node))
        # The plugin's NVML reads GPU faults from this file at every listing (none while it is
        # missing): a test makes a GPU fall off the bus under the running plugin.
        start_dra_plugin(gpu, root, SIMGPU_NVML_FAULTS=f"@{root / 'nvml-faults'}")
        yield gpu


# DRA claims, as docs/kubernetes.md writes them (test_kube_dra.py, test_kube_deployed_dra.py).


def claim_template(
    name: str,
    capacity: dict[str, str],
    device_class: str = "vgpu.sharegpu.io",
    config: dict[str, Any] | None = None,
    *,
    gpus: int = 1,
    selector: str | None = None,
) -> dict[str, Any]:
    """A ResourceClaimTemplate for a share of `gpus` GPUs (one request each, on distinct GPUs), as
    docs/kubernetes.md writes one."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    names = ["gpu"] if gpus == 1 else [f"gpu{i}" for i in range(gpus)]
    spec: dict[str, Any] = {"devices": {"requests": [{"name": n, "exactly": exactly} for n in names]}}
    if gpus > 1:
        spec["devices"]["constraints"] = [{"requests": names, "distinctAttribute": "sharegpu.io/uuid"}]
    if config:
        spec["devices"]["config"] = [
            {
                "opaque": {
                    "driver": "sharegpu.io",
                    "parameters": {"apiVersion": "sharegpu.io/v1alpha1", "kind": "VgpuConfig", **config},
                }
            }
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": APP_NS},
        "spec": {"spec": spec},
    }


def claim_pod(name: str, template: str, command: str, containers: int = 1) -> dict[str, Any]:
    """A pod whose containers use one claim made from `template` (the default scheduler)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": APP_NS},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": f"c{i}",
                    "image": PROBE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", command],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
                for i in range(containers)
            ],
        },
    }


def pod_claim(gpu: Cluster, pod: dict[str, Any]) -> ClaimRef:
    """The pod's one claim: of its spec, or the one the scheduler made for its extended resources."""
    mapped = pod["status"].get("extendedResourceClaimStatus")
    (status,) = [mapped] if mapped else pod["status"]["resourceClaimStatuses"]
    claim = gpu.get("resourceclaim", "-n", APP_NS, status["resourceClaimName"])
    return ClaimRef(APP_NS, claim["metadata"]["name"], claim["metadata"]["uid"])
