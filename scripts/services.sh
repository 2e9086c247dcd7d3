#!/usr/bin/env bash
# Install (if missing) and start (if not running) every service the tests need, wait
# until each is ready, and print the environment the tests read.
#   RabbitMQ (Debian rabbitmq-server, management plugin on)  127.0.0.1:5672 / :15672
#   Prometheus (Debian prometheus) on 127.0.0.1:19090, scraping the fixture exporters
#   that the tests start on 127.0.0.1:19101-19104 every second.
#   moto_server (PyPI moto[server], SQS-compatible) on 127.0.0.1:19566
# Kafka needs no service: the tests use librdkafka's in-process mock cluster.
# Usage: eval "$(scripts/services.sh)"
set -euo pipefail
log() { echo "services: $*" >&2; }
STATE=${PRESCALE_TEST_STATE:-/tmp/prescale-test-services}
mkdir -p "$STATE"

apt_updated=0
need_pkg() { # command package [apt options...]
  local cmd=$1 pkg=$2; shift 2
  command -v "$cmd" >/dev/null 2>&1 && return 0
  log "installing $pkg"
  if [ $apt_updated = 0 ]; then apt-get update -qq >&2; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" "$pkg" >&2
}

wait_for() { # description seconds command...
  local what=$1 secs=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then log "timed out waiting for $what"; return 1; fi
    sleep 0.5
  done
}

# --- RabbitMQ -------------------------------------------------------------
need_pkg rabbitmq-server rabbitmq-server
if ! rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
  log "starting rabbitmq-server"
  rabbitmq-server -detached >&2 || true
  wait_for "rabbitmq node" 60 rabbitmq-diagnostics -q ping
fi
rabbitmqctl await_startup --timeout 60 >&2
if ! curl -sf -u guest:guest http://127.0.0.1:15672/api/overview >/dev/null 2>&1; then
  log "enabling rabbitmq_management"
  rabbitmq-plugins enable rabbitmq_management >&2
  wait_for "rabbitmq management API" 60 curl -sf -u guest:guest http://127.0.0.1:15672/api/overview
fi

# --- moto (SQS-compatible server, PyPI) -------------------------------------
VENV=${PRESCALE_VENV:-$HOME/.cache/prescale/venv}
if [ ! -x "$VENV/bin/moto_server" ]; then
  log "installing moto[server] into $VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q 'moto[server]>=5,<6' >&2
fi
MOTO_PORT=19566
if ! curl -sf http://127.0.0.1:$MOTO_PORT/moto-api/ >/dev/null 2>&1; then
  log "starting moto_server on :$MOTO_PORT"
  nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p $MOTO_PORT >"$STATE/moto.log" 2>&1 &
  echo $! > "$STATE/moto.pid"
  wait_for "moto_server" 60 curl -sf http://127.0.0.1:$MOTO_PORT/moto-api/
fi

# --- Prometheus -----------------------------------------------------------
need_pkg prometheus prometheus --no-install-recommends
PROM_PORT=19090
if ! curl -sf http://127.0.0.1:$PROM_PORT/-/ready >/dev/null 2>&1; then
  log "starting prometheus on :$PROM_PORT"
  cat > "$STATE/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: fixtures
    scrape_interval: 1s
    static_configs:
      - targets: ['127.0.0.1:19101', '127.0.0.1:19102', '127.0.0.1:19103', '127.0.0.1:19104']
YAML
  rm -rf "$STATE/prom-data"
  nohup prometheus --config.file="$STATE/prometheus.yml" --storage.tsdb.path="$STATE/prom-data" \
    --web.listen-address=127.0.0.1:$PROM_PORT --log.level=warn >"$STATE/prometheus.log" 2>&1 &
  echo $! > "$STATE/prometheus.pid"
  wait_for "prometheus" 60 curl -sf http://127.0.0.1:$PROM_PORT/-/ready
fi

echo "export PRESCALE_TEST_AMQP='amqp://guest:guest@127.0.0.1:5672/%2f'"
echo "export PRESCALE_TEST_RABBIT_HTTP='http://guest:guest@127.0.0.1:15672'"
echo "export PRESCALE_TEST_PROM='http://127.0.0.1:$PROM_PORT'"
echo "export PRESCALE_TEST_SQS='http://127.0.0.1:$MOTO_PORT'"
echo "export PRESCALE_REQUIRE_SERVICES=1"
