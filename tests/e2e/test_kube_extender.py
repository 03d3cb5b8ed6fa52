"""The scheduler extender, driven with kube-scheduler payloads (ExtenderArgs with capitalised
keys around pods and nodes serialised by the `kubernetes` client), over HTTP and as its command.
In process: tests/unit/test_kube_extender.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kubeobjects import NOW, RecordingBinder, args, kept, node, pod
from sharegpu.kube.extender import MAX_SCORE, Extender, serve


@pytest.fixture
def http() -> Iterator[tuple[httpx.Client, RecordingBinder]]:
    binder = RecordingBinder()
    server = serve(Extender(binder, clock=lambda: NOW), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_address[1]}", timeout=10) as c:
            yield c, binder
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.timing
def test_the_http_api_speaks_the_extender_json(http: tuple[httpx.Client, RecordingBinder]) -> None:
    c, binder = http
    payload = args(pod("web"), [node("a"), node("b", age_s=600)])
    started = time.perf_counter()
    filtered = c.post("/filter", json=payload)
    assert filtered.status_code == 200
    assert kept(filtered.json()) == ["a"]
    scores = c.post("/prioritize", json=args(pod("web"), [node("a")])).json()
    assert scores == [{"Host": "a", "Score": MAX_SCORE}]
    bound = c.post("/bind", json={"PodName": "web", "PodNamespace": "ml", "PodUID": "uid-web", "Node": "a"})
    assert bound.json() == {"Error": ""}
    assert time.perf_counter() - started < 5
    assert binder.bound[0][2].node == "a"
    bad = c.post("/filter", content=b"{not json")
    assert bad.status_code == 400
    assert "malformed extender request" in bad.json()["Error"]
    assert c.post("/preempt", json={}).status_code == 404


def test_the_command_says_what_is_wrong_before_serving(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    def run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "sharegpu.kube.extender", *argv]
        return subprocess.run(
            cmd, capture_output=True, text=True, timeout=60, check=False, env={**os.environ, **env}
        )

    # Not in a pod, no kubeconfig: one line saying so, not a traceback.
    alone = run("--port", "0", KUBECONFIG=str(tmp_path / "none"), KUBERNETES_SERVICE_HOST="")
    assert alone.returncode == 2
    assert "sharegpu: error: no Kubernetes API server to talk to" in alone.stderr
    assert "Traceback" not in alone.stderr
    bad = tmp_path / "workload.json"
    bad.write_text('[{"shape": {"count": -1}, "weight": 1}]')
    refused = run("--dry-run", "--port", "0", "--workload", str(bad))
    assert refused.returncode == 2
    assert f"--workload {bad}" in refused.stderr
    assert "GPU count must not be negative" in refused.stderr


def test_the_preempt_verb_is_served_only_when_asked() -> None:
    for preempt, status in ((False, 404), (True, 200)):
        server = serve(Extender(clock=lambda: NOW), "127.0.0.1", 0, preempt=preempt)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}"
            got = httpx.post(url + "/preempt", json={"Pod": pod("x"), "NodeNameToMetaVictims": {}})
            assert got.status_code == status
        finally:
            server.shutdown()
            server.server_close()
