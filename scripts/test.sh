#!/usr/bin/env bash
# The test command: install and start every service the tests need (if missing),
# then run every test of the workspace against them, then check the Helm chart.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-deps.sh
eval "$(scripts/services.sh)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
scripts/check-chart.sh
# One closing line over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
