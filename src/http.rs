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
    // lock_janitor_ready says what /readyz would answer now, and
    // lock_janitor_scope_ready which scope it would name.
    let ready = shared.readiness.is_ready();
    shared.metrics.ready.set(i64::from(ready));
    for (scope, ok) in shared.readiness.scope_readiness() {
        shared
            .metrics
            .scope_ready
            .with_label_values(&[scope.as_str()])
            .set(i64::from(ok));
    }
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
    let r = &shared.readiness;
    let ready = r.is_ready();
    shared.metrics.ready.set(i64::from(ready));
    if ready {
        return (StatusCode::OK, "ok\n".to_owned());
    }
    let refused: Vec<String> = r
        .refused_scopes()
        .into_iter()
        .map(|(scope, missing)| format!("{} ({missing})", crate::readiness::scope_text(&scope)))
        .collect();
    let failing = r.failing_watches();
    let why = if !refused.is_empty() {
        format!(
            "scopes refused at start-up, checked again with backoff (the other scopes are served): {}",
            refused.join(", ")
        )
    } else if !failing.is_empty() {
        format!(
            "watches failing for more than a minute: {}",
            failing.join(", ")
        )
    } else if !r.is_synced() {
        "watches not synced yet".to_owned()
    } else {
        "shutting down".to_owned()
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: {why}\n"),
    )
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
