"""A pod on a real node (issue 37): the real API server, scheduler, controller manager, kubelet and
containerd of `scripts/kube-node.sh`, through `tests/e2e/kubenode.py`. The pod's image is built
here from files and imported into containerd (no registry), and so is the sandbox image.

Part of `make test`, which builds the binaries first (`make kube`); it needs root and Debian's
containerd, runc, CNI plugins and busybox-static (`.ci/run` installs them), and fails, never
skips, when one is missing. The node runs for this module's tests only, not beside the others.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from e2e.kubenode import KubeNode, running_kube_node


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


def test_pod_runs_to_completion_and_its_log_comes_back(kube_node: KubeNode) -> None:
    name = "hello-e2e"
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "c",
                    "image": kube_node.image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", 'echo "e2e pod on $(hostname)"'],
                }
            ],
        },
    }
    t0 = time.monotonic()
    kube_node.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
    deadline = t0 + 90
    scheduled = phase = ""
    while time.monotonic() < deadline:
        got = kube_node.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}/{.spec.nodeName}").stdout
        phase, _, scheduled = got.partition("/")
        if phase in ("Succeeded", "Failed"):
            break
        time.sleep(0.2)
    took = time.monotonic() - t0
    describe = kube_node.kubectl("describe", "pod", name, check=False).stdout
    assert phase == "Succeeded", f"phase {phase!r} after {took:.1f} s:\n{describe}"
    assert scheduled == kube_node.node
    assert kube_node.kubectl("logs", name).stdout == f"e2e pod on {name}\n"
    print(f"pod created -> Succeeded in {took:.1f} s")
    kube_node.kubectl("delete", "pod", name, "--wait", "--timeout", "60s")
