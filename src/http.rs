//! The HTTP endpoints: `/metrics`, `/healthz` (alive) and `/readyz` (see
//! `readiness`).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::shared::Shared;

async fn metrics(State(shared): State<Shared>) -> impl IntoResponse {
    match shared.metrics.render() {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            text,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            format!("encoding metrics: {e}\n"),
        ),
    }
}

async fn readyz(State(shared): State<Shared>) -> impl IntoResponse {
    if shared.readiness.is_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: watches not synced or shutting down\n",
        )
    }
}

pub fn router(shared: Shared) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(shared)
}

/// Binds first (so a taken port fails start-up with a clear error), then
/// serves until `shutdown` resolves.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

pub async fn serve(
    listener: TcpListener,
    shared: Shared,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(shared))
        .with_graceful_shutdown(shutdown)
        .await
}
