//! Stream helpers for the watches: their health (errors counted, WARN
//! lines, readiness) and their first sync.

use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use tracing::{info, warn};

use crate::shared::Shared;

/// Counts and reports a watch's errors (WARN, at most every 30 s), and
/// tells readiness whether it works.
pub fn watch_health<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    shared: Shared,
    resource: &'static str,
    scope: &str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> {
    let name = format!("{resource} in {scope}");
    stream.inspect(move |ev| match ev {
        Err(e) => {
            shared
                .metrics
                .watch_errors
                .with_label_values(&[resource])
                .inc();
            if let crate::readiness::Report::Warn {
                errors,
                failing_for,
            } = shared.readiness.watch_failed(&name)
            {
                warn!(watch = %name, error = %e, errors, failing_seconds = failing_for.as_secs(),
                      "watch failing; retrying with backoff (not ready after a minute of this)");
            }
        }
        Ok(_) => {
            if shared.readiness.watch_ok(&name) {
                info!(watch = %name, "watch recovered");
            }
        }
    })
}

/// Calls `synced` once, on the first InitDone of a watch.
pub fn on_first_sync<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    mut synced: impl FnMut() + Send,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> {
    let mut done = false;
    stream.inspect(move |ev| {
        if !done && matches!(ev, Ok(watcher::Event::InitDone)) {
            done = true;
            synced();
        }
    })
}
