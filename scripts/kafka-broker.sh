#!/usr/bin/env bash
# The slow test tier: a real Kafka-protocol broker, tansu 0.6 (Rust, from crates.io), for
# the one e2e test that checks Kafka lag against something other than librdkafka's mock.
# No Kafka broker is packaged in Debian; building tansu takes about 18 minutes on 2 cores,
# so it is built once per machine (cached in ~/.cache/prescale/tansu) and only when missing.
#   scripts/kafka-broker.sh build            # cargo install tansu if missing
#   eval "$(scripts/kafka-broker.sh start)"  # start it on 127.0.0.1:19092 if not running
set -euo pipefail
log() { echo "kafka-broker: $*" >&2; }
ROOT=${PRESCALE_TANSU_ROOT:-$HOME/.cache/prescale/tansu}
TANSU=$ROOT/bin/tansu
STATE=${PRESCALE_TEST_STATE:-/tmp/prescale-test-services}
PORT=19092
mkdir -p "$STATE"

build() {
  [ -x "$TANSU" ] && return 0
  # One build per machine at a time: a second run (another checkout's tests, a manual build)
  # waits for the first and then finds the binary, instead of racing it for the cache.
  mkdir -p "$ROOT"
  exec 9>"$ROOT/.build.lock"
  flock 9
  [ -x "$TANSU" ] && { exec 9>&-; return 0; }
  log "building tansu 0.6.0 with the in-memory store (once per machine, ~18 min on 2 cores)"
  # --features dynostore: the default features have no storage engine at all.
  CARGO_TARGET_DIR=${PRESCALE_TANSU_TARGET:-$ROOT/target} \
    cargo install tansu --version 0.6.0 --features dynostore --locked --root "$ROOT" >&2
  rm -rf "${PRESCALE_TANSU_TARGET:-$ROOT/target}"
  exec 9>&-
}

up() { (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null; }

start() {
  build
  if ! up; then
    log "starting tansu on 127.0.0.1:$PORT"
    nohup "$TANSU" broker --listener-url tcp://127.0.0.1:$PORT --advertised-listener-url tcp://127.0.0.1:$PORT \
      --storage-engine memory://tansu/ >"$STATE/tansu.log" 2>&1 &
    echo $! >"$STATE/tansu.pid"
    for _ in $(seq 1 100); do up && break; sleep 0.2; done
    up || { log "tansu did not open :$PORT"; tail -20 "$STATE/tansu.log" >&2; exit 1; }
  fi
  echo "export PRESCALE_TEST_KAFKA=127.0.0.1:$PORT"
}

case "${1:-start}" in
  build) build ;;
  start) start ;;
  *) echo "usage: $0 build|start" >&2; exit 2 ;;
esac
