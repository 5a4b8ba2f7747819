//! What the kinds' scopes share in their wiring: the terminal-pod watch,
//! the lead trigger, the filter that keeps settled locks from the
//! Controller, and `drive`, which runs a scope's Controller for one kind
//! (its triggers: the lock watch, and the suspects the scope's pod side,
//! the lead trigger and re-lists name).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::memory::Memory;
use super::{error_policy, key_of, reconcile, Context, Watched};

/// A terminal pod as its watch reads it: who it is and its version,
/// nothing else. Each event and list page is read into this directly: the
/// rest of the pod's metadata (its managedFields above all, kilobytes per
/// pod) is skipped unread rather than built and dropped, as the sweep's
/// `PodId` does. A metadata-only type (`metadata_api`), so the API server
/// sends metadata alone.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(from = "TerminalPodWire")]
pub(super) struct TerminalPod {
    pub(super) metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
}

#[derive(serde::Deserialize)]
struct TerminalPodWire {
    #[serde(default)]
    metadata: IdentityWire,
}

#[derive(Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct IdentityWire {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl From<TerminalPodWire> for TerminalPod {
    fn from(w: TerminalPodWire) -> Self {
        let m = w.metadata;
        TerminalPod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                ..Default::default()
            },
        }
    }
}

impl kube::Resource for TerminalPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn metadata_api() -> bool {
        true
    }
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        &mut self.metadata
    }
}

/// Terminal pods per page of the terminal-pod watch's list.
const TERMINAL_PODS_PAGE: u32 = 100;

/// The terminal-pod watch of a scope: health counted under `scope`, and
/// `on_sync` once it has listed.
pub(super) fn terminal_pods(
    ctx: &Context,
    namespace: Option<&str>,
    scope: &str,
    on_sync: impl FnMut() + Send + 'static,
) -> impl futures::Stream<Item = Result<TerminalPod, kube::runtime::watcher::Error>> + Send + 'static
{
    use crate::streams::{objects_only, on_first_sync, watch_backoff, watch_health};
    use kube::runtime::watcher::{self, watcher};
    use kube::runtime::WatchStreamExt;
    let pods: kube::Api<TerminalPod> = crate::scoped(&ctx.client, namespace);
    // Nothing of a listed page is kept (a terminal pod matters only by the
    // locks it holds, found in the indexes), but a page is held whole while
    // it is handed on: pages of 100 rather than kube-runtime's 500 keep that
    // peak small in a cluster of many finished pods (20,000 Succeeded Job
    // pods are 200 requests, at start and at a re-list only).
    let stream = watcher(
        pods,
        watcher::Config::default()
            .fields(crate::TERMINAL_PODS)
            .page_size(TERMINAL_PODS_PAGE),
    )
    .backoff(watch_backoff());
    let stream = watch_health(stream, ctx.shared.clone(), "pods", namespace, scope);
    objects_only(on_first_sync(stream, on_sync).touched_objects())
}

/// Queues every lock of `reader` whose last judgement does not stand (see
/// `Memory::needs_judging`): what the lock watch's own events did not queue
/// (before the first sweep, or during a re-list, whose objects reach the
/// store only at its end).
pub(super) fn queue_unsettled<K: Watched>(
    memory: &Memory,
    reader: &Store<K>,
    tx: &futures::channel::mpsc::UnboundedSender<kube::runtime::reflector::ObjectRef<K>>,
) {
    for m in reader.state() {
        if memory.needs_judging(&key_of(&*m), &m.version()) {
            let _ = tx.unbounded_send(kube::runtime::reflector::ObjectRef::from_obj(&*m));
        }
    }
}

/// On taking the lead, every lock of `reader` that is not settled is judged
/// at once: a standby judged stale locks without writing. The settled ones
/// are not queued at all (see `needs_judging_only`), nor anything before the
/// scope queues locks at all (`accepting`: before the first sweep, which
/// queues them itself). A lock whose reconcile is running as the lead comes
/// may look settled and be skipped here; that reconcile, as a standby's,
/// ends in `NotLeader`, sees the lead taken and looks again at once
/// (`decide::Next::OnLead`).
fn on_lead<K: Watched>(
    ctx: &Context,
    reader: Store<K>,
    accepting: Arc<AtomicBool>,
    tx: futures::channel::mpsc::UnboundedSender<kube::runtime::reflector::ObjectRef<K>>,
) -> Option<tokio::task::JoinHandle<()>> {
    let memory = ctx.memory.clone();
    ctx.gate.changes().map(|mut changes| {
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                if *changes.borrow_and_update() && accepting.load(Ordering::SeqCst) {
                    queue_unsettled(&memory, &reader, &tx);
                }
            }
        })
    })
}

/// Keeps from the Controller the lock events that come before the scope
/// queues locks at all (`accepting`), and those of settled, unchanged locks
/// (a re-list lists every lock again): their reconcile would return at once,
/// but queued all together they would grow the Controller's scheduler to
/// the number of locks, and that memory is kept for good.
fn needs_judging_only<K: Watched>(
    ctx: &Arc<Context>,
    accepting: Arc<AtomicBool>,
    locks: impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>>,
) -> impl futures::Stream<Item = Result<K, kube::runtime::watcher::Error>> {
    use futures::StreamExt;
    let memory = ctx.memory.clone();
    locks.filter(move |r| {
        future::ready(match r {
            Ok(obj) => {
                accepting.load(Ordering::SeqCst)
                    && memory.needs_judging(&key_of(obj), &obj.version())
            }
            Err(_) => true,
        })
    })
}

/// One kind's wiring of a scope, ready to run.
pub(super) struct Wiring<K: Watched, L> {
    /// The lock watch (reflected into `reader`).
    pub(super) locks: L,
    pub(super) reader: Store<K>,
    /// Suspects from the pod side, the lead trigger and the end of a
    /// re-list.
    pub(super) suspects:
        futures::channel::mpsc::UnboundedReceiver<kube::runtime::reflector::ObjectRef<K>>,
    pub(super) suspects_tx:
        futures::channel::mpsc::UnboundedSender<kube::runtime::reflector::ObjectRef<K>>,
    /// Whether the lock watch's events reach the Controller yet (ConfigMaps:
    /// after the first sweep; Leases: from the start).
    pub(super) accepting: Arc<AtomicBool>,
    pub(super) concurrency: u16,
}

/// Runs a scope's Controller for one kind until `shutdown`, then stops its
/// lead trigger.
pub(super) async fn drive<K, L>(
    ctx: Arc<Context>,
    w: Wiring<K, L>,
    scope: &str,
    shutdown: CancellationToken,
) where
    K: Watched,
    L: futures::Stream<Item = Result<K, kube::runtime::watcher::Error>> + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::controller::{Config as ControllerConfig, Controller};
    let lead = on_lead(&ctx, w.reader.clone(), w.accepting.clone(), w.suspects_tx);
    let locks = needs_judging_only(&ctx, w.accepting, w.locks);
    info!(scope = %scope, kind = %K::KIND, selector = %ctx.settings.selector, "watching locks");
    let ctx_errors = ctx
        .shared
        .metrics
        .reconcile_errors
        .with_label_values(&[crate::ErrorKind::Controller.as_str()]);
    Controller::for_stream(locks, w.reader)
        .reconcile_on(w.suspects)
        .with_config(ControllerConfig::default().concurrency(w.concurrency))
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile::<K>, error_policy::<K>, ctx)
        .for_each(|res| {
            match res {
                Ok((obj, _)) => debug!(lock = %obj, "reconciled"),
                // A reconcile's own failure is counted and said in
                // error_policy; this is anything else the Controller
                // reports (a queue or trigger failure).
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                // Deleted before its turn came (a reclaim's own trigger, a
                // suspect named twice): nothing to judge.
                Err(kube::runtime::controller::Error::ObjectNotFound(r)) => {
                    debug!(scope = %scope, lock = %r, "lock gone before its judgement");
                }
                Err(e) => {
                    ctx_errors.inc();
                    warn!(scope = %scope, kind = %K::KIND, error = %e, "controller error; the lock is judged again at the next event or sweep");
                }
            }
            future::ready(())
        })
        .await;
    if let Some(t) = lead {
        t.abort();
    }
    info!(scope = %scope, kind = %K::KIND, "stopped watching");
}
