//! Stream helpers for the watches: their health (errors counted, WARN
//! lines, readiness) and their first sync.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::watcher::{self, ExponentialBackoff};
use tracing::{info, warn};

use crate::readiness::Report;
use crate::shared::Shared;

/// How a broken watch retries: from 100 ms, doubling up to 500 ms, plus a
/// random jitter of up to as much again (so at most 1 s). kube-runtime's
/// default climbs to 30 s, so after an API server restart the watches came
/// back 2-6 s after it served again; with this, within a second. The cost
/// is about one failed request per second per watch during an outage (a
/// scope has two watches), under the client-side budget.
pub fn watch_backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_millis(500))
        .with_factor(2.0)
        .without_max_times()
        .with_jitter();
    ResetTimerBackoff::new(ExponentialBackoff::from(builder), Duration::from_secs(120))
}

/// Counts and reports a watch's errors (WARN, at most every 30 s), and
/// tells readiness whether it works.
pub fn watch_health<K>(
    stream: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    shared: Shared,
    resource: &'static str,
    namespace: Option<&str>,
    scope: &str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> {
    let name = format!("{resource} in {scope}");
    let namespace = namespace.unwrap_or_default().to_owned();
    let mut listed = false;
    stream.inspect(move |ev| match ev {
        Err(e) => {
            if let Report::Warn {
                errors,
                failing_for,
            } = shared.watch_failed(resource, &namespace, &name)
            {
                warn!(watch = %name, error = %e, errors, failing_seconds = failing_for.as_secs(),
                      "watch failing; retrying with backoff (not ready after a minute of this)");
            }
        }
        Ok(ev) => {
            if shared.readiness.watch_ok(&name) {
                info!(watch = %name, "watch recovered");
            }
            // The first list is expected; a later one (the API server no
            // longer had the watch's resourceVersion) is worth a line.
            match ev {
                watcher::Event::Init if listed => {
                    info!(watch = %name, "watch listing again (its resourceVersion expired)")
                }
                watcher::Event::InitDone if listed => info!(watch = %name, "watch re-listed"),
                watcher::Event::InitDone => listed = true,
                _ => {}
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

/// The objects of a watch stream, without its errors, for the Controller.
/// Errors are already counted and logged (`watch_health`) and retried with
/// `watch_backoff`; passed on, kube-runtime's Controller would also back
/// off its merged trigger stream on each one (800 ms doubling to 30 s),
/// holding back the events of every other watch, the terminal pods
/// included: measured, reclaims 5-40 s after an API server restart.
pub fn objects_only<K>(
    stream: impl Stream<Item = Result<K, watcher::Error>>,
) -> impl Stream<Item = Result<K, watcher::Error>> {
    stream.filter_map(|item| futures::future::ready(item.ok().map(Ok)))
}
