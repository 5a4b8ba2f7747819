//! What the controller and the HTTP server share for the life of the
//! process: the metrics and the readiness.

use std::sync::{Arc, OnceLock};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::lock::LockKey;
use crate::metrics::Metrics;
use crate::readiness::{Readiness, Report};

/// Process-wide, cheap to clone.
#[derive(Clone)]
pub struct Shared {
    pub metrics: Metrics,
    pub readiness: Arc<Readiness>,
    /// Opted-in Leases the lock watch saw leave, for auto opt-in.
    pub left: LeftOptIn,
}

impl Shared {
    pub fn new() -> Result<Self, prometheus::Error> {
        Ok(Shared {
            metrics: Metrics::new()?,
            readiness: Arc::default(),
            left: LeftOptIn::default(),
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

/// The Leases the lock watch (by the opt-in selector) saw leave: deleted,
/// or their opt-in label removed or changed. Auto opt-in, when on, reads
/// each live and labels it again if it is still a candidate without the
/// key: a renewed Lease's own watch events say nothing of a label removed
/// (only a change of holder is judged), so without this it would wait for
/// the next re-list (docs/design.md, "Auto opt-in"). ConfigMaps need none:
/// their finding watch judges every one-Pod-owned ConfigMap without the
/// key at each change.
#[derive(Clone, Default)]
pub struct LeftOptIn(Arc<OnceLock<UnboundedSender<LockKey>>>);

impl LeftOptIn {
    /// The receiving end, for auto opt-in; `None` if it was taken before.
    pub fn listen(&self) -> Option<UnboundedReceiver<LockKey>> {
        let (tx, rx) = unbounded_channel();
        self.0.set(tx).ok().map(|()| rx)
    }

    /// Tells auto opt-in, if it listens (nothing is kept otherwise).
    pub fn tell(&self, key: &LockKey) {
        if let Some(tx) = self.0.get() {
            let _ = tx.send(key.clone());
        }
    }
}
