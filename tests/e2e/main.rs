//! End-to-end tests: the real `prescale serve` binary against real services started by
//! `scripts/services.sh` (RabbitMQ, Prometheus). See README "Tests".

mod api;
mod cli;
mod cluster;
mod combined;
mod errors;
mod extmetrics;
mod gpu;
mod harness;
mod history;
mod kafka;
mod prometheus;
mod rabbitmq;
mod replay;
mod sqs;
mod tls;
