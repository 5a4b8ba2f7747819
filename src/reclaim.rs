//! Every write the janitor makes: guarded deletes, Events and the metrics
//! that count them. Called only with a judgement made from live reads.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use kube::Api;
use tracing::{error, info, warn};

use crate::controller::{Context, Judgement};
use crate::lock;
use crate::verdict::{self, StaleReason, Verdict};
use crate::{api_code, call, Error, ErrorKind};

pub const REASON_RECLAIMED: &str = "StaleLockReclaimed";
pub const REASON_DETECTED: &str = "StaleLockDetected";
pub const REASON_POD_DELETED: &str = "DeadHolderDeleted";
pub const REASON_UNMANAGEABLE: &str = "UnmanageableLock";
pub const REASON_AMBIGUOUS: &str = "AmbiguousLock";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The lock was deleted (and the dead pod, if asked).
    Reclaimed,
    /// Someone else deleted it first (404).
    AlreadyGone,
    /// The lock changed since it was judged (409): judge it again.
    Changed,
    /// `--dry-run`: reported, not deleted.
    DryRun,
}

fn lock_ref(j: &Judgement) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        namespace: j.meta.namespace.clone(),
        name: j.meta.name.clone(),
        uid: j.meta.uid.clone(),
        resource_version: j.meta.resource_version.clone(),
        ..Default::default()
    }
}

fn holder_ref(j: &Judgement) -> Option<ObjectReference> {
    let lock = j.lock.as_ref()?;
    Some(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(lock.namespace.clone()),
        name: Some(lock.holder.name.clone()),
        uid: Some(lock.holder.uid.clone()),
        ..Default::default()
    })
}

/// events.k8s.io refuses a note over 1 KiB.
const MAX_NOTE: usize = 1024;

fn truncate(mut note: String) -> String {
    if note.len() > MAX_NOTE {
        let mut end = MAX_NOTE - '…'.len_utf8();
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
        note.push('…');
    }
    note
}

/// Publishes an Event on the lock (related: the holder pod). A failed Event
/// never undoes or blocks a reclaim; it is logged and counted. True if written.
async fn publish(
    ctx: &Context,
    j: &Judgement,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) -> bool {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(truncate(note)),
        action: action.into(),
        secondary: holder_ref(j),
    };
    let res =
        tokio::time::timeout(crate::API_TIMEOUT, ctx.recorder.publish(&ev, &lock_ref(j))).await;
    let err = match res {
        Ok(Ok(())) => return true,
        Ok(Err(e)) => e.to_string(),
        Err(_) => "timed out".to_owned(),
    };
    ctx.state
        .metrics
        .reconcile_errors
        .with_label_values(&[ErrorKind::Event.as_str()])
        .inc();
    warn!(namespace = %j.key.namespace, lock = %j.key.name, reason, error = %err, "could not write Event");
    false
}

/// Publishes at most once per resourceVersion of the lock and reason (a
/// failed write is tried again at the next reconcile).
async fn publish_once(
    ctx: &Context,
    j: &Judgement,
    type_: EventType,
    reason: &'static str,
    action: &str,
    note: String,
) {
    let seen = (j.meta.resource_version.clone().unwrap_or_default(), reason);
    if ctx.with_memo(&j.key, |m| m.reported.as_ref() == Some(&seen)) {
        return;
    }
    if publish(ctx, j, type_, reason, action, note).await {
        ctx.with_memo(&j.key, |m| m.reported = Some(seen));
    }
}

/// Reports a lock the janitor will never touch (ambiguous or unmanageable).
pub async fn report_untouchable(ctx: &Context, j: &Judgement) {
    let (reason, note) = match &j.verdict {
        Verdict::Ambiguous { other_uid } => {
            let holder = j.lock.as_ref().map(|l| l.holder.name.as_str()).unwrap_or_default();
            (
                REASON_AMBIGUOUS,
                format!(
                    "Not reclaimed: pod {holder} exists with uid {other_uid}, not the lock's holder uid. \
                     A pod recreated under the same name believes it still leads; delete the lock by hand \
                     only once you know which pod leads."
                ),
            )
        }
        Verdict::Unmanageable(why) => (
            REASON_UNMANAGEABLE,
            format!("Not a leader-for-life lock the janitor can judge: {why}. It will never be deleted by lock-janitor; remove the opt-in label or fix the lock."),
        ),
        _ => return,
    };
    warn!(namespace = %j.key.namespace, lock = %j.key.name, reason, "{note}");
    publish_once(ctx, j, EventType::Warning, reason, "Skip", note).await;
}

/// Reclaims a stale lock: the guarded DELETE, then (if asked) the dead pod.
pub async fn reclaim(ctx: &Context, j: &Judgement) -> Result<Outcome, Error> {
    let (Verdict::Stale { reason, .. }, Some(lock)) = (&j.verdict, &j.lock) else {
        // Only stale locks come here; anything else is judged again, never deleted.
        return Ok(Outcome::Changed);
    };
    let reason = *reason;
    let m = &ctx.state.metrics;
    let (ns, name) = (lock.namespace.as_str(), lock.name.as_str());
    let why = describe(reason, j);

    if ctx.settings.dry_run {
        ctx.mark_stale(&j.key, reason);
        info!(namespace = ns, lock = name, holder = %lock.holder.name, reason = %reason, dry_run = true,
              "stale lock detected; not deleting (dry run)");
        let note = format!("Would delete this lock: {why} (dry run: nothing deleted).");
        publish_once(ctx, j, EventType::Warning, REASON_DETECTED, "DryRun", note).await;
        return Ok(Outcome::DryRun);
    }

    // The delete succeeds only if the lock is still exactly the one judged.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(lock.uid.clone()),
            resource_version: Some(lock.resource_version.clone()),
        }),
        ..Default::default()
    };
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    match call(format!("deleting lock {ns}/{name}"), cms.delete(name, &dp)).await {
        Ok(_) => {}
        Err(Error::Kube { source, .. }) if api_code(&source) == Some(404) => {
            info!(
                namespace = ns,
                lock = name,
                "lock already deleted by someone else"
            );
            m.set_stale(ns, name, None);
            return Ok(Outcome::AlreadyGone);
        }
        Err(Error::Kube { source, .. }) if api_code(&source) == Some(409) => {
            info!(namespace = ns, lock = name, error = %source,
                  "lock changed since it was judged; not deleting, judging again");
            return Ok(Outcome::Changed);
        }
        Err(e) => {
            ctx.mark_stale(&j.key, reason);
            error!(namespace = ns, lock = name, reason = %reason, error = %e, "stale lock not reclaimed");
            return Err(e);
        }
    }
    let now = Timestamp::now();
    m.set_stale(ns, name, None);
    m.reclaims
        .with_label_values(&[ns, name, reason.as_str()])
        .inc();
    let latency = j
        .died_at
        .map(|d| Duration::try_from(now.duration_since(d)).unwrap_or(Duration::ZERO));
    if let Some(l) = latency {
        m.reclaim_latency.observe(l.as_secs_f64());
    }
    info!(namespace = ns, lock = name, holder = %lock.holder.name, reason = %reason,
          latency_seconds = latency.map(|l| l.as_secs_f64()), "stale lock reclaimed");
    publish(
        ctx,
        j,
        EventType::Normal,
        REASON_RECLAIMED,
        "Reclaim",
        format!("Deleted this lock: {why}. A waiting replica can now take over."),
    )
    .await;

    if ctx.settings.delete_pod {
        delete_dead_pod(ctx, j, reason).await;
    }
    Ok(Outcome::Reclaimed)
}

/// How long to wait for a takeover after a lock is gone. operator-lib's
/// waiting replicas retry at most every 16 s; a new pod may need to start.
const TAKEOVER_WINDOW: Duration = Duration::from_secs(600);

/// After a lock is gone, waits for the takeover (a new holder creating the
/// lock again) and adds the opt-in label to the new lock: operator-lib
/// creates it without labels, and without the label the janitor would stop
/// watching the operator. Writes only a leader-for-life lock of another
/// holder that has no value for the label key (`false` is an opt-out), with
/// a resourceVersion-guarded merge patch, so it never overwrites a
/// concurrent change.
pub async fn carry_label_over(
    cms: Api<k8s_openapi::api::core::v1::ConfigMap>,
    name: String,
    (key, value): (String, String),
    old_holder_uid: String,
) {
    let ns = cms.namespace().unwrap_or_default().to_owned();
    let started = std::time::Instant::now();
    let mut wait = Duration::from_millis(500);
    while started.elapsed() < TAKEOVER_WINDOW {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(16));
        let read = call(
            "reading the lock after it was deleted",
            cms.get_metadata_opt(&name),
        );
        let meta = match read.await {
            Ok(Some(m)) => m.metadata,
            Ok(None) => continue,
            Err(e) => {
                warn!(namespace = %ns, lock = %name, error = %e, "waiting for the takeover");
                continue;
            }
        };
        let holder = match lock::parse(&meta) {
            // Same holder: the lock was not deleted but left the selector
            // (someone removed the label). Respect that.
            Ok(l) if l.holder.uid == old_holder_uid => return,
            Ok(l) => l.holder.name,
            Err(why) => {
                info!(namespace = %ns, lock = %name, why = %why,
                      "the lock was re-created but is not a leader-for-life lock; not labeling it");
                return;
            }
        };
        let after = started.elapsed().as_secs_f64();
        match lock::plan_label(&meta, &key, &value) {
            Some(lock::Plan::Add) => {}
            Some(lock::Plan::Unchanged) => {
                info!(namespace = %ns, lock = %name, holder = %holder, after_seconds = after,
                      "takeover: a new holder leads; the lock already carries the opt-in label");
                return;
            }
            Some(lock::Plan::Conflicting(other)) => {
                info!(namespace = %ns, lock = %name, holder = %holder, value = %other,
                      "takeover: a new holder leads; its lock sets the opt-in label key to another value, left alone");
                return;
            }
            None => return,
        }
        let patch = Patch::Merge(lock::label_patch(&meta, &key, &value));
        let pp = PatchParams {
            field_manager: Some(crate::NAME.into()),
            ..Default::default()
        };
        let write = cms.patch_metadata(&name, &pp, &patch);
        match call(format!("labeling lock {ns}/{name}"), write).await {
            Ok(_) => {
                info!(namespace = %ns, lock = %name, holder = %holder, after_seconds = after,
                      "takeover: a new holder leads; opt-in label carried over");
                return;
            }
            Err(Error::Kube { source, .. }) if matches!(api_code(&source), Some(409 | 404)) => {
                continue
            }
            Err(e) => {
                warn!(namespace = %ns, lock = %name, error = %e,
                      "could not carry the opt-in label over; label the lock with `lock-janitor label --apply`");
                return;
            }
        }
    }
    warn!(namespace = %ns, lock = %name,
          "no takeover within {}s; if a replica takes over later, label its lock with `lock-janitor label --apply`",
          TAKEOVER_WINDOW.as_secs());
}

fn describe(reason: StaleReason, j: &Judgement) -> String {
    let holder = j
        .lock
        .as_ref()
        .map(|l| l.holder.name.as_str())
        .unwrap_or_default();
    let status = j.holder.as_ref().and_then(|p| p.status.as_ref());
    let pod_reason = status.and_then(|s| s.reason.as_deref()).unwrap_or("");
    match reason {
        StaleReason::OwnerGone => format!("holder pod {holder} no longer exists"),
        StaleReason::Succeeded => format!("holder pod {holder} has Succeeded"),
        _ if pod_reason.is_empty() => format!("holder pod {holder} has Failed ({reason})"),
        _ => format!("holder pod {holder} has Failed with reason {pod_reason} ({reason})"),
    }
}

/// Deletes the dead holder (`--delete-pod`): only a terminal pod, only the
/// very pod judged (uid precondition). Failures are logged, never retried
/// blindly: the lock is already free.
async fn delete_dead_pod(ctx: &Context, j: &Judgement, reason: StaleReason) {
    // Terminal, and not already being deleted (a rollout deletes it anyway).
    let Some(pod) = j
        .holder
        .as_ref()
        .filter(|p| verdict::is_terminal(p) && p.metadata.deletion_timestamp.is_none())
    else {
        return;
    };
    let (Some(ns), Some(name), Some(uid)) = (
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
        pod.metadata.uid.as_deref(),
    ) else {
        return;
    };
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    match call(format!("deleting pod {ns}/{name}"), pods.delete(name, &dp)).await {
        Ok(_) => {
            ctx.state
                .metrics
                .pod_deletions
                .with_label_values(&[ns, reason.as_str()])
                .inc();
            info!(namespace = ns, pod = name, reason = %reason, "dead holder pod deleted");
            publish(
                ctx,
                j,
                EventType::Normal,
                REASON_POD_DELETED,
                "DeletePod",
                format!("Deleted the dead holder pod {name} ({reason})."),
            )
            .await;
        }
        Err(Error::Kube { source, .. }) if matches!(api_code(&source), Some(404 | 409)) => {
            info!(
                namespace = ns,
                pod = name,
                "dead holder pod already gone or replaced; left alone"
            );
        }
        Err(e) => {
            ctx.state
                .metrics
                .reconcile_errors
                .with_label_values(&[e.kind().as_str()])
                .inc();
            warn!(namespace = ns, pod = name, error = %e, "could not delete the dead holder pod; the lock is reclaimed");
        }
    }
}
