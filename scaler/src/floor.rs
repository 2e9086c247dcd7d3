//! `prescale floor` (hidden): an ExternalScaler that answers every call with a constant,
//! doing nothing else. The load benchmark runs it as its own process beside
//! `prescale serve`, so both are measured under the same process and scheduling costs.

use std::net::SocketAddr;
use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::proto::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use crate::proto::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec, MetricValue,
    ScaledObjectRef,
};

pub struct Floor;

type Active = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;
type Spec = Pin<Box<dyn Stream<Item = Result<GetMetricSpecResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for Floor {
    async fn is_active(&self, _: Request<ScaledObjectRef>) -> Result<Response<IsActiveResponse>, Status> {
        Ok(Response::new(IsActiveResponse { result: true }))
    }
    type StreamIsActiveStream = Active;
    async fn stream_is_active(&self, _: Request<ScaledObjectRef>) -> Result<Response<Active>, Status> {
        Err(Status::unimplemented("floor"))
    }
    async fn get_metric_spec(&self, _: Request<ScaledObjectRef>) -> Result<Response<GetMetricSpecResponse>, Status> {
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec { metric_name: "floor".into(), target_size: 1, target_size_float: 1.0 }],
        }))
    }
    async fn get_metrics(&self, r: Request<GetMetricsRequest>) -> Result<Response<GetMetricsResponse>, Status> {
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: r.into_inner().metric_name,
                metric_value: 1,
                metric_value_float: 1.0,
            }],
        }))
    }
    type StreamMetricSpecStream = Spec;
    async fn stream_metric_spec(&self, _: Request<ScaledObjectRef>) -> Result<Response<Spec>, Status> {
        Err(Status::unimplemented("floor"))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    #[error("cannot bind {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// Serve the floor; prints `floor grpc=ADDR` on stderr once bound.
pub async fn serve(addr: SocketAddr) -> Result<(), FloorError> {
    let l = tokio::net::TcpListener::bind(addr).await.map_err(|e| FloorError::Bind(addr, e))?;
    eprintln!("floor grpc={}", l.local_addr().map(|a| a.to_string()).unwrap_or_default());
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(ExternalScalerServer::new(Floor))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l))
        .await?;
    Ok(())
}
