#!/usr/bin/env bash
# Checks every deployment artifact with the real tools, offline (no cluster, no Docker engine):
#   deploy/kubernetes   rendered with `kubectl kustomize` per overlay, validated with kubernetes-validate --strict
#                       (core kinds) and scripts/check_deploy.py (KEDA / ServiceMonitor schemas, probes, grace
#                       period, read-only mounts, PDBs, KEDA ceilings = partitions of the topics Job, tracing
#                       opt-in and complete in overlays/tracing)
#   deploy/prometheus   promtool check config / check rules / test rules, the local stack's generated config, and
#                       every alert's runbook link (a heading of the docs)
#   docker-compose.yml  docker-compose config (tracing variables unset), then check_deploy.py compose
#   deploy/grafana      dashboard structure and its trace links, the example Tempo data source; the metric names
#                       it queries are checked against a running stack by Tests/EndToEndTests/DeployMetricsTests.swift
#   Dockerfile          builds through scripts/setup.sh only; runtime libraries match setup.sh's -dev packages
#   scripts/setup.sh    the apt-source parser, on made-up source files
#   Package.swift       scripts/check_imports.py: each target's dependencies are the modules its files import
# Each check is also run once against a broken copy, which must fail (a check that cannot fail proves nothing).
# Called by scripts/test.sh; runs alone too (after scripts/setup.sh). Set HERALD_BIN_DIR to find heraldctl.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
PY="$root/.venv/bin/python"
KV="$root/.venv/bin/kubernetes-validate"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0; failed=0

# check NAME COMMAND...: runs COMMAND, which must succeed.
check() {
  local name="$1"; shift
  if "$@" >"$tmp/out" 2>&1; then
    passed=$((passed + 1)); printf '[check-deploy] ok    %s\n' "$name" >&2
  else
    failed=$((failed + 1)); printf '[check-deploy] FAIL  %s\n' "$name" >&2; sed 's/^/    /' "$tmp/out" >&2
  fi
}
# refuses NAME COMMAND...: COMMAND (a check run against a deliberately broken input) must fail.
refuses() {
  local name="$1"; shift
  if "$@" >"$tmp/out" 2>&1; then
    failed=$((failed + 1)); printf '[check-deploy] FAIL  %s (the broken input passed)\n' "$name" >&2
  else
    passed=$((passed + 1)); printf '[check-deploy] ok    %s\n' "$name" >&2
  fi
}

# --- Kubernetes -------------------------------------------------------------------------------------------
# kubernetes-validate knows the core API; the two custom resources it reports as unknown are checked by
# check_deploy.py. Anything else unknown, or any ERROR, fails.
validate_k8s() { # rendered.yaml
  "$KV" --strict --quiet "$1" >"$tmp/kv.out" 2>&1 || { cat "$tmp/kv.out"; return 1; }
  if grep -v -E "Couldn't find schema for kind (ScaledObject|ServiceMonitor) " "$tmp/kv.out" | grep -q .; then
    cat "$tmp/kv.out"; return 1
  fi
}
render() { kubectl kustomize "deploy/kubernetes/overlays/$1" 2>"$tmp/render-$1.err" >"$tmp/$1.yaml" || { cat "$tmp/render-$1.err"; return 1; }; }
for overlay in dev production tracing; do
  check "kubectl kustomize overlays/$overlay" render "$overlay"
  check "kubernetes-validate --strict overlays/$overlay" validate_k8s "$tmp/$overlay.yaml"
  check "deployment rules (check_deploy.py kube) overlays/$overlay" "$PY" scripts/check_deploy.py kube "$tmp/$overlay.yaml"
done
# Tracing is opt-in: only overlays/tracing sets an OTLP endpoint (setting one turns tracing on), and it sets it,
# with a ratio and the pod's name as a resource attribute, on every stage (check_deploy.py kube above).
tracing_opt_in() {
  if grep -n 'OTEL_EXPORTER_OTLP' "$tmp/dev.yaml" "$tmp/production.yaml"; then echo "an OTLP endpoint outside overlays/tracing"; return 1; fi
  [ "$(grep -c '^  OTEL_EXPORTER_OTLP_ENDPOINT: http' "$tmp/tracing.yaml")" = 1 ] || { echo "overlays/tracing sets no endpoint in herald-env"; return 1; }
  [ "$(grep -c 'k8s.pod.name=$(POD_NAME)' "$tmp/tracing.yaml")" = 6 ] || { echo "not every stage has k8s.pod.name"; return 1; }
}
check "tracing is opt-in: overlays/tracing alone sets OTEL_EXPORTER_OTLP_ENDPOINT, with the pod name on every stage" tracing_opt_in
sed 's/- name: POD_NAME$/- name: POD_NAME_X/' "$tmp/tracing.yaml" >"$tmp/broken-tracing.yaml"
refuses "check_deploy.py rejects resource attributes naming a variable that is not set" "$PY" scripts/check_deploy.py kube "$tmp/broken-tracing.yaml"
sed 's/^  OTEL_TRACES_SAMPLER_ARG: .*/  OTEL_TRACES_SAMPLER_ARG: "5"/' "$tmp/tracing.yaml" >"$tmp/broken-ratio.yaml"
refuses "check_deploy.py rejects a sampling ratio above 1" "$PY" scripts/check_deploy.py kube "$tmp/broken-ratio.yaml"
sed 's/livenessProbe:/livenesProbe:/' "$tmp/production.yaml" >"$tmp/broken-probe.yaml"
refuses "kubernetes-validate rejects a misspelt field" validate_k8s "$tmp/broken-probe.yaml"
sed '0,/maxReplicaCount: 12/s//maxReplicaCount: 16/' "$tmp/production.yaml" >"$tmp/broken-ceiling.yaml"
refuses "check_deploy.py rejects a KEDA ceiling above the partition count" "$PY" scripts/check_deploy.py kube "$tmp/broken-ceiling.yaml"
sed 's/terminationGracePeriodSeconds: 35/terminationGracePeriodSeconds: 20/' "$tmp/production.yaml" >"$tmp/broken-grace.yaml"
refuses "check_deploy.py rejects a grace period under the shutdown deadline" "$PY" scripts/check_deploy.py kube "$tmp/broken-grace.yaml"
sed 's/lagThreshold:/lagTreshold:/' "$tmp/production.yaml" >"$tmp/broken-keda.yaml"
refuses "check_deploy.py rejects an unknown KEDA trigger key" "$PY" scripts/check_deploy.py kube "$tmp/broken-keda.yaml"
sed '0,/stabilizationWindowSeconds: 300/s//stabilizationWindowSeconds: 30/' "$tmp/production.yaml" >"$tmp/broken-scaledown.yaml"
refuses "check_deploy.py rejects a scale-down that does not wait for minutes of quiet" "$PY" scripts/check_deploy.py kube "$tmp/broken-scaledown.yaml"
sed '/kind: NetworkPolicy/,$ s/port: metrics/port: 8080/' "$tmp/production.yaml" >"$tmp/broken-netpol.yaml"
refuses "check_deploy.py rejects a NetworkPolicy that opens another port" "$PY" scripts/check_deploy.py kube "$tmp/broken-netpol.yaml"

# The cluster's pipeline file loads (the same loader the stages use) without warnings.
heraldctl="${HERALD_BIN_DIR:-$root/.build/debug}/heraldctl"
pipeline_loads() {
  "$heraldctl" simulate --event pipelines/examples/event-group.json --state pipelines/examples/state.json \
    --pipeline deploy/kubernetes/base/pipeline.yaml >"$tmp/sim.out" 2>"$tmp/sim.err" || { cat "$tmp/sim.err"; return 1; }
  if [ -s "$tmp/sim.err" ]; then cat "$tmp/sim.err"; return 1; fi
  grep -q '"decision":"deliver"' "$tmp/sim.out" || { echo "no delivery decided"; cat "$tmp/sim.out"; return 1; }
}
if [ -x "$heraldctl" ]; then
  check "deploy/kubernetes/base/pipeline.yaml loads (heraldctl simulate)" pipeline_loads
else
  failed=$((failed + 1)); printf '[check-deploy] FAIL  no %s: build first (swift build) or set HERALD_BIN_DIR\n' "$heraldctl" >&2
fi

# --- Prometheus ---------------------------------------------------------------------------------------------
check "promtool check config deploy/prometheus/prometheus.yml" promtool check config deploy/prometheus/prometheus.yml
check "promtool check rules deploy/prometheus/alerts.yml" promtool check rules deploy/prometheus/alerts.yml
check "promtool test rules deploy/prometheus/tests/alerts.test.yml" promtool test rules deploy/prometheus/tests/alerts.test.yml
mkdir -p "$tmp/rules/tests"
sed 's/> 0.05$/> 0.5/' deploy/prometheus/alerts.yml >"$tmp/rules/alerts.yml"
cp deploy/prometheus/tests/alerts.test.yml "$tmp/rules/tests/"
refuses "promtool test rules fails on a loosened DLQ threshold" promtool test rules "$tmp/rules/tests/alerts.test.yml"
check "every alert's runbook links a heading of the docs (check_deploy.py runbooks)" \
  "$PY" scripts/check_deploy.py runbooks deploy/prometheus/alerts.yml
sed 's|operations.md#heraldstagenotready|operations.md#no-such-heading|' deploy/prometheus/alerts.yml >"$tmp/rules/runbooks.yml"
refuses "check_deploy.py rejects a runbook link to a missing heading" "$PY" scripts/check_deploy.py runbooks "$tmp/rules/runbooks.yml"
check "scripts/local-prometheus.sh --config-only: promtool check config" \
  bash -c "bash scripts/local-prometheus.sh --config-only '$tmp/local-prom' >/dev/null && promtool check config '$tmp/local-prom/prometheus.yml'"

# --- docker-compose -----------------------------------------------------------------------------------------
# Rendered with the tracing variables unset, as on a host that does not trace (the rules check they stay unset).
compose_config() {
  env -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_TRACES_SAMPLER_ARG -u OTEL_RESOURCE_ATTRIBUTES \
    docker-compose -f docker-compose.yml config >"$tmp/compose.yaml" 2>"$tmp/compose.err" || { cat "$tmp/compose.err"; return 1; }
}
check "docker-compose config" compose_config
check "compose rules (check_deploy.py compose)" "$PY" scripts/check_deploy.py compose "$tmp/compose.yaml"
sed 's/stop_grace_period: 35s/stop_grace_period: 10s/' "$tmp/compose.yaml" >"$tmp/broken-compose.yaml"
refuses "check_deploy.py rejects a compose grace period under the deadline" "$PY" scripts/check_deploy.py compose "$tmp/broken-compose.yaml"
sed 's/OTEL_EXPORTER_OTLP_ENDPOINT: null/OTEL_EXPORTER_OTLP_ENDPOINT: http:\/\/collector:4318/' "$tmp/compose.yaml" >"$tmp/broken-compose-otel.yaml"
refuses "check_deploy.py rejects a compose file that turns tracing on by default" "$PY" scripts/check_deploy.py compose "$tmp/broken-compose-otel.yaml"

# --- Grafana, Dockerfile ------------------------------------------------------------------------------------
check "Grafana dashboard structure (schema 36+, queries, variables, trace links)" "$PY" scripts/check_deploy.py dashboard deploy/grafana/dashboards/herald.json
sed 's/herald-${__field.labels.stage}%20process/herald-process/' deploy/grafana/dashboards/herald.json >"$tmp/broken-dashboard.json"
refuses "check_deploy.py rejects a latency panel whose trace link filters on another span name" "$PY" scripts/check_deploy.py dashboard "$tmp/broken-dashboard.json"
check "the example Tempo data source parses and has the uid the docs give" \
  "$PY" -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1]))["datasources"][0]; sys.exit(not (d["type"] == "tempo" and d["uid"] == "tempo"))' deploy/grafana/examples/tempo-datasource.yml
check "Dockerfile builds through scripts/setup.sh; runtime libraries match" "$PY" scripts/check_deploy.py dockerfile Dockerfile scripts/setup.sh
sed 's|^RUN bash scripts/setup.sh$|RUN apt-get update \&\& apt-get install -y libhiredis-dev \&\& bash scripts/setup.sh|' Dockerfile >"$tmp/Dockerfile"
refuses "check_deploy.py rejects a Dockerfile installing on its own" "$PY" scripts/check_deploy.py dockerfile "$tmp/Dockerfile" scripts/setup.sh

# --- Package.swift: every target declares the modules it imports, and imports the ones it declares ----------
check "every target's imports match its declared dependencies (check_imports.py)" "$PY" scripts/check_imports.py
# A copy with one import no target declares and one declaration no file imports: both reported, by name.
planted_mismatches() {
  local copy="$tmp/imports"; mkdir -p "$copy"
  cp -r Package.swift Sources Tests "$copy/"
  printf 'import HeraldRedis\n' >>"$copy/Sources/Stages/herald-ingest/main.swift"
  sed -i 's/name: "HeraldBenchSupportTests", dependencies: \[/&"HeraldRedis", /' "$copy/Package.swift"
  ! cmp -s Package.swift "$copy/Package.swift" || { echo "the planted dependency did not apply"; return 1; }
  if "$PY" scripts/check_imports.py "$copy" >"$tmp/imports.out"; then echo "the planted mismatches passed"; return 1; fi
  cat "$tmp/imports.out"
  grep -q '^target herald-ingest .* imports HeraldRedis but does not declare it$' "$tmp/imports.out" &&
    grep -q '^target HeraldBenchSupportTests .* declares HeraldRedis but never imports it$' "$tmp/imports.out"
}
check "check_imports.py reports a planted undeclared import and a planted unused dependency" planted_mismatches

# --- setup.sh: the Debian archive from the apt sources --------------------------------------------------------
apt_sources() {
  source <(sed -n '/^debian_archive_uri()/,/^}/p' scripts/setup.sh)
  local d="$tmp/apt"; mkdir -p "$d/a/sources.list.d" "$d/b/sources.list.d" "$d/c/sources.list.d"
  printf 'Types: deb\nURIs: http://mirror-a.test/debian-security\nSuites: bookworm-security\nComponents: main\n\nTypes: deb\nURIs: http://mirror-a.test/debian\nSuites: bookworm bookworm-updates\nComponents: main\n' \
    >"$d/a/sources.list.d/debian.sources"
  printf 'Types: deb\nURIs: https://vendor.test/apt\nSuites: stable\n' >"$d/a/sources.list.d/vendor.sources"
  printf '# comment\ndeb [arch=amd64 signed-by=/k.gpg] https://vendor.test/apt cloud main\ndeb http://sec.test/debian-security bookworm-security main\ndeb [ trusted=yes ] http://mirror-b.test/debian bookworm main\n' \
    >"$d/b/sources.list"
  local a b c
  a=$(debian_archive_uri "$d/a"); b=$(debian_archive_uri "$d/b"); c=$(debian_archive_uri "$d/c" || true)
  [ "$a" = "http://mirror-a.test/debian" ] || { echo "deb822: got '$a'"; return 1; }
  [ "$b" = "http://mirror-b.test/debian" ] || { echo "sources.list: got '$b'"; return 1; }
  [ -z "$c" ] || { echo "no sources: got '$c'"; return 1; }
  ! grep -q -E 'deb\.debian\.org|pypi\.org' scripts/setup.sh || { echo "setup.sh names a mirror host"; return 1; }
}
check "setup.sh finds the Debian archive in deb822 and one-line apt sources" apt_sources

echo "check-deploy: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
