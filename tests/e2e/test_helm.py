"""The Helm chart `deploy/helm/sharegpu` (issue 37), with the real `helm` that `make kube` builds
from the Go module proxy: in step with `deploy/kubernetes` (scripts/helm-chart.py writes it from
there), `helm lint` clean, `helm template` giving exactly the objects `kubectl kustomize` gives
(and the monitoring overlay's with monitoring on), its values taking effect, and `helm install`
and `helm uninstall` on the real node of `scripts/kube-node.sh`.

Part of `make test`; the install needs root and the node's components, and fails, never skips,
when one is missing.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.kubenode import ROOT, KubeNode, kube_bin, running_kube_node

CHART = ROOT / "deploy" / "helm" / "sharegpu"
KUBERNETES = ROOT / "deploy" / "kubernetes"


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = kube_bin() / "helm"
    if not binary.is_file():
        pytest.fail(f"{binary} missing: run `make kube` (scripts/build-kube.sh builds helm)")
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def objects(text: str) -> dict[tuple[str, str], Any]:
    return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(text) if o}


def kustomize(directory: Path) -> dict[tuple[str, str], Any]:
    kubectl = kube_bin() / "kubectl"
    out = subprocess.run(
        [str(kubectl), "kustomize", str(directory)], capture_output=True, text=True, check=True
    )
    return objects(out.stdout)


def test_the_chart_is_in_step_with_the_manifests() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "helm-chart.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_helm_lint_is_clean() -> None:
    out = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out.stdout, out.stdout


def test_the_chart_renders_exactly_the_manifests_objects() -> None:
    assert objects(helm("template", "sharegpu", str(CHART)).stdout) == kustomize(KUBERNETES)
    with_monitoring = helm("template", "sharegpu", str(CHART), "--set", "monitoring.enabled=true").stdout
    assert objects(with_monitoring) == kustomize(KUBERNETES / "monitoring")
    dra = helm("template", "sharegpu", str(CHART), "--set", "mode=dra").stdout
    assert objects(dra) == kustomize(KUBERNETES / "dra")


def test_an_unknown_mode_is_refused_with_the_known_ones() -> None:
    out = helm("template", "sharegpu", str(CHART), "--set", "mode=mig", check=False)
    assert out.returncode != 0
    assert 'mode must be deviceplugin or dra, not "mig"' in out.stderr


def test_the_values_set_the_images() -> None:
    text = helm(
        "template",
        "sharegpu",
        str(CHART),
        "--set",
        "image.repository=registry.example.com/sharegpu,image.tag=9.9.9,schedulerImage.tag=v1.37.2",
    ).stdout
    images = {
        c["image"]
        for o in objects(text).values()
        if o["kind"] in ("Deployment", "DaemonSet")
        for c in [
            *o["spec"]["template"]["spec"].get("initContainers", []),
            *o["spec"]["template"]["spec"]["containers"],
        ]
    }
    assert images == {"registry.example.com/sharegpu:9.9.9", "registry.k8s.io/kube-scheduler:v1.37.2"}


@pytest.fixture(scope="module")
def node() -> Iterator[KubeNode]:
    with running_kube_node() as running:
        yield running


@pytest.mark.parametrize(("mode", "manifests"), [("deviceplugin", KUBERNETES), ("dra", KUBERNETES / "dra")])
def test_helm_installs_and_uninstalls_the_chart_on_a_real_node(
    node: KubeNode, mode: str, manifests: Path
) -> None:
    kubeconfig = ["--kubeconfig", str(node.kubeconfig)]
    installed = helm("install", "sharegpu", str(CHART), *kubeconfig, "--set", f"mode={mode}", "--wait=false")
    assert "STATUS: deployed" in installed.stdout, installed.stdout
    want = kustomize(manifests)
    for kind, name in want:
        namespace = want[kind, name]["metadata"].get("namespace")
        args = ["get", kind.lower(), name] + (["-n", namespace] if namespace else [])
        assert node.kubectl(*args, check=False).returncode == 0, f"{kind}/{name} not installed"
    listed = helm("list", "--all-namespaces", *kubeconfig).stdout
    assert "sharegpu" in listed
    helm("uninstall", "sharegpu", *kubeconfig, "--wait")
    gone = node.kubectl("get", "namespace", "sharegpu-system", check=False)
    still = [] if gone.returncode != 0 else ["the sharegpu-system namespace"]
    cluster_wide = [
        (k, n) for k, n in want if k in ("ClusterRole", "ClusterRoleBinding", "PriorityClass", "DeviceClass")
    ]
    still += [
        f"{k}/{n}" for k, n in cluster_wide if node.kubectl("get", k.lower(), n, check=False).returncode == 0
    ]
    assert not still, f"left after helm uninstall: {still}"
    print(f"helm installed and uninstalled {len(want)} objects ({mode})")
