"""deploy/: the Grafana dashboard and the Prometheus alert rules.

Valid files, a reason on every panel for when it is empty, a runbook on every alert, and every
metric they name exposed by a real agent (scraped on the simulated GPU with tenants running).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from agentutil import promtool
from conftest import Sim
from metricsutil import busy_node, free_port, running_agent, scrape_text, wait_for

DEPLOY = Path(__file__).parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "sharegpu.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
# Series Prometheus makes itself, not the exporter.
PROMETHEUS_OWN = {"up"}
_METRIC = re.compile(r"\b((?:sharegpu|process)_[a-z0-9_]+|up)\b(?!\s*\()")


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def dashboard_queries() -> list[str]:
    exprs = [t["expr"] for p in panels() for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    return exprs


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: words that look like ours, outside strings."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(_METRIC.findall(without_strings))


def test_promtool_accepts_the_rules() -> None:
    done = subprocess.run(
        [str(promtool()), "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# Each alert with series that make it fire (labels it must carry, the `$value` its summary shows)
# and series that must not: `promtool test rules` evaluates the rules over them.
N = {"instance": "node1:9479", "job": "sharegpu"}
T = {**N, "tenant": "web", "gpu": "GPU-1", "namespace": "prod", "pod": "web-0"}
ALERT_CASES: list[dict[str, Any]] = [
    {
        "alert": "SharegpuAgentDown",
        "eval": "6m",
        "fire": [("up", N, "0x10")],
        "quiet": [("up", N, "1x10")],
        "labels": N,
    },
    {
        "alert": "SharegpuAgentAbsent",
        "eval": "16m",
        "fire": [("up", {"job": "other", "instance": "x"}, "1x20")],
        "quiet": [("up", N, "1x20")],
        "labels": {"job": "sharegpu"},
    },
    {
        "alert": "SharegpuGpuMemoryNearlyExhausted",
        "eval": "6m",
        "fire": [
            ("sharegpu_gpu_memory_used_bytes", {**N, "gpu": "GPU-1"}, "970x10"),
            ("sharegpu_gpu_memory_total_bytes", {**N, "gpu": "GPU-1"}, "1000x10"),
        ],
        "quiet": [
            ("sharegpu_gpu_memory_used_bytes", {**N, "gpu": "GPU-1"}, "900x10"),
            ("sharegpu_gpu_memory_total_bytes", {**N, "gpu": "GPU-1"}, "1000x10"),
        ],
        "labels": {**N, "gpu": "GPU-1"},
        "value": "97%",
    },
    {
        "alert": "SharegpuTenantNearMemoryCap",
        "eval": "16m",
        "fire": [
            ("sharegpu_tenant_memory_used_bytes", T, "900x20"),
            ("sharegpu_tenant_memory_overhead_bytes", T, "50x20"),
            ("sharegpu_tenant_memory_cap_bytes", T, "1000x20"),
        ],
        "quiet": [
            ("sharegpu_tenant_memory_used_bytes", T, "800x20"),
            ("sharegpu_tenant_memory_overhead_bytes", T, "50x20"),
            ("sharegpu_tenant_memory_cap_bytes", T, "1000x20"),
        ],
        "labels": T,
        "value": "95%",
    },
    {
        "alert": "SharegpuTenantBelowGuarantee",
        "eval": "30m",
        "fire": [  # busy 0.1 s/s against a 30% guarantee, waiting 0.5 s/s
            ("sharegpu_tenant_gpu_busy_seconds_total", T, "0+6x40"),
            ("sharegpu_tenant_gpu_wait_seconds_total", T, "0+30x40"),
            ("sharegpu_tenant_compute_guaranteed_ratio", T, "0.3x40"),
        ],
        "quiet": [  # busy 0.2 s/s: more than half its guarantee
            ("sharegpu_tenant_gpu_busy_seconds_total", T, "0+12x40"),
            ("sharegpu_tenant_gpu_wait_seconds_total", T, "0+30x40"),
            ("sharegpu_tenant_compute_guaranteed_ratio", T, "0.3x40"),
        ],
        "labels": T,
    },
    {
        "alert": "SharegpuBypassDetected",
        "eval": "5m",
        "fire": [("sharegpu_audit_events_total", {**N, "kind": "bypass"}, "0 0 0 1x10")],
        "quiet": [
            ("sharegpu_audit_events_total", {**N, "kind": "bypass"}, "0x12"),
            ("sharegpu_audit_events_total", {**N, "kind": "reaped"}, "0 0 0 5x10"),
        ],
        "labels": {**N, "kind": "bypass"},
    },
    {
        "alert": "SharegpuComputeUncharged",
        "eval": "5m",
        "fire": [("sharegpu_audit_events_total", {**N, "kind": "compute_uncharged"}, "0 0 0 1x10")],
        "quiet": [
            ("sharegpu_audit_events_total", {**N, "kind": "compute_uncharged"}, "0x12"),
            ("sharegpu_audit_events_total", {**N, "kind": "bypass"}, "0 0 0 5x10"),
        ],
        "labels": {**N, "kind": "compute_uncharged"},
    },
    {
        "alert": "SharegpuArbiterRebuilt",
        "eval": "5m",
        "fire": [("sharegpu_arbiter_rebuilds_total", {**N, "gpu": "GPU-0"}, "0 0 0 1x10")],
        "quiet": [("sharegpu_arbiter_rebuilds_total", {**N, "gpu": "GPU-0"}, "0x12")],
        "labels": {**N, "gpu": "GPU-0"},
    },
    {
        "alert": "SharegpuAgentLoopFailing",
        "eval": "31m",
        "fire": [("sharegpu_agent_loop_errors_total", {**N, "loop": "audit"}, "0+1x40")],
        "quiet": [("sharegpu_agent_loop_errors_total", {**N, "loop": "audit"}, "0+1x3 3x40")],
        "labels": {**N, "loop": "audit"},
    },
]


def _series(items: list[tuple[str, dict[str, str], str]]) -> list[dict[str, str]]:
    return [
        {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}
        for name, labels, values in items
    ]


def _annotations(rule: dict[str, Any], labels: dict[str, str], value: str | None) -> dict[str, str]:
    """The rule's annotations as Prometheus renders them for these labels and value."""
    out = {}
    for key, template in rule["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)
        out[key] = text.replace("{{ $value | humanizePercentage }}", value or "")
    return out


def test_every_alert_fires_on_its_condition_and_only_then(tmp_path: Path) -> None:
    rules = {r["alert"]: r for r in yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]}
    assert {c["alert"] for c in ALERT_CASES} == set(rules)  # every alert has its cases
    tests = []
    for case in ALERT_CASES:
        rule = rules[case["alert"]]
        labels = {**case["labels"], **rule["labels"]}
        fired = {"exp_labels": labels, "exp_annotations": _annotations(rule, labels, case.get("value"))}
        for items, expected in ((case["fire"], [fired]), (case["quiet"], [])):
            tests.append(
                {
                    "interval": "1m",
                    "input_series": _series(items),
                    "alert_rule_test": [
                        {"eval_time": case["eval"], "alertname": case["alert"], "exp_alerts": expected}
                    ],
                }
            )
    spec = tmp_path / "alerts_test.yaml"
    spec.write_text(
        yaml.safe_dump({"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": tests})
    )
    done = subprocess.run(
        [str(promtool()), "test", "rules", str(spec)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_and_alerts_name_only_exposed_metrics(sim: Sim, tmp_path: Path) -> None:
    port = free_port()
    with (
        running_agent(sim, tmp_path, "--metrics-port", str(port), "--metrics-address", "127.0.0.1") as agent,
        busy_node(sim, agent),
    ):
        # Until the online tenant's wait histogram has an observation.
        wait_for(port, lambda f: any(s.value > 0 for s in f["sharegpu_tenant_online_wait_seconds"].samples))
        time.sleep(0.2)
        text = scrape_text(port)
    exposed = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    used: dict[str, set[str]] = {}
    for expr in dashboard_queries():
        for name in metric_names(expr):
            used.setdefault(name, set()).add(f"dashboard: {expr}")
    for rule in alert_rules():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(f"alert {rule['alert']}")
    missing = {name: where for name, where in used.items() if name not in exposed | PROMETHEUS_OWN}
    assert not missing, f"not exposed by the agent: {missing}"
    print(f"{len(used)} metric names used, all exposed ({len(exposed)} exposed)")
