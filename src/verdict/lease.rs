//! The judgement of a Lease lock (pure, like the ConfigMap one): from the
//! Lease and the pods of its namespace, at a given time.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::{judge_holder_pod, HeldBecause, Verdict};
use crate::lock::lease::{self, LeaseLock};

/// How long after a pod's last container finished a Lease renewal still
/// counts as its own: `finishedAt` has second precision.
const RENEW_SLACK: SignedDuration = SignedDuration::from_secs(2);

/// How long after the death a Lease is first released: the slack, then one
/// retry period of client-go (2 s) and a second of rounding, so that
/// anything still renewing under the identity has had its chance to show.
pub const RENEWAL_WINDOW: SignedDuration = SignedDuration::from_secs(5);

/// Judges a Lease from the pods of its namespace (all of them, or at least
/// every one the identity could name) at `now`.
pub fn judge_lease(lock: &LeaseLock, pods: &[Pod], now: Timestamp) -> Verdict {
    let Some(host) = lock.host.as_deref() else {
        return Verdict::Held(HeldBecause::Released);
    };
    if lock.expired(now) {
        return Verdict::Held(HeldBecause::Expired);
    }
    let matching: Vec<&Pod> = pods.iter().filter(|p| lease::names(host, p)).collect();
    let pod = match matching.as_slice() {
        [] => return Verdict::Held(HeldBecause::NoMatchingPod),
        [one] => *one,
        many => {
            let mut names: Vec<String> = many
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect();
            names.sort();
            return Verdict::AmbiguousHolders(names);
        }
    };
    let verdict = judge_holder_pod(pod);
    let Verdict::Stale { died_at, .. } = verdict else {
        return verdict;
    };
    // A Lease says who renews it, not who holds it: a dead pod's Lease is
    // released only when nothing renewed it after the death. Without a
    // death time (a pod refused at admission never ran), that cannot be
    // told: held, and the Lease expires by itself.
    let Some(died) = died_at else {
        return Verdict::Held(HeldBecause::DeathTimeUnknown);
    };
    let (Ok(slack), Ok(window)) = (
        died.checked_add(RENEW_SLACK),
        died.checked_add(RENEWAL_WINDOW),
    ) else {
        return Verdict::Held(HeldBecause::DeathTimeUnknown);
    };
    if lock.renewed.is_some_and(|r| r > slack) {
        return Verdict::Held(HeldBecause::RenewedAfterDeath);
    }
    if now < window {
        let remaining =
            std::time::Duration::try_from(window.duration_since(now)).unwrap_or_default();
        return Verdict::Held(HeldBecause::RenewalWindow { remaining });
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::StaleReason;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn now() -> Timestamp {
        "2026-12-01T10:00:00Z".parse().unwrap()
    }

    fn lease(identity: Option<&str>, renewed_ago: i64) -> LeaseLock {
        LeaseLock {
            namespace: "ops".into(),
            name: "op-lease".into(),
            uid: "lease-uid".into(),
            resource_version: "9".into(),
            created: None,
            identity: identity.map(str::to_owned),
            host: identity.map(|i| lease::host_of(i).unwrap()),
            renewed: Some(now() - SignedDuration::from_secs(renewed_ago)),
            duration: Some(SignedDuration::from_secs(60)),
        }
    }

    /// A pod `name` (with `hostname`) in `phase`, its container finished
    /// `finished_ago` seconds ago when terminal.
    fn pod(name: &str, hostname: Option<&str>, phase: &str, reason: Option<&str>) -> Pod {
        let terminal = matches!(phase, "Failed" | "Succeeded");
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ops".into()),
                uid: Some(format!("{name}-uid")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                hostname: hostname.map(str::to_owned),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                reason: reason.map(str::to_owned),
                container_statuses: terminal.then(|| {
                    vec![ContainerStatus {
                        name: "main".into(),
                        state: Some(ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                finished_at: Some(Time(now() - SignedDuration::from_secs(30))),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    fn stale(reason: StaleReason) -> Verdict {
        Verdict::Stale {
            reason,
            died_at: Some(now() - SignedDuration::from_secs(30)),
        }
    }

    #[test]
    fn verdicts() {
        let cr = "op-a_0c3e5a12-4b1f-4a2e-9d7c-1f2e3d4c5b6a";
        let long = format!("{}-x7k2p", "o".repeat(60));
        let cases: Vec<(&str, LeaseLock, Vec<Pod>, Verdict)> = vec![
            (
                "released",
                lease(None, 40),
                vec![pod("op-a", None, "Failed", Some("Evicted"))],
                Verdict::Held(HeldBecause::Released),
            ),
            (
                "expired (past the lease and a margin for clock skew)",
                lease(Some("op-a"), 75),
                vec![pod("op-a", None, "Failed", Some("Evicted"))],
                Verdict::Held(HeldBecause::Expired),
            ),
            (
                "holder running",
                lease(Some(cr), 40),
                vec![pod("op-a", None, "Running", None)],
                Verdict::Held(HeldBecause::Phase("Running".into())),
            ),
            (
                "holder terminating",
                lease(Some("op-a"), 40),
                vec![Pod {
                    metadata: ObjectMeta {
                        deletion_timestamp: Some(Time(now())),
                        ..pod("op-a", None, "Running", None).metadata
                    },
                    ..pod("op-a", None, "Running", None)
                }],
                Verdict::Held(HeldBecause::Terminating),
            ),
            (
                "holder evicted (controller-runtime identity)",
                lease(Some(cr), 40),
                vec![
                    pod("op-a", None, "Failed", Some("Evicted")),
                    pod("op-b", None, "Running", None),
                ],
                stale(StaleReason::Evicted),
            ),
            (
                "holder shut down (pod-name identity)",
                lease(Some("op-a"), 40),
                vec![pod("op-a", None, "Failed", Some("Terminated"))],
                stale(StaleReason::Shutdown),
            ),
            (
                "holder succeeded",
                lease(Some("op-a"), 40),
                vec![pod("op-a", None, "Succeeded", None)],
                stale(StaleReason::Succeeded),
            ),
            (
                "holder missing: held, the Lease expires by itself",
                lease(Some("op-a"), 40),
                vec![pod("op-b", None, "Running", None)],
                Verdict::Held(HeldBecause::NoMatchingPod),
            ),
            (
                "identity matches nothing",
                lease(Some("nobody-here"), 40),
                vec![],
                Verdict::Held(HeldBecause::NoMatchingPod),
            ),
            (
                "two pods match (name and spec.hostname)",
                lease(Some("op-a"), 40),
                vec![
                    pod("op-a", None, "Failed", Some("Evicted")),
                    pod("op-a-2", Some("op-a"), "Running", None),
                ],
                Verdict::AmbiguousHolders(vec!["op-a".into(), "op-a-2".into()]),
            ),
            (
                "matched by hostname cut at 63 characters",
                lease(
                    Some(&format!(
                        "{}-x7_0c3e5a12-4b1f-4a2e-9d7c-1f2e3d4c5b6a",
                        "o".repeat(60)
                    )),
                    40,
                ),
                vec![pod(&long, None, "Failed", Some("Preempting"))],
                stale(StaleReason::Preempted),
            ),
            (
                "died a second ago: the renewal window is still open",
                lease(Some("op-a"), 40),
                vec![{
                    let mut p = pod("op-a", None, "Failed", Some("Evicted"));
                    let cs = p
                        .status
                        .as_mut()
                        .unwrap()
                        .container_statuses
                        .as_mut()
                        .unwrap();
                    cs[0]
                        .state
                        .as_mut()
                        .unwrap()
                        .terminated
                        .as_mut()
                        .unwrap()
                        .finished_at = Some(Time(now() - SignedDuration::from_secs(1)));
                    p
                }],
                Verdict::Held(HeldBecause::RenewalWindow {
                    remaining: std::time::Duration::from_secs(4),
                }),
            ),
            (
                "failed without ever running (no death time)",
                lease(Some("op-a"), 40),
                vec![{
                    let mut p = pod("op-a", None, "Failed", Some("OutOfcpu"));
                    p.status.as_mut().unwrap().container_statuses = None;
                    p
                }],
                Verdict::Held(HeldBecause::DeathTimeUnknown),
            ),
            (
                "a renew time at the end of time does not panic",
                LeaseLock {
                    renewed: Some(Timestamp::MAX),
                    duration: Some(SignedDuration::from_secs(i64::from(i32::MAX))),
                    ..lease(Some("op-a"), 0)
                },
                vec![pod("op-a", None, "Failed", Some("Evicted"))],
                Verdict::Held(HeldBecause::RenewedAfterDeath),
            ),
            (
                "renewed after its pod died: something still runs",
                lease(Some("op-a"), 5),
                vec![pod("op-a", None, "Failed", Some("Evicted"))],
                Verdict::Held(HeldBecause::RenewedAfterDeath),
            ),
        ];
        for (name, l, pods, want) in cases {
            assert_eq!(judge_lease(&l, &pods, now()), want, "{name}");
        }
    }
}
