#!/usr/bin/env bash
# helm, kubeconform and promtool built from the Go module proxy (pinned versions), and Kubernetes JSON schemas for
# kubeconform generated from the k8s.io/kubernetes module's swagger.json. Everything lands in the cache dir.
set -euo pipefail
HELM_VERSION=v3.16.4
KUBECONFORM_VERSION=v0.6.7
PROMETHEUS_VERSION=v0.316.0  # the Go module of Prometheus 3.x: promtool checks the chart's alert rules
K8S_VERSION=v1.34.2
CACHE=${TIERPROXY_CACHE:-$HOME/.cache/tierproxy}
BIN=$CACHE/bin
mkdir -p "$BIN"
export GOPATH=$CACHE/go GOBIN=$BIN GOFLAGS=-mod=mod
command -v go >/dev/null || { echo "go is required to build helm and kubeconform"; exit 1; }
[ -x "$BIN/kubeconform" ] || go install "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
[ -x "$BIN/helm" ] || go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
[ -x "$BIN/promtool" ] || go install "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
SCHEMAS=$CACHE/k8s-schemas-$K8S_VERSION
if [ ! -f "$SCHEMAS/.complete" ]; then
  dir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  python3 "$(dirname "$0")/k8s_schemas.py" "$dir/api/openapi-spec/swagger.json" "$SCHEMAS"
  touch "$SCHEMAS/.complete"
fi
echo "helm, kubeconform, promtool and Kubernetes $K8S_VERSION schemas in $CACHE"
