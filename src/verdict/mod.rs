//! The judgement: from a lock, what live reads found of its holder, and how
//! long it has been missing, decide whether the lock can be reclaimed. Pure:
//! no I/O, no clock. Every caller (controller, `scan`) judges through here.
//! (Over 500 lines: most of it is the table of cases in its tests.)

use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::lock::{Lock, Unmanageable};

mod lease;
pub use lease::{judge_lease, Renewals};

/// Why a stale lock's holder can no longer run. `as_str` is the `reason`
/// label of the metrics and appears in Events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StaleReason {
    Evicted,
    Preempted,
    Shutdown,
    Failed,
    Succeeded,
    OwnerGone,
}

impl StaleReason {
    pub const ALL: [StaleReason; 6] = [
        StaleReason::Evicted,
        StaleReason::Preempted,
        StaleReason::Shutdown,
        StaleReason::Failed,
        StaleReason::Succeeded,
        StaleReason::OwnerGone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StaleReason::Evicted => "Evicted",
            StaleReason::Preempted => "Preempted",
            StaleReason::Shutdown => "Shutdown",
            StaleReason::Failed => "Failed",
            StaleReason::Succeeded => "Succeeded",
            StaleReason::OwnerGone => "OwnerGone",
        }
    }
}

impl fmt::Display for StaleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a lock is held: the holder might still run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeldBecause {
    /// Pending, Running, Unknown, or a phase this version does not know.
    Phase(String),
    /// The pod has no status yet; nothing proves it is dead.
    NoStatus,
    /// The pod is being deleted but has not reached a terminal phase: its
    /// containers may still run until the kubelet confirms.
    Terminating,
    /// The pod's phase is terminal, but its status still shows this
    /// container running (an older kubelet during node shutdown, or a
    /// status written by hand): no proof that it stopped.
    ContainerRunning(String),
    /// The holder pod is gone, but only for `since`; wait out the grace
    /// (a force-deleted pod's containers may still be stopping).
    OwnerGoneGrace { remaining: Duration },
    /// A Lease nobody holds (released): candidates take it at once.
    Released,
    /// A Lease whose holder did not renew in time: candidates take it.
    Expired,
    /// No pod in the Lease's namespace matches its holder identity: a
    /// force-deleted pod may still run; the Lease expires by itself.
    NoMatchingPod,
    /// The Lease was renewed after its matching pod's containers finished:
    /// something under that identity still runs.
    RenewedAfterDeath,
    /// The matching pod is terminal but says nothing of when its
    /// containers finished: whether the Lease was renewed since cannot be
    /// told. The Lease expires by itself.
    DeathTimeUnknown,
    /// The matching pod died moments ago: released once `remaining` has
    /// passed without a renewal (anything renewing under the identity
    /// shows within one retry period).
    RenewalWindow { remaining: Duration },
}

/// What the janitor concludes about a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Held(HeldBecause),
    Stale {
        reason: StaleReason,
        /// When the holder's containers last finished, if the pod says.
        died_at: Option<Timestamp>,
    },
    /// A pod with the holder's name but another uid exists: a recreated
    /// StatefulSet pod believes it still leads. Never reclaimed.
    Ambiguous {
        other_uid: String,
    },
    /// Several pods match a Lease's holder identity: which one leads is not
    /// known. Never released.
    AmbiguousHolders(Vec<String>),
    Unmanageable(Unmanageable),
}

/// The state names used by `lock_janitor_locks{state}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockState {
    Held,
    Stale,
    Ambiguous,
    Unmanageable,
}

impl LockState {
    pub const ALL: [LockState; 4] = [
        LockState::Held,
        LockState::Stale,
        LockState::Ambiguous,
        LockState::Unmanageable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LockState::Held => "held",
            LockState::Stale => "stale",
            LockState::Ambiguous => "ambiguous",
            LockState::Unmanageable => "unmanageable",
        }
    }
}

impl Verdict {
    pub fn state(&self) -> LockState {
        match self {
            Verdict::Held(_) => LockState::Held,
            Verdict::Stale { .. } => LockState::Stale,
            Verdict::Ambiguous { .. } | Verdict::AmbiguousHolders(_) => LockState::Ambiguous,
            Verdict::Unmanageable(_) => LockState::Unmanageable,
        }
    }
}

/// What live reads found of the holder.
#[derive(Clone, Debug)]
pub enum HolderSeen<'a> {
    /// A pod with the holder's name in the lock's namespace.
    Pod(&'a Pod),
    /// No pod of that name in the lock's namespace, but a pod with the
    /// holder's uid lives in this other namespace: an owner reference that
    /// crosses namespaces, which Kubernetes does not allow. Not ours to judge.
    Elsewhere(String),
    /// No pod of that name, for `gone_for` (measured on a monotonic clock)
    /// since the janitor first saw it missing at `since` (wall clock).
    Missing {
        since: Timestamp,
        gone_for: Duration,
    },
}

#[derive(Clone, Debug)]
pub struct Policy {
    pub owner_gone_grace: Duration,
}

/// Judges one lock. Everything that is not proof of death is `Held`.
pub fn judge(lock: &Lock, holder: HolderSeen<'_>, policy: &Policy) -> Verdict {
    let pod = match holder {
        HolderSeen::Missing { since, gone_for } => {
            return if gone_for >= policy.owner_gone_grace {
                Verdict::Stale {
                    reason: StaleReason::OwnerGone,
                    died_at: Some(since),
                }
            } else {
                Verdict::Held(HeldBecause::OwnerGoneGrace {
                    remaining: policy.owner_gone_grace - gone_for,
                })
            };
        }
        HolderSeen::Elsewhere(namespace) => {
            return Verdict::Unmanageable(Unmanageable::OwnerInOtherNamespace(namespace))
        }
        HolderSeen::Pod(pod) => pod,
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    if uid != lock.holder.uid {
        return Verdict::Ambiguous {
            other_uid: uid.to_owned(),
        };
    }
    judge_holder_pod(pod)
}

/// Judges the one pod a lock names, known to be its holder.
pub(crate) fn judge_holder_pod(pod: &Pod) -> Verdict {
    let Some(status) = pod.status.as_ref() else {
        return Verdict::Held(HeldBecause::NoStatus);
    };
    let phase = status.phase.as_deref().unwrap_or_default();
    let reason = match phase {
        "Failed" => match status.reason.as_deref().unwrap_or_default() {
            "Evicted" => StaleReason::Evicted,
            "Preempting" => StaleReason::Preempted,
            "Terminated" | "Shutdown" | "NodeShutdown" => StaleReason::Shutdown,
            _ => StaleReason::Failed,
        },
        "Succeeded" => StaleReason::Succeeded,
        // Not terminal: the kubelet may still run its containers.
        _ if pod.metadata.deletion_timestamp.is_some() => {
            return Verdict::Held(HeldBecause::Terminating)
        }
        "" => return Verdict::Held(HeldBecause::NoStatus),
        other => return Verdict::Held(HeldBecause::Phase(other.to_owned())),
    };
    if let Some(container) = running_container(pod) {
        return Verdict::Held(HeldBecause::ContainerRunning(container.to_owned()));
    }
    Verdict::Stale {
        reason,
        died_at: last_finished(pod),
    }
}

/// The first container (init, app or ephemeral) whose status says running.
fn running_container(pod: &Pod) -> Option<&str> {
    let status = pod.status.as_ref()?;
    [
        &status.init_container_statuses,
        &status.container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .find(|cs| cs.state.as_ref().is_some_and(|s| s.running.is_some()))
    .map(|cs| cs.name.as_str())
}

/// The latest `finishedAt` over all terminated containers of the pod.
pub fn last_finished(pod: &Pod) -> Option<Timestamp> {
    let status = pod.status.as_ref()?;
    [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .filter_map(|cs| cs.state.as_ref()?.terminated.as_ref()?.finished_at.as_ref())
    .map(|t| t.0)
    .max()
}

/// Whether a pod is terminal, which is the only state in which the janitor
/// deletes it.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Failed" | "Succeeded")
    )
}

#[cfg(test)]
mod tests;
