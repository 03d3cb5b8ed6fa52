"""deploy/: the Grafana dashboard and the Prometheus alert rules as files: valid, a reason on
every panel for when it is empty, a runbook on every alert. Against promtool and a real agent's
scrape: tests/e2e/test_deploy.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "sharegpu.json"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
_METRIC = re.compile(r"\b((?:sharegpu|process)_[a-z0-9_]+|up)\b(?!\s*\()")


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


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
