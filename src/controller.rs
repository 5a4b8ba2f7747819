//! kube-runtime wiring: a metadata-only watch of the opted-in locks, a watch
//! of terminal pods that maps each to the locks it holds, and a periodic
//! resync. Every reconcile re-reads the lock and its holder live, judges, and
//! hands stale locks to `reclaim`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{future, Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::http::State;
use crate::lock::{self, Lock, Unmanageable};
use crate::reclaim;
use crate::selector::Selector;
use crate::verdict::{self, HolderSeen, LockState, Policy, Verdict};
use crate::{call, Error, NAME};

/// Pods that can no longer run. A pod entering this set (Running -> Failed)
/// arrives as a new object; pods that never hold a lock are never cached.
pub const TERMINAL_PODS: &str = "status.phase!=Pending,status.phase!=Running,status.phase!=Unknown";

/// How soon a lock that changed under a delete is judged again.
const REJUDGE_AFTER: Duration = Duration::from_millis(500);
/// Retry delay after an error (counted in `error_policy`).
const ERROR_BACKOFF: Duration = Duration::from_secs(5);

pub type LockMeta = PartialObjectMeta<ConfigMap>;

#[derive(Clone, Debug)]
pub struct Settings {
    pub selector: Selector,
    /// Empty: the whole cluster.
    pub namespaces: Vec<String>,
    pub dry_run: bool,
    pub delete_pod: bool,
    pub policy: Policy,
    pub resync: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    pub namespace: String,
    pub name: String,
}

/// What the janitor remembers about a lock between reconciles.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    pub state: Option<LockState>,
    /// The holder uid last judged, so that a follower knows whose lock it was.
    pub holder_uid: Option<String>,
    /// (holder uid, first seen missing, wall time then): the start of the
    /// owner-gone grace, measured on the monotonic clock so that a clock
    /// step never shortens it.
    pub missing_since: Option<(String, Instant, Timestamp)>,
    /// (holder uid, first seen terminal): the death time when the pod does
    /// not say when its containers finished.
    pub stale_since: Option<(String, Timestamp)>,
    /// (resourceVersion, Event reason) last reported, so that a condition is
    /// announced once per version of the lock, not once per resync.
    pub reported: Option<(String, &'static str)>,
}

/// Per-reconcile context: the client, the Event recorder, metrics and memory.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub state: State,
    pub settings: Settings,
    memos: Mutex<HashMap<LockKey, Memo>>,
    /// Label carry-over tasks waiting for a takeover, one per lock.
    followers: Mutex<HashMap<LockKey, tokio::task::JoinHandle<()>>>,
}

/// A lock as judged from live reads: what `reclaim` acts on, and nothing else.
#[derive(Clone, Debug)]
pub struct Judgement {
    pub key: LockKey,
    /// The lock's metadata exactly as read (uid and resourceVersion guard the delete).
    pub meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    pub lock: Option<Lock>,
    pub holder: Option<Pod>,
    pub verdict: Verdict,
    /// For stale locks: when the holder died, as well as is known.
    pub died_at: Option<Timestamp>,
}

impl Context {
    pub fn new(client: Client, state: State, settings: Settings) -> Arc<Self> {
        let reporter = Reporter {
            controller: NAME.into(),
            instance: std::env::var("POD_NAME").ok().filter(|s| !s.is_empty()),
        };
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            state,
            settings,
            memos: Mutex::default(),
            followers: Mutex::default(),
        })
    }

    pub(crate) fn with_memo<T>(&self, key: &LockKey, f: impl FnOnce(&mut Memo) -> T) -> T {
        let mut memos = self.memos.lock().unwrap_or_else(|e| e.into_inner());
        f(memos.entry(key.clone()).or_default())
    }

    /// Records a lock's state and refreshes `lock_janitor_locks{state}`.
    pub(crate) fn set_state(&self, key: &LockKey, state: LockState) {
        let mut memos = self.memos.lock().unwrap_or_else(|e| e.into_inner());
        let memo = memos.entry(key.clone()).or_default();
        if memo.state.is_none() && state != LockState::Unmanageable {
            // A lock's reclaim counters exist at 0 from the moment it is
            // watched: increase() needs a sample before the first reclaim,
            // or the reclaim alert cannot see it.
            for r in verdict::StaleReason::ALL {
                self.state.metrics.reclaims.with_label_values(&[
                    &key.namespace,
                    &key.name,
                    r.as_str(),
                ]);
            }
        }
        memo.state = Some(state);
        self.publish_counts(&memos);
    }

    /// Forgets a lock that no longer exists (or no longer carries the
    /// opt-in label), and starts following its name for a takeover.
    pub fn forget(&self, key: &LockKey) {
        let mut memos = self.memos.lock().unwrap_or_else(|e| e.into_inner());
        let memo = memos.remove(key);
        self.publish_counts(&memos);
        let m = &self.state.metrics;
        m.set_stale(&key.namespace, &key.name, None);
        for r in verdict::StaleReason::ALL {
            let labels = [key.namespace.as_str(), key.name.as_str(), r.as_str()];
            // Counters that never counted go with the lock; the others stay
            // so that increase() keeps seeing them.
            if m.reclaims
                .get_metric_with_label_values(&labels)
                .is_ok_and(|c| c.get() == 0)
            {
                let _ = m.reclaims.remove_label_values(&labels);
            }
        }
        drop(memos);
        if let Some(uid) = memo.and_then(|m| m.holder_uid) {
            self.follow_takeover(key, uid);
        }
    }

    /// Marks a lock stale-but-not-reclaimed, unless it was forgotten
    /// meanwhile (deleted under a reclaim that then failed or timed out).
    pub(crate) fn mark_stale(&self, key: &LockKey, reason: verdict::StaleReason) {
        let memos = self.memos.lock().unwrap_or_else(|e| e.into_inner());
        if memos.contains_key(key) {
            self.state
                .metrics
                .set_stale(&key.namespace, &key.name, Some(reason));
        }
    }

    /// operator-lib re-creates a lock without labels: after a lock is gone,
    /// wait for a new holder to create it and carry the opt-in label over,
    /// so the operator stays protected. One follower per lock; none in
    /// dry-run (no writes) or when the selector is not one `key=value`.
    fn follow_takeover(&self, key: &LockKey, old_holder_uid: String) {
        if self.settings.dry_run {
            return;
        }
        let Some((k, v)) = self.settings.selector.opt_in_label() else {
            warn!(namespace = %key.namespace, lock = %key.name, selector = %self.settings.selector,
                  "the selector is not a single key=value label; label the new lock by hand after a takeover");
            return;
        };
        let mut followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        followers.retain(|_, t| !t.is_finished());
        if followers.contains_key(key) {
            return;
        }
        let task = reclaim::carry_label_over(
            self.cm_api(&key.namespace),
            key.name.clone(),
            (k.to_owned(), v.to_owned()),
            old_holder_uid,
        );
        followers.insert(key.clone(), tokio::spawn(task));
    }

    /// Locks whose takeover is still awaited (lost if the process stops).
    pub fn awaiting_takeover(&self) -> Vec<LockKey> {
        let followers = self.followers.lock().unwrap_or_else(|e| e.into_inner());
        let mut keys: Vec<LockKey> = followers
            .iter()
            .filter(|(_, t)| !t.is_finished())
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys
    }

    /// After a re-list: forgets locks of this scope that are no longer there.
    fn forget_missing(&self, namespace: Option<&str>, store: &Store<LockMeta>) {
        let present: std::collections::HashSet<LockKey> =
            store.state().iter().map(|m| key_of(m)).collect();
        let gone: Vec<LockKey> = {
            let memos = self.memos.lock().unwrap_or_else(|e| e.into_inner());
            memos
                .keys()
                .filter(|k| namespace.is_none_or(|ns| k.namespace == ns) && !present.contains(k))
                .cloned()
                .collect()
        };
        for k in gone {
            self.forget(&k);
        }
    }

    fn publish_counts(&self, memos: &HashMap<LockKey, Memo>) {
        let mut counts: HashMap<LockState, i64> = LockState::ALL.iter().map(|s| (*s, 0)).collect();
        for s in memos.values().filter_map(|m| m.state) {
            *counts.entry(s).or_default() += 1;
        }
        self.state.metrics.set_lock_counts(counts);
    }

    fn cm_api(&self, namespace: &str) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn pod_api(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    async fn read_holder(&self, lock: &Lock) -> Result<Option<Pod>, Error> {
        call(
            format!("reading holder pod {}/{}", lock.namespace, lock.holder.name),
            self.pod_api(&lock.namespace).get_opt(&lock.holder.name),
        )
        .await
    }

    /// Judges what a live read found of the holder, remembering since when
    /// it has been missing.
    fn judge_holder(&self, key: &LockKey, lock: &Lock, holder: Option<&Pod>) -> Verdict {
        let now = Timestamp::now();
        let seen = match holder {
            Some(pod) => {
                self.with_memo(key, |m| m.missing_since = None);
                HolderSeen::Pod(pod)
            }
            None => self.with_memo(key, |m| {
                let (since, at) = match &m.missing_since {
                    Some((u, since, at)) if *u == lock.holder.uid => (*since, *at),
                    _ => {
                        let first = (Instant::now(), now);
                        m.missing_since = Some((lock.holder.uid.clone(), first.0, first.1));
                        first
                    }
                };
                HolderSeen::Missing {
                    since: at,
                    gone_for: since.elapsed(),
                }
            }),
        };
        verdict::judge(lock, seen, &self.settings.policy)
    }

    /// Reads the lock and its holder live and judges them. `None`: the lock
    /// no longer exists.
    pub async fn judge_live(&self, key: &LockKey) -> Result<Option<Judgement>, Error> {
        let Some(live) = call(
            format!("reading lock {}/{}", key.namespace, key.name),
            self.cm_api(&key.namespace).get_metadata_opt(&key.name),
        )
        .await?
        else {
            return Ok(None);
        };
        let meta = live.metadata;
        // The cache said this lock is opted in; the live copy must say so too.
        if !self.settings.selector.matches(meta.labels.as_ref()) {
            return Ok(None);
        }
        let lock = match lock::parse(&meta) {
            Ok(lock) => lock,
            Err(why) => {
                return Ok(Some(Judgement {
                    key: key.clone(),
                    meta,
                    lock: None,
                    holder: None,
                    verdict: Verdict::Unmanageable(why),
                    died_at: None,
                }))
            }
        };
        let uid = lock.holder.uid.clone();
        self.with_memo(key, |m| m.holder_uid = Some(uid.clone()));
        let mut holder = self.read_holder(&lock).await?;
        let mut verdict = self.judge_holder(key, &lock, holder.as_ref());
        if let Verdict::Stale {
            reason: verdict::StaleReason::OwnerGone,
            ..
        } = verdict
        {
            if let Some(ns) =
                holder_elsewhere(&self.client, &self.settings.namespaces, &lock).await?
            {
                verdict = Verdict::Unmanageable(Unmanageable::OwnerInOtherNamespace(ns));
            } else {
                // That search took time: the holder read must be the last
                // read before a delete (a same-name pod may have appeared).
                holder = self.read_holder(&lock).await?;
                verdict = self.judge_holder(key, &lock, holder.as_ref());
            }
        }
        let now = Timestamp::now();
        let died_at = match &verdict {
            Verdict::Stale { died_at, .. } => Some(died_at.unwrap_or_else(|| {
                self.with_memo(key, |m| match &m.stale_since {
                    Some((u, t)) if *u == uid => *t,
                    _ => {
                        m.stale_since = Some((uid.clone(), now));
                        now
                    }
                })
            })),
            _ => None,
        };
        Ok(Some(Judgement {
            key: key.clone(),
            meta,
            lock: Some(lock),
            holder,
            verdict,
            died_at,
        }))
    }
}

/// Before calling a lock's owner gone: is a pod with the holder's uid
/// alive in another namespace (an owner reference that crosses
/// namespaces)? Owner references are namespace-local, so such a lock is
/// not ours to judge. One list by name (a field selector), cluster-wide;
/// an install limited to some namespaces may not list cluster-wide, and
/// then looks in the namespaces it watches.
pub async fn holder_elsewhere(
    client: &Client,
    namespaces: &[String],
    lock: &Lock,
) -> Result<Option<String>, Error> {
    let lp = ListParams::default().fields(&format!("metadata.name={}", lock.holder.name));
    let find = |pods: kube::core::ObjectList<PartialObjectMeta<Pod>>| {
        pods.items
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() == Some(lock.holder.uid.as_str()))
            .map(|p| p.namespace().unwrap_or_default())
    };
    let all: Api<Pod> = Api::all(client.clone());
    match call(
        "looking for the holder in other namespaces",
        all.list_metadata(&lp),
    )
    .await
    {
        Ok(pods) => return Ok(find(pods)),
        Err(e) if e.kind() == crate::ErrorKind::Forbidden && !namespaces.is_empty() => {
            debug!(error = %e, "cannot list pods cluster-wide; looking in the watched namespaces only");
        }
        Err(e) => return Err(e),
    }
    for ns in namespaces.iter().filter(|ns| **ns != lock.namespace) {
        let pods = call(
            "looking for the holder in other namespaces",
            Api::<Pod>::namespaced(client.clone(), ns).list_metadata(&lp),
        )
        .await?;
        if let Some(found) = find(pods) {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

pub fn key_of(m: &LockMeta) -> LockKey {
    LockKey {
        namespace: m.namespace().unwrap_or_default(),
        name: m.name_any(),
    }
}

/// Judges one lock from live reads and acts on the verdict.
pub async fn reconcile(obj: Arc<LockMeta>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.state.readiness.is_synced() {
        // Safety rule 4: nothing happens before every watch has synced.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let _timer = ctx.state.metrics.reconcile_duration.start_timer();
    let key = key_of(&obj);
    let Some(judgement) = ctx.judge_live(&key).await? else {
        debug!(namespace = %key.namespace, lock = %key.name, "lock is gone");
        ctx.forget(&key);
        return Ok(Action::await_change());
    };
    act(&ctx, judgement).await
}

/// Acts on a judgement: reports, reclaims, and says when to look again.
pub async fn act(ctx: &Context, j: Judgement) -> Result<Action, Error> {
    let resync = Action::requeue(ctx.settings.resync);
    ctx.set_state(&j.key, j.verdict.state());
    if !matches!(j.verdict, Verdict::Stale { .. }) {
        ctx.state
            .metrics
            .set_stale(&j.key.namespace, &j.key.name, None);
    }
    match &j.verdict {
        Verdict::Held(why) => {
            debug!(namespace = %j.key.namespace, lock = %j.key.name, held = ?why, "lock is held");
            if let verdict::HeldBecause::OwnerGoneGrace { remaining } = why {
                info!(namespace = %j.key.namespace, lock = %j.key.name,
                      "holder pod is missing; reclaiming after the owner-gone grace unless it reappears");
                let wait = remaining.saturating_add(Duration::from_millis(100));
                return Ok(Action::requeue(wait.min(ctx.settings.resync)));
            }
            Ok(resync)
        }
        Verdict::Ambiguous { .. } | Verdict::Unmanageable(_) => {
            reclaim::report_untouchable(ctx, &j).await;
            Ok(resync)
        }
        Verdict::Stale { .. } => match reclaim::reclaim(ctx, &j).await? {
            reclaim::Outcome::Reclaimed | reclaim::Outcome::AlreadyGone => {
                ctx.forget(&j.key);
                Ok(Action::await_change())
            }
            reclaim::Outcome::Changed => Ok(Action::requeue(REJUDGE_AFTER)),
            reclaim::Outcome::DryRun => Ok(resync),
        },
    }
}

/// The one place where failures are counted.
pub fn error_policy(obj: Arc<LockMeta>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.state
        .metrics
        .reconcile_errors
        .with_label_values(&[err.kind().as_str()])
        .inc();
    warn!(namespace = %obj.namespace().unwrap_or_default(), lock = %obj.name_any(), error = %err,
          kind = err.kind().as_str(), "reconcile failed; nothing deleted, retrying");
    Action::requeue(ERROR_BACKOFF)
}

/// Calls `synced` once, on the first InitDone of a watch.
fn on_first_sync<K>(
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

/// Runs the controller for one scope (a namespace, or all) until `shutdown`.
async fn run_scope(ctx: Arc<Context>, namespace: Option<String>, shutdown: CancellationToken) {
    // Api<PartialObjectMeta<_>> makes metadata-only requests.
    let (cms, pods): (Api<LockMeta>, Api<PartialObjectMeta<Pod>>) = match &namespace {
        Some(ns) => (
            Api::namespaced(ctx.client.clone(), ns),
            Api::namespaced(ctx.client.clone(), ns),
        ),
        None => (Api::all(ctx.client.clone()), Api::all(ctx.client.clone())),
    };
    let (reader, writer) = reflector::store::<LockMeta>();
    let readiness = ctx.state.readiness.clone();

    let locks = {
        let ctx = ctx.clone();
        let reader = reader.clone();
        let readiness = readiness.clone();
        let ns = namespace.clone();
        let config = watcher::Config::default()
            .labels(ctx.settings.selector.as_str())
            .any_semantic();
        let stream = watcher(cms, config)
            .default_backoff()
            // Keep only what judging needs: owner references live in metadata.
            .modify(|m: &mut LockMeta| {
                m.metadata.managed_fields = None;
                m.metadata.annotations = None;
            })
            .reflect(writer)
            .inspect(move |ev| match ev {
                Ok(watcher::Event::Delete(m)) => ctx.forget(&key_of(m)),
                Ok(watcher::Event::InitDone) => ctx.forget_missing(ns.as_deref(), &reader),
                _ => {}
            });
        on_first_sync(stream, move || readiness.synced()).touched_objects()
    };

    let terminal_pods = {
        let readiness = readiness.clone();
        let stream =
            watcher(pods, watcher::Config::default().fields(TERMINAL_PODS)).default_backoff();
        on_first_sync(stream, move || readiness.synced()).touched_objects()
    };
    let holders = reader.clone();
    let held_by = move |pod: PartialObjectMeta<Pod>| {
        let ns = pod.namespace();
        let uid = pod.metadata.uid.unwrap_or_default();
        holders
            .state()
            .into_iter()
            .filter(|cm| {
                cm.namespace() == ns
                    && cm
                        .owner_references()
                        .iter()
                        .any(|o| o.kind == "Pod" && !uid.is_empty() && o.uid == uid)
            })
            .map(|cm| ObjectRef::from_obj(&*cm))
            .collect::<Vec<_>>()
    };

    // A lock deleted while its reconcile was in flight may be remembered
    // again after the watch said it was gone; prune such ghosts each resync.
    let pruner = {
        let (ctx, reader, ns, shutdown) = (
            ctx.clone(),
            reader.clone(),
            namespace.clone(),
            shutdown.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(ctx.settings.resync);
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => {
                        if ctx.state.readiness.is_synced() {
                            ctx.forget_missing(ns.as_deref(), &reader);
                        }
                    }
                }
            }
        })
    };

    let scope = namespace.as_deref().unwrap_or("all namespaces").to_owned();
    info!(scope = %scope, selector = %ctx.settings.selector, "watching locks");
    Controller::for_stream(locks, reader)
        .watches_stream(terminal_pods, held_by)
        .with_config(ControllerConfig::default().concurrency(4))
        .graceful_shutdown_on(shutdown.cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            match res {
                Ok((obj, _)) => debug!(lock = %obj, "reconciled"),
                Err(e) => debug!(error = %e, "controller event"),
            }
            future::ready(())
        })
        .await;
    pruner.abort();
    info!(scope = %scope, "stopped watching");
}

/// Checks, before any watch starts, that the selector is accepted and the
/// janitor may list and watch locks and terminal pods in every scope: a clear
/// error at start-up beats a watcher that lists once (and looks synced) and
/// then retries a forbidden watch forever.
pub async fn preflight(client: &Client, settings: &Settings) -> Result<(), Error> {
    let scopes: Vec<Option<&str>> = if settings.namespaces.is_empty() {
        vec![None]
    } else {
        settings
            .namespaces
            .iter()
            .map(|n| Some(n.as_str()))
            .collect()
    };
    for ns in scopes {
        let (cms, pods): (Api<ConfigMap>, Api<Pod>) = match ns {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone())),
        };
        let where_ = ns.unwrap_or("all namespaces");
        let lp = ListParams::default()
            .labels(settings.selector.as_str())
            .limit(1);
        let wp = WatchParams::default()
            .labels(settings.selector.as_str())
            .timeout(1);
        check_list_and_watch(&cms, &lp, &wp, &format!("configmaps in {where_}")).await?;
        let lp = ListParams::default().fields(TERMINAL_PODS).limit(1);
        let wp = WatchParams::default().fields(TERMINAL_PODS).timeout(1);
        check_list_and_watch(&pods, &lp, &wp, &format!("pods in {where_}")).await?;
    }
    Ok(())
}

/// Lists (one item) and opens a one-second watch from the list's version;
/// an error status in the watch stream counts as a failure too.
async fn check_list_and_watch<K>(
    api: &Api<K>,
    lp: &ListParams,
    wp: &WatchParams,
    what: &str,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = call(format!("listing {what}"), api.list_metadata(lp)).await?;
    let rv = list.metadata.resource_version.unwrap_or_else(|| "0".into());
    let action = format!("watching {what}");
    let events = call(action.clone(), api.watch_metadata(wp, &rv)).await?;
    futures::pin_mut!(events);
    let first = call(action.clone(), async { Ok(events.next().await) }).await?;
    match first {
        Some(Err(source)) => Err(Error::Kube { action, source }),
        Some(Ok(WatchEvent::Error(status))) => Err(Error::Kube {
            action,
            source: kube::Error::Api(status),
        }),
        _ => Ok(()),
    }
}

/// Runs one controller per scope until `shutdown` is cancelled and every
/// in-flight reconcile has finished.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let scopes: Vec<Option<String>> = if ctx.settings.namespaces.is_empty() {
        vec![None]
    } else {
        ctx.settings.namespaces.iter().cloned().map(Some).collect()
    };
    // Two watches per scope (locks, terminal pods) must list before ready.
    ctx.state.readiness.expect(2 * scopes.len());
    future::join_all(
        scopes
            .into_iter()
            .map(|ns| run_scope(ctx.clone(), ns, shutdown.clone())),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Before every watch has synced, a reconcile does nothing at all: no
    /// API call (the client points nowhere), no judgement.
    #[tokio::test]
    async fn nothing_happens_before_the_watches_sync() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let state = State::new().unwrap();
        state.readiness.expect(2);
        state.readiness.synced();
        let ctx = Context::new(
            client,
            state.clone(),
            Settings {
                selector: Selector::parse(crate::DEFAULT_SELECTOR).unwrap(),
                namespaces: vec![],
                dry_run: false,
                delete_pod: false,
                policy: Policy {
                    owner_gone_grace: Duration::from_secs(30),
                },
                resync: Duration::from_secs(300),
            },
        );
        let mut lock = LockMeta::default();
        lock.metadata.name = Some("op-lock".into());
        lock.metadata.namespace = Some("ops".into());
        let lock = Arc::new(lock);
        let action = reconcile(lock.clone(), ctx.clone()).await.unwrap();
        assert_eq!(action, Action::requeue(Duration::from_secs(1)));
        assert_eq!(state.metrics.reconcile_duration.get_sample_count(), 0);

        // Once synced, the same reconcile reads live, and fails here (nothing
        // listens): an error, never a verdict.
        state.readiness.synced();
        let err = reconcile(lock, ctx).await.unwrap_err();
        assert!(
            matches!(
                err.kind(),
                crate::ErrorKind::Api | crate::ErrorKind::Timeout
            ),
            "{err}"
        );
        assert_eq!(state.metrics.reconcile_duration.get_sample_count(), 1);
    }
}
