//! The verdict table of ConfigMap locks, row by row, and the death time.

// Property tests of the parsers and the verdict, on generated input.
mod properties;

use super::*;
use crate::lock::Holder;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

const GRACE: Duration = Duration::from_secs(30);

fn lock() -> Lock {
    Lock {
        namespace: "ops".into(),
        name: "op-lock".into(),
        uid: "cm-uid".into(),
        resource_version: "7".into(),
        created: None,
        holder: Holder {
            name: "op-1".into(),
            uid: "pod-uid".into(),
        },
        deleting: None,
    }
}

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn pod(uid: &str, phase: Option<&str>, reason: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("op-1".into()),
            namespace: Some("ops".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: phase.map(Into::into),
            reason: reason.map(Into::into),
            ..Default::default()
        }),
    }
}

fn judge_pod(p: &Pod) -> Verdict {
    judge(
        &lock(),
        HolderSeen::Pod(p),
        &Policy {
            owner_gone_grace: GRACE,
        },
    )
}

fn stale(reason: StaleReason) -> Verdict {
    Verdict::Stale {
        reason,
        died_at: None,
    }
}

type Case = (&'static str, Pod, Verdict);

/// Pods that can no longer run: stale, by the reason their status gives.
fn terminal_cases() -> Vec<Case> {
    let failed_and_terminating = {
        let mut p = pod("pod-uid", Some("Failed"), Some("Evicted"));
        p.metadata.deletion_timestamp = Some(Time(t("2026-01-01T00:00:00Z")));
        p
    };
    vec![
        (
            "evicted",
            pod("pod-uid", Some("Failed"), Some("Evicted")),
            stale(StaleReason::Evicted),
        ),
        (
            "preempted",
            pod("pod-uid", Some("Failed"), Some("Preempting")),
            stale(StaleReason::Preempted),
        ),
        (
            "terminated",
            pod("pod-uid", Some("Failed"), Some("Terminated")),
            stale(StaleReason::Shutdown),
        ),
        (
            "shutdown",
            pod("pod-uid", Some("Failed"), Some("Shutdown")),
            stale(StaleReason::Shutdown),
        ),
        (
            "node shutdown",
            pod("pod-uid", Some("Failed"), Some("NodeShutdown")),
            stale(StaleReason::Shutdown),
        ),
        (
            "other failure",
            pod("pod-uid", Some("Failed"), Some("OOMKilled")),
            stale(StaleReason::Failed),
        ),
        (
            "failed, no reason",
            pod("pod-uid", Some("Failed"), None),
            stale(StaleReason::Failed),
        ),
        (
            "succeeded",
            pod("pod-uid", Some("Succeeded"), None),
            stale(StaleReason::Succeeded),
        ),
        (
            "terminal wins over terminating",
            failed_and_terminating,
            stale(StaleReason::Evicted),
        ),
    ]
}

/// Pods that may run, in any phase but the terminal ones, or terminating.
fn live_cases() -> Vec<Case> {
    let terminating = {
        let mut p = pod("pod-uid", Some("Running"), None);
        p.metadata.deletion_timestamp = Some(Time(t("2026-01-01T00:00:00Z")));
        p
    };
    vec![
        (
            "pending",
            pod("pod-uid", Some("Pending"), None),
            Verdict::Held(HeldBecause::Phase("Pending".into())),
        ),
        (
            "running",
            pod("pod-uid", Some("Running"), None),
            Verdict::Held(HeldBecause::Phase("Running".into())),
        ),
        (
            "unknown",
            pod("pod-uid", Some("Unknown"), None),
            Verdict::Held(HeldBecause::Phase("Unknown".into())),
        ),
        (
            "future phase",
            pod("pod-uid", Some("Hibernating"), None),
            Verdict::Held(HeldBecause::Phase("Hibernating".into())),
        ),
        (
            "running, evicted reason",
            pod("pod-uid", Some("Running"), Some("Evicted")),
            Verdict::Held(HeldBecause::Phase("Running".into())),
        ),
        (
            "terminating",
            terminating,
            Verdict::Held(HeldBecause::Terminating),
        ),
    ]
}

/// What a status leaves unsaid, a container still running, another pod.
fn doubtful_cases() -> Vec<Case> {
    let no_status = Pod {
        status: None,
        ..pod("pod-uid", None, None)
    };
    let running = |name: &str| ContainerStatus {
        name: name.into(),
        state: Some(ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let still_running = |phase: &str, reason: Option<&str>, at: usize| {
        let mut p = pod("pod-uid", Some(phase), reason);
        let st = p.status.as_mut().unwrap();
        match at {
            0 => st.init_container_statuses = Some(vec![running("init")]),
            1 => st.container_statuses = Some(vec![running("app")]),
            _ => st.ephemeral_container_statuses = Some(vec![running("debug")]),
        }
        p
    };
    vec![
        ("no status", no_status, Verdict::Held(HeldBecause::NoStatus)),
        (
            "failed, but an init container still runs",
            still_running("Failed", Some("Evicted"), 0),
            Verdict::Held(HeldBecause::ContainerRunning("init".into())),
        ),
        (
            "failed, but a container still runs",
            still_running("Failed", Some("Terminated"), 1),
            Verdict::Held(HeldBecause::ContainerRunning("app".into())),
        ),
        (
            "succeeded, but an ephemeral container still runs",
            still_running("Succeeded", None, 2),
            Verdict::Held(HeldBecause::ContainerRunning("debug".into())),
        ),
        (
            "empty phase",
            pod("pod-uid", None, None),
            Verdict::Held(HeldBecause::NoStatus),
        ),
        (
            "same name, other uid, even if dead",
            pod("other-uid", Some("Failed"), Some("Evicted")),
            Verdict::Ambiguous {
                other_uid: "other-uid".into(),
            },
        ),
        (
            "same name, other uid",
            pod("other-uid", Some("Running"), None),
            Verdict::Ambiguous {
                other_uid: "other-uid".into(),
            },
        ),
        (
            "same name, no uid",
            Pod {
                metadata: ObjectMeta {
                    uid: None,
                    ..Default::default()
                },
                ..pod("", Some("Failed"), None)
            },
            Verdict::Ambiguous {
                other_uid: String::new(),
            },
        ),
    ]
}

#[test]
fn design_table() {
    let cases = terminal_cases()
        .into_iter()
        .chain(live_cases())
        .chain(doubtful_cases());
    for (name, p, want) in cases {
        assert_eq!(judge_pod(&p), want, "{name}");
    }
}

#[test]
fn owner_gone_waits_for_the_grace() {
    let policy = Policy {
        owner_gone_grace: GRACE,
    };
    let since = t("2026-01-01T00:00:00Z");
    let judge_after = |secs: u64| {
        let gone_for = Duration::from_secs(secs);
        judge(&lock(), HolderSeen::Missing { since, gone_for }, &policy)
    };
    assert_eq!(
        judge_after(10),
        Verdict::Held(HeldBecause::OwnerGoneGrace {
            remaining: Duration::from_secs(20)
        })
    );
    assert_eq!(
        judge_after(0),
        Verdict::Held(HeldBecause::OwnerGoneGrace { remaining: GRACE })
    );
    assert_eq!(
        judge_after(30),
        Verdict::Stale {
            reason: StaleReason::OwnerGone,
            died_at: Some(since)
        }
    );
}

#[test]
fn a_holder_elsewhere_is_unmanageable_even_past_the_grace() {
    let v = judge(
        &lock(),
        HolderSeen::Elsewhere("other".into()),
        &Policy {
            owner_gone_grace: Duration::ZERO,
        },
    );
    assert_eq!(
        v,
        Verdict::Unmanageable(Unmanageable::OwnerInOtherNamespace("other".into()))
    );
}

#[test]
fn death_time_is_the_last_container_finish() {
    let term = |at: &str| ContainerStatus {
        name: "c".into(),
        state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                finished_at: Some(Time(t(at))),
                exit_code: 137,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut p = pod("pod-uid", Some("Failed"), Some("Evicted"));
    let st = p.status.as_mut().unwrap();
    st.container_statuses = Some(vec![
        term("2026-01-01T00:00:05Z"),
        term("2026-01-01T00:00:09Z"),
    ]);
    st.init_container_statuses = Some(vec![term("2026-01-01T00:00:01Z")]);
    assert_eq!(
        judge_pod(&p),
        Verdict::Stale {
            reason: StaleReason::Evicted,
            died_at: Some(t("2026-01-01T00:00:09Z"))
        }
    );
    assert!(is_terminal(&p));
    assert!(!is_terminal(&pod("pod-uid", Some("Running"), None)));
    assert!(!is_terminal(&Pod {
        status: None,
        ..pod("pod-uid", None, None)
    }));
}
