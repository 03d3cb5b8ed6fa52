"""`kubectl apply -k` of each install in deploy/kubernetes, twice, against a real API server
(`kube-node.sh --api-only`): an operator re-applies the same manifests (an upgrade, a GitOps
loop), and the second apply must change nothing. An object reported `configured` every time is
drift that is not there: the PriorityClasses were, for `globalDefault: false`, which the API
server leaves out and kubectl's merge puts back at every apply."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from e2e.kubenode import ROOT, ApiServer, running_api_server

INSTALLS = ("base", "dra", "kind")


@pytest.fixture(scope="module")
def server() -> Iterator[ApiServer]:
    with running_api_server() as started:
        yield started


def kubectl(server: ApiServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(server.kubectl_bin), "--kubeconfig", str(server.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("install", INSTALLS)
def test_applying_an_install_again_changes_nothing(server: ApiServer, install: str) -> None:
    directory = str(ROOT / "deploy" / "kubernetes" / install)
    first = kubectl(server, "apply", "-k", directory)
    assert first.returncode == 0, first.stderr
    again = kubectl(server, "apply", "-k", directory)
    assert again.returncode == 0, again.stderr
    changed = [line for line in again.stdout.splitlines() if not line.endswith(" unchanged")]
    assert changed == [], f"applied again, these were not unchanged:\n{again.stdout}"
    assert len(again.stdout.splitlines()) == len(first.stdout.splitlines())
    diff = kubectl(server, "diff", "-k", directory)
    assert diff.returncode == 0, f"kubectl diff after apply:\n{diff.stdout}{diff.stderr}"
