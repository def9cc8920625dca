#!/usr/bin/env bash
# Debian's Prometheus scraping the local stack's stages, with Herald's alerts (deploy/prometheus/alerts.yml), so
# the alerts can be watched firing against the real metrics (stop Redis for HeraldStageNotReady, inject APNs
# faults with HERALD_LOCAL_MOCK_ARGS for HeraldProviderErrorRatio, ...). scripts/local-stack.sh --with-prometheus
# calls `start` once its stages are up and `stop` with the rest of the stack.
#
#   scripts/local-prometheus.sh start             write run/local/prometheus/prometheus.yml and start Prometheus
#   scripts/local-prometheus.sh stop
#   scripts/local-prometheus.sh --config-only DIR write the configuration (and the rules) to DIR, start nothing
#
# Ports (env): HERALD_LOCAL_PROMETHEUS_PORT 19290 (the web UI: /alerts, /graph); the stages are scraped on
# HERALD_LOCAL_METRICS_BASE+1..+6 (default 19201-19206) and the APNs stand-in on +9, as scripts/local-stack.sh
# starts them. Scrapes and rule evaluations every 5 s.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
METRICS_BASE="${HERALD_LOCAL_METRICS_BASE:-19200}"
PORT="${HERALD_LOCAL_PROMETHEUS_PORT:-19290}"
DIR="$root/run/local/prometheus"
say() { printf '[local-prometheus] %s\n' "$*" >&2; }

write_config() { # dir
  mkdir -p "$1"
  cp "$root/deploy/prometheus/alerts.yml" "$1/alerts.yml"
  {
    echo "# Written by scripts/local-prometheus.sh for the local stack; deploy/prometheus/prometheus.yml is the compose one."
    echo "global: {scrape_interval: 5s, evaluation_interval: 5s}"
    echo "rule_files: [alerts.yml]"
    echo "scrape_configs:"
    echo "  - job_name: herald"
    echo "    static_configs:"
    local i=0 s
    for s in ingest resolve suppress render send registry; do
      i=$((i + 1))
      echo "      - {targets: ['127.0.0.1:$((METRICS_BASE + i))'], labels: {process: herald-$s}}"
    done
    echo "  - job_name: herald-mock-apns"
    echo "    static_configs:"
    echo "      - {targets: ['127.0.0.1:$((METRICS_BASE + 9))']}"
  } >"$1/prometheus.yml"
}

stop() {
  [ -f "$DIR/prometheus.pid" ] || return 0
  local pid; pid=$(cat "$DIR/prometheus.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$DIR/prometheus.pid"
}

case "${1:-}" in
  --config-only)
    [ -n "${2:-}" ] || { echo "usage: $0 --config-only DIR" >&2; exit 2; }
    write_config "$2"; echo "$2/prometheus.yml" ;;
  start)
    command -v prometheus >/dev/null || { say "prometheus is not installed (bash scripts/setup.sh installs it)"; exit 1; }
    stop
    write_config "$DIR"
    promtool check config "$DIR/prometheus.yml" >/dev/null
    prometheus --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/data" \
      --web.listen-address="127.0.0.1:$PORT" --storage.tsdb.retention.time=1d >"$DIR/prometheus.log" 2>&1 &
    echo $! >"$DIR/prometheus.pid"
    for _ in $(seq 1 100); do curl -fs "http://127.0.0.1:$PORT/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
    curl -fs "http://127.0.0.1:$PORT/-/ready" >/dev/null || { say "Prometheus did not start:"; tail -5 "$DIR/prometheus.log" >&2; exit 1; }
    say "Prometheus on http://127.0.0.1:$PORT (alerts: /alerts; log: $DIR/prometheus.log)" ;;
  stop) stop ;;
  *) sed -n '2,15p' "$0" >&2; exit 2 ;;
esac
