//! HTTP: `/healthz`, `/readyz`, `/metrics`, `/debug/scalers`, and `/peers/plans` (the plans
//! of the ScaledObjects KEDA asks this replica about, read by the Lease holder).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::engine::Engine;

#[derive(Clone)]
pub struct HttpState {
    pub engine: Engine,
    /// Set once the gRPC listener is bound; cleared on shutdown.
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/debug/scalers", get(debug))
        .route("/debug/scalers/{namespace}/{name}", get(debug_one))
        .route(crate::cluster::peers::PATH, get(peer_plans))
        .with_state(state)
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    s.engine.refresh_gauges();
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        s.engine.metrics().render(),
    )
}

async fn peer_plans(State(s): State<HttpState>) -> axum::response::Response {
    match s.engine.cluster() {
        Some(c) => Json(c.peer_report()).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "cluster integration not started\n").into_response(),
    }
}

async fn debug(State(s): State<HttpState>) -> impl IntoResponse {
    Json(s.engine.debug_view())
}

async fn debug_one(State(s): State<HttpState>, Path((ns, name)): Path<(String, String)>) -> axum::response::Response {
    match s.engine.debug_one(&ns, &name) {
        Some(v) => Json(v).into_response(),
        None => (StatusCode::NOT_FOUND, format!("no ScaledObject {ns}/{name} is tracked\n")).into_response(),
    }
}
