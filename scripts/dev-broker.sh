#!/usr/bin/env bash
# Start / stop / drive herald-dev-broker (librdkafka's mock cluster on fixed loopback ports; docs/kafka.md, "The local
# and test broker").
#
#   scripts/dev-broker.sh start PORT [RUN_DIR]   start in the background: broker i on PORT+i-1, the control API on
#                                          PORT+100; waits for the ready line and prints it; pid, log and the
#                                          bootstrap list in RUN_DIR (default run/dev-broker-PORT)
#   scripts/dev-broker.sh stop PORT [RUN_DIR]    stop the broker started by `start` (SIGTERM, then SIGKILL after 5 s)
#   scripts/dev-broker.sh status PORT      exit 0 if the control API answers; prints the brokers (GET /brokers)
#   scripts/dev-broker.sh topics PORT NAME:PARTITIONS...   create topics (existing ones are left alone)
#   scripts/dev-broker.sh down PORT ID [GROUP...]   take broker ID down; the partitions it leads, and the named
#                                          groups it coordinates, move to brokers that are up
#   scripts/dev-broker.sh up PORT ID       let broker ID accept connections again (leadership stays where it is)
#   scripts/dev-broker.sh leader PORT TOPIC PARTITION ID   make broker ID the leader of TOPIC/PARTITION
#
# Environment: HERALD_DEV_BROKER_BROKERS (3), HERALD_DEV_BROKER_CONTROL_PORT (PORT+100), HERALD_DEV_BROKER_ARGS (more
# options for `start`, e.g. "--topic chat.events:8 --group herald-ingest"; herald-dev-broker --help lists them).
# The binary is $HERALD_BIN_DIR/herald-dev-broker, else the package's release build if there is one, else its debug
# build (`swift build --product herald-dev-broker`).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

dev_broker_bin() {
  if [ -n "${HERALD_BIN_DIR:-}" ]; then
    [ -x "$HERALD_BIN_DIR/herald-dev-broker" ] || { echo "no herald-dev-broker in HERALD_BIN_DIR=$HERALD_BIN_DIR" >&2; exit 1; }
    echo "$HERALD_BIN_DIR/herald-dev-broker"; return
  fi
  local config dir
  for config in release debug; do
    dir="$(cd "$root" && swift build -c "$config" --show-bin-path 2>/dev/null || echo "$root/.build/$config")"
    [ -x "$dir/herald-dev-broker" ] && { echo "$dir/herald-dev-broker"; return; }
  done
  echo "herald-dev-broker is not built: run swift build --product herald-dev-broker (or set HERALD_BIN_DIR)" >&2
  exit 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cmd="${1:-}"; port="${2:-}"
[ -n "$cmd" ] && [ -n "$port" ] || { sed -n '2,21p' "$0" >&2; exit 2; }
control="${HERALD_DEV_BROKER_CONTROL_PORT:-$((port + 100))}"
api="http://127.0.0.1:$control"

post() { # path; prints the answer, fails with it on an error status
  local out
  if ! out="$(curl -sS -X POST --max-time 30 -w '\n%{http_code}' "$api$1")"; then echo "$out" >&2; return 1; fi
  local status="${out##*$'\n'}"; out="${out%$'\n'*}"; out="${out%$'\n'}"
  if [ "$status" != 200 ]; then echo "$out" >&2; return 1; fi
  echo "$out"
}

case "$cmd" in
  start)
    run_dir="${3:-$root/run/dev-broker-$port}"
    brokers="${HERALD_DEV_BROKER_BROKERS:-3}"
    for p in $(seq "$port" $((port + brokers - 1))) "$control"; do
      if port_open "$p"; then echo "port $p is already in use" >&2; exit 1; fi
    done
    mkdir -p "$run_dir"
    bin="$(dev_broker_bin)"
    : >"$run_dir/dev-broker.out"
    # shellcheck disable=SC2086 # HERALD_DEV_BROKER_ARGS is a list of options
    nohup "$bin" --brokers "$brokers" --port "$port" --control-port "$control" \
      --bootstrap-file "$run_dir/bootstrap" ${HERALD_DEV_BROKER_ARGS:-} \
      >"$run_dir/dev-broker.out" 2>>"$run_dir/dev-broker.log" &
    echo $! >"$run_dir/dev-broker.pid"
    for _ in $(seq 1 100); do
      if grep -q '^herald-dev-broker ready' "$run_dir/dev-broker.out"; then
        echo "$(cat "$run_dir/dev-broker.out") (pid $(cat "$run_dir/dev-broker.pid"))"; exit 0
      fi
      kill -0 "$(cat "$run_dir/dev-broker.pid")" 2>/dev/null || { tail -5 "$run_dir/dev-broker.log" >&2; exit 1; }
      sleep 0.1
    done
    echo "herald-dev-broker did not say ready within 10 s; see $run_dir/dev-broker.log" >&2; exit 1 ;;
  stop)
    run_dir="${3:-$root/run/dev-broker-$port}"
    pidfile="$run_dir/dev-broker.pid"
    [ -f "$pidfile" ] || { echo "no pid file $pidfile" >&2; exit 0; }
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$pidfile"; echo "herald-dev-broker on port $port stopped" ;;
  status)
    curl -fsS --max-time 5 "$api/healthz" >/dev/null 2>&1 || exit 1
    curl -fsS --max-time 10 "$api/brokers" ;;
  topics)
    shift 2
    for _ in $(seq 1 100); do curl -fs --max-time 1 "$api/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
    for spec in "$@"; do
      name="${spec%:*}"; parts="${spec##*:}"; [ "$name" = "$spec" ] && parts=1
      out="$(post "/topics?name=$name&partitions=$parts")"
      if grep -q '"created":true' <<<"$out"; then echo "topic $name ($parts partitions) created"
      else echo "topic $name exists"; fi
    done ;;
  down)
    [ $# -ge 3 ] || { echo "usage: $0 down PORT ID [GROUP...]" >&2; exit 2; }
    id="$3"; shift 3
    groups="$(IFS=,; echo "$*")"
    post "/brokers/$id/down${groups:+?groups=$groups}" ;;
  up)
    [ $# -ge 3 ] || { echo "usage: $0 up PORT ID" >&2; exit 2; }
    post "/brokers/$3/up" ;;
  leader)
    [ $# -ge 5 ] || { echo "usage: $0 leader PORT TOPIC PARTITION ID" >&2; exit 2; }
    post "/partitions/leader?topic=$3&partition=$4&broker=$5" ;;
  *) sed -n '2,21p' "$0" >&2; exit 2 ;;
esac
