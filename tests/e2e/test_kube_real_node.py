"""A pod on a real node (issue 37): the real API server, scheduler, controller manager, kubelet and
containerd of `scripts/kube-node.sh`, through `tests/e2e/kubenode.py`. The pod's image is built
here from files and imported into containerd (no registry), and so is the sandbox image; the
project's own image is built from Debian's packages (scripts/build-image.sh) and runs as a pod.

Part of `make test`, which builds the binaries first (`make kube`); it needs root and Debian's
containerd, runc, CNI plugins and busybox-static (`.ci/run` installs them), and fails, never
skips, when one is missing. The node runs for this module's tests only, not beside the others.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from e2e.kubedeployed import build_project_image
from e2e.kubenode import KubeNode, running_kube_node
from e2e.kubesharegpu import import_archive


@pytest.fixture(scope="module")
def kube_node() -> Iterator[KubeNode]:
    with running_kube_node() as node:
        yield node


def test_node_is_ready_on_containerd(kube_node: KubeNode) -> None:
    node = json.loads(kube_node.kubectl("get", "node", kube_node.node, "-o", "json").stdout)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True", node["status"]["conditions"]
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")  # CDI
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.")
    print(f"kube node started in {kube_node.start_s:.1f} s")


def run_pod(kube_node: KubeNode, name: str, image: str, script: str, timeout: float) -> tuple[str, float]:
    """A pod of one container running `script` with `sh -c` to its end: the node it ran on and
    how long from its creation to Succeeded (its phase, description and log when it did not)."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "c", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", script]}
            ],
        },
    }
    t0 = time.monotonic()
    kube_node.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    scheduled = phase = ""
    while time.monotonic() < t0 + timeout:
        got = kube_node.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}/{.spec.nodeName}").stdout
        phase, _, scheduled = got.partition("/")
        if phase in ("Succeeded", "Failed"):
            break
        time.sleep(0.2)
    took = time.monotonic() - t0
    if phase != "Succeeded":
        describe = kube_node.kubectl("describe", "pod", name, check=False).stdout
        logs = kube_node.kubectl("logs", name, check=False).stdout
        pytest.fail(f"pod {name}: phase {phase!r} after {took:.1f} s:\n{describe}\n{logs[-3000:]}")
    return scheduled, took


def test_pod_runs_to_completion_and_its_log_comes_back(kube_node: KubeNode) -> None:
    name = "hello-e2e"
    scheduled, took = run_pod(kube_node, name, kube_node.image, 'echo "e2e pod on $(hostname)"', 90)
    assert scheduled == kube_node.node
    assert kube_node.kubectl("logs", name).stdout == f"e2e pod on {name}\n"
    print(f"pod created -> Succeeded in {took:.1f} s")
    kube_node.kubectl("delete", "pod", name, "--wait", "--timeout", "60s")


def test_the_project_image_runs_the_demo_as_a_pod(kube_node: KubeNode) -> None:
    """The image every container of deploy/kubernetes runs, built here from Debian's packages and
    imported into the node's containerd, runs under the kubelet: the commands the manifests start
    import, and `sharegpu demo` (memory caps, the arbiter, online beside offline, on the
    simulated GPU the image carries) passes inside the pod."""
    image, archive = build_project_image()
    import_archive(kube_node, archive)
    name = "sharegpu-image"
    script = (
        "sharegpu version && "
        "python3 -c 'import sharegpu.kube.extender, sharegpu.kube.deviceplugin, sharegpu.agent.daemon' && "
        "echo commands-import && sharegpu demo"
    )
    _, took = run_pod(kube_node, name, image, script, 300)
    logs = kube_node.kubectl("logs", name).stdout
    assert logs.startswith("sharegpu ")
    assert "commands-import" in logs
    assert "Results" in logs  # the demo's last table
    assert "(all figures: simulated GPU)" in logs
    print(f"{image}: demo pod Succeeded in {took:.0f} s")
    kube_node.kubectl("delete", "pod", name, "--wait", "--timeout", "60s")
