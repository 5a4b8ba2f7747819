//! `lock-janitor scan` and `lock-janitor label`: find the leader-for-life
//! locks of a cluster, judge them as the controller does, and opt them in.
//!
//! # What scan reads
//!
//! With N ConfigMaps in scope, of which L are lock candidates:
//!
//! - One paged (500 per page), metadata-only list of all ConfigMaps per
//!   namespace in scope (one cluster-wide list without `--namespace`). Each
//!   ConfigMap is classified client-side: *labeled* when its labels match the
//!   `--selector` (the equality-based grammar `selector::Selector` accepts,
//!   with the API server's semantics), *unlabeled candidate* when it is not
//!   labeled but [`looks_like_lock`]. A second, selector-filtered list is not
//!   made: there is no server-side filter on ownerReferences, so the unfiltered
//!   list is needed anyway and already holds every labeled ConfigMap, and a
//!   label-selected list still makes the server walk all N.
//! - One GET per distinct holder pod (16 in flight). A pod list per namespace
//!   would fetch every pod of the namespace, most of which hold no lock in a
//!   real cluster: its cost grows with unrelated pods, that of the GETs only
//!   with the locks. (`examples/bench_scan.rs`, on the local control plane:
//!   500 GETs take ~0.4 s; listing 10 namespaces whose only pods are the 500
//!   holders, the list's best case, ~0.15 s.)
//! - Only for a lock whose holder is missing and past the grace: one
//!   metadata-only pod list by name (field selector), as the controller does,
//!   to tell `OwnerGone` from an owner in another namespace.
//!
//! # A missing holder
//!
//! The controller starts the owner-gone grace when it first sees the holder
//! missing. A one-shot scan cannot watch, so it starts the grace at the lock's
//! creation: a missing holder makes the lock `stale:OwnerGone` only once the
//! lock is older than `--owner-gone-grace`, and `held` (reason
//! `OwnerGoneGrace`) before that. The holder cannot have vanished before its
//! lock was created, so this never calls a lock stale earlier than the
//! controller could.
//!
//! # label
//!
//! `label` lists the same way (no holder reads) and adds the selector's
//! `key=value` to each unlabeled candidate, with a merge patch carrying the
//! `metadata.resourceVersion` it read: a concurrent change makes the write fail
//! with 409 instead of overwriting it. A ConfigMap whose key already has
//! another value (e.g. `lock-janitor.io/watch=false`, a deliberate opt-out) is
//! skipped, never overwritten.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde::Serialize;

use crate::cli::{LabelArgs, Output, ScanArgs, Scope};
use crate::lock::{self, label_patch, looks_like_lock, plan_label, Lock, Plan, Unmanageable};
use crate::selector::Selector;
use crate::verdict::{self, HeldBecause, HolderSeen, Policy, StaleReason, Verdict};
use crate::{call, Error};

/// Objects per page of a list.
const PAGE_SIZE: u32 = 500;
/// API calls in flight at once for holder reads and label writes.
const CONCURRENCY: usize = 16;
/// Width the table fits in.
const TABLE_WIDTH: usize = 100;
/// Exit code of `scan` when at least one lock is stale.
pub const EXIT_STALE: u8 = 3;

// ---------------------------------------------------------------------------
// Cluster access and errors

/// A client and where it points, for error messages.
struct Cluster {
    client: Client,
    url: String,
}

async fn connect() -> anyhow::Result<Cluster> {
    let config = kube::Config::infer().await.map_err(|e| {
        anyhow!(
            "no Kubernetes cluster configured: set KUBECONFIG, create ~/.kube/config, or run in a pod \
             with a service account ({e})"
        )
    })?;
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config)
        .with_context(|| format!("cannot build a client for the cluster at {url}"))?;
    Ok(Cluster { client, url })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        let t = inner.to_string();
        if !s.contains(&t) {
            let _ = write!(s, ": {t}");
        }
        src = inner.source();
    }
    s
}

/// Turns an API error into a message that says what failed and what to do.
fn explain(err: Error, cluster: &Cluster, needs: &str) -> anyhow::Error {
    match err {
        Error::Kube {
            action,
            source: kube::Error::Api(status),
        } => match status.code {
            403 => anyhow!(
                "{action} was forbidden: {}. This command needs {needs}.",
                status.message
            ),
            401 => anyhow!(
                "{action}: the API server at {} rejected the credentials (401 Unauthorized): {}. \
                 Check the user in your kubeconfig.",
                cluster.url,
                status.message
            ),
            code => anyhow!(
                "{action}: the API server answered {code} {}: {}",
                status.reason,
                status.message
            ),
        },
        Error::Kube { action, source } => anyhow!(
            "{action}: cannot reach the Kubernetes API server at {}: {}",
            cluster.url,
            error_chain(&source)
        ),
        Error::Timeout { action, after } => anyhow!(
            "{action}: no answer from the Kubernetes API server at {} within {after:?}",
            cluster.url
        ),
        other => anyhow!(other),
    }
}

// ---------------------------------------------------------------------------
// Listing candidates

/// A ConfigMap scan reports: labeled, or unlabeled but shaped like a lock.
#[derive(Clone, Debug)]
struct Candidate {
    meta: ObjectMeta,
    labeled: bool,
}

/// What the ConfigMap lists found.
struct Listing {
    candidates: Vec<Candidate>,
    /// ConfigMaps read, candidates or not.
    scanned: usize,
}

fn scope_text(scope: &Scope) -> String {
    if scope.namespaces.is_empty() {
        "all namespaces".to_owned()
    } else {
        let n = &scope.namespaces;
        format!(
            "namespace{} {}",
            if n.len() == 1 { "" } else { "s" },
            n.join(", ")
        )
    }
}

/// Lists every ConfigMap in scope (paged, metadata only) and keeps the
/// candidates. Each namespace is listed once (deduplicated).
async fn list_candidates(
    cluster: &Cluster,
    scope: &Scope,
    selector: &Selector,
    needs: &str,
) -> anyhow::Result<Listing> {
    let namespaces: Vec<Option<String>> = if scope.namespaces.is_empty() {
        vec![None]
    } else {
        let set: BTreeSet<&String> = scope.namespaces.iter().collect();
        set.into_iter().cloned().map(Some).collect()
    };
    let mut listing = Listing {
        candidates: Vec::new(),
        scanned: 0,
    };
    for ns in namespaces {
        list_namespace(cluster, ns.as_deref(), selector, &mut listing)
            .await
            .map_err(|e| explain(e, cluster, needs))?;
    }
    listing
        .candidates
        .sort_by(|a, b| (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name)));
    Ok(listing)
}

async fn list_namespace(
    cluster: &Cluster,
    ns: Option<&str>,
    selector: &Selector,
    out: &mut Listing,
) -> Result<(), Error> {
    let api: Api<ConfigMap> = match ns {
        Some(ns) => Api::namespaced(cluster.client.clone(), ns),
        None => Api::all(cluster.client.clone()),
    };
    let what = match ns {
        Some(ns) => format!("listing configmaps in namespace {ns}"),
        None => "listing configmaps in all namespaces".to_owned(),
    };
    // A continue token expires (410) if paging takes longer than the etcd
    // compaction interval; start over then, a few times.
    let mut restarts = 0;
    'restart: loop {
        let mut found = Vec::new();
        let mut scanned = 0;
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default().limit(PAGE_SIZE);
            if let Some(t) = &token {
                lp = lp.continue_token(t);
            }
            let page = match call(what.clone(), api.list_metadata(&lp)).await {
                Ok(page) => page,
                Err(Error::Kube {
                    source: kube::Error::Api(s),
                    ..
                }) if s.code == 410 && token.is_some() && restarts < 3 => {
                    restarts += 1;
                    tracing::debug!(%what, "continue token expired; listing again");
                    continue 'restart;
                }
                Err(e) => return Err(e),
            };
            scanned += page.items.len();
            for item in page.items {
                let mut meta = item.metadata;
                // Not needed, and the largest part of the metadata.
                meta.managed_fields = None;
                let labeled = selector.matches(meta.labels.as_ref());
                if labeled || looks_like_lock(&meta) {
                    found.push(Candidate { meta, labeled });
                }
            }
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                break;
            }
        }
        out.candidates.extend(found);
        out.scanned += scanned;
        return Ok(());
    }
}

// ---------------------------------------------------------------------------
// scan

/// One line of the report. Field names are a stable interface (`-o json`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Row {
    pub namespace: String,
    pub name: String,
    /// Matches `--selector` (watched by the controller).
    pub labeled: bool,
    /// The holder pod's name, from the lock's ownerReference.
    pub holder: Option<String>,
    /// The holder's uid, from the lock's ownerReference.
    pub holder_uid: Option<String>,
    /// Whether a pod with the holder's name exists (None: not looked up).
    pub holder_found: Option<bool>,
    /// The uid of the pod found under the holder's name (differs from
    /// `holder_uid` when ambiguous).
    pub holder_pod_uid: Option<String>,
    /// `status.phase` of the pod found.
    pub phase: Option<String>,
    /// `status.reason` of the pod found (e.g. Evicted).
    pub phase_reason: Option<String>,
    /// `status.message` of the pod found.
    pub phase_message: Option<String>,
    /// The pod found has a deletionTimestamp.
    pub holder_deleting: bool,
    /// `spec.nodeName` of the pod found.
    pub node: Option<String>,
    /// The lock's creationTimestamp (RFC 3339).
    pub created_at: Option<String>,
    pub age_seconds: Option<u64>,
    /// As in the table: `held`, `stale:<Reason>`, `ambiguous`, `unmanageable:<Code>`.
    pub verdict: String,
    /// `held`, `stale`, `ambiguous` or `unmanageable` (the `state` of the metrics).
    pub state: String,
    /// Stale reason, unmanageable code, or why held (`Running`, `Pending`,
    /// `Unknown`, `NoStatus`, `Terminating`, `OwnerGoneGrace`).
    pub reason: Option<String>,
    /// When the holder died, if known (stale only).
    pub died_at: Option<String>,
    /// A sentence explaining the verdict.
    pub message: String,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Summary {
    pub total: usize,
    pub labeled: usize,
    pub unlabeled: usize,
    pub held: usize,
    pub stale: usize,
    pub ambiguous: usize,
    pub unmanageable: usize,
    /// ConfigMaps read to find the candidates.
    pub configmaps_scanned: usize,
    /// The namespaces in scope; empty means all.
    pub namespaces: Vec<String>,
    pub selector: String,
    pub owner_gone_grace_seconds: f64,
    pub duration_seconds: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub locks: Vec<Row>,
    pub summary: Summary,
}

/// What a live read found of a lock's holder.
#[derive(Clone, Debug)]
enum Found {
    Pod(Box<Pod>),
    Missing,
}

async fn fetch_holders(
    cluster: &Cluster,
    keys: BTreeSet<(String, String)>,
) -> Result<HashMap<(String, String), Found>, Error> {
    futures::stream::iter(keys)
        .map(|(ns, name)| {
            let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
            async move {
                let pod = call(
                    format!("reading holder pod {ns}/{name}"),
                    api.get_opt(&name),
                )
                .await?;
                let found = match pod {
                    Some(p) => Found::Pod(Box::new(p)),
                    None => Found::Missing,
                };
                Ok(((ns, name), found))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// A one-shot scan cannot watch a grace go by: the lock's age stands in
/// for how long its missing holder has been gone.
fn missing_holder(lock: &Lock, now: Timestamp) -> HolderSeen<'static> {
    let since = lock.created.unwrap_or(now);
    let gone_for = std::time::Duration::try_from(now.duration_since(since)).unwrap_or_default();
    HolderSeen::Missing { since, gone_for }
}

fn held_code(why: &HeldBecause) -> String {
    match why {
        HeldBecause::Phase(p) => p.clone(),
        HeldBecause::NoStatus => "NoStatus".into(),
        HeldBecause::Terminating => "Terminating".into(),
        HeldBecause::OwnerGoneGrace { .. } => "OwnerGoneGrace".into(),
    }
}

fn verdict_text(v: &Verdict) -> String {
    match v {
        Verdict::Held(_) => "held".into(),
        Verdict::Stale { reason, .. } => format!("stale:{reason}"),
        Verdict::Ambiguous { .. } => "ambiguous".into(),
        Verdict::Unmanageable(why) => format!("unmanageable:{}", why.code()),
    }
}

fn secs(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

fn explain_verdict(v: &Verdict, holder: &str, pod: Option<&Pod>, age: Option<Duration>) -> String {
    let status = pod.and_then(|p| p.status.as_ref());
    match v {
        Verdict::Held(HeldBecause::Phase(p)) => format!("holder pod {holder} is {p}"),
        Verdict::Held(HeldBecause::NoStatus) => {
            format!("holder pod {holder} has no status yet; nothing proves it is dead")
        }
        Verdict::Held(HeldBecause::Terminating) => format!(
            "holder pod {holder} is being deleted but has not stopped; its containers may still run"
        ),
        Verdict::Held(HeldBecause::OwnerGoneGrace { remaining }) => format!(
            "holder pod {holder} does not exist, but the lock is only {} old: stale once it is \
             older than --owner-gone-grace (in {})",
            age.map(secs).unwrap_or_else(|| "0s".into()),
            secs(*remaining)
        ),
        Verdict::Stale {
            reason: StaleReason::OwnerGone,
            ..
        } => format!(
            "holder pod {holder} does not exist (the lock is {} old)",
            age.map(secs).unwrap_or_else(|| "?".into())
        ),
        Verdict::Stale { reason, .. } => {
            let mut s = format!(
                "holder pod {holder} is {}",
                status.and_then(|s| s.phase.as_deref()).unwrap_or("?")
            );
            if let Some(r) = status.and_then(|s| s.reason.as_deref()) {
                let _ = write!(s, "/{r}");
            }
            if let Some(m) = status
                .and_then(|s| s.message.as_deref())
                .filter(|m| !m.is_empty())
            {
                let _ = write!(s, " ({m:?})");
            }
            let _ = write!(s, ": its containers cannot run again ({reason})");
            s
        }
        Verdict::Ambiguous { other_uid } => format!(
            "a pod named {holder} exists with uid {other_uid}, not the lock's holder uid: a pod \
             recreated under the same name believes it still leads; never reclaimed"
        ),
        Verdict::Unmanageable(why) => format!("{why}; never reclaimed"),
    }
}

fn age_of(created: Option<Timestamp>, now: Timestamp) -> Option<Duration> {
    let d = now.duration_since(created?);
    Some(Duration::try_from(d).unwrap_or(Duration::ZERO))
}

/// Builds a row from what was read. Pure, for tests.
fn build_row(
    c: &Candidate,
    parsed: &Result<Lock, Unmanageable>,
    found: Option<&Found>,
    verdict: &Verdict,
    now: Timestamp,
) -> Row {
    let meta = &c.meta;
    let owner = meta.owner_references.as_deref().and_then(|o| match o {
        [one] if !one.name.is_empty() => Some(one),
        _ => None,
    });
    let holder = owner.map(|o| o.name.clone());
    let holder_uid = owner.map(|o| o.uid.clone()).filter(|u| !u.is_empty());
    let pod = match found {
        Some(Found::Pod(p)) => Some(p.as_ref()),
        _ => None,
    };
    let status = pod.and_then(|p| p.status.as_ref());
    let created = meta.creation_timestamp.as_ref().map(|t| t.0);
    let age = age_of(created, now);
    let reason = match verdict {
        Verdict::Held(why) => Some(held_code(why)),
        Verdict::Stale { reason, .. } => Some(reason.as_str().to_owned()),
        Verdict::Ambiguous { .. } => None,
        Verdict::Unmanageable(why) => Some(why.code().to_owned()),
    };
    let died_at = match verdict {
        Verdict::Stale { died_at, .. } => died_at.map(|t| t.to_string()),
        _ => None,
    };
    let holder_name = holder.clone().unwrap_or_default();
    Row {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        labeled: c.labeled,
        holder,
        holder_uid,
        holder_found: found
            .map(|f| matches!(f, Found::Pod(_)))
            .filter(|_| parsed.is_ok()),
        holder_pod_uid: pod.and_then(|p| p.metadata.uid.clone()),
        phase: status.and_then(|s| s.phase.clone()),
        phase_reason: status.and_then(|s| s.reason.clone()),
        phase_message: status.and_then(|s| s.message.clone()),
        holder_deleting: pod.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        node: pod
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.clone()),
        created_at: created.map(|t| t.to_string()),
        age_seconds: age.map(|a| a.as_secs()),
        verdict: verdict_text(verdict),
        state: verdict.state().as_str().to_owned(),
        reason,
        died_at,
        message: explain_verdict(verdict, &holder_name, pod, age),
    }
}

/// Lists, reads holders, judges. Everything `scan` reports.
async fn build_report(cluster: &Cluster, args: &ScanArgs) -> anyhow::Result<Report> {
    let started = Instant::now();
    let needs = "list on configmaps and get and list on pods";
    let selector = &args.scope.selector;
    let listing = list_candidates(cluster, &args.scope, selector, needs).await?;

    let parsed: Vec<Result<Lock, Unmanageable>> = listing
        .candidates
        .iter()
        .map(|c| lock::parse(&c.meta))
        .collect();
    let keys: BTreeSet<(String, String)> = parsed
        .iter()
        .flatten()
        .map(|l| (l.namespace.clone(), l.holder.name.clone()))
        .collect();
    let holders = fetch_holders(cluster, keys)
        .await
        .map_err(|e| explain(e, cluster, needs))?;

    let policy = Policy {
        owner_gone_grace: args.owner_gone_grace,
    };
    let now = Timestamp::now();
    let mut verdicts: Vec<(Verdict, Option<&Found>)> = Vec::with_capacity(parsed.len());
    for p in &parsed {
        verdicts.push(match p {
            Err(why) => (Verdict::Unmanageable(why.clone()), None),
            Ok(lock) => {
                let found = holders.get(&(lock.namespace.clone(), lock.holder.name.clone()));
                let seen = match found {
                    Some(Found::Pod(pod)) => HolderSeen::Pod(pod),
                    _ => missing_holder(lock, now),
                };
                (verdict::judge(lock, seen, &policy), found)
            }
        });
    }
    // An owner that is gone here may live in another namespace.
    let owner_gone: Vec<usize> = verdicts
        .iter()
        .enumerate()
        .filter(|(_, (v, _))| {
            matches!(
                v,
                Verdict::Stale {
                    reason: StaleReason::OwnerGone,
                    ..
                }
            )
        })
        .map(|(i, _)| i)
        .collect();
    let elsewhere: Vec<(usize, Option<String>)> = futures::stream::iter(owner_gone)
        .map(|i| {
            let lock = parsed[i].as_ref().expect("judged locks parsed");
            async move {
                crate::controller::holder_elsewhere(&cluster.client, &args.scope.namespaces, lock)
                    .await
                    .map(|ns| (i, ns))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
        .map_err(|e| explain(e, cluster, needs))?;
    for (i, ns) in elsewhere {
        if let Some(ns) = ns {
            verdicts[i].0 = Verdict::Unmanageable(Unmanageable::OwnerInOtherNamespace(ns));
        }
    }

    let locks: Vec<Row> = listing
        .candidates
        .iter()
        .zip(&parsed)
        .zip(&verdicts)
        .map(|((c, p), (v, found))| build_row(c, p, *found, v, now))
        .collect();
    let mut summary = Summary {
        total: locks.len(),
        configmaps_scanned: listing.scanned,
        namespaces: args.scope.namespaces.clone(),
        selector: args.scope.selector.to_string(),
        owner_gone_grace_seconds: args.owner_gone_grace.as_secs_f64(),
        ..Default::default()
    };
    for r in &locks {
        if r.labeled {
            summary.labeled += 1;
        } else {
            summary.unlabeled += 1;
        }
        match r.state.as_str() {
            "held" => summary.held += 1,
            "stale" => summary.stale += 1,
            "ambiguous" => summary.ambiguous += 1,
            _ => summary.unmanageable += 1,
        }
    }
    summary.duration_seconds = (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    Ok(Report { locks, summary })
}

/// `lock-janitor scan`: exit 0 when no lock is stale, 3 when one is.
pub async fn scan_command(args: ScanArgs) -> anyhow::Result<ExitCode> {
    let cluster = connect().await?;
    let report = build_report(&cluster, &args).await?;
    let out = match args.output {
        Output::Json => {
            let mut s = serde_json::to_string_pretty(&report).context("encoding the report")?;
            s.push('\n');
            s
        }
        Output::Table => render_report(&report, &args.scope),
    };
    print_stdout(&out)?;
    Ok(if report.summary.stale > 0 {
        ExitCode::from(EXIT_STALE)
    } else {
        ExitCode::SUCCESS
    })
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn print_stdout(s: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------
// Table

/// kubectl-style age: 45s, 3m20s, 42m, 5h30m, 20h, 3d4h, 30d, 2y40d.
pub fn human_age(secs: u64) -> String {
    let (m, h, d) = (60, 3600, 86400);
    let y = 365 * d;
    match secs {
        s if s < 2 * m => format!("{s}s"),
        s if s < 10 * m => match s % m {
            0 => format!("{}m", s / m),
            r => format!("{}m{r}s", s / m),
        },
        s if s < 3 * h => format!("{}m", s / m),
        s if s < 8 * h => match (s % h) / m {
            0 => format!("{}h", s / h),
            r => format!("{}h{r}m", s / h),
        },
        s if s < 2 * d => format!("{}h", s / h),
        s if s < 8 * d => match (s % d) / h {
            0 => format!("{}d", s / d),
            r => format!("{}d{r}h", s / d),
        },
        s if s < 2 * y => format!("{}d", s / d),
        s if s < 8 * y => match (s % y) / d {
            0 => format!("{}y", s / y),
            r => format!("{}y{r}d", s / y),
        },
        s => format!("{}y", s / y),
    }
}

/// Shortens `s` to `width` characters with a `…` in the middle, which keeps
/// both a name's prefix and the generated suffix of pod names.
pub fn ellipsize(s: &str, width: usize) -> String {
    let n = s.chars().count();
    if n <= width {
        return s.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let keep = width - 1;
    let tail = keep / 2;
    let head = keep - tail;
    let mut out: String = s.chars().take(head).collect();
    out.push('…');
    out.extend(s.chars().skip(n - tail));
    out
}

/// A node name without its domain (`ip-10-0-1-2.ec2.internal` → `ip-10-0-1-2`),
/// as long as what is left is not a number (an IP address stays whole).
pub fn short_host(node: &str) -> String {
    match node.split_once('.') {
        Some((host, _)) if host.bytes().any(|b| b.is_ascii_alphabetic()) => host.to_owned(),
        _ => node.to_owned(),
    }
}

fn phase_cell(r: &Row) -> String {
    match (r.holder_found, &r.phase) {
        (None, _) => "-".into(),
        (Some(false), _) => "(gone)".into(),
        (Some(true), phase) => {
            let terminal = matches!(phase.as_deref(), Some("Failed" | "Succeeded"));
            if r.holder_deleting && !terminal {
                return "Terminating".into();
            }
            let mut s = phase.clone().unwrap_or_else(|| "?".into());
            if let Some(reason) = &r.phase_reason {
                let _ = write!(s, "/{reason}");
            }
            s
        }
    }
}

const HEADERS: [&str; 8] = [
    "NAMESPACE",
    "NAME",
    "LABELED",
    "HOLDER",
    "PHASE",
    "NODE",
    "AGE",
    "VERDICT",
];
/// Columns that may be shortened (index, narrowest width), in stages: first
/// the holder (pod names end in a generated suffix), node and namespace, then
/// the lock name and phase, the verdict only as a last resort.
const SHRINKABLE: [&[(usize, usize)]; 3] = [
    &[(3, 20), (5, 12), (0, 14)],
    &[(0, 9), (1, 20), (3, 10), (4, 14), (5, 6)],
    &[(1, 12), (4, 8), (7, 20)],
];

/// Columns shortened in the middle: pod and node names end in a generated,
/// identifying suffix. The others keep their beginning.
const MIDDLE: [usize; 2] = [3, 5];

/// Cuts `s` to `width` characters, ending with `…`.
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Wraps `text` at spaces into lines of at most `width` characters (a word
/// longer than that gets a line of its own), continuation lines indented.
pub fn wrap(text: &str, width: usize, indent: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let len = line.chars().count();
        if !line.trim().is_empty() && len + 1 + word.chars().count() > width {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(indent);
        }
        if !line.trim().is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// Aligned columns, two spaces apart, fitted into `max` characters by
/// shortening the shrinkable columns (widest first, stage by stage). Cells
/// are cut at their end, those of the `middle` columns in the middle.
pub fn render_table(
    headers: &[&str],
    rows: &[Vec<String>],
    max: usize,
    stages: &[&[(usize, usize)]],
    middle: &[usize],
) -> String {
    let cols = headers.len();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let total = |w: &[usize]| w.iter().sum::<usize>() + 2 * (cols.saturating_sub(1));
    for stage in stages {
        while total(&widths) > max {
            let Some(&(i, _)) = stage
                .iter()
                .filter(|(i, min)| widths[*i] > *min)
                .max_by_key(|(i, _)| widths[*i])
            else {
                break;
            };
            widths[i] -= 1;
        }
    }
    let mut out = String::new();
    let header_row: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            let cell = if middle.contains(&i) {
                ellipsize(cell, widths[i])
            } else {
                cut(cell, widths[i])
            };
            line.push_str(&cell);
            if i + 1 < cols {
                let pad = widths[i] - cell.chars().count();
                line.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn render_report(report: &Report, scope: &Scope) -> String {
    let s = &report.summary;
    let mut out = String::new();
    if report.locks.is_empty() {
        let _ = writeln!(
            out,
            "No lock candidates in {} ({} ConfigMaps scanned).",
            scope_text(scope),
            s.configmaps_scanned
        );
        return out;
    }
    let rows: Vec<Vec<String>> = report
        .locks
        .iter()
        .map(|r| {
            vec![
                r.namespace.clone(),
                r.name.clone(),
                if r.labeled { "yes" } else { "no" }.into(),
                r.holder.clone().unwrap_or_else(|| "-".into()),
                phase_cell(r),
                r.node
                    .as_deref()
                    .map(short_host)
                    .unwrap_or_else(|| "-".into()),
                r.age_seconds.map(human_age).unwrap_or_else(|| "-".into()),
                r.verdict.clone(),
            ]
        })
        .collect();
    out.push_str(&render_table(
        &HEADERS,
        &rows,
        TABLE_WIDTH,
        &SHRINKABLE,
        &MIDDLE,
    ));

    // Explain what a glance at the table does not.
    let notes: Vec<&Row> = report
        .locks
        .iter()
        .filter(|r| r.state != "held" || r.reason.as_deref() == Some("OwnerGoneGrace"))
        .collect();
    if !notes.is_empty() {
        out.push('\n');
        for r in notes {
            let note = format!("{}/{}: {}", r.namespace, r.name, r.message);
            out.push_str(&wrap(&note, TABLE_WIDTH, 4));
        }
    }
    out.push('\n');
    let mut parts = vec![format!("{} held", s.held), format!("{} stale", s.stale)];
    if s.ambiguous > 0 {
        parts.push(format!("{} ambiguous", s.ambiguous));
    }
    if s.unmanageable > 0 {
        parts.push(format!("{} unmanageable", s.unmanageable));
    }
    let summary = format!(
        "{} lock{} ({} labeled, {} unlabeled) in {}: {}.",
        s.total,
        if s.total == 1 { "" } else { "s" },
        s.labeled,
        s.unlabeled,
        scope_text(scope),
        parts.join(", "),
    );
    out.push_str(&wrap(&summary, TABLE_WIDTH, 0));
    let _ = writeln!(
        out,
        "{} ConfigMaps scanned in {:.2}s.",
        s.configmaps_scanned, s.duration_seconds
    );
    if s.unlabeled > 0 {
        out.push_str(&wrap(
            "Unlabeled locks are not watched by `lock-janitor run`; opt them in with \
             `lock-janitor label` (add --apply to write).",
            TABLE_WIDTH,
            0,
        ));
    }
    out
}

// ---------------------------------------------------------------------------
// label

/// `--include` (any; empty: all) and `--exclude` (none) on the lock name.
pub fn name_selected(name: &str, include: &[glob::Pattern], exclude: &[glob::Pattern]) -> bool {
    (include.is_empty() || include.iter().any(|p| p.matches(name)))
        && !exclude.iter().any(|p| p.matches(name))
}

/// The result of one label write.
enum Written {
    Labeled,
    Gone,
    Conflict,
    Failed { error: String, forbidden: bool },
}

async fn write_label(cluster: &Cluster, meta: &ObjectMeta, key: &str, value: &str) -> Written {
    let ns = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), ns);
    let patch = label_patch(meta, key, value);
    let pp = PatchParams {
        field_manager: Some(crate::NAME.to_owned()),
        ..Default::default()
    };
    match call(
        format!("labeling configmap {ns}/{name}"),
        api.patch_metadata(name, &pp, &Patch::Merge(&patch)),
    )
    .await
    {
        Ok(_) => Written::Labeled,
        Err(Error::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 404 => Written::Gone,
        Err(Error::Kube {
            source: kube::Error::Api(s),
            ..
        }) if s.code == 409 => Written::Conflict,
        Err(e) => Written::Failed {
            forbidden: e.kind() == crate::ErrorKind::Forbidden,
            error: format!("{:#}", explain(e, cluster, "list and patch on configmaps")),
        },
    }
}

/// `lock-janitor label`: adds the opt-in label to unlabeled lock candidates.
pub async fn label_command(args: LabelArgs) -> anyhow::Result<ExitCode> {
    let Some((key, value)) = args.scope.selector.opt_in_label() else {
        anyhow::bail!(
            "--selector {:?} has no single key=value term to write; label needs a selector like \
             lock-janitor.io/watch=true (the one `lock-janitor run` is given)",
            args.scope.selector
        );
    };
    let selector = &args.scope.selector;
    let cluster = connect().await?;
    let needs = if args.apply {
        "list and patch on configmaps"
    } else {
        "list on configmaps"
    };
    let listing = list_candidates(&cluster, &args.scope, selector, needs).await?;

    let mut excluded = 0;
    let mut planned: Vec<(&ObjectMeta, Plan)> = Vec::new();
    for c in &listing.candidates {
        let Some(plan) = plan_label(&c.meta, key, value) else {
            continue;
        };
        if name_selected(
            c.meta.name.as_deref().unwrap_or_default(),
            &args.include,
            &args.exclude,
        ) {
            planned.push((&c.meta, plan));
        } else {
            excluded += 1;
        }
    }

    // Writes run CONCURRENCY at a time; lines are printed in order as their
    // results come in.
    let mut results = futures::stream::iter(&planned)
        .map(|(meta, plan)| {
            let cluster = &cluster;
            async move {
                let written = match plan {
                    Plan::Add if args.apply => Some(write_label(cluster, meta, key, value).await),
                    _ => None,
                };
                (*meta, plan, written)
            }
        })
        .buffered(CONCURRENCY);

    let label = format!("{key}={value}");
    let (mut added, mut unchanged, mut skipped, mut gone, mut conflicts, mut failed) =
        (0, 0, 0, 0, 0, 0);
    let mut fatal = None;
    while let Some((meta, plan, written)) = results.next().await {
        let id = format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        );
        let holder = meta
            .owner_references
            .as_deref()
            .and_then(|o| o.first())
            .map(|o| o.name.as_str())
            .unwrap_or_default();
        let line = match (plan, written) {
            (Plan::Unchanged, _) => {
                unchanged += 1;
                format!("unchanged    {id}: already has {label}")
            }
            (Plan::Conflicting(v), _) => {
                skipped += 1;
                format!("skipped      {id}: has {key}={v}; not overwriting it")
            }
            (Plan::Add, None) => {
                added += 1;
                format!("would label  {id} (holder {holder}): add {label}")
            }
            (Plan::Add, Some(Written::Labeled)) => {
                added += 1;
                format!("labeled      {id} (holder {holder}): added {label}")
            }
            (Plan::Add, Some(Written::Gone)) => {
                gone += 1;
                format!("gone         {id}: deleted since it was read; nothing to label")
            }
            (Plan::Add, Some(Written::Conflict)) => {
                conflicts += 1;
                format!(
                    "conflict     {id}: changed since it was read (409); not labeled, run again"
                )
            }
            (Plan::Add, Some(Written::Failed { error, forbidden })) => {
                failed += 1;
                if forbidden {
                    // Every other write would be refused the same way.
                    fatal = Some(error);
                    break;
                }
                format!("failed       {id}: {error}")
            }
        };
        print_stdout(&format!("{line}\n"))?;
    }
    drop(results);
    let mut summary = if args.apply {
        format!("{added} labeled, {unchanged} unchanged, {skipped} skipped")
    } else {
        format!("dry run: {added} would be labeled, {unchanged} unchanged, {skipped} skipped")
    };
    if gone > 0 {
        let _ = write!(summary, ", {gone} gone");
    }
    if conflicts > 0 {
        let _ = write!(
            summary,
            ", {conflicts} conflict{}",
            if conflicts == 1 { "" } else { "s" }
        );
    }
    if failed > 0 {
        let _ = write!(summary, ", {failed} failed");
    }
    let _ = write!(
        summary,
        " ({} lock candidate{} in {}",
        planned.len() + excluded,
        if planned.len() + excluded == 1 {
            ""
        } else {
            "s"
        },
        scope_text(&args.scope)
    );
    if excluded > 0 {
        let _ = write!(summary, ", {excluded} left out by --include/--exclude");
    }
    summary.push(')');
    if !args.apply && added > 0 {
        summary.push_str("; run again with --apply to write");
    }
    if fatal.is_some() {
        summary.push_str("; stopped at the first forbidden write");
    }
    summary.push_str(".\n");
    print_stdout(&summary)?;
    if let Some(error) = fatal {
        return Err(anyhow!(error));
    }
    if conflicts + failed > 0 {
        anyhow::bail!(
            "{} of {} locks were not labeled (see above); run again to retry",
            conflicts + failed,
            added + conflicts + failed + gone
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn ages_read_like_kubectl() {
        for (s, want) in [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (42 * 60 + 5, "42m"),
            (5 * 3600 + 30 * 60, "5h30m"),
            (20 * 3600, "20h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400, "3y"),
        ] {
            assert_eq!(human_age(s), want, "{s}");
        }
    }

    #[test]
    fn wraps_at_spaces() {
        let text = "a ".repeat(80) + &"b".repeat(120);
        let w = wrap(&text, 100, 4);
        let lines: Vec<&str> = w.lines().collect();
        assert_eq!(lines.len(), 3, "{w}");
        assert!(lines[0].len() <= 100 && lines[1].starts_with("    a"));
        assert_eq!(lines[2], format!("    {}", "b".repeat(120)));
        assert_eq!(wrap("short", 100, 4), "short\n");
    }

    #[test]
    fn node_names_lose_their_domain() {
        assert_eq!(
            short_host("ip-10-0-12-34.eu-west-1.compute.internal"),
            "ip-10-0-12-34"
        );
        assert_eq!(short_host("node-a"), "node-a");
        assert_eq!(short_host("10.0.12.34"), "10.0.12.34");
    }

    #[test]
    fn ellipsis_keeps_both_ends() {
        assert_eq!(ellipsize("short", 10), "short");
        assert_eq!(
            ellipsize("memcached-operator-7d9f8b6c5-x2x9k", 15),
            "memcach…5-x2x9k"
        );
        assert_eq!(
            ellipsize("memcached-operator-7d9f8b6c5-x2x9k", 15)
                .chars()
                .count(),
            15
        );
        assert_eq!(ellipsize("abc", 1), "…");
    }

    #[test]
    fn table_fits_in_100_columns_and_aligns() {
        let long = "x".repeat(80);
        let rows = vec![
            vec![
                "operators-production-eu-west".to_string(),
                format!("memcached-operator-lock-{long}"),
                "no".into(),
                format!("memcached-operator-{long}-7d9f8b6c5-x2x9k"),
                "Failed/Evicted".into(),
                "ip-10-0-12-34.eu-west-1.compute.internal".into(),
                "3d4h".into(),
                "unmanageable:OwnerInOtherNamespace".into(),
            ],
            vec![
                "ops".into(),
                "lock".into(),
                "yes".into(),
                "op-1".into(),
                "Running".into(),
                "node-a".into(),
                "5s".into(),
                "held".into(),
            ],
        ];
        let t = render_table(&HEADERS, &rows, 100, &SHRINKABLE, &MIDDLE);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        for l in &lines {
            assert!(l.chars().count() <= 100, "{} chars: {l}", l.chars().count());
        }
        // Every column starts at the same offset on every line.
        let col = |l: &str, word: &str| l.find(word).unwrap();
        let verdict_at = lines[0].chars().count() - "VERDICT".len();
        assert_eq!(lines[2].chars().count(), verdict_at + "held".len());
        assert_eq!(col(lines[0], "LABELED"), col(lines[2], "yes"));
        assert!(lines[1].contains("unmanageable:Owner"), "{t}");
        assert!(lines[1].contains('…'));

        // Short tables are not padded out to 100.
        let t = render_table(&HEADERS, &rows[1..], 100, &SHRINKABLE, &MIDDLE);
        assert!(t.lines().all(|l| l.len() < 70), "{t}");
    }

    fn lock_meta(owners: Vec<OwnerReference>, lbl: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            namespace: Some("ops".into()),
            name: Some("op-lock".into()),
            uid: Some("cm-uid".into()),
            resource_version: Some("7".into()),
            creation_timestamp: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
            owner_references: Some(owners),
            labels: Some(labels(lbl)),
            ..Default::default()
        }
    }

    fn pod_owner(name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

    #[test]
    fn label_plans() {
        let k = "lock-janitor.io/watch";
        let m = lock_meta(vec![pod_owner("op-1", "u")], &[]);
        assert_eq!(plan_label(&m, k, "true"), Some(Plan::Add));
        let m = lock_meta(vec![pod_owner("op-1", "u")], &[(k, "true")]);
        assert_eq!(plan_label(&m, k, "true"), Some(Plan::Unchanged));
        let m = lock_meta(vec![pod_owner("op-1", "u")], &[(k, "false")]);
        assert_eq!(
            plan_label(&m, k, "true"),
            Some(Plan::Conflicting("false".into()))
        );
        let two = lock_meta(vec![pod_owner("a", "1"), pod_owner("b", "2")], &[]);
        assert_eq!(plan_label(&two, k, "true"), None);
        let deploy = lock_meta(
            vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                ..pod_owner("d", "1")
            }],
            &[],
        );
        assert_eq!(plan_label(&deploy, k, "true"), None);
        assert_eq!(plan_label(&lock_meta(vec![], &[]), k, "true"), None);
    }

    #[test]
    fn include_and_exclude() {
        let p = |s: &str| glob::Pattern::new(s).unwrap();
        assert!(name_selected("a-lock", &[], &[]));
        assert!(name_selected("a-lock", &[p("a-*"), p("z")], &[]));
        assert!(!name_selected("b-lock", &[p("a-*")], &[]));
        assert!(!name_selected("a-lock", &[], &[p("*-lock")]));
        assert!(!name_selected("a-lock", &[p("a-*")], &[p("a-lock")]));
    }

    #[test]
    fn rows_carry_the_verdict() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let c = Candidate {
            meta: lock_meta(vec![pod_owner("op-1", "pod-uid")], &[]),
            labeled: false,
        };
        let parsed = lock::parse(&c.meta);
        let lock = parsed.clone().unwrap();
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("op-1".into()),
                uid: Some("pod-uid".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-a".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                reason: Some("Evicted".into()),
                message: Some("The node was low on resource: memory.".into()),
                ..Default::default()
            }),
        };
        let policy = Policy {
            owner_gone_grace: Duration::from_secs(30),
        };
        let v = verdict::judge(&lock, HolderSeen::Pod(&pod), &policy);
        let found = Found::Pod(Box::new(pod));
        let r = build_row(&c, &parsed, Some(&found), &v, now);
        assert_eq!(r.verdict, "stale:Evicted");
        assert_eq!(r.state, "stale");
        assert_eq!(r.reason.as_deref(), Some("Evicted"));
        assert_eq!(r.node.as_deref(), Some("node-a"));
        assert_eq!(r.age_seconds, Some(60));
        assert_eq!(phase_cell(&r), "Failed/Evicted");
        assert!(r.message.contains("low on resource"), "{}", r.message);

        // A missing holder: the grace runs from the lock's creation.
        for (grace, want) in [(30, "stale:OwnerGone"), (120, "held")] {
            let policy = Policy {
                owner_gone_grace: Duration::from_secs(grace),
            };
            let v = verdict::judge(&lock, missing_holder(&lock, now), &policy);
            let r = build_row(&c, &parsed, Some(&Found::Missing), &v, now);
            assert_eq!(r.verdict, want);
            assert_eq!(r.holder_found, Some(false));
            assert_eq!(phase_cell(&r), "(gone)");
        }

        // Unmanageable: no holder read at all.
        let bad = Candidate {
            meta: lock_meta(vec![pod_owner("op-1", "")], &[]),
            labeled: true,
        };
        let parsed = lock::parse(&bad.meta);
        let v = Verdict::Unmanageable(parsed.clone().unwrap_err());
        let r = build_row(&bad, &parsed, None, &v, now);
        assert_eq!(r.verdict, "unmanageable:EmptyOwnerUid");
        assert_eq!(r.holder.as_deref(), Some("op-1"));
        assert_eq!(r.holder_found, None);
        assert_eq!(phase_cell(&r), "-");
    }
}
