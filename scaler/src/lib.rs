//! prescale: a warm-up-aware KEDA external scaler for GPU inference fleets.
//!
//! Layers (see ARCHITECTURE.md): `config` (metadata → typed config) → `sources`
//! (one module per signal) → `engine` (shared pollers, per-ScaledObject planning,
//! snapshots) → `grpc` / `http` (request paths that read snapshots only) → `cli`.

pub mod check;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod extmetrics;
pub mod floor;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod redact;
pub mod replay;
pub mod serve;
pub mod sources;
pub mod tls;

/// KEDA's `externalscaler` protocol, generated from `proto/externalscaler.proto`.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("externalscaler");
}
