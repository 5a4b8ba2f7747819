//! `/metrics`, `/healthz` (alive) and `/readyz` (every watch has listed once,
//! and shutdown has not started).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::State as AxumState;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::metrics::Metrics;

/// Readiness: a count of watches that have not finished their first list,
/// and a flag raised when shutdown starts.
#[derive(Debug, Default)]
pub struct Readiness {
    unsynced: AtomicUsize,
    registered: AtomicBool,
    shutting_down: AtomicBool,
}

impl Readiness {
    /// Declares `n` watches that must each call `synced` once.
    pub fn expect(&self, n: usize) {
        self.unsynced.fetch_add(n, Ordering::SeqCst);
        self.registered.store(true, Ordering::SeqCst);
    }
    pub fn synced(&self) {
        self.unsynced.fetch_sub(1, Ordering::SeqCst);
    }
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }
    /// Every declared watch has listed once.
    pub fn is_synced(&self) -> bool {
        self.registered.load(Ordering::SeqCst) && self.unsynced.load(Ordering::SeqCst) == 0
    }
    pub fn is_ready(&self) -> bool {
        self.is_synced() && !self.shutting_down.load(Ordering::SeqCst)
    }
}

/// Process-wide state shared by the controller and the HTTP server.
#[derive(Clone)]
pub struct State {
    pub metrics: Metrics,
    pub readiness: Arc<Readiness>,
}

impl State {
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(State {
            metrics: Metrics::new()?,
            readiness: Arc::default(),
        })
    }
}

async fn metrics(AxumState(state): AxumState<State>) -> impl IntoResponse {
    match state.metrics.render() {
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

async fn readyz(AxumState(state): AxumState<State>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: watches not synced or shutting down\n",
        )
    }
}

pub fn router(state: State) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Binds first (so a taken port fails start-up with a clear error), then
/// serves until `shutdown` resolves.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

pub async fn serve(
    listener: TcpListener,
    state: State,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
