# Container image for `prescale serve` (the Helm chart's default image runs it).
#
#   docker build -t <your-registry>/prescale:0.1.0 .
#
# Stage 1 builds the release binary with the toolchain this repository is tested on; stage 2 is
# a slim Debian runtime with only what the binary links (OpenSSL and zlib for librdkafka's TLS
# and compression, CA certificates for SQS/Prometheus over HTTPS). The image runs as the
# non-root UID/GID 65532 the chart's securityContext expects and writes nothing to its root
# filesystem (the chart mounts it read-only). The replay's bundled trace is compiled into the
# binary, so `prescale replay` works in the image too.
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libssl-dev pkg-config zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p prescale \
 && install -D -m 0755 target/release/prescale /out/prescale

FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/prescale /usr/local/bin/prescale
USER 65532:65532
# gRPC (KEDA external scaler), HTTP (external metrics API, /metrics, /healthz, /debug).
EXPOSE 9090 8080
ENTRYPOINT ["/usr/local/bin/prescale"]
CMD ["serve"]
