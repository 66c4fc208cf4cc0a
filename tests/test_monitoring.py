"""The chart's Grafana dashboard and Prometheus alerts: the rules pass `promtool check rules` (as files/alerts.yaml
and as the rendered PrometheusRule), the dashboard passes a JSON schema of Grafana's dashboard model, and every
metric either of them uses is exported by a running proxy."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from tests.support.helm import CHART, chart_tool, render_chart
from tests.support.proxy import ProxyProcess
from tests.support.waiting import wait_until
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port
from tierproxy.jobs.restore.drill import DrillFindings, prometheus_text

DASHBOARD = CHART / "files" / "dashboard.json"
ALERTS = CHART / "files" / "alerts.yaml"
METRIC = re.compile(r"\btierproxy_[a-z_]+\b")

# Grafana's dashboard JSON model (the fields the dashboard uses; Grafana's own schema has many more, all optional)
DASHBOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "refresh": {"type": "string"},
        "time": {"type": "object", "required": ["from", "to"]},
        "templating": {"type": "object", "required": ["list"], "properties": {"list": {"type": "array", "items": {
            "type": "object", "required": ["name", "type"]}}}},
        "panels": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["id", "type", "title", "gridPos", "targets", "datasource"],
            "properties": {
                "id": {"type": "integer"},
                "type": {"enum": ["timeseries", "stat", "gauge", "table", "bargauge"]},
                "gridPos": {"type": "object", "required": ["h", "w", "x", "y"], "properties": {
                    "w": {"type": "integer", "minimum": 1, "maximum": 24}, "x": {"type": "integer", "minimum": 0,
                                                                                  "maximum": 23}}},
                "datasource": {"type": "object", "required": ["type", "uid"]},
                "targets": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["refId", "expr"],
                    "properties": {"expr": {"type": "string", "minLength": 1}}}},
            }}},
    },
}


def _promtool() -> str:
    return chart_tool("promtool")


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _rules(group: str | None = None) -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] if group in (None, g["name"]) for r in g["rules"]]


def test_the_drills_alerts_use_what_the_drill_writes() -> None:
    """The restore drill's rules read what `restore --dry-run --metrics-file` writes, not what serve exports."""
    text = prometheus_text(DrillFindings(lost={("t", 0): (1, 2)}), 0.0)
    written = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    used = {m for r in _rules("tierproxy-restore-drill") for m in METRIC.findall(r["expr"])}
    assert used and used <= written, used - written


def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    out = subprocess.run([_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "SUCCESS: 11 rules found" in out.stdout, out.stdout + out.stderr
    rendered = render_chart("--set", "monitoring.prometheusRule.enabled=true", "--show-only",
                       "templates/prometheusrule.yaml")
    spec = yaml.safe_load(rendered)["spec"]
    (tmp_path / "rendered.yaml").write_text(yaml.safe_dump(spec))
    out = subprocess.run([_promtool(), "check", "rules", str(tmp_path / "rendered.yaml")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {r["alert"] for r in _rules()} == {
        "TierproxyGapDetected", "TierproxyTieringLagGrowing", "TierproxyTierPassFailing", "TierproxyRemoteFetchErrors",
        "TierproxyNotReady", "TierproxyMetadataConsumerRestarts", "TierproxyMemoryBoundReached",
        "TierproxyRestoreDrillBrokenSegments", "TierproxyRestoreDrillIncomplete", "TierproxyRestorePointOld",
        "TierproxyRestoreDrillNotRun"}


def test_dashboard_passes_the_schema_and_lays_out_its_panels() -> None:
    dash = _dashboard()
    jsonschema.validate(dash, DASHBOARD_SCHEMA)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
    assert any(v["name"] == "datasource" for v in dash["templating"]["list"])
    rendered = render_chart("--set", "monitoring.grafanaDashboard.enabled=true", "--show-only",
                       "templates/grafana-dashboard.yaml")
    cm = yaml.safe_load(rendered)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["tierproxy.json"]) == dash


@pytest.mark.kafka
def test_every_metric_the_dashboard_and_alerts_use_is_exported(kafka: KafkaCluster, tmp_path: Path) -> None:
    admin = f"127.0.0.1:{free_port()}"
    proxy = ProxyProcess(kafka.bootstrap, tmp_path, {"TIERPROXY_ADMIN_LISTEN": admin})
    try:
        wait_until(lambda: "tierproxy_ready 1.0" in httpx.get(f"http://{admin}/metrics", timeout=10).text,
                   "the proxy's tier to be ready", timeout=60)
        text = httpx.get(f"http://{admin}/metrics", timeout=10).text
    finally:
        proxy.stop()
    exported = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            exported.add(name)
            if kind == "histogram":
                exported |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    used = {m for p in _dashboard()["panels"] for t in p["targets"] for m in METRIC.findall(t["expr"])}
    used |= {m for r in _rules("tierproxy") for m in METRIC.findall(r["expr"])}
    assert len(used) >= 20
    assert used - exported == set()
