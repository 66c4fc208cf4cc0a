"""The Helm chart renders with default and full values, lints, and validates against Kubernetes schemas
(kubeconform, closed objects so a misspelled field fails); values.schema.json rejects bad values."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tests.support.helm import CHART, chart_tool, render_chart
from tests.support.parts import unavailable
from tierproxy.dev.maven import cache_dir

SCHEMAS = "k8s-schemas-v1.34.2"






def _kubeconform(manifests: str) -> str:
    schemas = cache_dir() / SCHEMAS
    if not (schemas / ".complete").exists():
        unavailable("Kubernetes schemas", f"{schemas} missing (make install: .ci/install-tools.sh)")
    out = subprocess.run([chart_tool("kubeconform"), "-summary", "-skip", "ServiceMonitor,PrometheusRule",
                          "-schema-location",
                          f"{schemas}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json"],
                         input=manifests, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("values", [[], ["-f", str(CHART / "ci" / "full-values.yaml")]], ids=["default", "full"])
def test_chart_lints_renders_and_validates(values: list[str]) -> None:
    lint = subprocess.run([chart_tool("helm"), "lint", str(CHART), *values], capture_output=True, text=True,
                          timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    manifests = render_chart(*values)
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(manifests) if d)
    summary = _kubeconform(manifests)
    assert "Invalid: 0, Errors: 0" in summary
    if values:
        assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "Deployment", "HorizontalPodAutoscaler",
                         "PodDisruptionBudget", "PrometheusRule", "Service", "Service", "ServiceMonitor"]
    else:
        assert kinds == ["ConfigMap", "CronJob", "Deployment", "PodDisruptionBudget", "Service", "Service"]
    docs = {d["kind"] + "/" + d["metadata"]["name"]: d for d in yaml.safe_load_all(manifests) if d}
    service = docs["Service/demo-tierproxy"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports["bootstrap"] == 9192 and ports["broker-0"] == 9200  # port-per-broker exposed
    assert "admin" not in ports  # the admin API on its own Service, inside the cluster only
    admin = docs["Service/demo-tierproxy-admin"]
    assert admin["spec"]["type"] == "ClusterIP" and [p["name"] for p in admin["spec"]["ports"]] == ["admin"]
    if values:  # the ServiceMonitor scrapes the admin Service alone
        monitor = docs["ServiceMonitor/demo-tierproxy"]
        assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "admin"


@pytest.mark.parametrize("bad", ["storage.uri=ftp://nope", "proxy.brokerPortCount=0", "tier.mode=sometimes",
                                 "kafka.bootstrapServers=no-port"])
def test_values_schema_rejects_bad_values(bad: str) -> None:
    out = subprocess.run([chart_tool("helm"), "template", "demo", str(CHART), "--set", bad], capture_output=True,
                         text=True, timeout=120, env={**os.environ})
    assert out.returncode != 0 and "values don't meet the specifications" in out.stderr


def test_default_images_are_the_ones_make_image_builds() -> None:
    """`make image` tags localhost/tierproxy:<package version> (the proxy) and localhost/tierproxy-jobs (the jobs);
    the chart deploys exactly those, the proxy's Deployment on the first and the tier job on the second, as a
    non-root user."""
    import tomllib

    version = tomllib.loads((CHART.parents[1] / "pyproject.toml").read_text())["project"]["version"]
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == version
    for mode in ("cronjob", "deployment"):
        docs = [d for d in yaml.safe_load_all(render_chart("--set", f"tier.mode={mode}"))
                if d and d["kind"] in ("Deployment", "CronJob")]
        images = {}
        for d in docs:
            pod = d["spec"]["jobTemplate"]["spec"]["template"]["spec"] if d["kind"] == "CronJob" else \
                d["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
            images.update({c["name"]: c["image"] for c in pod["containers"]})
        assert images == {"proxy": f"localhost/tierproxy:{version}",
                          "tier": f"localhost/tierproxy-jobs:{version}"}, images
    pinned = render_chart("--set", "image.repository=registry.example.com/tierproxy", "--set", "image.tag=9.9.9",
                          "--set", "jobsImage.repository=registry.example.com/tierproxy-jobs")
    assert "image: \"registry.example.com/tierproxy:9.9.9\"" in pinned
    assert f"image: \"registry.example.com/tierproxy-jobs:{version}\"" in pinned


@pytest.mark.parametrize("mode", ["cronjob", "deployment"])
def test_command_config_secret_reaches_the_proxy_and_the_tier_job(mode: str) -> None:
    """kafka.commandConfig.existingSecret: mounted read-only for both, TIERPROXY_COMMAND_CONFIG names the file."""
    docs = [d for d in yaml.safe_load_all(render_chart("--set", "kafka.commandConfig.existingSecret=kafka-client",
                                                  "--set", "kafka.commandConfig.key=own.properties",
                                                  "--set", f"tier.mode={mode}")) if d]
    pods = [d["spec"]["jobTemplate"]["spec"]["template"]["spec"] if d["kind"] == "CronJob" else d["spec"]["template"]
            ["spec"] for d in docs if d["kind"] in ("Deployment", "CronJob")]
    assert len(pods) == 2  # the proxy and the tier job
    for pod in pods:
        c = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["TIERPROXY_COMMAND_CONFIG"] == "/etc/tierproxy/kafka-client/own.properties"
        mount = next(m for m in c["volumeMounts"] if m["name"] == "kafka-client")
        assert mount == {"name": "kafka-client", "mountPath": "/etc/tierproxy/kafka-client", "readOnly": True}
        vol = next(v for v in pod["volumes"] if v["name"] == "kafka-client")
        assert vol["secret"]["secretName"] == "kafka-client" and vol["secret"]["defaultMode"] == 0o440
    plain = [d for d in yaml.safe_load_all(render_chart()) if d]
    assert "kafka-client" not in yaml.safe_dump_all(plain)


def test_iceberg_values_reach_the_proxy_and_the_tier_job() -> None:
    """iceberg.catalog (and a REST catalog's secret) in both pods: the tier job writes the table, the proxy
    shows its lag; unset, neither gets it."""
    docs = [d for d in yaml.safe_load_all(render_chart("--set", "iceberg.catalog=rest:https://catalog.example.com/api",
                                                  "--set", "iceberg.table=lake.kafka",
                                                  "--set", "iceberg.existingSecret=iceberg-rest")) if d]
    pods = [d["spec"]["jobTemplate"]["spec"]["template"]["spec"] if d["kind"] == "CronJob" else d["spec"]["template"]
            ["spec"] for d in docs if d["kind"] in ("Deployment", "CronJob")]
    assert len(pods) == 2
    for pod in pods:
        env = {e["name"]: e for e in pod["containers"][0]["env"]}
        assert env["TIERPROXY_ICEBERG_CATALOG"]["value"] == "rest:https://catalog.example.com/api"
        assert env["TIERPROXY_ICEBERG_TABLE"]["value"] == "lake.kafka"
        assert env["TIERPROXY_ICEBERG_CATALOG_CREDENTIAL"]["valueFrom"]["secretKeyRef"]["name"] == "iceberg-rest"
    assert "ICEBERG" not in render_chart()
    bad = subprocess.run([chart_tool("helm"), "template", "demo", str(CHART), "--set", "iceberg.table=no-namespace"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "values don't meet the specifications" in bad.stderr
