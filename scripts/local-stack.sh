#!/usr/bin/env bash
# Herald's whole pipeline on this machine, no Docker: Redis + a Kafka broker on loopback (herald-dev-broker:
# librdkafka's mock cluster, three brokers; or Tansu with --broker tansu), the APNs stand-in
# with JWT checking, the FCM + webhook stand-in (herald-mock-fcm), the OTLP trace receiver stand-in
# (herald-mock-otlp), the six stages with tracing on; loads a sample state through herald.registry, publishes the seed
# scenarios to chat.events, and prints what the stand-in received, what was suppressed and why, and one event's trace.
#
#   scripts/local-stack.sh            run the demo, then stop everything
#   scripts/local-stack.sh --keep     keep everything running until Ctrl-C
#   scripts/local-stack.sh --stop     stop what a previous --keep or --up run left running (the --keep process too)
#   options: --no-build (use the existing build), --no-setup (skip scripts/setup.sh), --debug (debug build),
#            --with-prometheus (also Debian's Prometheus with Herald's alerts: scripts/local-prometheus.sh)
#
# For benchmarks and fault tests (herald-bench pipeline, herald-chaos):
#   scripts/local-stack.sh --up           start everything (no demo) and return; the stack keeps running
#   scripts/local-stack.sh --restart NAME stop NAME (SIGTERM, 10 s, then SIGKILL) and start it again
#   scripts/local-stack.sh --start NAME   start NAME (after a kill)
#   scripts/local-stack.sh --signal SIG NAME   send SIG (KILL, TERM, ...) to NAME and return at once
#   NAME: ingest resolve suppress render send registry (a stage), redis, kafka, mock-apns, mock-otlp, or STAGE@N (N 1-3) for
#         an extra process of a stage: same command line and environment, its own metrics port
#         (base+41.. for @1, base+51.. for @2, base+61.. for @3) and instance name, as an autoscaler adds them
#   --persistent   both of: --redis-aof (Redis with an append-only file, appendfsync always) and
#   --kafka-s3     (Tansu on S3-style storage: a local moto server, installed by scripts/setup.sh; implies
#                  --broker tansu), so restarts keep their data
#   --broker dev|tansu  the Kafka broker (env HERALD_LOCAL_BROKER; default dev): herald-dev-broker, three brokers on
#                  HERALD_LOCAL_KAFKA_PORT and the two ports above it, its control API on that port + 100
#                  (scripts/dev-broker.sh down|up|leader PORT ...); or Tansu 0.6 (one broker; its group coordinator
#                  wedges under member churn, docs/kafka.md)
#   --run-dir DIR  state directory instead of run/local (env HERALD_LOCAL_RUN)
#   --redis-cluster  a Redis Cluster instead of one Redis: 3 masters + 3 replicas on HERALD_LOCAL_REDIS_PORT and the
#                  5 ports above it (cluster bus: each port + 10000); the stages get a redis+cluster:// URL.
#                  Components redis-0 .. redis-5 (one node each) for --restart / --start / --signal.
# A stage's exit status is written to RUN/<stage>.exit when it exits; RUN/stack.env lists ports and pids.
#
# Ports (env): HERALD_LOCAL_REDIS_PORT 16479, HERALD_LOCAL_KAFKA_PORT 19192, HERALD_LOCAL_APNS_PORT 18543,
# HERALD_LOCAL_FCM_PORT 18544 (FCM messages:send, its token endpoint and the webhook receiver),
# HERALD_LOCAL_METRICS_BASE 19200 (stages use base+1 .. base+6, the registry API base+7, the stand-in base+9),
# HERALD_LOCAL_OTLP_PORT (herald-mock-otlp; default 4318, or base+8 when HERALD_LOCAL_METRICS_BASE is set, so that
# stacks the tools start on free ports do not share one).
# Tracing: the stages export their spans to herald-mock-otlp (OTEL_EXPORTER_OTLP_ENDPOINT, every 500 ms) with every
# event traced; HERALD_TRACE_RATIO sets the share of events traced (OTEL_TRACES_SAMPLER_ARG, default 1.0) and
# HERALD_TRACING=off turns tracing off (no receiver is started); HERALD_LOCAL_OTLP_MAX_SPANS the spans the receiver
# keeps (default 50000). `heraldctl trace EVENT` draws an event's trace.
# The registry API's bearer token is made once per run directory (RUN/api-token); the script prints it, the API's
# URL and an `export` line for heraldctl (HERALD_KAFKA_BROKERS, HERALD_REDIS_URL, HERALD_STAGE_ENDPOINTS).
# HERALD_LOCAL_BIN: directory of the built executables (default .build/release, or .build/debug with --debug).
# HERALD_LOCAL_PIPELINE_SRC: pipeline file the stack's run/pipeline.yaml is made from (default pipelines/example.yaml;
# the benchmarks of docs/performance.md compare settings this way).
# HERALD_LOCAL_COUNTS: "off" turns every app's `counts: true` into `counts: false` in run/pipeline.yaml (the chat
# service sets the unread counts instead); herald-bench and the fault suite run so, as docs/performance.md measures.
# HERALD_LOCAL_MOCK_ARGS: extra herald-mock-apns options, e.g. "--rate-503 0.2 --goaway-every 50".
# HERALD_TANSU_NICE: the broker's nice value (scripts/tansu.sh; default 0).
# HERALD_LOCAL_STAGES: with --up, the stages to start, space-separated (default all six; "none": only Redis, Tansu
# and the stand-ins, the stages started later with --start NAME, as herald-bench stage does).
# HERALD_LOCAL_STAGE_REDIS_URL: the Redis URL the stages get instead of the stack's own (herald-bench pipeline
# --redis-rtt-ms points it at a relay that delays each way).
# Everything (pids, logs, keys, the stand-in's record) lives under run/local/ (gitignored).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

keep=0; build=1; setup=1; stop_only=0; config=release; prometheus=0; up=0; redis_aof=0; kafka_s3=0; redis_cluster=0
broker="${HERALD_LOCAL_BROKER:-dev}"
action=""; target=""; sig=""
RUN="${HERALD_LOCAL_RUN:-$root/run/local}"
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=1 ;;
    --no-build) build=0 ;;
    --no-setup) setup=0 ;;
    --stop) stop_only=1 ;;
    --debug) config=debug ;;
    --up) up=1 ;;
    --with-prometheus) prometheus=1 ;;
    --persistent) redis_aof=1; kafka_s3=1 ;;
    --redis-aof) redis_aof=1 ;;
    --kafka-s3) kafka_s3=1 ;;
    --broker) broker="$2"; shift ;;
    --redis-cluster) redis_cluster=1 ;;
    --run-dir) RUN="$2"; shift ;;
    --restart|--start) action="${1#--}"; target="$2"; shift ;;
    --signal) action=signal; sig="$2"; target="$3"; shift 2 ;;
    -h|--help) sed -n '2,57p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
case "$RUN" in /*) ;; *) RUN="$PWD/$RUN" ;; esac
[ "$kafka_s3" = 1 ] && broker=tansu
case "$broker" in dev|tansu) ;; *) echo "--broker: expected dev or tansu, got $broker" >&2; exit 2 ;; esac

REDIS_PORT="${HERALD_LOCAL_REDIS_PORT:-16479}"
KAFKA_PORT="${HERALD_LOCAL_KAFKA_PORT:-19192}"
APNS_PORT="${HERALD_LOCAL_APNS_PORT:-18543}"
FCM_PORT="${HERALD_LOCAL_FCM_PORT:-18544}"
METRICS_BASE="${HERALD_LOCAL_METRICS_BASE:-19200}"
STAGES=(ingest resolve suppress render send registry)
if [ -n "${HERALD_LOCAL_METRICS_BASE:-}" ]; then OTLP_PORT="${HERALD_LOCAL_OTLP_PORT:-$((METRICS_BASE + 8))}"
else OTLP_PORT="${HERALD_LOCAL_OTLP_PORT:-4318}"; fi
TRACING="${HERALD_TRACING:-on}"
TRACE_RATIO="${HERALD_TRACE_RATIO:-1.0}"
case "$TRACING" in on|off) ;; *) echo "HERALD_TRACING: expected on or off, got $TRACING" >&2; exit 2 ;; esac
# The demo webhook's Basic password: the pipeline file names this variable (a stage restarted by --restart or
# --start needs it too, so it is set for every invocation).
export HERALD_WEBHOOK_PASSWORD="local-demo-secret"
# The API key herald-mock-fcm's /translate (the LibreTranslate stand-in) requires, and app1's translator sends.
export HERALD_TRANSLATOR_API_KEY="local-demo-translator-key"
DEMO="$root/pipelines/examples/demo"

say() { printf '\033[1m[local-stack]\033[0m %s\n' "$*" >&2; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

stop_pid() { # name pidfile
  local pidfile="$2" pid
  [ -f "$pidfile" ] || return 0
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then say "$1 did not stop within 10 s; killing"; kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$pidfile"
}

stop_all() {
  local s
  # A --keep run waiting in another shell: it stops the rest itself; whatever is left is stopped below.
  local keeper
  keeper="$(cat "$RUN/keep.pid" 2>/dev/null || true)"
  if [ -n "$keeper" ] && [ "$keeper" != "$$" ] && kill -0 "$keeper" 2>/dev/null; then
    kill -TERM "$keeper" 2>/dev/null || true
    for _ in $(seq 1 600); do kill -0 "$keeper" 2>/dev/null || break; sleep 0.1; done
  fi
  [ "$keeper" = "$$" ] || rm -f "$RUN/keep.pid"
  for s in "${STAGES[@]}"; do stop_pid "herald-$s" "$RUN/$s.pid"; done
  local extra; for extra in "$RUN"/*@*.pid; do [ -f "$extra" ] && stop_pid "$(basename "$extra" .pid)" "$extra"; done
  stop_pid herald-mock-apns "$RUN/mock-apns.pid"
  stop_pid herald-mock-fcm "$RUN/mock-fcm.pid"
  stop_pid herald-mock-otlp "$RUN/mock-otlp.pid"
  stop_pid redis-server "$RUN/redis.pid"
  local n; for n in 0 1 2 3 4 5; do stop_pid "redis-server (cluster node $n)" "$RUN/redis-$n.pid"; done
  bash scripts/local-prometheus.sh stop
  [ -f "$RUN/tansu/tansu.pid" ] && bash scripts/tansu.sh stop "$KAFKA_PORT" "$RUN/tansu" >/dev/null || true
  [ -f "$RUN/kafka/dev-broker.pid" ] && bash scripts/dev-broker.sh stop "$KAFKA_PORT" "$RUN/kafka" >/dev/null || true
  [ -f "$RUN/tansu/moto.pid" ] && bash scripts/tansu.sh stop-storage "$KAFKA_PORT" "$RUN/tansu" >/dev/null || true
}

BIN="${HERALD_LOCAL_BIN:-$root/.build/$config}"   # HERALD_LOCAL_BIN: binaries from elsewhere (tests)
if [ -n "$action" ] && [ -f "$RUN/stack.env" ]; then   # a running stack keeps the storage and binaries it started with
  # (a stage restarted in a stack started with --debug must not run .build/release's binaries, or fail without them)
  started_bin="$(sed -n 's/^BIN=//p' "$RUN/stack.env" | head -n1)"
  [ -n "$started_bin" ] && [ -z "${HERALD_LOCAL_BIN:-}" ] && BIN="$started_bin"
  redis_aof="$(sed -n 's/^REDIS_AOF=//p' "$RUN/stack.env" | head -n1)"; redis_aof="${redis_aof:-0}"
  kafka_s3="$(sed -n 's/^KAFKA_S3=//p' "$RUN/stack.env" | head -n1)"; kafka_s3="${kafka_s3:-0}"
  broker="$(sed -n 's/^BROKER=//p' "$RUN/stack.env" | head -n1)"; broker="${broker:-dev}"
  redis_cluster="$(sed -n 's/^REDIS_CLUSTER=//p' "$RUN/stack.env" | head -n1)"; redis_cluster="${redis_cluster:-0}"
  # ... and its tracing (a restarted stage exports to the same receiver, at the same ratio)
  TRACING="$(sed -n 's/^TRACING=//p' "$RUN/stack.env" | head -n1)"; TRACING="${TRACING:-off}"
  OTLP_PORT="$(sed -n 's/^OTLP_PORT=//p' "$RUN/stack.env" | head -n1)"; OTLP_PORT="${OTLP_PORT:-4318}"
  TRACE_RATIO="$(sed -n 's/^TRACE_RATIO=//p' "$RUN/stack.env" | head -n1)"; TRACE_RATIO="${TRACE_RATIO:-1.0}"
  # ... and the executables it started with (a stack started with --debug restarts debug binaries)
  if [ -z "${HERALD_LOCAL_BIN:-}" ]; then
    stack_bin="$(sed -n 's/^BIN=//p' "$RUN/stack.env" | head -n1)"; BIN="${stack_bin:-$BIN}"
  fi
fi

CLUSTER_NODES=6   # --redis-cluster: 3 masters, each with one replica
if [ "$redis_cluster" = 1 ]; then
  REDIS_URL="redis+cluster://127.0.0.1:$REDIS_PORT,127.0.0.1:$((REDIS_PORT + 1)),127.0.0.1:$((REDIS_PORT + 2))"
else
  REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
fi
# The stages' Redis: HERALD_LOCAL_STAGE_REDIS_URL puts something between them and Redis (herald-bench pipeline
# --redis-rtt-ms: a relay that delays each way); the script itself and the tools it runs use Redis directly.
STAGE_REDIS_URL="${HERALD_LOCAL_STAGE_REDIS_URL:-$REDIS_URL}"

# One cluster node (0-5) on REDIS_PORT + n, its bus on that + 10000; its nodes.conf keeps its identity across restarts.
start_redis_node() {
  local n="$1" port=$((REDIS_PORT + $1)) extra=(--save '' --appendonly no)
  [ "$redis_aof" = 1 ] && extra=(--save '' --appendonly yes --appendfsync always --appenddirname "appendonlydir-$n")
  mkdir -p "$RUN/redis-cluster"
  redis-server --port "$port" --bind 127.0.0.1 "${extra[@]}" --dir "$RUN/redis-cluster" --daemonize no \
    --cluster-enabled yes --cluster-config-file "$RUN/redis-cluster/nodes-$n.conf" --cluster-port $((port + 10000)) \
    --cluster-node-timeout 3000 >>"$RUN/logs/redis-$n.log" 2>&1 &
  echo $! >"$RUN/redis-$n.pid"
  for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
}

cluster_ok() { # every running node reports cluster_state:ok with all slots served
  local n port
  for n in $(seq 0 $((CLUSTER_NODES - 1))); do
    port=$((REDIS_PORT + n))
    kill -0 "$(cat "$RUN/redis-$n.pid" 2>/dev/null || echo 0)" 2>/dev/null || continue
    redis-cli -p "$port" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || return 1
    redis-cli -p "$port" cluster info 2>/dev/null | grep -q 'cluster_slots_ok:16384' || return 1
  done
}

start_redis_cluster() {
  local n nodes=()
  for n in $(seq 0 $((CLUSTER_NODES - 1))); do start_redis_node "$n"; nodes+=("127.0.0.1:$((REDIS_PORT + n))"); done
  if ! redis-cli -p "$REDIS_PORT" cluster info | grep -q 'cluster_known_nodes:6'; then
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >>"$RUN/logs/redis-cluster-create.log" 2>&1
  fi
  for _ in $(seq 1 600); do cluster_ok && return 0; sleep 0.1; done
  say "the Redis cluster did not reach cluster_state:ok"; return 1
}

start_redis() {
  if [ "$redis_cluster" = 1 ]; then start_redis_cluster; return; fi
  local extra=(--save '' --appendonly no)
  [ "$redis_aof" = 1 ] && extra=(--save '' --appendonly yes --appendfsync always)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 "${extra[@]}" --dir "$RUN" --daemonize no \
    >>"$RUN/logs/redis.log" 2>&1 &
  echo $! >"$RUN/redis.pid"
  for _ in $(seq 1 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
}

# Every broker of the local cluster, so that a process starting while one broker is down still finds the others.
kafka_bootstrap() {
  if [ "$broker" = dev ]; then echo "127.0.0.1:$KAFKA_PORT,127.0.0.1:$((KAFKA_PORT + 1)),127.0.0.1:$((KAFKA_PORT + 2))"
  else echo "127.0.0.1:$KAFKA_PORT"; fi
}

start_kafka() {
  if [ "$broker" = dev ]; then
    # The stages' groups (bulk and priority lanes), so that a broker taken down hands the groups it coordinates on.
    local groups="" s
    for s in "${STAGES[@]}"; do groups+=" --group herald-$s --group herald-$s-priority"; done
    HERALD_BIN_DIR="$BIN" HERALD_DEV_BROKER_ARGS="$groups ${HERALD_DEV_BROKER_ARGS:-}" \
      bash scripts/dev-broker.sh start "$KAFKA_PORT" "$RUN/kafka" >&2
  elif [ "$kafka_s3" = 1 ]; then
    HERALD_TANSU_STORAGE=s3 bash scripts/tansu.sh start "$KAFKA_PORT" "$RUN/tansu" >&2
  else
    bash scripts/tansu.sh start "$KAFKA_PORT" "$RUN/tansu" >&2
  fi
}

mock_record_file() { # the first start writes apns-record.jsonl, each restart the next apns-record.N.jsonl
  local n=1 f="$RUN/apns-record.jsonl"
  while [ -e "$f" ] && [ "${1:-}" = next ]; do n=$((n + 1)); f="$RUN/apns-record.$n.jsonl"; done
  echo "$f"
}

start_mock() { # [record file]
  local record="${1:-$RUN/apns-record.jsonl}"
  "$BIN/herald-mock-apns" --port "$APNS_PORT" --cert "$RUN/apns-cert.pem" --key "$RUN/apns-key.pem" \
    --auth-key "KEY1234567:ABCDE12345:$RUN/AuthKey.pub.pem" --auth-key "KEY7654321:ABCDE12345:$RUN/AuthKey.pub.pem" \
    --topic com.example.chat --topic com.example.chat.beta --topic com.example.messenger --topic com.example.calls \
    --dead-token dead000000000000000000000000000000000000000000000000000000000007 \
    --record "$record" --metrics-port "$((METRICS_BASE + 9))" ${HERALD_LOCAL_MOCK_ARGS:-} \
    >>"$RUN/logs/mock-apns.log" 2>&1 &
  echo $! >"$RUN/mock-apns.pid"
  for _ in $(seq 1 50); do port_open "$APNS_PORT" && break; sleep 0.1; done
}

# The OTLP receiver stand-in the stages export their spans to (tracing on).
start_otlp() {
  "$BIN/herald-mock-otlp" --port "$OTLP_PORT" --max-spans "${HERALD_LOCAL_OTLP_MAX_SPANS:-50000}" \
    >>"$RUN/logs/mock-otlp.log" 2>&1 &
  echo $! >"$RUN/mock-otlp.pid"
  for _ in $(seq 1 50); do port_open "$OTLP_PORT" && break; sleep 0.1; done
}

stage_index() { local i=0 s; for s in "${STAGES[@]}"; do i=$((i + 1)); [ "$s" = "$1" ] && { echo "$i"; return; }; done; echo 0; }
# The metrics port of a stage or of a stage's extra process STAGE@N (N 1-3): base+1 .. base+6 for the stages,
# base+40+10(N-1)+1 .. for the extra processes (what an autoscaler's added pods are; same command line and
# environment, their own metrics port and instance name).
stage_port() {
  local s="$1" base="${1%@*}" n=0
  [ "$s" != "$base" ] && n="${s#*@}"
  if [ "$n" = 0 ]; then echo $((METRICS_BASE + $(stage_index "$base"))); else echo $((METRICS_BASE + 40 + 10 * (n - 1) + $(stage_index "$base"))); fi
}

# One stage in the background; a watcher subshell writes its exit status to RUN/<stage>.exit (only while the pid
# file still names that process).
start_stage() {
  local s="$1" stage="${1%@*}" port; port="$(stage_port "$1")"
  rm -f "$RUN/$s.pid" "$RUN/$s.exit"
  (
    # The watcher must not run the script's EXIT trap, nor be stopped by set -e on the stage's status.
    trap - EXIT; set +e
    # The stages warn about HERALD_* keys they do not know: the HERALD_LOCAL_* ones are for this script only.
    env -u HERALD_LOCAL_REDIS_PORT -u HERALD_STAGE_ENDPOINTS -u HERALD_LOCAL_KAFKA_PORT -u HERALD_LOCAL_APNS_PORT -u HERALD_LOCAL_METRICS_BASE \
        -u HERALD_LOCAL_MOCK_ARGS -u HERALD_LOCAL_RUN -u HERALD_LOCAL_BIN -u HERALD_LOCAL_FCM_PORT -u HERALD_LOCAL_STAGES \
        -u HERALD_LOCAL_STAGE_REDIS_URL -u HERALD_LOCAL_SESSION_TIMEOUT_MS -u HERALD_LOCAL_BROKER \
        -u HERALD_LOCAL_OTLP_PORT -u HERALD_LOCAL_OTLP_MAX_SPANS -u HERALD_TRACING -u HERALD_TRACE_RATIO \
        HERALD_PIPELINE="$RUN/pipeline.yaml" HERALD_KAFKA_BROKERS="$(kafka_bootstrap)" \
        HERALD_REDIS_URL="$STAGE_REDIS_URL" HERALD_METRICS_HOST=127.0.0.1 \
        HERALD_METRICS_PORT="$port" HERALD_KAFKA_SESSION_TIMEOUT_MS="${HERALD_LOCAL_SESSION_TIMEOUT_MS:-3000}" HERALD_KAFKA_PROFILE=local \
        HERALD_INSTANCE="local-${s/@/-}" HERALD_SHUTDOWN_DEADLINE_MS=10000 \
        $( [ "$TRACING" = on ] && echo "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$OTLP_PORT OTEL_TRACES_SAMPLER_ARG=$TRACE_RATIO" ) \
        $( [ "$s" = registry ] && echo "HERALD_API_PORT=$((METRICS_BASE + 7)) HERALD_API_TOKENS=local=$(cat "$RUN/api-token")" ) \
        $( [ "$stage" = suppress ] && echo "HERALD_TRANSLATOR_CA_FILE=$RUN/apns-cert.pem" ) \
        $( [ "$stage" = send ] && echo "HERALD_APNS_HOST=127.0.0.1:$APNS_PORT HERALD_APNS_CA_FILE=$RUN/apns-cert.pem HERALD_SEND_RETRY_INITIAL_MS=500 HERALD_FCM_HOST=127.0.0.1:$FCM_PORT HERALD_FCM_CA_FILE=$RUN/apns-cert.pem HERALD_WEBHOOK_CA_FILE=$RUN/apns-cert.pem HERALD_WEBPUSH_CA_FILE=$RUN/apns-cert.pem" ) \
        "$BIN/herald-$stage" >>"$RUN/logs/$s.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$RUN/$s.pid.tmp"; mv "$RUN/$s.pid.tmp" "$RUN/$s.pid"
    wait "$pid"; rc=$?
    # A stage restarted meanwhile (its pid file names another process) must not be marked exited: a watcher
    # slowed by a busy host may get here after the restart.
    [ "$(cat "$RUN/$s.pid" 2>/dev/null)" = "$pid" ] && echo "$rc" >"$RUN/$s.exit"
  ) >/dev/null 2>&1 &
  for _ in $(seq 1 50); do [ -f "$RUN/$s.pid" ] && break; sleep 0.02; done
}

wait_stage_ready() { # stage; 0 when /readyz answers (a loaded machine's debug build may take a minute)
  local s="$1" port; port="$(stage_port "$1")"
  for _ in $(seq 1 900); do
    if curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then return 0; fi
    kill -0 "$(cat "$RUN/$s.pid" 2>/dev/null || echo 0)" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

write_stack_env() {
  {
    echo "RUN=$RUN"; echo "BIN=$BIN"; echo "REDIS_AOF=$redis_aof"; echo "KAFKA_S3=$kafka_s3"; echo "BROKER=$broker"
    echo "REDIS_CLUSTER=$redis_cluster"; echo "REDIS_URL=$REDIS_URL"
    echo "REDIS_PORT=$REDIS_PORT"; echo "KAFKA_PORT=$KAFKA_PORT"; echo "APNS_PORT=$APNS_PORT"; echo "FCM_PORT=$FCM_PORT"
    echo "METRICS_BASE=$METRICS_BASE"; echo "MOCK_METRICS_PORT=$((METRICS_BASE + 9))"
    echo "API_PORT=$((METRICS_BASE + 7))"; echo "API_TOKEN=$(cat "$RUN/api-token")"
    echo "STAGES=${STAGES[*]}"
    echo "TRACING=$TRACING"; echo "OTLP_PORT=$OTLP_PORT"; echo "TRACE_RATIO=$TRACE_RATIO"
  } >"$RUN/stack.env"
}

# --- One component of a running stack -----------------------------------------------------------------
if [ -n "$action" ]; then
  [ -f "$RUN/stack.env" ] || { echo "no running stack in $RUN (start one with --up)" >&2; exit 1; }
  case "$target" in
    redis) pidfile="$RUN/redis.pid" ;;
    redis-[0-5]) pidfile="$RUN/$target.pid" ;;
    kafka) if [ "$broker" = dev ]; then pidfile="$RUN/kafka/dev-broker.pid"; else pidfile="$RUN/tansu/tansu.pid"; fi ;;
    mock-apns) pidfile="$RUN/mock-apns.pid" ;;
    mock-otlp) pidfile="$RUN/mock-otlp.pid" ;;
    ingest|resolve|suppress|render|send|registry) pidfile="$RUN/$target.pid" ;;
    ingest@[1-3]|resolve@[1-3]|suppress@[1-3]|render@[1-3]|send@[1-3]|registry@[1-3]) pidfile="$RUN/$target.pid" ;;
    *) echo "unknown component $target" >&2; exit 2 ;;
  esac
  case "$action" in
    signal)
      kill -s "$sig" "$(cat "$pidfile")" ;;
    restart|start)
      if [ "$action" = restart ]; then
        case "$target" in
          kafka) if [ "$broker" = dev ]; then bash scripts/dev-broker.sh stop "$KAFKA_PORT" "$RUN/kafka" >/dev/null
                 else bash scripts/tansu.sh stop "$KAFKA_PORT" "$RUN/tansu" >/dev/null; fi ;;
          *) stop_pid "$target" "$pidfile" ;;
        esac
      fi
      case "$target" in
        redis) start_redis ;;
        redis-[0-5]) start_redis_node "${target#redis-}" ;;
        kafka) start_kafka ;;
        mock-apns) start_mock "$(mock_record_file next)" ;;
        mock-otlp) start_otlp ;;
        *) for _ in $(seq 1 100); do [ -f "$pidfile" ] || break; [ -f "$RUN/$target.exit" ] || ! kill -0 "$(cat "$pidfile" 2>/dev/null || echo 0)" 2>/dev/null && break; sleep 0.05; done
           start_stage "$target"
           wait_stage_ready "$target" || { say "herald-$target is not ready"; exit 1; } ;;
      esac
      say "$target ${action}ed" ;;
  esac
  exit 0
fi

mkdir -p "$RUN/logs"
stop_all   # leftovers of a previous run
rm -f "$RUN"/apns-record*.jsonl "$RUN"/*.exit "$RUN/appendonly.aof" "$RUN/stack.env"; rm -rf "$RUN/appendonlydir" "$RUN/redis-cluster"
[ "$stop_only" = 1 ] || trap 'code=$?; { [ "$keep" = 1 ] || [ "$up" = 1 ]; } && [ "$code" = 0 ] || stop_all; exit $code' EXIT
if [ "$stop_only" = 1 ]; then say "stopped"; exit 0; fi
redis_ports=("$REDIS_PORT")
[ "$redis_cluster" = 1 ] && for n in 1 2 3 4 5; do redis_ports+=($((REDIS_PORT + n)) $((REDIS_PORT + n + 10000))); done
[ "$redis_cluster" = 1 ] && redis_ports+=($((REDIS_PORT + 10000)))
kafka_ports=("$KAFKA_PORT")
[ "$broker" = dev ] && kafka_ports+=($((KAFKA_PORT + 1)) $((KAFKA_PORT + 2)) $((KAFKA_PORT + 100)))
otlp_ports=(); [ "$TRACING" = on ] && otlp_ports=("$OTLP_PORT")
for p in "${redis_ports[@]}" "${kafka_ports[@]}" "$APNS_PORT" "$FCM_PORT" ${otlp_ports[@]+"${otlp_ports[@]}"}; do
  if port_open "$p"; then echo "port $p is in use by another program; set HERALD_LOCAL_*_PORT" >&2; exit 1; fi
done

if [ "$setup" = 1 ]; then bash scripts/setup.sh; fi
export PKG_CONFIG_PATH="/usr/local/lib/pkgconfig:${PKG_CONFIG_PATH:-}"
if [ "$build" = 1 ]; then
  say "building ($config)"
  for p in "${STAGES[@]/#/herald-}" herald-mock-apns herald-mock-fcm herald-mock-otlp herald-dev-broker; do
    if ! swift build -c "$config" --product "$p" >"$RUN/logs/build.log" 2>&1; then
      grep -E "error" "$RUN/logs/build.log" >&2 || tail -20 "$RUN/logs/build.log" >&2; exit 1
    fi
  done
  swift build -c "$config" --product heraldctl >"$RUN/logs/build-heraldctl.log" 2>&1 \
    || say "heraldctl did not build (see run/local/logs/build-heraldctl.log); the simulate comparison is skipped"
fi

# --- Redis and the Kafka broker --------------------------------------------------------------------
: >"$RUN/logs/redis.log"
start_redis
if [ "$redis_cluster" = 1 ]; then
  say "redis cluster (3 masters, 3 replicas) on 127.0.0.1:$REDIS_PORT-$((REDIS_PORT + 5)): $REDIS_URL"
else
  say "redis on 127.0.0.1:$REDIS_PORT$( [ "$redis_aof" = 1 ] && echo ' (append-only file)')"
fi
start_kafka
if [ "$broker" = dev ]; then
  say "herald-dev-broker (3 brokers) on 127.0.0.1:$KAFKA_PORT-$((KAFKA_PORT + 2)), control API on :$((KAFKA_PORT + 100))"
else
  say "tansu on 127.0.0.1:$KAFKA_PORT"
fi
bash "scripts/$( [ "$broker" = dev ] && echo dev-broker || echo tansu ).sh" topics "$KAFKA_PORT" chat.events:4 herald.ingested:4 herald.resolved:4 herald.deliverable:4 \
  herald.outbound:4 herald.retry:4 herald.dlq:1 herald.token-feedback:2 herald.registry:2 \
  herald.ingested.priority:4 herald.resolved.priority:4 herald.deliverable.priority:4 herald.outbound.priority:4 \
  herald.retry.priority:4 >/dev/null \
  || { say "cannot create the topics on 127.0.0.1:$KAFKA_PORT (above; the broker's log in $RUN/kafka or $RUN/tansu)"; exit 1; }

# --- The registry API's bearer token (one per run directory) -------------------------------------------
[ -s "$RUN/api-token" ] || { umask 077; openssl rand -hex 24 >"$RUN/api-token"; }

# --- Keys for the stand-in: TLS certificate and a .p8-style P-256 provider key ----------------------
if [ ! -f "$RUN/apns-cert.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -keyout "$RUN/apns-key.pem" -out "$RUN/apns-cert.pem" -subj /CN=localhost \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$RUN/AuthKey.p8" 2>/dev/null
  openssl pkey -in "$RUN/AuthKey.p8" -pubout -out "$RUN/AuthKey.pub.pem" 2>/dev/null
fi
# The FCM service account (an RSA key; its token endpoint is herald-mock-fcm) and the webhook password.
if [ ! -f "$RUN/fcm-sa.key" ]; then
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$RUN/fcm-sa.key" 2>/dev/null
fi
python3 - "$RUN/fcm-sa.key" "$FCM_PORT" >"$RUN/fcm-sa.json" <<'PY'
import json, sys
print(json.dumps({"type": "service_account", "project_id": "herald-demo", "private_key_id": "demo-key",
                  "private_key": open(sys.argv[1]).read(), "client_email": "herald@herald-demo.iam.gserviceaccount.com",
                  "token_uri": "https://127.0.0.1:%s/token" % sys.argv[2]}))
PY
# Web Push: app1's VAPID key, and a browser (u10 in c1): its subscription's key and secret, which the stand-in's push
# service decrypts with (RUN/webpush/demo-browser.json). The demo state, with the browser added, goes to RUN/state.json.
if [ ! -f "$RUN/vapid.pem" ]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$RUN/vapid.pem" 2>/dev/null
fi
mkdir -p "$RUN/webpush"
if [ ! -f "$RUN/webpush/browser.pem" ]; then
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$RUN/webpush/browser.pem" 2>/dev/null
  head -c 16 /dev/urandom >"$RUN/webpush/browser.auth"
fi
b64url() { base64 -w0 | tr '+/' '-_' | tr -d '='; }
wp_p256dh="$(openssl pkey -in "$RUN/webpush/browser.pem" -pubout -outform DER 2>/dev/null | tail -c 65 | b64url)"
wp_auth="$(b64url <"$RUN/webpush/browser.auth")"
python3 - "$DEMO/state.json" "$RUN" "$FCM_PORT" "$wp_p256dh" "$wp_auth" <<'PY'
import json, sys
state, run, port, p256dh, auth = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
json.dump({"private_key": open(run + "/webpush/browser.pem").read(), "auth": auth},
          open(run + "/webpush/demo-browser.json", "w"))
endpoint = "https://127.0.0.1:%s/wp/demo-browser" % port
state["app1"]["users"]["u10"] = {"devices": [{"token": "%s.%s.%s" % (p256dh, auth, endpoint), "kind": "webpush",
                                             "registered_at": 1731000000000}]}
state["app1"]["conversations"]["c1"]["members"].append("u10")
json.dump(state, open(run + "/state.json", "w"), indent=1)
PY
# The example pipeline with the local keys (app2's certificate credential becomes a token one here), the
# FCM, webhook and Web Push providers pointed at herald-mock-fcm, and app1's translator turned on against its
# /translate.
sed -e "s#/etc/herald/AuthKey_KEY1234567.p8#$RUN/AuthKey.p8#; s#/etc/herald/AuthKey_KEY7654321.p8#$RUN/AuthKey.p8#" \
    -e "s#/etc/herald/firebase-service-account.json#$RUN/fcm-sa.json#" \
    -e "s#https://push.example.com/herald/webhook#https://127.0.0.1:$FCM_PORT/webhook/custom-1#" \
    -e "s#https://push.example.com/herald/cometchat#https://127.0.0.1:$FCM_PORT/webhook/comet-custom#" \
    -e "s#/etc/herald/vapid.pem#$RUN/vapid.pem#" \
    -e "s#^    \# translator: {url: \"[^\"]*\"#    translator: {url: \"https://127.0.0.1:$FCM_PORT\"#" \
    -e "s#certificate_file: /etc/herald/messenger.pem#team_id: ABCDE12345\n        key_id: KEY1234567\n        key_file: $RUN/AuthKey.p8#" \
    -e "/private_key_file: \/etc\/herald\/messenger.key/d" \
    "${HERALD_LOCAL_PIPELINE_SRC:-pipelines/example.yaml}" >"$RUN/pipeline.yaml"
if [ "${HERALD_LOCAL_COUNTS-}" = off ]; then
  sed -i -E 's#^(    counts: )true#\1false#' "$RUN/pipeline.yaml"
fi
if [ "$kafka_s3" = 1 ]; then
  # Tansu 0.6.0's S3 engine can acknowledge a batch of an idempotent producer and never store it when it is
  # stopped mid-request (scripts/repro/tansu-s3-idempotence.sh; docs/kafka.md, "Tansu on S3"): on this broker
  # the stages produce without idempotence, one request in flight per connection (order kept; a retried request
  # may duplicate a record, which send's claims absorb).
  sed -i -e 's#^  session_timeout_ms: \(.*\)$#  session_timeout_ms: \1\n  properties: {enable.idempotence: "false", max.in.flight.requests.per.connection: "1"}#' "$RUN/pipeline.yaml"
  # Its fetches read S3 objects and take longer than the local profile's 10-50 ms fetch waits, so a short wait
  # answers empty every time and nothing is consumed: 500 ms waits on this engine (the stages log the override).
  sed -i -e 's#^  session_timeout_ms: \(.*\)$#  session_timeout_ms: \1\n  flow: {fetch_wait_ms: 500, linger_ms: 5}\n  priority_flow: {fetch_wait_ms: 500, linger_ms: 5}#' "$RUN/pipeline.yaml"
fi

# --- The APNs stand-in -------------------------------------------------------------------------------
: >"$RUN/logs/mock-apns.log"
start_mock "$RUN/apns-record.jsonl"
say "herald-mock-apns on 127.0.0.1:$APNS_PORT (JWT checked against $RUN/AuthKey.pub.pem)"

# --- The FCM and webhook stand-in --------------------------------------------------------------------
"$BIN/herald-mock-fcm" --port "$FCM_PORT" --cert "$RUN/apns-cert.pem" --key "$RUN/apns-key.pem" \
  --project herald-demo --client-email herald@herald-demo.iam.gserviceaccount.com \
  --service-public-key "$RUN/fcm-sa.key" --webhook-user herald --webhook-password "$HERALD_WEBHOOK_PASSWORD" \
  --translate-api-key "$HERALD_TRANSLATOR_API_KEY" \
  --webpush-keys "$RUN/webpush" --record "$RUN/fcm-record.jsonl" >"$RUN/logs/mock-fcm.log" 2>&1 &
echo $! >"$RUN/mock-fcm.pid"
: >"$RUN/fcm-record.jsonl"
for _ in $(seq 1 50); do port_open "$FCM_PORT" && break; sleep 0.1; done
say "herald-mock-fcm on 127.0.0.1:$FCM_PORT (FCM messages:send, /token checking the RS256 assertion, /webhook/custom-1, Web Push /wp/demo-browser, LibreTranslate's /translate)"

# --- The OTLP trace receiver --------------------------------------------------------------------------
if [ "$TRACING" = on ] && [ ! -x "$BIN/herald-mock-otlp" ]; then
  say "$BIN/herald-mock-otlp is not built: tracing off (swift build --product herald-mock-otlp)"; TRACING=off
fi
if [ "$TRACING" = on ]; then
  : >"$RUN/logs/mock-otlp.log"
  start_otlp
  port_open "$OTLP_PORT" || { say "herald-mock-otlp did not start on :$OTLP_PORT:"; tail -5 "$RUN/logs/mock-otlp.log" >&2; exit 1; }
  # Spans leave the stages every 500 ms instead of every 5 s, so an event's trace is there soon after it.
  grep -q '^tracing:' "$RUN/pipeline.yaml" || printf 'tracing:\n  export_interval_ms: 500\n' >>"$RUN/pipeline.yaml"
  say "herald-mock-otlp on 127.0.0.1:$OTLP_PORT (the stages' spans, $TRACE_RATIO of the events traced; heraldctl trace EVENT --receiver http://127.0.0.1:$OTLP_PORT)"
fi

# --- The six stages ----------------------------------------------------------------------------------
UP_STAGES=("${STAGES[@]}")
if [ "$up" = 1 ] && [ -n "${HERALD_LOCAL_STAGES:-}" ]; then
  read -r -a UP_STAGES <<<"${HERALD_LOCAL_STAGES/none/}"
  for s in "${UP_STAGES[@]}"; do
    [ "$(stage_index "$s")" != 0 ] || { echo "HERALD_LOCAL_STAGES: unknown stage $s" >&2; exit 2; }
  done
fi
for s in "${STAGES[@]}"; do : >"$RUN/logs/$s.log"; done
for s in "${UP_STAGES[@]}"; do start_stage "$s"; done
not_ready=0
for s in "${UP_STAGES[@]}"; do
  i="$(stage_index "$s")"
  if wait_stage_ready "$s"; then say "herald-$s ready (metrics on :$((METRICS_BASE + i)))"
  else not_ready=1; say "herald-$s is not ready; last log lines:"; tail -5 "$RUN/logs/$s.log" >&2; fi
done
write_stack_env
say "registry API on http://127.0.0.1:$((METRICS_BASE + 7))/v1 (Authorization: Bearer $(cat "$RUN/api-token"))"
endpoints="$(for i in 1 2 3 4 5 6; do printf 'http://127.0.0.1:%s,' "$((METRICS_BASE + i))"; done)"
say "for heraldctl: export HERALD_KAFKA_BROKERS=$(kafka_bootstrap) HERALD_REDIS_URL=$REDIS_URL HERALD_STAGE_ENDPOINTS=${endpoints%,}"
[ "$prometheus" = 1 ] && bash scripts/local-prometheus.sh start
if [ "$up" = 1 ]; then
  [ "$not_ready" = 0 ] || exit 1
  say "up: $RUN/stack.env (stop with: scripts/local-stack.sh --stop --run-dir $RUN)"
  exit 0
fi

metric_sum() { # port metric-name [label filter]
  curl -fs "http://127.0.0.1:$1/metrics" 2>/dev/null | grep "^$2" | grep -- "${3:-}" | awk '{s += $NF} END {print s + 0}'
}

# --- State: the demo fixture as herald.registry records (applied by herald-registry) -----------------
now_ms=$(($(date +%s%N) / 1000000))
python3 - "$RUN/state.json" "$now_ms" >"$RUN/registry.tsv" <<'PY'
import json, sys
apps = json.load(open(sys.argv[1])); now = int(sys.argv[2])
def out(key, rec): print(key + "\t" + json.dumps(rec, separators=(",", ":")))
for app, fx in apps.items():
    for user, st in fx.get("users", {}).items():
        out(user, {"op": "unregister_all", "app_id": app, "user": user})
        for d in st.get("devices", []):
            out(user, {"op": "register_device", "app_id": app, "user": user, "device": d})
        if "preferences" in st: out(user, {"op": "set_preferences", "app_id": app, "user": user, "preferences": st["preferences"]})
        out(user, {"op": "set_presence", "app_id": app, "user": user, "online": st.get("online", []), "ttl_ms": 600000})
        if "unread" in st: out(user, {"op": "set_unread", "app_id": app, "user": user, "unread": st["unread"]})
    for conv, c in fx.get("conversations", {}).items():
        out(conv, {"op": "set_members", "app_id": app, "conversation": conv, "members": c["members"]})
PY
expected=$(wc -l <"$RUN/registry.tsv")
kcat -P -b "127.0.0.1:$KAFKA_PORT" -t herald.registry -K $'\t' <"$RUN/registry.tsv"
for _ in $(seq 1 300); do
  [ "$(metric_sum $((METRICS_BASE + 6)) herald_registry_ops_total)" -ge "$expected" ] && break; sleep 0.1
done
say "state loaded through herald.registry: $(metric_sum $((METRICS_BASE + 6)) herald_registry_ops_total) of $expected updates applied"

# --- Events: the seed scenarios ----------------------------------------------------------------------
python3 - "$DEMO/events.jsonl" "$now_ms" >"$RUN/events.tsv" <<'PY'
import json, sys
now = int(sys.argv[2])
for line in open(sys.argv[1]):
    if not line.strip(): continue
    e = json.loads(line); e["created_at"] = now
    print(e["conversation"]["id"] + "\t" + json.dumps(e, separators=(",", ":"), ensure_ascii=False))
PY
kcat -P -b "127.0.0.1:$KAFKA_PORT" -t chat.events -K $'\t' <"$RUN/events.tsv"
say "published $(wc -l <"$RUN/events.tsv") chat events; waiting for the pipeline"

# Wait until ingest consumed them all and send / registry are idle for 2 s.
last=""; still=0
for _ in $(seq 1 300); do
  cur="$(metric_sum $((METRICS_BASE + 1)) herald_consumed_total) $(metric_sum $((METRICS_BASE + 5)) herald_consumed_total) $(metric_sum $((METRICS_BASE + 6)) herald_consumed_total) $(wc -l <"$RUN/apns-record.jsonl" 2>/dev/null || echo 0) $(wc -l <"$RUN/fcm-record.jsonl" 2>/dev/null || echo 0)"
  if [ "$cur" = "$last" ] && [ "${cur%% *}" -ge "$(wc -l <"$RUN/events.tsv")" ]; then
    still=$((still + 1)); [ "$still" -ge 20 ] && break
  else still=0; last="$cur"; fi
  sleep 0.1
done

# --- Report ------------------------------------------------------------------------------------------
echo
echo "=== What the APNs stand-in received ($RUN/apns-record.jsonl) ==="
python3 - "$RUN/apns-record.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    p = r.get("payload") or {}
    aps = p.get("aps", {}) if isinstance(p, dict) else {}
    alert = aps.get("alert")
    body = alert.get("body") if isinstance(alert, dict) else alert
    extra = {k: v for k, v in p.items() if k != "aps"} if isinstance(p, dict) else {}
    print(f'{r["status"]} {r.get("reason") or "":<12} token {r["token"][:8]}… {r["push_type"]:<5} {r["topic"]:<26} '
          f'body={body!r} badge={aps.get("badge")} extra={json.dumps(extra, ensure_ascii=False)[:90]}')
PY

echo
echo "=== What the FCM, webhook and Web Push stand-in answered ($RUN/fcm-record.jsonl) ==="
python3 - "$RUN/fcm-record.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["endpoint"] == "token":
        print(f'{r["status"]} token endpoint {r["reason"] or "access token issued"}')
        continue
    if r["endpoint"] == "translate":
        try: asked, answer = json.loads(r["body"]), json.loads(r.get("answer") or "{}")
        except ValueError: asked, answer = {}, {}
        print(f'{r["status"]} {r["reason"] or "":<12} translate {asked.get("source")}->{asked.get("target")} '
              f'{asked.get("q")!r} -> {answer.get("translatedText", answer.get("error"))!r}')
        continue
    try: body = json.loads(r["body"])
    except ValueError: body = {}
    if r["endpoint"] == "webpush":
        h = r.get("headers", {})
        print(f'{r["status"]} {r["reason"][:12] if r["reason"] else "":<12} Web Push {r["target"]} urgency={h.get("urgency")} '
              f'ttl={h.get("ttl")} title={body.get("title")!r} body={body.get("body")!r} tag={body.get("tag")} (decrypted)')
    elif r["endpoint"] == "send":
        m = body.get("message", {})
        n = m.get("notification") or {}
        print(f'{r["status"]} {r["reason"] or "":<12} FCM token {r["target"][:8]}… priority={m.get("android", {}).get("priority")} '
              f'body={n.get("body") or m.get("data", {}).get("body")!r} data={json.dumps(m.get("data", {}), ensure_ascii=False)[:70]}')
    else:
        d = body.get("data", {})
        print(f'{r["status"]} {r["reason"] or "":<12} webhook {r["target"]} to={d.get("to")} '
              f'body={d.get("notificationDetails", {}).get("body")!r} type={d.get("notificationDetails", {}).get("type")}')
PY
echo
echo "=== Decisions per event and user (explain trail in Redis) ==="
cat >"$RUN/explain.py" <<'PY'
# The compact explain trail (docs/redis-keys.md, "The explain trail"): one line per entry in hourly logs, only
# what was not routine (the pipeline file's explain.full_trail keeps everything for chosen users, apps or events).
import json, subprocess, sys
events, ports = sys.argv[1], sys.argv[2:]
def cli(port, *args):
    return subprocess.run(["redis-cli", "-c", "-p", port, "--raw", *args], capture_output=True, text=True).stdout
def unescape(f):
    return f.replace("\\t", "\t").replace("\\n", "\n").replace("\\\\", "\\")
# Stages and decisions are stored as one-letter codes (ExplainCodes); a one-letter field is always a code.
STAGES = dict(s="suppress", d="send", r="resolve", n="render", i="ingest", g="registry")
DECISIONS = dict(v="deliver", s="suppress", d="delivered", r="retry", u="duplicate", t="token_dead", q="dlq",
                 e="error", x="drop", f="fanned_out", c="classified", y="read_sync")
latest = {}
# Every node is scanned (a cluster's keys are spread over its masters; a replica lists its master's again).
keys = sorted({k for port in ports for k in cli(port, "--scan", "--pattern", "herald:*:explain:*").split()})
for key in keys:
    app = key.split(":")[1]
    for line in cli(ports[0], "LRANGE", key, "0", "-1").split("\n"):
        f = line.split("\t")
        # Event to `at` always; status, attempt and count up to the last one present.
        if not 7 <= len(f) <= 10: continue
        f[3], f[4] = STAGES.get(f[3], f[3]), DECISIONS.get(f[4], f[4])
        event, user, token, stage, decision, reason, at, status, attempt, count = map(unescape, f + [""] * (10 - len(f)))
        latest[(app, event, user, token)] = (stage, decision, reason, status, count)
for line in open(events):
    if "\t" not in line: continue
    ev = json.loads(line.split("\t", 1)[1])
    rows = sorted((k, v) for k, v in latest.items() if k[0] == ev["app_id"] and k[1] == ev["event_id"])
    rows.sort(key=lambda r: (0 if not r[0][2] else 1 if not r[0][3] else 2, r[0][2], r[0][3]))
    if not rows:
        print("%-18s (no trail: delivered as expected outside the full trail, or dead-lettered at ingest)" % ev["event_id"]); continue
    for (app, event, user, token), (stage, decision, reason, status, count) in rows:
        who = "event" if not user and not token else user + (" " + token[:8] + "..." if token else "")
        extra = (" status=%s" % status) if status else ""
        extra += (" count=%s" % count) if count else ""
        print("%-18s %-20s %-9s %-11s %s%s" % (event, who, stage, decision, reason, extra))
PY
redis_nodes=("$REDIS_PORT"); [ "$redis_cluster" = 1 ] && redis_nodes=($(seq "$REDIS_PORT" $((REDIS_PORT + CLUSTER_NODES - 1))))
python3 "$RUN/explain.py" "$RUN/events.tsv" "${redis_nodes[@]}"
echo
echo "=== Counters (Prometheus /metrics of the stages) ==="
for i in 1 3 5; do
  curl -fs "http://127.0.0.1:$((METRICS_BASE + i))/metrics" | grep -E '^herald_(suppressed|dlq|apns_responses|retries)_total' || true
done
curl -fs "http://127.0.0.1:$((METRICS_BASE + 6))/metrics" | grep -E '^herald_registry_ops_total.*remove_dead_token' || true
echo
dead="dead000000000000000000000000000000000000000000000000000000000007"
if u7_devices=$(redis-cli -c -p "$REDIS_PORT" HGET 'herald:app1:user:{u7}:state' d) && ! grep -q "$dead" <<<"$u7_devices"; then
  echo "u7's token ${dead:0:8}… answered 410 and was removed from Redis by herald-registry (token feedback)."
else
  echo "u7's token ${dead:0:8}… is still registered (token feedback not applied yet)."
fi
dlq=$(kcat -C -b "127.0.0.1:$KAFKA_PORT" -t herald.dlq -o beginning -e -q -f '%s\n' 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    if l.strip():
        d = json.loads(l); print("  " + d["stage"] + ": " + d["reason"] + " - " + d["detail"][:100])')
echo "DLQ (herald.dlq):"; echo "${dlq:-  (empty)}"
echo
# Did every notification arrive exactly as `heraldctl simulate` predicts for the same events and state?
if [ -x "$BIN/heraldctl" ]; then
  cat >"$RUN/parity.py" <<'PY'
import collections, json, subprocess, sys
run, bin_dir, state_file = sys.argv[1], sys.argv[2], sys.argv[3]
states = json.load(open(state_file))
# Apps with `counts: true` count every message, delivered or not, as the pipeline meets it, and calls and mentions
# take the priority lane, so a later message may be counted first; simulate counts each event alone, from the
# fixture. The count fields are therefore compared apart: a device's badges must be distinct and each within what
# counting allows (from the predicted count up to one less than it plus the messages its user is counted for).
COUNTED = {"badge", "notification_count", "unread_message_count", "channel_unread_count",
           "total_unread_mention_count", "channel_unread_mention_count"}
def strip(v, found):
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if k in COUNTED:
                found.append((k, x)); out[k] = "#"
            else:
                out[k] = strip(x, found)
        return out
    if isinstance(v, list): return [strip(x, found) for x in v]
    return v
counts_got, counts_want = collections.defaultdict(list), collections.defaultdict(list)
def key(token, topic, push_type, payload, counts, device=None):
    found = []
    shape = strip(payload, found)
    # One count per notification (an FCM message carries it for Android and for its apns block).
    badges = [int(x) for k, x in found if k in ("badge", "notification_count")]
    if badges: counts[device or token].append(badges[0])
    return (token, topic, push_type, json.dumps(shape, sort_keys=True))
got = collections.Counter(key(r["token"], r["topic"], r["push_type"], r["payload"], counts_got)
                          for r in map(json.loads, open(run + "/apns-record.jsonl")))
# FCM, webhook and Web Push requests, as herald-mock-fcm recorded their bodies (the FCM body names its token; a Web
# Push body is the message the stand-in decrypted).
for r in map(json.loads, open(run + "/fcm-record.jsonl")):
    if r["endpoint"] in ("send", "webhook") or (r["endpoint"] == "webpush" and r["status"] == 201):
        body = json.loads(r["body"])
        # The device a count belongs to: an FCM message's token, a Web Push subscription's id (`/wp/<id>`).
        device = {"send": body.get("message", {}).get("token"), "webpush": "wp:" + r["target"]}.get(r["endpoint"])
        got[key(r["endpoint"].replace("send", "fcm"), "", "", body, counts_got, device)] += 1
# Messages each user is counted for: every message event simulate decides for them, whatever its push, never the
# sender's own.
counted_for = collections.Counter()
user_of = {}
def device_of(n):
    if n.get("provider") == "webpush": return "wp:" + n["token"].split(".", 2)[-1].rsplit("/", 1)[-1]
    return n["token"]
# simulate calls no translator: it is given the translations the translator stand-in answered (for the events
# whose text it was asked), as if the events had carried them; suppress adds them the same way (behaviour.md §7a).
answered = {}
for r in map(json.loads, open(run + "/fcm-record.jsonl")):
    if r["endpoint"] == "translate" and r["status"] == 200:
        asked = json.loads(r["body"])
        answered.setdefault(asked["q"], {})[asked["target"]] = json.loads(r["answer"])["translatedText"]
want = collections.Counter()
for line in open(run + "/events.tsv"):
    event = json.loads(line.split("\t", 1)[1])
    message = event.get("message") or {}
    for target, text in answered.get(message.get("text"), {}).items():
        message.setdefault("translations", {}).setdefault(target, text)
    open(run + "/sim-event.json", "w").write(json.dumps(event))
    json.dump(states.get(event["app_id"], {"users": {}}), open(run + "/sim-state.json", "w"))
    out = subprocess.run([bin_dir + "/heraldctl", "simulate", "--event", run + "/sim-event.json", "--state",
                          run + "/sim-state.json", "--pipeline", run + "/pipeline.yaml"], capture_output=True, text=True).stdout
    for l in out.splitlines():
        line = json.loads(l)
        if event.get("kind") == "message" and line.get("reason") != "sender":
            counted_for[(event["app_id"], line["user"])] += 1
        for n in line["notifications"]:
            user_of[device_of(n)] = (event["app_id"], line["user"])
            if n.get("provider") in ("fcm", "webhook", "webpush"):
                want[key(n["provider"], "", "", n["payload"], counts_want, device_of(n))] += 1
            else:
                want[key(n["token"], n["topic"], n["push_type"], n["payload"], counts_want)] += 1
def counts_fit(token):
    received, predicted = sorted(counts_got[token]), sorted(counts_want[token])
    if len(received) != len(predicted): return False
    if not predicted: return True
    slack = max(0, counted_for[user_of.get(token, ("", ""))] - 1)
    return len(set(received)) == len(received) and all(predicted[0] <= c <= predicted[-1] + slack for c in received)
counts_same = all(counts_fit(t) for t in set(counts_got) | set(counts_want))
same = got == want and counts_same
print("heraldctl simulate predicted %d notifications; the stand-ins received %d; identical (APNs: token, topic, push type, payload; FCM, webhooks and Web Push: body; badges as the pipeline counted them): %s"
      % (sum(want.values()), sum(got.values()), "yes" if same else "NO"))
for t in sorted(set(counts_got) | set(counts_want)):
    if not counts_fit(t):
        print("  badges of %s…: received %s, predicted %s" % (t[:8], sorted(counts_got[t]), sorted(counts_want[t])))
for k in want - got: print("  predicted, not received:", k[0][:8] + "…", k[3][:100])
for k in got - want: print("  received, not predicted:", k[0][:8] + "…", k[3][:100])
PY
  python3 "$RUN/parity.py" "$RUN" "$BIN" "$RUN/state.json"
else
  echo "(heraldctl not built: skipping the comparison with heraldctl simulate)"
fi
echo
# One event's trace, as herald-mock-otlp received the stages' spans (they leave the stages every 500 ms: wait until
# send's span is there).
if [ "$TRACING" = on ] && [ -x "$BIN/heraldctl" ]; then
  echo "=== The trace of demo-group (heraldctl trace demo-group --receiver http://127.0.0.1:$OTLP_PORT) ==="
  trace_out=""
  for _ in $(seq 1 50); do
    trace_out="$("$BIN/heraldctl" trace demo-group --receiver "http://127.0.0.1:$OTLP_PORT" 2>&1)" \
      && grep -q 'herald-send process' <<<"$trace_out" && break
    sleep 0.2
  done
  echo "$trace_out"
  echo
fi
echo "Logs: $RUN/logs/   Metrics: http://127.0.0.1:$((METRICS_BASE + 1))..$((METRICS_BASE + 6))/metrics"

if [ "$keep" = 1 ]; then
  say "running; Ctrl-C stops everything (or scripts/local-stack.sh --stop from another shell)"
  echo $$ >"$RUN/keep.pid"
  trap 'echo; stop_all; rm -f "$RUN/keep.pid"; say "stopped"; exit 0' INT TERM
  while true; do sleep 1 & wait $!; done
fi
stop_all
say "stopped (use --keep to keep the stack running)"
