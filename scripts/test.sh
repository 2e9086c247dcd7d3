#!/usr/bin/env bash
# The test command: install and start every service the tests need (if missing),
# then run every test of the workspace against them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-deps.sh
eval "$(scripts/services.sh)"
cargo test --workspace --locked
scripts/check-chart.sh
