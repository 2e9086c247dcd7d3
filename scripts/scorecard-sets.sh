#!/usr/bin/env bash
# Run the planner scorecard over the dev traces (with every variant, per scenario) and every
# held-out probe set, and keep one log per set, so that two builds can be compared scenario by
# scenario with scripts/scorecard-diff.py. A planner change is judged this way: on every set,
# not on the scenario that motivated it (ARCHITECTURE.md, "Where this differs").
#
#   scripts/scorecard-sets.sh OUT_DIR [SET ...]
#
# SET is `dev` or any set of scripts/probe-sets.py (default: dev and every set that
# `probe-sets.py --list` names). Sets run JOBS at a time (default 2); the whole battery takes
# about 4 minutes on 2 cores once built.
# Environment variables set by the caller (CARGO_TARGET_DIR, experiment switches) reach
# every run.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [SET ...]" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
out=$1
shift
sets=("$@")
if [ ${#sets[@]} -eq 0 ]; then
  read -r -a probes <<<"$(python3 "$root/scripts/probe-sets.py" --list)"
  sets=(dev "${probes[@]}")
fi
mkdir -p "$out"

# Build once and take the bench executable from cargo's own report of it.
bin=$(cd "$root" && cargo bench -p prescale-forecaster --bench scorecard --no-run --message-format=json 2>"$out/build.log" |
  python3 -c 'import json,sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "scorecard":
        print(m["executable"])') || true
if [ -z "$bin" ] || [ ! -x "$bin" ]; then
  echo "could not build the scorecard bench (cargo bench -p prescale-forecaster --bench scorecard --no-run); see $out/build.log" >&2
  exit 1
fi

run_one() {
  local set=$1
  if [ "$set" = dev ]; then
    PRESCALE_VARIANTS=detail "$bin" >"$out/$set.log" 2>&1
  else
    local spec
    spec=$(python3 "$root/scripts/probe-sets.py" "$set") || return 1
    PRESCALE_TRACE_SET=$spec "$bin" >"$out/$set.log" 2>&1
  fi
}

jobs=${JOBS:-2}
failed=0
running=0
for s in "${sets[@]}"; do
  run_one "$s" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done

for s in "${sets[@]}"; do
  echo "== $s ($out/$s.log)"
  grep -E '^rule [123]|^variant|rule 1 fails' "$out/$s.log" || echo "   (no rule lines: see the log)"
done
exit "$failed"
