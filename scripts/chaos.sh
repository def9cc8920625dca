#!/usr/bin/env bash
# The fault suite: builds what it needs, then runs `herald-chaos`, which starts a fresh local
# stack per scenario (scripts/local-stack.sh --up on free ports, under run/chaos-<pid>/) and prints one line
# per scenario with lost, duplicated and dead-lettered counts, then "N passed, M failed".
#
#   scripts/chaos.sh                      every scenario, full size (about 15 minutes on 2 cores)
#   scripts/chaos.sh --reduced            short variants (a few minutes; what scripts/test.sh runs)
#   scripts/chaos.sh --only redis-restart,apns-stall
#   scripts/chaos.sh --debug ...          use the debug build instead of release
#   scripts/chaos.sh --expect-fail a,b    known failures are reported as XFAIL and do not fail the run
#   HERALD_CHAOS_NO_BUILD=1               skip the build step
# Every other option goes to `herald-chaos` (see .build/release/herald-chaos --help).
set -euo pipefail
cd "$(dirname "$0")/.."
config=release
for a in "$@"; do [ "$a" = --debug ] && config=debug; done
export PKG_CONFIG_PATH="/usr/local/lib/pkgconfig:${PKG_CONFIG_PATH:-}"
if [ "${HERALD_CHAOS_NO_BUILD:-0}" != 1 ]; then
  echo "[chaos] building ($config)" >&2
  for p in herald-ingest herald-resolve herald-suppress herald-render herald-send herald-registry herald-mock-apns herald-mock-fcm herald-chaos; do
    swift build -c "$config" --product "$p" >/dev/null || { echo "[chaos] build of $p failed" >&2; exit 1; }
  done
fi
exec ".build/$config/herald-chaos" "$@"
