"""sharegpu deployed on the real node of `kubenode.py` the way an operator deploys it (issue 37):
the project's image built here from Debian's packages (scripts/build-image.sh) and imported into
the node's containerd, the kube-scheduler's image made from the binary `make kube` built, and
`deploy/kubernetes/kind` (the base on the simulated GPU) applied with `kubectl apply -k`. The
DaemonSet's agent and device plugin, the extender and the second scheduler then run as pods of
those images, under their ServiceAccounts, started and probed by the kubelet.

The overlay this writes changes only what the test node lacks. The node has no kube-proxy and no
cluster DNS (its API server and kubelet are on loopback, the pods' bridge has no route to the
host), so the pods run on the host network and are told the API server's address
(KUBERNETES_SERVICE_HOST/PORT, as clusters with Cilium's kube-proxy replacement do), the scheduler
calls the extender at 127.0.0.1:8998, and one replica each of the extender and the scheduler runs
(two on one node's host network would want the same port; two replicas' leader election is
tested with host processes, test_kube_real_sharegpu.py). The CDI volume is the node containerd's
spec directory. In DRA mode (`deploy/kubernetes/kind-dra`, issue 38) the DRA plugin also sees
the kubelet's directories at the node's path, since it tells the kubelet where its socket is
(`dra_plugin_on`). Everything else, the host paths /run/sharegpu and /var/lib/sharegpu included, is
the manifests' own; the test fails rather than disturb a sharegpu already using them, and removes
what it made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubenode import ROOT, KubeNode, kube_bin, running_kube_node
from e2e.kubesharegpu import (
    DEPLOY,
    NAMESPACE,
    SCHEDULER_CONFIG,
    allocatable_vgpus,
    audit_denials,
    import_archive,
    import_image,
    import_probe_image,
)

PROJECT_IMAGE = "ghcr.io/sharegpu/sharegpu"
SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler"
LOCAL_EXTENDER = "http://127.0.0.1:8998"  # deploy/kubernetes/base/extender.yaml's --port, on the host
CHART = ROOT / "deploy" / "helm" / "sharegpu"
POST_RENDERER = "sharegpu-test-node"
INSTALLERS = ("kubectl", "helm")
# What the node DaemonSet of deploy/kubernetes/kind makes on the node (hostPath volumes; the
# init container's copy of the simulated driver, at the path the image has the package).
HOST_PATHS = (
    Path("/run/sharegpu"),
    Path("/var/lib/sharegpu"),
    Path("/usr/local/lib/python3.11/site-packages/sharegpu"),
)
READY_TIMEOUT_S = 180.0


def build_project_image() -> tuple[str, Path]:
    """The project's image (scripts/build-image.sh: Debian's packages and this tree's wheel, no
    registry): its name and its OCI archive."""
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build-image.sh")], capture_output=True, text=True, check=False
    )
    assert built.returncode == 0, f"build-image.sh exited {built.returncode}:\n{built.stdout}{built.stderr}"
    last = built.stdout.strip().splitlines()[-1]  # build-image: NAME -> ARCHIVE (SIZE)
    name, _, rest = last.removeprefix("build-image: ").partition(" -> ")
    print(built.stdout.strip())
    return name, Path(rest.rpartition(" (")[0])


def import_scheduler_image(node: KubeNode, root: Path) -> str:
    """The kube-scheduler `make kube` built, as the image the scheduler Deployment names (the
    node's own version: the skew policy's best case); its tag."""
    binary = node.kubectl_bin.parent / "kube-scheduler"
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    tag = version.split()[-1]  # "Kubernetes v1.37.2"
    rootfs = root / "scheduler-rootfs"
    (rootfs / "usr/local/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, rootfs / "usr/local/bin" / "kube-scheduler")
    # The Deployment names the command; the image needs no entrypoint.
    import_image(node, rootfs, f"{SCHEDULER_IMAGE}:{tag}", root / "kube-scheduler.tar")
    return tag


def api_server(node: KubeNode) -> tuple[str, str]:
    """The API server's host and port, from the node's kubeconfig."""
    server = yaml.safe_load(node.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    host, _, port = server.removeprefix("https://").partition(":")
    return host, port


def write_overlay(
    node: KubeNode, directory: Path, scheduler_tag: str, *, mode: str = "deviceplugin", rendered: bool = False
) -> Path:
    """The kustomize overlay of deploy/kubernetes/kind (kind-dra in DRA mode) for this node (the
    module's docstring); with `rendered`, of the chart's output (rendered.yaml) with that
    overlay's changes."""
    directory.mkdir(parents=True, exist_ok=True)
    host, port = api_server(node)
    api = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": host},
        {"name": "KUBERNETES_SERVICE_PORT", "value": port},
    ]
    on_host = {"hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet"}

    def workload(kind: str, name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
        pod = dict(on_host, containers=[dict(c, env=api) for c in containers])
        return {
            "apiVersion": "apps/v1",
            "kind": kind,
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": dict(spec, template={"spec": pod}),
        }

    volumes = [{"name": "cdi", "hostPath": {"path": str(node.cdi), "type": "Directory"}}]
    if mode == "dra":
        plugin = dra_plugin_on(node, volumes)
        patches = [workload("DaemonSet", "sharegpu-node", [{"name": "agent"}, plugin])]
    else:
        patches = [
            workload("DaemonSet", "sharegpu-node", [{"name": "agent"}, {"name": "device-plugin"}]),
            workload("Deployment", "sharegpu-extender", [{"name": "extender"}], replicas=1),
            workload("Deployment", "sharegpu-scheduler", [{"name": "scheduler"}], replicas=1),
        ]
    patches[0]["spec"]["template"]["spec"]["volumes"] = volumes
    (directory / "host-network.yaml").write_text(yaml.safe_dump_all(patches))
    kind_dir = DEPLOY / ("kind-dra" if mode == "dra" else "kind")
    if rendered:
        # Helm's output as the base, with the kind overlay's changes made to it here.
        kind = yaml.safe_load((kind_dir / "kustomization.yaml").read_text())
        for patch in kind["patches"]:
            shutil.copy(kind_dir / patch["path"], directory)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["rendered.yaml"],  # the post-renderer writes it (helm_post_renderer)
            "components": [os.path.relpath((kind_dir / c).resolve(), directory) for c in kind["components"]],
            "patches": [*kind["patches"], {"path": "host-network.yaml"}],
        }
        (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return directory
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes a base by a relative path only.
        "resources": [os.path.relpath(kind_dir, directory)],
        "patches": [{"path": "host-network.yaml"}],
    }
    if mode != "dra":
        config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
        config["extenders"][0]["urlPrefix"] = LOCAL_EXTENDER
        (directory / "scheduler-config.yaml").write_text(yaml.safe_dump(config))
        kustomization["images"] = [{"name": SCHEDULER_IMAGE, "newTag": scheduler_tag}]
        kustomization["configMapGenerator"] = [
            {
                "name": "sharegpu-scheduler-config",
                "namespace": NAMESPACE,
                "behavior": "replace",
                "files": ["config.yaml=scheduler-config.yaml"],
            }
        ]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def dra_plugin_on(node: KubeNode, volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """The DRA plugin's container patched for the node's kubelet directory (its --root-dir is
    the node's own, not /var/lib/kubelet), and the kubelet's volumes added to `volumes`. The
    plugin tells the kubelet its socket's path, so it sees that directory at the path the
    kubelet has it: mounted there too (the manifests' mounts stay, and the probes use them)."""
    kubelet = node.kubelet_dir
    (daemonset,) = yaml.safe_load_all((DEPLOY / "dra" / "node.yaml").read_text())
    (plugin,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "dra-plugin"]
    args = [a for a in plugin["args"] if not a.startswith("--kubelet-dir=")]
    mounts = []
    for name, sub in (("plugins-registry", "plugins_registry"), ("plugins", "plugins")):
        volumes.append({"name": name, "hostPath": {"path": str(kubelet / sub), "type": "DirectoryOrCreate"}})
        mounts.append({"name": name, "mountPath": str(kubelet / sub)})
    return {"name": "dra-plugin", "args": [f"--kubelet-dir={kubelet}", *args], "volumeMounts": mounts}


def helm_post_renderer(helm: Path, node: KubeNode, root: Path, overlay: Path) -> dict[str, str]:
    """A Helm 4 post-renderer plugin (postrenderer/v1, a subprocess) that runs the chart's output
    through `overlay` (the operator's way to adapt a chart it does not own), installed in a
    Helm home of its own under root; the environment that makes helm use that home."""
    plugin = root / "helm-plugin"
    plugin.mkdir()
    (plugin / "plugin.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "type": "postrenderer/v1",
                "name": POST_RENDERER,
                "version": "0.1.0",
                "runtime": "subprocess",
                "runtimeConfig": {"platformCommand": [{"command": "${HELM_PLUGIN_DIR}/render.sh"}]},
            }
        )
    )
    extender_url = yaml.safe_load(SCHEDULER_CONFIG.read_text())["extenders"][0]["urlPrefix"]
    script = plugin / "render.sh"
    script.write_text(
        "#!/bin/sh\nset -e\n"
        f"sed 's|{extender_url}|{LOCAL_EXTENDER}|' > {overlay}/rendered.yaml\n"
        f"exec {node.kubectl_bin} kustomize {overlay}\n"
    )
    script.chmod(0o755)
    env = dict(
        os.environ, **{f"HELM_{d}_HOME": str(root / f"helm-{d.lower()}") for d in ("CONFIG", "CACHE", "DATA")}
    )
    env.pop("HELM_PLUGINS", None)  # plugins are installed under HELM_DATA_HOME
    subprocess.run([helm, "plugin", "install", str(plugin)], env=env, check=True, capture_output=True)
    return env


@dataclass
class Deployed:
    """sharegpu's pods on the node: what `kubectl apply -k` created and how long until every
    pod was Ready."""

    node: KubeNode
    applied: list[str]
    ready_s: float
    image: str
    mode: str = "deviceplugin"  # or "dra"

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.node.kubectl(*args, **kwargs)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def pods(self) -> list[dict[str, Any]]:
        return list(self.get("pods", "-n", NAMESPACE)["items"])

    def tail(self, lines: int = 30) -> str:
        """Each sharegpu container's last log lines (what a failing test prints)."""
        out = []
        for pod in self.pods():
            for container in pod["spec"]["containers"]:
                name = f"{pod['metadata']['name']}/{container['name']}"
                log = self.kubectl(
                    "-n",
                    NAMESPACE,
                    "logs",
                    pod["metadata"]["name"],
                    "-c",
                    container["name"],
                    "--tail",
                    str(lines),
                    check=False,
                )
                out.append(f"--- {name}:\n{log.stdout}{log.stderr}")
        return "\n".join(out)

    def components(self) -> set[str]:
        """The components whose pods this mode runs."""
        return {"node"} if self.mode == "dra" else {"node", "extender", "scheduler"}

    def offered(self) -> bool:
        """Whether the node offers its GPUs: as sharegpu.io/vgpu (the device plugin), or in a
        ResourceSlice of sharegpu.io (DRA)."""
        if self.mode == "dra":
            slices = self.get("resourceslices", "--field-selector", f"spec.nodeName={self.node.node}")
            return any(s["spec"].get("devices") for s in slices["items"])
        return allocatable_vgpus(self.get("node", self.node.node)) > 0

    def roll_node(self) -> float:
        """`kubectl rollout restart` of the node DaemonSet, as an upgrade rolls it, until the new
        pod is Ready and the node offers its GPUs again; the seconds the roll took. The old pod
        is gone."""
        (old,) = [p["metadata"]["name"] for p in self.pods() if "sharegpu-node" in p["metadata"]["name"]]
        t0 = time.monotonic()
        self.kubectl("-n", NAMESPACE, "rollout", "restart", "daemonset/sharegpu-node")
        self.kubectl(
            "-n", NAMESPACE, "rollout", "status", "daemonset/sharegpu-node", "--timeout", "180s", timeout=200
        )
        rolled = time.monotonic() - t0
        self.wait_ready()
        assert old not in [p["metadata"]["name"] for p in self.pods()]
        return rolled

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Until the DaemonSet's pod and one of each Deployment's are Ready and the node offers
        its GPUs; the seconds it took."""
        t0 = time.monotonic()
        while True:
            pods = self.pods()
            components = {
                p["metadata"]["labels"].get("app.kubernetes.io/component")
                for p in pods
                if _ready(p) and p["metadata"].get("deletionTimestamp") is None
            }
            if self.components() <= components and self.offered():
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                describe = self.kubectl("-n", NAMESPACE, "describe", "pods", check=False).stdout
                pytest.fail(
                    f"sharegpu's pods not Ready after {timeout:.0f} s:\n{describe[-6000:]}\n" + self.tail()
                )
            time.sleep(0.5)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
    return conditions.get("Ready") == "True"


def _made_by_us(path: Path) -> Path | None:
    """The topmost directory on the way to `path` that does not exist yet (what to remove
    after), or None when `path` exists."""
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


@contextmanager
def deployed_from_image(
    node: KubeNode, root: Path, installer: str = "kubectl", mode: str = "deviceplugin"
) -> Iterator[Deployed]:
    """sharegpu from its image on `node`, on the simulated GPU of deploy/kubernetes/kind (two GPUs
    of 16 GiB; kind-dra in DRA mode), installed by `kubectl apply -k` or by `helm install` of
    deploy/helm/sharegpu; the probe image imported for the tests' pods. Removed at the end: the
    objects, then the host directories the DaemonSet made."""
    assert installer in INSTALLERS, installer
    assert mode in ("deviceplugin", "dra"), mode
    busy = [str(p) for p in HOST_PATHS if p.exists()]
    if busy:
        pytest.fail(f"{', '.join(busy)} already there: sharegpu is installed on this machine")
    made = [m for p in HOST_PATHS if (m := _made_by_us(p)) is not None]
    image, archive = build_project_image()
    import_archive(node, archive)
    scheduler_tag = import_scheduler_image(node, root) if mode == "deviceplugin" else ""
    import_probe_image(node, root)
    overlay = write_overlay(node, root / "overlay", scheduler_tag, mode=mode, rendered=installer == "helm")
    kubeconfig = ["--kubeconfig", str(node.kubeconfig)]
    helm = kube_bin() / "helm"
    helm_env = helm_post_renderer(helm, node, root, overlay) if installer == "helm" else {}
    # The one line docs/kubernetes.md gives for a GPU node.
    node.kubectl("label", "node", node.node, "sharegpu.io/gpu=true", "--overwrite")
    try:
        if installer == "helm":
            args = [str(helm), "install", "sharegpu", str(CHART), *kubeconfig, "--wait=false"]
            args += ["--set", f"mode={mode}", "--post-renderer", POST_RENDERER]
            if mode == "deviceplugin":
                args += ["--set", f"schedulerImage.tag={scheduler_tag}"]
            applied = subprocess.run(
                args, check=False, env=helm_env, capture_output=True, text=True, timeout=180
            )
        else:
            applied = node.kubectl("apply", "-k", str(overlay), check=False, timeout=120)
        assert applied.returncode == 0, f"{installer}: the manifests were refused:\n{applied.stderr}"
        deployed = Deployed(node, applied.stdout.splitlines(), 0.0, image, mode)
        deployed.ready_s = deployed.wait_ready()
        print(f"sharegpu's pods Ready {deployed.ready_s:.1f} s after {installer} installed them")
        yield deployed
    finally:
        node.kubectl("delete", "pods", "--all", "-n", "default", "--wait", "--timeout", "60s", check=False)
        if installer == "helm":
            uninstall = [str(helm), "uninstall", "sharegpu", *kubeconfig, "--wait"]
            subprocess.run(uninstall, env=helm_env, capture_output=True, timeout=180, check=False)
        else:
            node.kubectl(
                "delete", "-k", str(overlay), "--wait", "--timeout", "120s", check=False, timeout=180
            )
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def deployed_on_a_fresh_node(root: Path, installer: str, mode: str = "deviceplugin") -> Iterator[Deployed]:
    """A fresh node with sharegpu deployed on it (deployed_from_image); at the end, what every
    component asked of the API server from its pod, judged by the server's RBAC, had no refusal."""
    with running_kube_node() as node, deployed_from_image(node, root, installer, mode) as cluster:
        yield cluster
        denied = audit_denials(node.dir / "audit.log")
        assert not denied, "the API server refused sharegpu's components:\n" + "\n".join(denied)
