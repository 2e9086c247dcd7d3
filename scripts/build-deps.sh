#!/usr/bin/env bash
# System packages the Rust build needs on a fresh machine (rdkafka's TLS links OpenSSL).
set -euo pipefail
missing=()
for p in libssl-dev pkg-config zlib1g-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-deps: installing ${missing[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi
