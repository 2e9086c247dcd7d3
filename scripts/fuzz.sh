#!/usr/bin/env bash
# Coverage-guided fuzzing of the input paths (libFuzzer through cargo-fuzz): trace files and
# replays (`replay`), the planner as serve drives it (`planner`), plan CSVs (`plan_csv`) and
# the text that reaches the scaler from outside (`scaler_text`), and the Kubernetes objects
# of the cluster loop (`cluster`). The fuzz crate's first build
# compiles the whole scaler (~15 min on 2 cores). Not part of CI: it needs cargo-fuzz and runs for as long
# as asked.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]     (default 300 s, every target)
#
# cargo-fuzz is installed from crates.io when missing. The machine's toolchain is stable, so
# the sanitizer flags libFuzzer needs are enabled with RUSTC_BOOTSTRAP=1 (the fuzz build
# only). Every input found to crash is kept under fuzz/artifacts/TARGET/; turn it into a
# regression test in the crate's own suite before fixing it. Exits 1 on any crash.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-300}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(replay planner plan_csv scaler_text cluster)

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "installing cargo-fuzz from crates.io" >&2
  cargo install cargo-fuzz --locked
fi
export RUSTC_BOOTSTRAP=1
cd "$root"
status=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  # Seeds for the replay target: a scenario (μ 2 req/s, W 120 s, SLO 5 s, I 15 s, in
  # arbitrary's little-endian field order) followed by the first lines of real traces, one
  # rate series and one request log.
  if [ "$t" = replay ] && [ -z "$(ls -A "fuzz/corpus/$t")" ]; then
    for f in examples/traces/servegen-m-large-14d.csv forecaster/benches/heldout/azure-llm-2023-conv.csv; do
      python3 - "$f" "fuzz/corpus/$t/$(basename "$f")" <<'PY'
import struct, sys
head = open(sys.argv[1], "rb").read(6000)
head = head[: head.rfind(b"\n") + 1]
prefix = struct.pack("<dHfBBBB", 2.0, 120, 5.0, 15, 0, 0, 0)
open(sys.argv[2], "wb").write(prefix + head)
PY
    done
  fi
  # Seeds for the scaler's text: the example ScaledObjects (selector byte 0), a RabbitMQ
  # trigger's metadata as `key=value` lines (1), a vLLM scrape (4), a label selector (5).
  if [ "$t" = scaler_text ] && [ -z "$(ls -A "fuzz/corpus/$t")" ]; then
    for f in examples/*.yaml; do
      { printf '\000'; cat "$f"; } > "fuzz/corpus/$t/yaml-$(basename "$f")"
    done
    printf '\001rabbitmqHost=amqp://guest:guest@127.0.0.1:5672/\nrabbitmqQueueName=jobs\nwarmupSeconds=180\ncapacityPerReplica=2\n' \
      > "fuzz/corpus/$t/metadata"
    printf '\004# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 3\nvllm:num_requests_running{model_name="m"} 8\n' \
      > "fuzz/corpus/$t/vllm"
    printf '\005app=vllm,tier in (gpu,cpu),!canary' > "fuzz/corpus/$t/selector"
    printf '\0071500m' > "fuzz/corpus/$t/quantity"
  fi
  # The cluster target's seed: real-shaped Nodes, Pods, NodePools, a NodeClaim, a
  # ScaledObject and a pod template in one JSON document.
  if [ "$t" = cluster ] && [ -z "$(ls -A "fuzz/corpus/$t")" ]; then
    cp fuzz/seeds/cluster.json "fuzz/corpus/$t/"
  fi
  echo "== $t: ${secs}s" >&2
  if ! cargo fuzz run --release "$t" "fuzz/corpus/$t" -- -max_total_time="$secs" -timeout=60 -rss_limit_mb=4096 -max_len=65536; then
    status=1
  fi
done
exit $status
