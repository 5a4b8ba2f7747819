//! The judgement of a Lease lock (pure, like the ConfigMap one): from the
//! Lease and the pods of its namespace, at a given time.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::{judge_holder_pod, HeldBecause, Verdict};
use crate::lock::lease::{self, LeaseLock};

/// How long after a pod's last container finished a Lease renewal still
/// counts as its own: `finishedAt` has second precision.
const RENEW_SLACK: SignedDuration = SignedDuration::from_secs(2);

/// What the janitor saw of a Lease's renewals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Renewals {
    /// The holder's renew period as observed: the longest of the recent
    /// gaps between renewals under the current holder identity.
    pub period: Option<Duration>,
    /// How long since the janitor last saw the renew time change (or first
    /// saw the Lease under this holder), on its own clock. `None`: it does
    /// not watch the Lease (a one-shot `scan`).
    pub quiet_for: Option<Duration>,
}

/// The shortest wait after the death: the slack, one retry period of
/// client-go's defaults (2 s) and a second of rounding.
pub const MIN_RENEWAL_WINDOW: Duration = Duration::from_secs(5);

/// The holder must stay silent for two and a half of its renew periods:
/// one it missed, one more for a renewal attempt that failed (client-go
/// tries again a retry period later, still leading), and half of one for
/// the API server's latency.
const MISSED_PERIODS: (u32, u32) = (5, 2);

/// The share of `leaseDurationSeconds` waited when no renew period was
/// observed: client-go needs lease > renew deadline > 1.2 x retry period,
/// so a holder renews at least every 5/6 of its lease.
const UNOBSERVED_SHARE: (u32, u32) = (5, 6);

/// How long the holder must have been silent since its death before its
/// Lease is released: `max(5 s, 2.5 x the observed renew period)`, or
/// `max(5 s, 5/6 x leaseDurationSeconds)` when no period was observed. A
/// period longer than the lease itself is taken as the lease.
pub fn renewal_window(lock: &LeaseLock, renewals: &Renewals) -> Duration {
    let lease = lock
        .duration
        .and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default();
    let share = |d: Duration, (n, m): (u32, u32)| d.saturating_mul(n) / m;
    let wait = match renewals.period {
        Some(p) if lease.is_zero() => share(p, MISSED_PERIODS),
        Some(p) => share(p.min(lease), MISSED_PERIODS),
        None => share(lease, UNOBSERVED_SHARE),
    };
    wait.max(MIN_RENEWAL_WINDOW)
}

/// Judges a Lease from the pods of its namespace (all of them, or at least
/// every one the identity could name) at `now`, with what the janitor saw
/// of its renewals.
pub fn judge_lease(lock: &LeaseLock, pods: &[Pod], now: Timestamp, renewals: &Renewals) -> Verdict {
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
    // A Lease says who renews it, not who holds it: something else may
    // renew under the same identity (a same-named pod elsewhere, a
    // process outside the cluster). A dead pod's Lease is released only
    // once nothing renewed it after the death for as long as its holder
    // takes to renew (`renewal_window`), by the Lease's times and on the
    // janitor's own clock. Without a death time (a pod refused at
    // admission never ran), that cannot be told: held, and the Lease
    // expires by itself.
    let Some(died) = died_at else {
        return Verdict::Held(HeldBecause::DeathTimeUnknown);
    };
    let Ok(slack) = died.checked_add(RENEW_SLACK) else {
        return Verdict::Held(HeldBecause::DeathTimeUnknown);
    };
    if lock.renewed.is_some_and(|r| r > slack) {
        return Verdict::Held(HeldBecause::RenewedAfterDeath);
    }
    let window = renewal_window(lock, renewals);
    if lock.renewed.is_none() && renewals.quiet_for.is_none() {
        // A record whose renew times are not trusted (no zone), judged by
        // one who did not watch it (`scan`): whether it was renewed after
        // the death cannot be told. Held for a window of watching, as a
        // janitor that starts now would hold it.
        return Verdict::Held(HeldBecause::RenewalWindow { remaining: window });
    }
    let silent_from = lock.renewed.map_or(died, |r| r.max(died));
    let Ok(until) = SignedDuration::try_from(window).and_then(|w| silent_from.checked_add(w))
    else {
        return Verdict::Held(HeldBecause::DeathTimeUnknown);
    };
    let by_times = Duration::try_from(until.duration_since(now)).unwrap_or_default();
    let by_watch = renewals
        .quiet_for
        .map_or(Duration::ZERO, |q| window.saturating_sub(q));
    let remaining = by_times.max(by_watch);
    if !remaining.is_zero() {
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

    type Case = (&'static str, LeaseLock, Vec<Pod>, Verdict);

    /// Who holds it: released or expired, and whether the pod its identity
    /// names is there, alive, and the only one.
    fn holder_cases() -> Vec<Case> {
        let cr = "op-a_0c3e5a12-4b1f-4a2e-9d7c-1f2e3d4c5b6a";
        let long = format!("{}-x7k2p", "o".repeat(60));
        vec![
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
        ]
    }

    /// When its holder died, against the renewals seen.
    fn death_cases() -> Vec<Case> {
        vec![
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
        ]
    }

    #[test]
    fn verdicts() {
        let cases = holder_cases().into_iter().chain(death_cases());
        // A client-go holder renewing every 2 s, watched for 40 s.
        let seen = Renewals {
            period: Some(Duration::from_secs(2)),
            quiet_for: Some(Duration::from_secs(40)),
        };
        for (name, l, pods, want) in cases {
            assert_eq!(judge_lease(&l, &pods, now(), &seen), want, "{name}");
        }
    }

    /// A Lease of `duration` seconds renewed `renewed_ago`, its holder pod
    /// evicted 30 s ago.
    fn dead_holder(duration: i32, renewed_ago: i64, seen: Renewals) -> Verdict {
        let l = LeaseLock {
            duration: Some(SignedDuration::from_secs(i64::from(duration))),
            ..lease(Some("op-a"), renewed_ago)
        };
        judge_lease(
            &l,
            &[pod("op-a", None, "Failed", Some("Evicted"))],
            now(),
            &seen,
        )
    }

    #[test]
    fn the_holder_must_miss_its_own_renewals() {
        let window = |ms: u64| {
            Verdict::Held(HeldBecause::RenewalWindow {
                remaining: Duration::from_millis(ms),
            })
        };
        let watched = |period: Option<u64>, quiet: u64| Renewals {
            period: period.map(Duration::from_secs),
            quiet_for: Some(Duration::from_secs(quiet)),
        };
        // OpenShift's library-go: 137 s lease, renewed every 26 s; last
        // renewal 5 s before the death 30 s ago: 2.5 x 26 s = 65 s after it.
        assert_eq!(dead_holder(137, 35, watched(Some(26), 35)), window(35_000));
        assert_eq!(
            dead_holder(137, 45, watched(Some(12), 45)),
            stale(StaleReason::Evicted),
            "2.5 x 12 s = 30 s after the death"
        );
        // No period observed: 5/6 of the lease (114.166 s) after the death.
        assert_eq!(
            dead_holder(137, 35, watched(None, 35)),
            Verdict::Held(HeldBecause::RenewalWindow {
                remaining: Duration::from_secs(137) * 5 / 6 - Duration::from_secs(30)
            })
        );
        // The janitor's own clock: it has watched only 10 s of silence.
        assert_eq!(dead_holder(137, 45, watched(Some(26), 10)), window(55_000));
        // Never sooner than 5 s, whatever the period.
        assert_eq!(dead_holder(60, 31, watched(Some(1), 2)), window(3_000));
        // A period longer than the lease counts as the lease (25 s).
        assert_eq!(dead_holder(25, 31, watched(Some(600), 40)), window(32_500));
        // Renewed 3 s after the death: something still renews.
        assert_eq!(
            dead_holder(137, 27, watched(Some(26), 0)),
            Verdict::Held(HeldBecause::RenewedAfterDeath)
        );
        // scan watches nothing: the Lease's times alone.
        assert_eq!(
            dead_holder(137, 35, Renewals::default()),
            Verdict::Held(HeldBecause::RenewalWindow {
                remaining: Duration::from_secs(137) * 5 / 6 - Duration::from_secs(30)
            })
        );
    }
}
