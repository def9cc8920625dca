#!/usr/bin/env bash
# Formats the Swift sources with Apple's swift-format and the repository's .swift-format (120 columns, 4-space
# indent, the rules that match the code as written).
#
#   bash scripts/format.sh            rewrite every Swift file in place (the lead applies it to the whole tree in
#                                     one commit; do not mix a reformat into a change of behaviour)
#   bash scripts/format.sh --check    change nothing; list each file the formatter would change and exit 1 if any
#                                     (scripts/test.sh runs this)
#   bash scripts/format.sh [--check] FILE...   only these files
#
# The check compares the formatter's output with the file, so it fails exactly when formatting would change
# something; rules that only lint (naming, documentation) are off in .swift-format and never fail it.
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
if [ "${1-}" = "--check" ]; then
  check=1
  shift
fi

if swift format --version >/dev/null 2>&1; then
  formatter=(swift format)
elif command -v swift-format >/dev/null 2>&1; then
  formatter=(swift-format)
elif [ -x /opt/swift/usr/bin/swift-format ]; then
  formatter=(/opt/swift/usr/bin/swift-format)
else
  echo "[format] swift-format not found (it ships with the Swift 6 toolchain as 'swift format')" >&2
  exit 2
fi

if [ "$#" -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(git ls-files -- 'Package.swift' 'Sources/*.swift' 'Tests/*.swift')
fi

if [ "$check" -eq 0 ]; then
  "${formatter[@]}" format --configuration .swift-format --in-place --parallel "${files[@]}"
  exit 0
fi

# One formatter run over a copy of the files (one process, parallel), then a byte comparison per file.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for f in "${files[@]}"; do
  mkdir -p "$scratch/$(dirname "$f")"
  cp "$f" "$scratch/$f"
done
cp .swift-format "$scratch/.swift-format"
(cd "$scratch" && "${formatter[@]}" format --configuration .swift-format --in-place --parallel "${files[@]}")
differ=0
for f in "${files[@]}"; do
  if ! cmp -s "$f" "$scratch/$f"; then
    echo "[format] would reformat $f" >&2
    differ=$((differ + 1))
  fi
done
if [ "$differ" -gt 0 ]; then
  echo "[format] $differ of ${#files[@]} file(s) differ from swift-format's output; run: bash scripts/format.sh" >&2
  exit 1
fi
echo "[format] ${#files[@]} file(s) formatted as .swift-format says" >&2
