//! The words for a verdict, the same in logs, Events and `scan`: short codes
//! for tables and JSON, and the sentences that explain them.

use std::fmt::Write as _;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::verdict::{HeldBecause, StaleReason, Verdict};

/// Why held, as one word (`Running`, `Pending`, `NoStatus`, ...).
pub fn held_code(why: &HeldBecause) -> String {
    match why {
        HeldBecause::Phase(p) => p.clone(),
        HeldBecause::NoStatus => "NoStatus".into(),
        HeldBecause::Terminating => "Terminating".into(),
        HeldBecause::OwnerGoneGrace { .. } => "OwnerGoneGrace".into(),
        HeldBecause::ContainerRunning(_) => "ContainerRunning".into(),
        HeldBecause::Released => "Released".into(),
        HeldBecause::Expired => "Expired".into(),
        HeldBecause::NoMatchingPod => "NoMatchingPod".into(),
        HeldBecause::RenewedAfterDeath => "RenewedAfterDeath".into(),
        HeldBecause::DeathTimeUnknown => "DeathTimeUnknown".into(),
        HeldBecause::RenewalWindow { .. } => "RenewalWindow".into(),
    }
}

/// `held`, `stale:<Reason>`, `ambiguous` or `unmanageable:<Code>`.
pub fn verdict_code(v: &Verdict) -> String {
    match v {
        Verdict::Held(_) => "held".into(),
        Verdict::Stale { reason, .. } => format!("stale:{reason}"),
        Verdict::Ambiguous { .. } | Verdict::AmbiguousHolders(_) => "ambiguous".into(),
        Verdict::Unmanageable(why) => format!("unmanageable:{}", why.code()),
    }
}

/// The stale reason, the unmanageable code, or why held; none when ambiguous.
pub fn reason_code(v: &Verdict) -> Option<String> {
    match v {
        Verdict::Held(why) => Some(held_code(why)),
        Verdict::Stale { reason, .. } => Some(reason.as_str().to_owned()),
        Verdict::Ambiguous { .. } | Verdict::AmbiguousHolders(_) => None,
        Verdict::Unmanageable(why) => Some(why.code().to_owned()),
    }
}

fn secs(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// Why a stale lock's holder is dead, for the reclaim log and Event.
pub fn why_stale(reason: StaleReason, holder: &str, pod: Option<&Pod>) -> String {
    let status = pod.and_then(|p| p.status.as_ref());
    let pod_reason = status.and_then(|s| s.reason.as_deref()).unwrap_or("");
    match reason {
        StaleReason::OwnerGone => format!("holder pod {holder} no longer exists"),
        StaleReason::Succeeded => format!("holder pod {holder} has Succeeded"),
        _ if pod_reason.is_empty() => format!("holder pod {holder} has Failed ({reason})"),
        _ => format!("holder pod {holder} has Failed with reason {pod_reason} ({reason})"),
    }
}

/// The note of the Warning Event on a lock the janitor will never touch;
/// none for a verdict that is not ambiguous or unmanageable.
pub fn untouchable_note(v: &Verdict, holder: &str) -> Option<String> {
    match v {
        Verdict::Ambiguous { other_uid } => Some(format!(
            "Not reclaimed: pod {holder} exists with uid {other_uid}, not the lock's holder uid. \
             A pod recreated under the same name believes it still leads; delete the lock by hand \
             only once you know which pod leads."
        )),
        Verdict::AmbiguousHolders(pods) => Some(format!(
            "Not released: pods {} all match the Lease's holder identity {holder}; which one leads \
             is not known.",
            pods.join(", ")
        )),
        Verdict::Unmanageable(why) => Some(format!(
            "Not a lock the janitor can judge ({}): {why}. It will never be deleted or released \
             by lock-janitor; remove the opt-in label or fix the lock.",
            why.code()
        )),
        _ => None,
    }
}

/// One sentence explaining a verdict, as `scan` prints it. `age` is the
/// lock's age, which a one-shot scan uses as the owner-gone clock.
pub fn explain(v: &Verdict, holder: &str, pod: Option<&Pod>, age: Option<Duration>) -> String {
    let status = pod.and_then(|p| p.status.as_ref());
    match v {
        Verdict::Held(HeldBecause::Phase(p)) => format!("holder pod {holder} is {p}"),
        Verdict::Held(HeldBecause::NoStatus) => {
            format!("holder pod {holder} has no status yet; nothing proves it is dead")
        }
        Verdict::Held(HeldBecause::Terminating) => format!(
            "holder pod {holder} is being deleted but has not stopped; its containers may still run"
        ),
        Verdict::Held(HeldBecause::ContainerRunning(c)) => format!(
            "holder pod {holder} is {}, but its status still shows container {c} running; \
             nothing proves it stopped",
            status.and_then(|s| s.phase.as_deref()).unwrap_or("?")
        ),
        Verdict::Held(HeldBecause::Released) => {
            "the Lease is released: a candidate takes it by itself".into()
        }
        Verdict::Held(HeldBecause::Expired) => {
            format!("the Lease of {holder} expired: a candidate takes it by itself")
        }
        Verdict::Held(HeldBecause::NoMatchingPod) => format!(
            "no pod matches the holder identity {holder}: a force-deleted pod may still run; \
             the Lease expires by itself"
        ),
        Verdict::Held(HeldBecause::RenewedAfterDeath) => format!(
            "the Lease was renewed after pod {holder} stopped: something under that identity \
             still runs"
        ),
        Verdict::Held(HeldBecause::DeathTimeUnknown) => format!(
            "pod {holder} is terminal but never says when its containers finished: whether the \
             Lease was renewed since cannot be told; it expires by itself"
        ),
        Verdict::Held(HeldBecause::RenewalWindow { remaining }) => format!(
            "pod {holder} died moments ago; released in {} unless something renews the Lease",
            secs(*remaining)
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
        Verdict::AmbiguousHolders(pods) => format!(
            "pods {} all match the holder identity: which one leads is not known; never released",
            pods.join(", ")
        ),
        Verdict::Unmanageable(why) => format!("{why}; never reclaimed"),
    }
}
