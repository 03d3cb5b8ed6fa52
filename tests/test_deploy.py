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
from test_metrics import busy_node, free_port, running_agent, scrape_text, wait_for

DEPLOY = Path(__file__).parents[1] / "deploy"
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


def test_metric_names_are_parsed_out_of_promql() -> None:
    expr = 'sum by (gpu) (rate(sharegpu_tenant_gpu_busy_seconds_total{tenant=~"sharegpu_x"}[5m])) / up'
    assert metric_names(expr) == {"sharegpu_tenant_gpu_busy_seconds_total", "up"}


def test_the_dashboard_is_valid_and_says_why_a_panel_is_empty() -> None:
    doc = dashboard()
    assert doc["uid"] == "sharegpu"
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert {"datasource", "node", "gpu", "tenant"} <= set(variables)
    assert len(panels()) >= 10
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels():
        title = panel["title"]
        assert "Empty when:" in panel["description"], title
        assert panel["fieldConfig"]["defaults"]["noValue"].startswith("No data: "), title
        assert panel["targets"], title
        for target in panel["targets"]:
            assert metric_names(target["expr"]), f"{title}: {target['expr']}"
            # Every query follows the template variables.
            assert "$node" in target["expr"], f"{title}: {target['expr']}"
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, title
    titles = " ".join(p["title"].lower() for p in panels())
    for topic in ("allocated", "achieved", "top", "wait", "throttled", "oom"):
        assert topic in titles, topic


def test_every_alert_has_a_runbook() -> None:
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert {
        "SharegpuAgentDown",
        "SharegpuAgentAbsent",
        "SharegpuGpuMemoryNearlyExhausted",
        "SharegpuTenantNearMemoryCap",
        "SharegpuTenantBelowGuarantee",
        "SharegpuBypassDetected",
    } <= names
    for rule in rules:
        assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule["alert"]
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert len(rule["annotations"]["runbook"]) > 100, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert metric_names(rule["expr"]), rule["alert"]


def test_promtool_accepts_the_rules() -> None:
    done = subprocess.run(
        [str(promtool()), "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
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
