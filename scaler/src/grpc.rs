//! KEDA's `externalscaler.ExternalScaler` service. The request path reads the engine's
//! snapshot and does no I/O.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::engine::clock::now_ms;
use crate::engine::{Engine, ScalerEntry};
use crate::proto::external_scaler_server::ExternalScaler;
use crate::proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec, MetricValue,
    ScaledObjectRef,
};

pub struct Service {
    engine: Engine,
}

impl Service {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }

    pub fn into_server(self) -> crate::proto::external_scaler_server::ExternalScalerServer<Self> {
        crate::proto::external_scaler_server::ExternalScalerServer::new(self)
    }

    fn resolve(&self, r: &ScaledObjectRef) -> Result<Arc<ScalerEntry>, Status> {
        if r.name.is_empty() {
            return Err(Status::invalid_argument("ScaledObjectRef.name is empty"));
        }
        self.engine
            .resolve(&r.namespace, &r.name, &r.scaler_metadata)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }

    async fn answer(&self, r: &ScaledObjectRef) -> Result<crate::engine::Answer, Status> {
        let e = self.resolve(r)?;
        e.wait_first_read().await;
        e.answer(now_ms()).map_err(|u| Status::unavailable(u.0))
    }

    fn record<T>(&self, rpc: &'static str, started: Instant, res: &Result<T, Status>) {
        let code = match res {
            Ok(_) => "OK".to_string(),
            Err(s) => format!("{:?}", s.code()),
        };
        let m = self.engine.metrics();
        m.grpc_requests.get_or_create(&vec![("rpc", rpc.to_string()), ("code", code)].into()).inc();
        m.grpc_latency.get_or_create(&vec![("rpc", rpc.to_string())].into()).observe(started.elapsed().as_secs_f64());
        if let Err(s) = res {
            tracing::debug!(rpc, code = ?s.code(), message = s.message(), "request failed");
        }
    }
}

type ActiveStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;
type SpecStream = Pin<Box<dyn Stream<Item = Result<GetMetricSpecResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for Service {
    async fn is_active(&self, req: Request<ScaledObjectRef>) -> Result<Response<IsActiveResponse>, Status> {
        let t = Instant::now();
        let res = self.answer(req.get_ref()).await.map(|a| Response::new(IsActiveResponse { result: a.active }));
        self.record("IsActive", t, &res);
        res
    }

    type StreamIsActiveStream = ActiveStream;

    /// Pushes `true` only on inactive→active transitions (KEDA ignores `false`, and every
    /// `true` resets its cooldown). Opening the stream while active counts as one.
    async fn stream_is_active(&self, req: Request<ScaledObjectRef>) -> Result<Response<ActiveStream>, Status> {
        let t = Instant::now();
        let res = self.resolve(req.get_ref());
        self.record("StreamIsActive", t, &res);
        let entry = res?;
        let mut rx = entry.watch_active();
        let (tx, out) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut was = false;
            loop {
                // (And answerable right now: a signal gone stale since the last tick flips
                // the watch only at the next one.)
                let now = *rx.borrow_and_update() && entry.answer(now_ms()).is_ok();
                entry.touch();
                if now && !was && tx.send(Ok(IsActiveResponse { result: true })).await.is_err() {
                    return;
                }
                was = now;
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return },
                    _ = tx.closed() => return,
                    // Keep the ScaledObject tracked while KEDA holds the stream.
                    _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(out))))
    }

    async fn get_metric_spec(&self, req: Request<ScaledObjectRef>) -> Result<Response<GetMetricSpecResponse>, Status> {
        let t = Instant::now();
        // Parse and register only: no I/O, and no dependency on any source's health
        // (KEDA never counts GetMetricSpec failures towards fallback).
        let res = self.resolve(req.get_ref()).map(|e| {
            Response::new(GetMetricSpecResponse {
                metric_specs: vec![MetricSpec {
                    metric_name: e.config.metric_name.clone(),
                    target_size: 1,
                    target_size_float: 1.0,
                }],
            })
        });
        self.record("GetMetricSpec", t, &res);
        res
    }

    async fn get_metrics(&self, req: Request<GetMetricsRequest>) -> Result<Response<GetMetricsResponse>, Status> {
        let t = Instant::now();
        let req = req.into_inner();
        let res = match req.scaled_object_ref {
            None => Err(Status::invalid_argument("GetMetricsRequest.scaledObjectRef is missing")),
            Some(r) => self.answer(&r).await.map(|a| {
                let name = if req.metric_name.is_empty() { "prescale-replicas".to_string() } else { req.metric_name };
                Response::new(GetMetricsResponse {
                    metric_values: vec![MetricValue {
                        metric_name: name,
                        metric_value: i64::from(a.replicas),
                        metric_value_float: f64::from(a.replicas),
                    }],
                })
            }),
        };
        self.record("GetMetrics", t, &res);
        res
    }

    type StreamMetricSpecStream = SpecStream;

    async fn stream_metric_spec(&self, _req: Request<ScaledObjectRef>) -> Result<Response<SpecStream>, Status> {
        let t = Instant::now();
        let res = Err(Status::unimplemented(
            "StreamMetricSpec is not implemented: prescale's metric target is fixed at 1; use GetMetricSpec",
        ));
        self.record("StreamMetricSpec", t, &res);
        res
    }
}
