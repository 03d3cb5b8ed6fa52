"""`devices`, `tenants` and `status` in every output format (table, wide, JSON, YAML), through the
agent and without it, and `--watch`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from agentutil import Agent
from conftest import Sim
from sharegpu.spec import MIB

KINDS = {"devices": "DeviceList", "tenants": "TenantList", "status": "NodeStatus"}


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout
    return proc.stdout


def _every_format(sim: Sim, env: dict[str, str]) -> dict[tuple[str, str], Any]:
    """Every command in every format; the parsed documents and the tables' text."""
    found: dict[tuple[str, str], Any] = {}
    for command, kind in KINDS.items():
        for fmt in ("table", "wide", "json", "yaml"):
            out = _ok(sim.cli(command, "-o", fmt, env=env))
            if fmt in ("json", "yaml"):
                doc = json.loads(out) if fmt == "json" else yaml.safe_load(out)
                assert (doc["version"], doc["kind"]) == (1, kind)
                found[command, fmt] = doc
            else:
                found[command, fmt] = out
        # JSON and YAML are the same document (figures that move with time aside).
        assert _shape(found[command, "json"]) == _shape(found[command, "yaml"])
    return found


def _shape(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _shape(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shape(v) for v in doc]
    return type(doc).__name__ if isinstance(doc, int | float) else doc


def _hold(sim: Sim, tenant: Path, mib: int) -> subprocess.Popen[str]:
    proc = sim.spawn_probe("hold", "plain", str(mib * MIB), "60", env=sim.tenant_env(tenant))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready=1"
    return proc


def test_every_format_without_the_agent(sim: Sim) -> None:
    web = sim.tenant("web", 256, gpus=[0])
    held = _hold(sim, web, 100)
    try:
        found = _every_format(sim, sim.env(SHAREGPU_NO_AGENT="1"))
    finally:
        held.kill()
        held.communicate(timeout=30)
    uuids = sim.uuids()
    assert [g["uuid"] for g in found["devices", "json"]["items"]] == uuids
    assert found["devices", "yaml"]["items"][0]["tenants"] == ["web"]
    assert uuids[0] in found["devices", "table"]
    assert "TENANT NAMES" in found["devices", "wide"]
    assert "HOLDER" not in found["devices", "table"]
    (web_item,) = found["tenants", "json"]["items"]
    assert web_item["devices"][0]["memory_used_bytes"] == 100 * MIB
    assert "100MiB / 256MiB" in found["tenants", "table"]
    for column in ("OVERHEAD", "GENERATION", "LABELS", "STATE"):
        assert column in found["tenants", "wide"]
        assert column not in found["tenants", "table"]
    (status,) = found["status", "json"]["items"]
    assert status["agent"]["running"] is False
    assert status["tenants"]["total"] == 1
    assert status["tenants"]["running"] == 1
    assert len(status["gpus"]) == 2
    assert status["warnings"] == []
    assert "not running" in found["status", "table"]
    assert "tenants:  1 (1 running" in found["status", "table"]


def test_every_format_through_the_agent(agent: Agent, sim: Sim) -> None:
    with agent.http() as http:
        body = {"name": "web", "memory": "256MiB", "gpus": ["0"], "labels": {"pod": "web-0"}}
        created = http.post("/v1/tenants", json=body)
        assert created.status_code == 201, created.text
    held = _hold(sim, Path(created.json()["path"]), 100)
    try:
        with agent.http() as http:  # a shrink below usage: a warning event
            assert http.patch("/v1/tenants/web", json={"memory": "64MiB"}).status_code == 200
        found = _every_format(sim, sim.env())
    finally:
        held.kill()
        held.communicate(timeout=30)
    (web_item,) = found["tenants", "yaml"]["items"]
    assert web_item["managed"] is True
    assert web_item["labels"] == {"pod": "web-0"}
    assert "pod=web-0" in found["tenants", "wide"]
    assert "over cap" in found["tenants", "table"]
    (status,) = found["status", "json"]["items"]
    assert status["agent"]["running"] is True
    assert status["agent"]["version"]
    assert status["tenants"]["over_cap"] == 1
    assert any(e["kind"] == "tenant.resized" and e["severity"] == "warning" for e in status["warnings"])
    table = found["status", "table"]
    assert "running (sharegpu" in table
    assert "WARNING tenant.resized [web]" in table
    assert "loop " in found["status", "wide"]


def _watch(sim: Sim, *args: str, marker: str, frames: int = 2) -> list[str]:
    """Run a watching command until `frames` lines start with `marker`, then Ctrl-C it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sharegpu.cli", *args],
        env=sim.env(SHAREGPU_NO_AGENT="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(seen) < frames and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(marker):
                seen.append(line)
        assert len(seen) == frames, seen
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    return seen


def test_watch_json_prints_one_document_per_frame(sim: Sim) -> None:
    sim.tenant("web", 64, gpus=[0])
    lines = _watch(sim, "tenants", "-o", "json", "--watch", "--interval", "0.3", marker="{")
    docs = [json.loads(line) for line in lines]
    assert [d["kind"] for d in docs] == ["TenantList", "TenantList"]
    assert docs[0]["items"][0]["id"] == "web"


def test_watch_tables_and_yaml(sim: Sim) -> None:
    _watch(sim, "status", "-w", "--interval", "0.3", marker="sharegpu status")
    _watch(sim, "devices", "-o", "yaml", "-w", "--interval", "0.3", marker="kind: DeviceList")


def test_watch_refuses_a_zero_interval(sim: Sim) -> None:
    proc = sim.cli("devices", "--watch", "--interval", "0")
    assert proc.returncode == 2
    assert "interval" in proc.stderr


def test_json_envelopes_are_unchanged(sim: Sim) -> None:
    doc = json.loads(_ok(sim.cli("tenants", "-o", "json", env=sim.env(SHAREGPU_NO_AGENT="1"))))
    assert doc == {"version": 1, "kind": "TenantList", "items": []}
