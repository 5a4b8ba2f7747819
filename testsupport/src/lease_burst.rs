//! The Lease burst of `bench_scale`: holders renew their Leases as
//! client-go's elector does with controller-runtime's defaults (a 15 s
//! lease, renewed every 2 s, the holder identity its pod's name), all of
//! them fail at once, and each release is timed from the moment the
//! janitor's renewal rule allows it (docs/how-it-decides.md: the renewal
//! window `W` after the later of the last renewal and the death) to the
//! release a watch here sees. The floor, in the same run, is a bare
//! releaser: it knows each moment without reading anything and sends the
//! same guarded release then, one at a time (as the ConfigMap floor sends
//! one DELETE per death).
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use lock_janitor_testenv::audit::AuditEvent;
use lock_janitor_testenv::kubelet;

use crate::bench::*;

/// client-go's retry period with controller-runtime's defaults: a leader
/// renews this often.
pub const RENEW: Duration = Duration::from_secs(2);
/// controller-runtime's default lease duration.
pub const LEASE_SECONDS: i32 = 15;
/// Every Lease of the burst carries it (the release watch's selector).
pub const BENCH_LABEL: (&str, &str) = ("lock-janitor.io/bench", "lease-burst");
const WRITERS: usize = 32;

/// One holder: its pod and the Lease it renews, named after it.
#[derive(Clone)]
pub struct Holder {
    pub ns: String,
    pub pod: String,
    pub lease: String,
}

impl Holder {
    fn key(&self) -> String {
        format!("{}/{}", self.ns, self.lease)
    }
}

/// Creates `n` running holder pods and their Leases across `namespaces`,
/// named `<prefix>-<i>`; `watched`: the Leases carry the janitor's opt-in
/// label.
pub async fn holders(
    client: &Client,
    namespaces: &[String],
    prefix: &str,
    n: usize,
    watched: bool,
) -> Vec<Holder> {
    futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let ns = namespaces[i % namespaces.len()].clone();
            let pod = format!("{prefix}-{i}");
            async move {
                running(&client, &ns, &pod, &node_of(i), "leader").await;
                let mut labels = std::collections::BTreeMap::from([(
                    BENCH_LABEL.0.to_string(),
                    BENCH_LABEL.1.to_string(),
                )]);
                if watched {
                    labels.insert(crate::WATCH_LABEL.0.into(), crate::WATCH_LABEL.1.into());
                }
                let now = MicroTime(Timestamp::now());
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(format!("{pod}-lease")),
                        labels: Some(labels),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(pod.clone()),
                        lease_duration_seconds: Some(LEASE_SECONDS),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                let api: Api<Lease> = Api::namespaced(client.clone(), &ns);
                let pp = PostParams::default();
                let made = retry(&format!("creating lease {ns}/{pod}-lease"), || {
                    api.create(&pp, &lease)
                })
                .await;
                Holder {
                    lease: made.name_any(),
                    ns,
                    pod,
                }
            }
        })
        .buffered(WRITERS)
        .collect()
        .await
}

/// What the renewer wrote to one Lease.
#[derive(Clone)]
pub struct Renewed {
    /// The renew times written, oldest first.
    times: Vec<Timestamp>,
    /// The Lease as the last renewal's answer returned it.
    last: Option<Lease>,
    /// When the API server acknowledged the last renewal.
    acked: Timestamp,
}

/// Renews every Lease of `holders` each `RENEW`, until stopped.
pub struct Renewer {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicUsize>,
    seen: Arc<Mutex<HashMap<String, Renewed>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Renewer {
    pub fn start(client: &Client, holders: &[Holder]) -> Renewer {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicUsize::new(0));
        let seen: Arc<Mutex<HashMap<String, Renewed>>> = Arc::default();
        let task = {
            let (client, holders) = (client.clone(), holders.to_vec());
            let (stop, rounds, seen) = (stop.clone(), rounds.clone(), seen.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let started = tokio::time::Instant::now();
                    futures::stream::iter(holders.iter())
                        .for_each_concurrent(WRITERS, |h| {
                            let (client, seen) = (client.clone(), seen.clone());
                            async move {
                                let at = Timestamp::now();
                                let patch =
                                    serde_json::json!({"spec": {"renewTime": MicroTime(at)}});
                                let api: Api<Lease> = Api::namespaced(client, &h.ns);
                                let (pp, patch) = (PatchParams::default(), Patch::Merge(&patch));
                                let answer = retry(&format!("renewing {}", h.key()), || {
                                    api.patch(&h.lease, &pp, &patch)
                                })
                                .await;
                                let acked = Timestamp::now();
                                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                                let r = seen.entry(h.key()).or_insert_with(|| Renewed {
                                    times: Vec::new(),
                                    last: None,
                                    acked,
                                });
                                r.times.push(at);
                                r.last = Some(answer);
                                r.acked = acked;
                            }
                        })
                        .await;
                    rounds.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep_until(started + RENEW).await;
                }
            })
        };
        Renewer {
            stop,
            rounds,
            seen,
            task,
        }
    }

    /// Waits until `n` more rounds of renewals are done.
    pub async fn rounds(&self, n: usize) {
        let until = self.rounds.load(Ordering::SeqCst) + n;
        while self.rounds.load(Ordering::SeqCst) < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops renewing; returns once the last renewal was acknowledged.
    pub async fn stop(self) -> HashMap<String, Renewed> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.clone()
    }
}

/// A floor's holders renew five rounds (four gaps, as the janitor keeps),
/// then all fail at once: when the rule allows each release.
pub async fn renew_then_fail(client: &Client, holders: &[Holder]) -> HashMap<String, Allowed> {
    let renewer = Renewer::start(client, holders);
    renewer.rounds(5).await;
    let renewed = renewer.stop().await;
    fail_all(client, holders, &renewed).await
}

/// The janitor's renewal window for a Lease renewed at `times` (see
/// `verdict::lease::renewal_window`): `max(5 s, 2.5 x the longest of the
/// last four gaps of at least 1 s)`, the gap taken as at most the lease.
pub fn window(times: &[Timestamp]) -> Duration {
    let gaps: Vec<Duration> = times
        .windows(2)
        .filter_map(|w| Duration::try_from(w[1].duration_since(w[0])).ok())
        .filter(|g| *g >= Duration::from_secs(1))
        .collect();
    let lease = Duration::from_secs(LEASE_SECONDS as u64);
    let period = gaps.iter().rev().take(4).max().copied();
    let wait = match period {
        Some(p) if gaps.len() >= 2 => p.min(lease) * 5 / 2,
        _ => lease * 5 / 6,
    };
    wait.max(Duration::from_secs(5))
}

/// When the renewal rule allows each Lease's release: `W` after the later
/// of its last acknowledged renewal and its holder's death.
pub struct Allowed {
    pub at: Timestamp,
    pub window: Duration,
    pub lease: Lease,
}

/// Every holder of `holders` fails at once (Evicted, 32 writers); returns
/// when the rule allows each release, by lease key.
pub async fn fail_all(
    client: &Client,
    holders: &[Holder],
    renewed: &HashMap<String, Renewed>,
) -> HashMap<String, Allowed> {
    let died: Vec<(Holder, Timestamp)> = futures::stream::iter(holders.iter().cloned())
        .map(|h| async move {
            let pod = retry(&format!("evicting {}/{}", h.ns, h.pod), || {
                kubelet::set_failed(
                    client,
                    &h.ns,
                    &h.pod,
                    "Evicted",
                    "The node was low on resource: memory.",
                )
            })
            .await;
            let finished = pod
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().next())
                .and_then(|c| c.state?.terminated?.finished_at)
                .map(|t| t.0)
                .unwrap_or_else(Timestamp::now);
            (h, finished)
        })
        .buffer_unordered(WRITERS)
        .collect()
        .await;
    died.into_iter()
        .filter_map(|(h, finished)| {
            let r = renewed.get(&h.key())?;
            let window = window(&r.times);
            let from = r.acked.max(finished);
            let at = from
                .checked_add(SignedDuration::try_from(window).ok()?)
                .ok()?;
            Some((
                h.key(),
                Allowed {
                    at,
                    window,
                    lease: r.last.clone()?,
                },
            ))
        })
        .collect()
}

/// When each Lease of the burst was seen released (its holder identity
/// emptied), by "ns/name", on this process's wall clock.
pub type Releases = Arc<Mutex<HashMap<String, Timestamp>>>;

pub fn watch_releases(
    client: &Client,
) -> (
    Releases,
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Receiver<()>,
) {
    let released: Releases = Arc::default();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = {
        let released = released.clone();
        let api: Api<Lease> = Api::all(client.clone());
        let config =
            watcher::Config::default().labels(&format!("{}={}", BENCH_LABEL.0, BENCH_LABEL.1));
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let stream = watcher(api, config);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(l)) => {
                        let holder = l.spec.as_ref().and_then(|s| s.holder_identity.as_deref());
                        if holder.is_none_or(str::is_empty) {
                            let key =
                                format!("{}/{}", l.namespace().unwrap_or_default(), l.name_any());
                            released
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .entry(key)
                                .or_insert_with(Timestamp::now);
                        }
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    _ => {}
                }
            }
        })
    };
    (released, task, rx)
}

/// The floor: sends each release at the moment the rule allows it, the
/// same guarded update as the janitor's (the Lease as last renewed, so a
/// changed Lease answers 409), one at a time in the order of those moments.
/// `released` is the janitor's own release (`lock_janitor::lock::lease::released`).
pub async fn bare_releases(
    client: &Client,
    allowed: &HashMap<String, Allowed>,
    released: impl Fn(Lease, Timestamp) -> Lease,
) -> usize {
    let mut order: Vec<(&String, &Allowed)> = allowed.iter().collect();
    order.sort_by_key(|(_, a)| a.at);
    let mut refused = 0;
    for (key, a) in order {
        if let Ok(wait) = Duration::try_from(a.at.duration_since(Timestamp::now())) {
            tokio::time::sleep(wait).await;
        }
        let (ns, name) = key.split_once('/').unwrap_or_default();
        let api: Api<Lease> = Api::namespaced(client.clone(), ns);
        let released = released(a.lease.clone(), Timestamp::now());
        if let Err(e) = api.replace(name, &PostParams::default(), &released).await {
            eprintln!("bare release of {key}: {e}");
            refused += 1;
        }
    }
    refused
}

/// What the Lease safe floor did that was not a release.
#[derive(Default)]
pub struct SafeMisses {
    /// A live read found the Lease changed (renewed, released, gone) or
    /// its holder not exactly one dead pod: nothing written.
    pub skipped: AtomicUsize,
    /// A request failed (or the release was refused): no release.
    pub failed: AtomicUsize,
    /// Intent Events refused or not answered within `INTENT_WITHIN`.
    pub events_failed: AtomicUsize,
}

/// The safe floor of the Lease burst: a bare client making exactly the
/// requests the janitor must make for a release once the renewal rule
/// allows it, in the janitor's order, and no others: a live GET of the
/// Lease; a list of its namespace's pods in pages of 100 (a holder
/// identity may name a pod by `spec.hostname`, which no field selector
/// reaches); the intent Event (as the ConfigMap safe floor writes it);
/// the holder read again by name; the release (`released`, the janitor's
/// own) of the Lease as read, its resourceVersion guarding it. Each
/// begins at its moment (`allowed`) and waits for one of
/// `JANITOR_CONCURRENCY` turns, first come first served, as the janitor's
/// judgements do. Its judgement is the least that reads can decide: the
/// Lease still names the holder and was not renewed since the last
/// renewal, and exactly one pod is named (`names`, the janitor's
/// `lock::lease::names`), Failed or Succeeded.
pub async fn safe_releases(
    client: &Client,
    allowed: &HashMap<String, Allowed>,
    released: impl Fn(Lease, Timestamp) -> Lease + Sync,
    names: impl Fn(&str, &k8s_openapi::api::core::v1::Pod) -> bool + Sync,
) -> SafeMisses {
    use crate::reclaim::{JANITOR_CONCURRENCY, SAFE_FLOOR_USER};
    // HTTP/1.1: a request in flight holds a connection. The janitor's
    // are open from its judgements at the deaths (a list and a read of
    // each Lease, seconds before); the floor, which reads nothing then,
    // opens as many first.
    let warm = (0..JANITOR_CONCURRENCY).map(|_| client.apiserver_version());
    let _ = futures::future::join_all(warm).await;
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: SAFE_FLOOR_USER.into(),
            instance: None,
        },
    );
    let turns = tokio::sync::Semaphore::new(JANITOR_CONCURRENCY);
    let misses = SafeMisses::default();
    futures::stream::iter(allowed)
        .for_each_concurrent(None, |(key, a)| {
            let (turns, misses, recorder) = (&turns, &misses, &recorder);
            let (released, names) = (&released, &names);
            async move {
                if let Ok(wait) = Duration::try_from(a.at.duration_since(Timestamp::now())) {
                    tokio::time::sleep(wait).await;
                }
                let Ok(_turn) = turns.acquire().await else {
                    return;
                };
                let fns = (released, names);
                match safe_release(client, recorder, key, a, fns, &misses.events_failed).await {
                    Ok(true) => {}
                    Ok(false) => {
                        misses.skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("Lease safe floor: {key}: {e}");
                        misses.failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
        .await;
    misses
}

/// One release of the Lease safe floor (see `safe_releases`): true if the
/// Lease was released, false if a read stopped it.
async fn safe_release(
    client: &Client,
    recorder: &kube::runtime::events::Recorder,
    key: &str,
    a: &Allowed,
    (released, names): (
        impl Fn(Lease, Timestamp) -> Lease,
        impl Fn(&str, &k8s_openapi::api::core::v1::Pod) -> bool,
    ),
    events_failed: &AtomicUsize,
) -> kube::Result<bool> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ListParams;
    use kube::Resource;
    let (ns, name) = key.split_once('/').unwrap_or_default();
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let Some(live) = leases.get_opt(name).await? else {
        return Ok(false);
    };
    let spec = |l: &Lease| l.spec.clone().unwrap_or_default();
    let host = spec(&live).holder_identity.unwrap_or_default();
    if host.is_empty() || spec(&live).renew_time != spec(&a.lease).renew_time {
        return Ok(false);
    }
    let mut named = Vec::new();
    let mut lp = ListParams::default().limit(100);
    loop {
        let page = pods.list(&lp).await?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        named.extend(page.items.into_iter().filter(|p| names(&host, p)));
        match next {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    let dead = |p: &Pod| {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        matches!(phase, Some("Failed" | "Succeeded"))
    };
    let [holder] = named.as_slice() else {
        return Ok(false);
    };
    if !dead(holder) {
        return Ok(false);
    }
    let note = format!(
        "Releasing this Lease: holder pod {} was evicted (it can never run again) and \
         nothing renewed it. Released by the safe floor of bench-scale.",
        holder.name_any()
    );
    crate::reclaim::intent(
        recorder,
        &live.object_ref(&()),
        Some(holder),
        note,
        events_failed,
    )
    .await;
    let again = pods.get_opt(&holder.name_any()).await?;
    if !again.is_some_and(|p| p.metadata.uid == holder.metadata.uid && dead(&p)) {
        return Ok(false);
    }
    leases
        .replace(
            name,
            &PostParams::default(),
            &released(live, Timestamp::now()),
        )
        .await?;
    Ok(true)
}

/// Waits until every Lease of `allowed` is released (or `timeout` after
/// the last moment allowed); returns release - allowed, in seconds.
pub async fn release_latencies(
    released: &Releases,
    allowed: &HashMap<String, Allowed>,
    timeout: Duration,
) -> Vec<f64> {
    let last = allowed
        .values()
        .map(|a| a.at)
        .max()
        .unwrap_or_else(Timestamp::now);
    let give_up = last
        .checked_add(SignedDuration::try_from(timeout).unwrap_or(SignedDuration::MAX))
        .unwrap_or(last);
    loop {
        let done = {
            let r = released.lock().unwrap_or_else(|e| e.into_inner());
            allowed.keys().all(|k| r.contains_key(k))
        };
        if done || Timestamp::now() > give_up {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = released.lock().unwrap_or_else(|e| e.into_inner());
    allowed
        .iter()
        .filter_map(|(k, a)| Some(r.get(k)?.duration_since(a.at).as_secs_f64()))
        .collect()
}

/// The janitor's requests in `namespaces` within `windows` (each from its
/// start to its end), by verb and resource, from the API server's audit
/// log.
pub fn requests_in(
    audit: &[AuditEvent],
    user: &str,
    namespaces: &[String],
    windows: &[(Timestamp, Timestamp)],
) -> String {
    by_verb(audit.iter().filter(|e| {
        e.effective_user() == user
            && e.received_at()
                .is_some_and(|t| windows.iter().any(|(from, to)| t >= *from && t <= *to))
            && e.namespace
                .as_deref()
                .is_some_and(|ns| namespaces.iter().any(|n| n == ns))
    }))
}

/// Where each release's time goes, from the API server's audit log: for
/// each Lease of `allowed`, from the moment the rule allows it to the
/// release's arrival (an update that empties the holder identity, by
/// `user`, or by anyone but `not_user`), and for the janitor, to the last
/// list of pods it sent in that namespace before it (the judgement's one
/// read). Returns (allowed -> last pod list, pod list -> release, allowed
/// -> release), in seconds.
pub fn timeline(
    audit: &[AuditEvent],
    user: Option<&str>,
    not_user: &str,
    allowed: &HashMap<String, Allowed>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let by = |e: &AuditEvent| match user {
        Some(u) => e.effective_user() == u,
        None => e.effective_user() != not_user,
    };
    let (mut to_list, mut list_to_release, mut to_release) = (Vec::new(), Vec::new(), Vec::new());
    for (key, a) in allowed {
        let Some((ns, name)) = key.split_once('/') else {
            continue;
        };
        let release = audit.iter().filter_map(|e| {
            let is = by(e)
                && e.verb == "update"
                && e.resource.as_deref() == Some("leases")
                && e.namespace.as_deref() == Some(ns)
                && e.name.as_deref() == Some(name)
                && e.code == Some(200)
                && e.request_object
                    .as_ref()
                    .is_some_and(|b| b["spec"]["holderIdentity"] == "");
            is.then(|| e.received_at()).flatten()
        });
        let Some(released) = release.min() else {
            continue;
        };
        to_release.push(released.duration_since(a.at).as_secs_f64());
        if user.is_none() {
            continue;
        }
        let list = audit
            .iter()
            .filter(|e| {
                by(e)
                    && e.verb == "list"
                    && e.resource.as_deref() == Some("pods")
                    && e.namespace.as_deref() == Some(ns)
            })
            .filter_map(AuditEvent::received_at)
            .filter(|t| *t <= released)
            .max();
        if let Some(list) = list {
            to_list.push(list.duration_since(a.at).as_secs_f64());
            list_to_release.push(released.duration_since(list).as_secs_f64());
        }
    }
    (to_list, list_to_release, to_release)
}

/// When the janitor itself found each Lease releasable: from its debug log,
/// the last "Lease holder died moments ago" line per Lease (a judgement
/// that found the renewal window open), its time plus the remaining time it
/// logged. By "ns/name".
pub fn janitor_moments(log: &str) -> HashMap<String, Timestamp> {
    let mut at = HashMap::new();
    for line in log
        .lines()
        .filter(|l| l.contains("Lease holder died moments ago"))
    {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        };
        let moment = (|| {
            let logged: Timestamp = line.split_whitespace().next()?.parse().ok()?;
            let remaining: f64 = field("remaining_seconds")?.parse().ok()?;
            let key = format!("{}/{}", field("namespace")?, field("lock")?);
            let end = logged
                .checked_add(SignedDuration::try_from_secs_f64(remaining).ok()?)
                .ok()?;
            Some((key, end))
        })();
        if let Some((key, end)) = moment {
            at.insert(key, end);
        }
    }
    at
}

/// For each Lease released: (the rule's moment -> the janitor's own, the
/// janitor's own -> the release), in seconds.
pub fn by_janitor_moment(
    released: &Releases,
    allowed: &HashMap<String, Allowed>,
    moments: &HashMap<String, Timestamp>,
) -> (Vec<f64>, Vec<f64>) {
    let r = released.lock().unwrap_or_else(|e| e.into_inner());
    allowed
        .iter()
        .filter_map(|(k, a)| {
            let own = moments.get(k)?;
            let done = r.get(k)?;
            Some((
                own.duration_since(a.at).as_secs_f64(),
                done.duration_since(*own).as_secs_f64(),
            ))
        })
        .unzip()
}
