#!/usr/bin/env bash
# helm, kubeconform, promtool and SeaweedFS's weed built from the Go module proxy (pinned versions), and Kubernetes JSON schemas for
# kubeconform generated from the k8s.io/kubernetes module's swagger.json. Everything lands in the cache dir.
set -euo pipefail
HELM_VERSION=v3.16.4
KUBECONFORM_VERSION=v0.6.7
PROMETHEUS_VERSION=v0.316.0  # the Go module of Prometheus 3.x: promtool checks the chart's alert rules
K8S_VERSION=v1.34.2
# SeaweedFS (Apache-2.0), the tests' S3 server: `go install` refuses its replace directives, so it is built inside
# the downloaded module (about 6 minutes on 2 cores, once)
SEAWEEDFS_VERSION=v0.0.0-20261109003541-7506e5f91cd6
CACHE=${TIERPROXY_CACHE:-$HOME/.cache/tierproxy}
BIN=$CACHE/bin
mkdir -p "$BIN"
export GOPATH=$CACHE/go GOBIN=$BIN GOFLAGS=-mod=mod
command -v go >/dev/null || { echo "go is required to build helm and kubeconform"; exit 1; }
[ -x "$BIN/kubeconform" ] || go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
[ -x "$BIN/helm" ] || go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
[ -x "$BIN/promtool" ] || go install "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
if [ ! -x "$BIN/weed" ]; then
  dir=$(go mod download -json "github.com/seaweedfs/seaweedfs@$SEAWEEDFS_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  (cd "$dir" && go build -o "$BIN/weed.part" ./weed && mv "$BIN/weed.part" "$BIN/weed")
fi
SCHEMAS=$CACHE/k8s-schemas-$K8S_VERSION
if [ ! -f "$SCHEMAS/.complete" ]; then
  dir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  python3 "$(dirname "$0")/k8s_schemas.py" "$dir/api/openapi-spec/swagger.json" "$SCHEMAS"
  touch "$SCHEMAS/.complete"
fi
# Spark as a user of the typed tables runs it: PySpark 4.1 beside Iceberg's Spark runtime for 4.1 (Iceberg publishes
# none for the Spark 4.2 the tier job uses), in its own environment; the tests read tables with it in a subprocess
SPARK_ICEBERG_PYSPARK=4.1.1
if [ ! -f "$CACHE/spark-iceberg/.complete-$SPARK_ICEBERG_PYSPARK" ]; then
  rm -rf "$CACHE/spark-iceberg"
  python3 -m venv "$CACHE/spark-iceberg"
  "$CACHE/spark-iceberg/bin/pip" install -q "pyspark==$SPARK_ICEBERG_PYSPARK"
  touch "$CACHE/spark-iceberg/.complete-$SPARK_ICEBERG_PYSPARK"
fi
echo "helm, kubeconform, promtool, weed, Kubernetes $K8S_VERSION schemas and PySpark $SPARK_ICEBERG_PYSPARK (spark-iceberg) in $CACHE"
