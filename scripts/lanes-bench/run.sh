#!/usr/bin/env bash
# Calls and direct messages behind a backlog, on a running local stack (scripts/local-stack.sh --keep).
# usage: scripts/lanes-bench/run.sh TAG EVENTS PROBES   (from the repository root)
# Loads a 40-member group and two direct conversations into app1 first:
#   heraldctl state load run/lanes-bench/state.json --app app1 --redis redis://127.0.0.1:$HERALD_LOCAL_REDIS_PORT
# (run gen.py once to write it). EVENTS group messages (x40 notifications) are published at once, then PROBES
# (call, DM) pairs; prints drain rate, latencies and the backlog left when each call was answered.
set -euo pipefail
tag=$1; events=$2; probes=${3:-5}
S="$(cd "$(dirname "$0")" && pwd)"; export LANES_BENCH_OUT="${LANES_BENCH_OUT:-$PWD/run/lanes-bench}"; B="$LANES_BENCH_OUT"
CTL="${HERALD_CTL:-$PWD/.build/debug/heraldctl}"; REC="$PWD/run/local/apns-record.jsonl"
KAFKA="127.0.0.1:${HERALD_LOCAL_KAFKA_PORT:-19192}"
mkdir -p "$B"
python3 $S/gen.py 40 "$events" "$tag"
start_lines=$(wc -l < $REC)
: > $B/probes-$tag.tsv
$CTL publish $B/backlog-$tag.jsonl --brokers $KAFKA >/dev/null
t0=$(date +%s%3N)
# wait until the backlog is arriving at the stand-in
until [ $(($(wc -l < $REC) - start_lines)) -gt 500 ]; do sleep 0.05; done
for n in $(seq 1 "$probes"); do
  python3 $S/probe.py "$tag" call "$n" > $B/call.json; python3 $S/probe.py "$tag" dm "$n" > $B/dm.json
  $CTL publish $B/call.json $B/dm.json --brokers $KAFKA >/dev/null
  echo "published $(date +%s%3N)" >> $B/probes-$tag.tsv
  sleep 0.7
done
want=$((events * 40 + 2 * probes))
until [ $(($(wc -l < $REC) - start_lines)) -ge $want ]; do sleep 0.2; done
python3 - "$REC" "$start_lines" "$B" "$tag" "$t0" <<'PY'
import json, sys
rec, start, B, tag, t0 = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
lines = [json.loads(l) for l in open(rec).read().splitlines()[start:]]
calls = [l for l in lines if l["token"].startswith("ca11")]
dms = [l for l in lines if l["token"].startswith("d0d0")]
bulk = [l for l in lines if l["token"].endswith("b" * 60)]
import glob
def created(kind):
    out = []
    # probe events were written in order; their created_at is in the event JSON the stand-in cannot see, so
    # take it from the payload order: the n-th answer for the token belongs to the n-th probe.
    return out
probes = {"call": [], "dm": []}
for l in open(f"{B}/probes-{tag}.tsv"):
    k, c = l.split(); probes.setdefault(k, []).append(int(c))
def lat(kind, recs):
    return [r["at"] - c for r, c in zip(recs, probes[kind])]
cl, dl = lat("call", calls), lat("dm", dms)
ats = [b["at"] for b in bulk]
print(f"{tag}: backlog {len(bulk)} notifications, drain {min(ats)-t0} ms after publish .. {max(ats)-t0} ms; rate {len(bulk)/((max(ats)-min(ats))/1000):.0f}/s")
print(f"{tag}: call event->APNs answer ms: {cl} (max {max(cl)})")
print(f"{tag}: dm   event->APNs answer ms: {dl} (max {max(dl)})")
pc = [r["at"] - p for r, p in zip(calls, probes['published'])]
pd = [r["at"] - p for r, p in zip(dms, probes['published'])]
print(f"{tag}: call: heraldctl publish returned -> APNs answer ms: {pc} (max {max(pc)})")
print(f"{tag}: dm:   heraldctl publish returned -> APNs answer ms: {pd} (max {max(pd)})")
print(f"{tag}: publish tool took ms: {[p - c for p, c in zip(probes['published'], probes['call'])]}")
print(f"{tag}: backlog left when each call was answered: {[sum(1 for a in ats if a > r['at']) for r in calls]}")
PY
