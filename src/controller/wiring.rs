//! What the kinds' scopes share in their wiring: the terminal-pod watch,
//! the lead trigger, the filter that keeps settled locks from the
//! Controller, and `drive`, which runs a scope's Controller for one kind
//! (its triggers: the lock watch, and the suspects the scope's pod side,
//! the lead trigger and re-lists name).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future;
use kube::runtime::controller::Action;
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

/// A judgement's turn (`in_turn`): held from the judgement's first read
/// until its write is answered (the intent Event, the holder read again,
/// the freeing write, and a `StaleLockReclaimStopped` when the holder or
/// the lock changed), or, when none is made, until that is known, before
/// anything is said; at the latest until `reconcile` returns. What is said
/// after (`StaleLockReclaimed`, `--delete-pod`'s deletion, a dry run's,
/// a blocked or an untouchable lock's Event) goes on past `end`, in the
/// same reconcile, while the next lock is judged: a report never holds a
/// turn a death waits for, and waits itself while a lock is in line or
/// judged (`reclaim::Judging`, 1 s at most), which the turn counts from
/// the lock's handover to its `end`. Outside the
/// Controller (unit and end-to-end tests call `reconcile` directly) a
/// reconcile has none (`Turn::default`).
#[derive(Default)]
pub struct Turn {
    /// Held for its drop, which gives the turn on.
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Counted among the judgements reports yield to, from the lock's
    /// handover to the turn's end (`reclaim::Judging`).
    _in_line: Option<crate::reclaim::InLine>,
}

impl Turn {
    /// Gives the turn to the next lock in line.
    pub fn end(self) {}

    /// A turn taken from `permit` (a test's own semaphore).
    #[cfg(test)]
    pub(super) fn of(permit: tokio::sync::OwnedSemaphorePermit) -> Turn {
        Turn {
            _permit: Some(permit),
            _in_line: None,
        }
    }
}

/// Reconciles a Controller takes at once, most of them waiting their turn
/// (see `in_turn`); past this many, kube-runtime holds the rest itself.
const QUEUED: u16 = 1024;

/// The reconciler of a Controller: at most `concurrency` judgements at once,
/// begun in the order the Controller hands their locks over. kube-runtime's
/// Controller can bound them itself, but a lock queued while its reconciles
/// are all busy waits in a set, and any of the set runs next: in a burst
/// larger than the bound, the lock whose holder died first could be judged
/// last, behind every later one. So the Controller takes each queued lock
/// at once (up to `QUEUED`), and a fair semaphore lets `concurrency` of them
/// on, first come first served.
///
/// A lock's place in line is taken here, as the Controller hands it over
/// (in the order of its queue; locks queued within the same millisecond
/// come out of it in no fixed order), not when its task is first run (the
/// Controller spawns each reconcile, and a runtime's threads pick spawned
/// tasks in no set order; so do the first `concurrency`, which get their
/// turn at once). While it waits, a lock holds its task, its Controller
/// entry and a few pointers; its judgement's future is made once its turn
/// comes, from the store's copy then (`current`: none if the lock is gone
/// meanwhile, and nothing is judged). A lock named again while it waits is
/// judged again after its turn (kube-runtime merges the names of a lock not
/// yet handed over, not of one handed over); that judgement finds the
/// first one standing, unless something changed. Once `shutdown` is
/// cancelled, a lock whose turn comes is not judged, as kube-runtime would
/// not begin a queued one.
fn in_turn<O, C, F, Fut>(
    concurrency: u16,
    judging: crate::reclaim::Judging,
    shutdown: CancellationToken,
    current: impl Fn(&O) -> Option<Arc<O>> + Clone + Send + 'static,
    judge: F,
) -> impl FnMut(Arc<O>, Arc<C>) -> future::BoxFuture<'static, Result<Action, crate::Error>>
where
    O: Send + Sync + 'static,
    C: Send + Sync + 'static,
    F: Fn(Arc<O>, Arc<C>, Turn) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Action, crate::Error>> + Send + 'static,
{
    use std::future::Future;
    use std::task::Poll;
    let turns = Arc::new(tokio::sync::Semaphore::new(usize::from(concurrency)));
    move |obj, ctx| {
        let (shutdown, current, judge) = (shutdown.clone(), current.clone(), judge.clone());
        let in_line = judging.enter();
        // In line now: a first poll enqueues the wait (the task's own poll
        // later takes the place of this waker, which wakes nothing). Out of
        // tokio's cooperative budget, which could otherwise answer this
        // poll with Pending before it gets in line.
        let mut waiting = Box::pin(tokio::task::unconstrained(turns.clone().acquire_owned()));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let first = waiting.as_mut().poll(&mut cx);
        Box::pin(async move {
            let turn = match first {
                Poll::Ready(turn) => turn,
                Poll::Pending => waiting.await,
            };
            // Never closed; were it, nothing would be judged.
            let (Ok(turn), false) = (turn, shutdown.is_cancelled()) else {
                return Ok(Action::await_change());
            };
            let Some(obj) = current(&obj) else {
                debug!("lock gone before its judgement");
                return Ok(Action::await_change());
            };
            let turn = Turn {
                _permit: Some(turn),
                _in_line: Some(in_line),
            };
            Box::pin(judge(obj, ctx, turn)).await
        })
    }
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
    let current = {
        let reader = w.reader.clone();
        move |o: &K| reader.get(&kube::runtime::reflector::ObjectRef::from_obj(o))
    };
    let locks = needs_judging_only(&ctx, w.accepting, w.locks);
    info!(scope = %scope, kind = %K::KIND, selector = %ctx.settings.selector, "watching locks");
    let ctx_errors = ctx
        .shared
        .metrics
        .reconcile_errors
        .with_label_values(&[crate::ErrorKind::Controller.as_str()]);
    Controller::for_stream(locks, w.reader)
        .reconcile_on(w.suspects)
        .with_config(ControllerConfig::default().concurrency(QUEUED))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(
            in_turn(
                w.concurrency,
                ctx.reclaimer.judging(),
                shutdown,
                current,
                reconcile::<K>,
            ),
            error_policy::<K>,
            ctx,
        )
        .for_each(|res| {
            match res {
                Ok((obj, _)) => debug!(lock = %obj, "reconciled"),
                // A reconcile's own failure is counted and said in
                // error_policy; this is anything else the Controller
                // reports (a queue or trigger failure).
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                // Deleted before the Controller handed it over (a reclaim's
                // own trigger, a suspect named twice): nothing to judge.
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// What the judgements did: the order they began in, how many ran at
    /// once at most.
    #[derive(Default)]
    struct Seen {
        began: Mutex<Vec<usize>>,
        running: Mutex<(usize, usize)>,
    }

    /// A judgement that holds its turn to the end (one that writes nothing).
    async fn judge(n: Arc<usize>, seen: Arc<Seen>, _turn: Turn) -> Result<Action, crate::Error> {
        seen.began.lock().unwrap().push(*n);
        {
            let mut r = seen.running.lock().unwrap();
            r.0 += 1;
            r.1 = r.1.max(r.0);
        }
        // The reads and the write of a judgement, here a pause.
        tokio::time::sleep(Duration::from_millis(10 + 7 * (*n as u64 % 3))).await;
        seen.running.lock().unwrap().0 -= 1;
        Ok(Action::requeue(Duration::from_secs(1)))
    }

    /// The store's copy: the one the lock was queued with.
    fn same(n: &usize) -> Option<Arc<usize>> {
        Some(Arc::new(*n))
    }

    #[tokio::test(start_paused = true)]
    async fn queued_locks_are_judged_in_the_order_they_came_a_few_at_a_time() {
        let seen = Arc::new(Seen::default());
        let mut turn = in_turn(3, Default::default(), CancellationToken::new(), same, judge);
        // 30 locks queued at once, more than 3 may run: each begins after
        // every lock queued before it, and never more than 3 run. (30:
        // join_all's limit for polling each future only when woken.)
        let all: Vec<_> = (0..30).map(|n| turn(Arc::new(n), seen.clone())).collect();
        let out = futures::future::join_all(all).await;
        assert!(out
            .iter()
            .all(|r| matches!(r, Ok(a) if *a == Action::requeue(Duration::from_secs(1)))));
        assert_eq!(*seen.began.lock().unwrap(), (0..30).collect::<Vec<_>>());
        assert_eq!(seen.running.lock().unwrap().1, 3);
    }

    /// A reclaim: its reads and write (10 ms), its turn ended once the
    /// write is answered, then its Event (1 s).
    async fn reclaim(n: Arc<usize>, seen: Arc<Seen>, turn: Turn) -> Result<Action, crate::Error> {
        seen.began.lock().unwrap().push(*n);
        {
            let mut r = seen.running.lock().unwrap();
            r.0 += 1;
            r.1 = r.1.max(r.0);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        seen.running.lock().unwrap().0 -= 1;
        turn.end();
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(Action::await_change())
    }

    #[tokio::test(start_paused = true)]
    async fn a_turn_ends_with_the_write_not_with_what_is_said_after_it() {
        let seen = Arc::new(Seen::default());
        let mut turn = in_turn(
            2,
            Default::default(),
            CancellationToken::new(),
            same,
            reclaim,
        );
        let started = tokio::time::Instant::now();
        let all: Vec<_> = (0..8).map(|n| turn(Arc::new(n), seen.clone())).collect();
        let out = futures::future::join_all(all).await;
        assert!(out.iter().all(Result::is_ok));
        assert_eq!(*seen.began.lock().unwrap(), (0..8).collect::<Vec<_>>());
        assert_eq!(seen.running.lock().unwrap().1, 2, "2 writes at most");
        // 4 rounds of writes, then the last Event: not 4 rounds of both.
        let took = started.elapsed();
        assert!(took < Duration::from_millis(1100), "{took:?}");
    }

    /// When each report went, after the start, with the count it yields to.
    struct Reports {
        judging: crate::reclaim::Judging,
        t0: tokio::time::Instant,
        went: Mutex<Vec<Duration>>,
    }

    /// A reclaim whose report yields to the judgements (`Judging::quiet`):
    /// its write (10 ms), its turn ended, then its report.
    async fn reclaim_then_report(
        _n: Arc<usize>,
        r: Arc<Reports>,
        turn: Turn,
    ) -> Result<Action, crate::Error> {
        tokio::time::sleep(Duration::from_millis(10)).await;
        turn.end();
        r.judging.quiet(Duration::from_secs(5)).await;
        r.went.lock().unwrap().push(r.t0.elapsed());
        Ok(Action::await_change())
    }

    #[tokio::test(start_paused = true)]
    async fn reports_follow_the_last_write_of_a_burst_and_the_count_returns_to_zero() {
        let judging = crate::reclaim::Judging::default();
        let r = Arc::new(Reports {
            judging: judging.clone(),
            t0: tokio::time::Instant::now(),
            went: Mutex::default(),
        });
        let shutdown = CancellationToken::new();
        let mut turn = in_turn(
            2,
            judging.clone(),
            shutdown.clone(),
            same,
            reclaim_then_report,
        );
        let all: Vec<_> = (0..8).map(|n| turn(Arc::new(n), r.clone())).collect();
        let out = futures::future::join_all(all).await;
        assert!(out.iter().all(Result::is_ok));
        // 4 rounds of 2 writes: every report goes once the last is answered,
        // none waits for its own judgement.
        assert_eq!(*r.went.lock().unwrap(), vec![Duration::from_millis(40); 8]);

        // Every other end of a lock's place in line gives it up: dropped
        // before it is judged, gone from the store, after shutdown.
        let mut gone = in_turn(
            1,
            judging.clone(),
            shutdown.clone(),
            |_: &usize| None,
            reclaim_then_report,
        );
        let waiting = turn(Arc::new(8), r.clone());
        let _ = gone(Arc::new(9), r.clone()).await;
        drop(waiting);
        shutdown.cancel();
        let _ = turn(Arc::new(10), r.clone()).await;
        let t = tokio::time::Instant::now();
        judging.quiet(Duration::from_secs(5)).await;
        assert_eq!(t.elapsed(), Duration::ZERO, "a count left behind");
    }

    #[tokio::test(start_paused = true)]
    async fn the_place_in_line_is_taken_when_the_lock_is_handed_over_not_when_its_task_runs() {
        // The Controller hands locks over in order and spawns each; the
        // runtime may run the tasks in any order, here the reverse.
        let seen = Arc::new(Seen::default());
        let mut turn = in_turn(1, Default::default(), CancellationToken::new(), same, judge);
        let handed: Vec<_> = (0..20).map(|n| turn(Arc::new(n), seen.clone())).collect();
        let out = futures::future::join_all(handed.into_iter().rev()).await;
        assert!(out.iter().all(Result::is_ok));
        assert_eq!(*seen.began.lock().unwrap(), (0..20).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_dropped_while_it_waits_gives_its_turn_up() {
        // As when the Controller stops and drops its queued reconciles.
        let seen = Arc::new(Seen::default());
        let mut turn = in_turn(1, Default::default(), CancellationToken::new(), same, judge);
        let first = turn(Arc::new(0), seen.clone());
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), turn(Arc::new(1), seen.clone()));
        assert!(matches!(second.await, Ok(Ok(_))));
        assert_eq!(*seen.began.lock().unwrap(), vec![1]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_store_copy_is_judged_and_a_lock_gone_from_it_while_it_waited_is_not() {
        let seen = Arc::new(Seen::default());
        // The store holds 100 for 0 (changed while it waited), nothing for 1.
        let now = |n: &usize| (*n != 1).then(|| Arc::new(*n + 100));
        let mut turn = in_turn(1, Default::default(), CancellationToken::new(), now, judge);
        let (a, b) = futures::join!(
            turn(Arc::new(0), seen.clone()),
            turn(Arc::new(1), seen.clone())
        );
        assert!(matches!(a, Ok(x) if x == Action::requeue(Duration::from_secs(1))));
        assert!(matches!(b, Ok(x) if x == Action::await_change()));
        assert_eq!(*seen.began.lock().unwrap(), vec![100]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_whose_turn_comes_after_shutdown_is_not_judged() {
        let seen = Arc::new(Seen::default());
        let shutdown = CancellationToken::new();
        let mut turn = in_turn(1, Default::default(), shutdown.clone(), same, judge);
        let first = turn(Arc::new(0), seen.clone());
        let second = turn(Arc::new(1), seen.clone());
        let stop = async {
            // The first is judging; the second waits its turn.
            tokio::time::sleep(Duration::from_millis(1)).await;
            shutdown.cancel();
        };
        let (a, b, ()) = futures::join!(first, second, stop);
        assert!(matches!(a, Ok(x) if x == Action::requeue(Duration::from_secs(1))));
        assert!(matches!(b, Ok(x) if x == Action::await_change()));
        assert_eq!(*seen.began.lock().unwrap(), vec![0]);
    }
}
