//! What the controller and the HTTP server share for the life of the
//! process: the metrics and the readiness.

use std::sync::Arc;

use crate::metrics::Metrics;
use crate::readiness::Readiness;

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
}
