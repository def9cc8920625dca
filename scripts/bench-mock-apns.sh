#!/usr/bin/env bash
# Throughput of herald-mock-apns against nghttpd, same machine, same run, same h2load load:
# 200,000 POSTs of a ~360-byte APNs payload over TLS, 1 connection x 100 streams (and 2 x 100).
# Prints req/s and server CPU seconds per 100,000 requests for both servers.
# Usage: scripts/bench-mock-apns.sh [requests] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
ROUNDS=${2:-2}
swift build -c release --product herald-mock-apns >/dev/null 2>&1
BIN=$(swift build -c release --show-bin-path)/herald-mock-apns
W=$(mktemp -d)
trap 'kill $MOCK $NGHTTPD 2>/dev/null; rm -rf "$W"' EXIT
cd "$W"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout key.pem -out cert.pem \
  -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" 2>/dev/null
TOKEN=$(printf 'ab%.0s' {1..32})
mkdir -p www/3/device && touch "www/3/device/$TOKEN"
python3 -c "import json; print(json.dumps({'aps':{'alert':{'title':'Cindy','body':'x'*200},'badge':5,'sound':'default','thread-id':'c1'},'f':'u1','t':'u2','m':'373360335316321408','g':'c1'}))" > body.json

NPORT=$((20000 + RANDOM % 20000))
nghttpd -d www --address=127.0.0.1 --max-concurrent-streams=1000 "$NPORT" key.pem cert.pem >/dev/null 2>&1 &
NGHTTPD=$!
# --initial-streams 1000: like nghttpd, allow 1000 streams from the start (h2load sends its first
# 100 requests before reading the server's SETTINGS and does not resend refused ones).
"$BIN" --port 0 --cert cert.pem --key key.pem --port-file port --topic com.example.chat --initial-streams 1000 >/dev/null &
MOCK=$!
for _ in $(seq 50); do [ -s port ] && break; sleep 0.1; done
MPORT=$(cat port)
sleep 0.3

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # utime + stime, clock ticks
TICK=$(getconf CLK_TCK)
H=(-H "apns-topic: com.example.chat" -H "apns-push-type: alert" -H "apns-priority: 10")

run() { # name pid port conns
  local before after out rate
  before=$(cpu "$2")
  out=$(h2load -n "$N" -c "$4" -m 100 -d body.json "${H[@]}" "https://127.0.0.1:$3/3/device/$TOKEN" 2>&1)
  after=$(cpu "$2")
  rate=$(grep -oP 'finished in [0-9.]+m?s, \K[0-9.]+' <<<"$out")
  ok=$(grep -oP 'status codes: \K[0-9]+' <<<"$out")
  printf '%-18s %d x 100  %10.0f req/s  server CPU %.2f s/100k  (%s x 200)\n' "$1" "$4" "$rate" \
    "$(echo "($after - $before) / $TICK * 100000 / $N" | bc -l)" "$ok"
}
echo "h2load -n $N -m 100, payload $(wc -c < body.json) bytes, $(nproc) cores"
for r in $(seq "$ROUNDS"); do
  run nghttpd "$NGHTTPD" "$NPORT" 1
  run herald-mock-apns "$MOCK" "$MPORT" 1
  run nghttpd "$NGHTTPD" "$NPORT" 2
  run herald-mock-apns "$MOCK" "$MPORT" 2
done
