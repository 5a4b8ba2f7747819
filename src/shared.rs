//! What the controller and the HTTP server share for the life of the
//! process: the metrics and the readiness.

use std::sync::Arc;

use crate::metrics::Metrics;
use crate::readiness::{Readiness, Report};

/// Process-wide, cheap to clone.
#[derive(Clone)]
pub struct Shared {
    pub metrics: Metrics,
    pub readiness: Arc<Readiness>,
}

impl Shared {
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(Shared {
            metrics: Metrics::new()?,
            readiness: Arc::default(),
        })
    }
    /// A watch failed (or a sweep, counted as a pod watch): counted under
    /// `resource`, and told to readiness as the watch `name` (not ready
    /// after a minute of failures). Says whether a WARN line is due.
    pub fn watch_failed(&self, resource: &str, namespace: &str, name: &str) -> Report {
        self.metrics
            .watch_errors
            .with_label_values(&[resource])
            .inc();
        self.readiness.watch_failed(namespace, name)
    }
}
