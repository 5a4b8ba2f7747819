//! Property tests of the parsers and the verdict (proptest: structured
//! inputs, shrinking, and a fixed seed so that `make test` runs the same
//! cases every time; PROPTEST_CASES=100000 for a long run). Whatever the
//! input: no panic, and nothing that is not a lock-shaped, opted-in lock
//! with a provably dead holder is ever judged stale.
//!
//! proptest rather than cargo fuzz: the inputs are structured objects
//! (owner references, pod statuses), which proptest generates directly;
//! cargo fuzz needs a nightly toolchain and a byte-level decoder.

use std::collections::BTreeMap;

// The crate under its own name: these tests began as an end-to-end suite.
use crate as lock_janitor;

use k8s_openapi::api::core::v1::{
    ConfigMap, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use lock_janitor::cli::Cli;
use lock_janitor::lock::{self, Unmanageable};
use lock_janitor::selector::Selector;
use lock_janitor::verdict::{self, HolderSeen, Policy, Verdict};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};

fn config() -> Config {
    Config {
        rng_seed: RngSeed::Fixed(20261201),
        ..Config::default()
    }
}

/// Short strings that are often the interesting ones.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("v1".to_string()),
        Just("Pod".to_string()),
        Just("pod".to_string()),
        Just("apps/v1".to_string()),
        Just("op-1".to_string()),
        Just("pod-uid".to_string()),
        "[a-zA-Z0-9/._-]{0,12}",
        "\\PC{0,8}",
    ]
}

fn owner() -> impl Strategy<Value = OwnerReference> {
    (word(), word(), word(), word()).prop_map(|(api_version, kind, name, uid)| OwnerReference {
        api_version,
        kind,
        name,
        uid,
        ..Default::default()
    })
}

fn configmap() -> impl Strategy<Value = ConfigMap> {
    (
        proptest::option::of(word()),
        proptest::option::of(word()),
        proptest::option::of(word()),
        proptest::option::of(proptest::collection::vec(owner(), 0..4)),
        proptest::option::of(proptest::collection::btree_map(word(), word(), 0..3)),
        any::<bool>(),
    )
        .prop_map(|(name, uid, rv, owners, data, deleting)| ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ops".into()),
                name,
                uid,
                resource_version: rv,
                owner_references: owners,
                deletion_timestamp: deleting.then(|| Time("2026-01-01T00:00:00Z".parse().unwrap())),
                ..Default::default()
            },
            data,
            ..Default::default()
        })
}

fn container(running: bool) -> ContainerStatus {
    ContainerStatus {
        name: "c".into(),
        state: Some(if running {
            ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }
        } else {
            ContainerState {
                terminated: Some(ContainerStateTerminated::default()),
                ..Default::default()
            }
        }),
        ..Default::default()
    }
}

fn pod() -> impl Strategy<Value = Pod> {
    (
        prop_oneof![
            Just(None),
            Just(Some("Running".to_string())),
            Just(Some("Pending".to_string())),
            Just(Some("Unknown".to_string())),
            Just(Some("Failed".to_string())),
            Just(Some("Succeeded".to_string())),
            proptest::option::of(word()),
        ],
        proptest::option::of(word()),
        proptest::collection::vec(any::<bool>(), 0..3),
        prop_oneof![Just("pod-uid".to_string()), word()],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(phase, reason, containers, uid, has_status, deleting)| Pod {
                metadata: ObjectMeta {
                    name: Some("op-1".into()),
                    uid: Some(uid),
                    deletion_timestamp: deleting
                        .then(|| Time("2026-01-01T00:00:00Z".parse().unwrap())),
                    ..Default::default()
                },
                spec: None,
                status: has_status.then(|| PodStatus {
                    phase,
                    reason,
                    container_statuses: Some(containers.into_iter().map(container).collect()),
                    ..Default::default()
                }),
            },
        )
}

proptest! {
    #![proptest_config(config())]

    /// Parsing never panics, and a lock that parses is exactly what
    /// docs/design.md calls a leader-for-life lock: one v1 Pod owner with a name
    /// and uid, and (read whole) no data.
    #[test]
    fn a_parsed_lock_is_lock_shaped(cm in configmap()) {
        let holds_data = lock::holds_data(&cm);
        match lock::parse_shaped(&cm.metadata, holds_data) {
            Ok(l) => {
                let owners = cm.metadata.owner_references.as_deref().unwrap_or_default();
                prop_assert_eq!(owners.len(), 1);
                prop_assert_eq!(owners[0].kind.as_str(), "Pod");
                prop_assert_eq!(owners[0].api_version.as_str(), "v1");
                prop_assert!(!l.holder.name.is_empty() && !l.holder.uid.is_empty());
                prop_assert!(lock::lock_shaped(&cm));
            }
            Err(why) => {
                prop_assert!(!why.to_string().is_empty());
                if holds_data && lock::parse(&cm.metadata).is_ok() {
                    prop_assert_eq!(why, Unmanageable::HoldsData);
                }
            }
        }
    }

    /// Stale only on proof of death: the pod with the lock's uid, terminal,
    /// no container running; never for a live phase, a terminating pod that
    /// is not terminal, another uid, or no status.
    #[test]
    fn stale_only_on_proof_of_death(p in pod()) {
        let meta = ObjectMeta {
            namespace: Some("ops".into()),
            name: Some("op-lock".into()),
            uid: Some("cm-uid".into()),
            resource_version: Some("1".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: "op-1".into(),
                uid: "pod-uid".into(),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let l = lock::parse(&meta).unwrap();
        let policy = Policy { owner_gone_grace: std::time::Duration::ZERO };
        let v = verdict::judge(&l, HolderSeen::Pod(&p), &policy);
        if let Verdict::Stale { .. } = v {
            let st = p.status.as_ref().unwrap();
            prop_assert_eq!(p.metadata.uid.as_deref(), Some("pod-uid"));
            prop_assert!(matches!(st.phase.as_deref(), Some("Failed" | "Succeeded")));
            let running = st.container_statuses.iter().flatten()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
            prop_assert!(!running);
        }
    }

    /// Any selector text: no panic; one `run` accepts selects only
    /// ConfigMaps that carry its opt-in label value, never one without it.
    #[test]
    fn run_selectors_stay_opt_in(text in "[a-z.!=,/ -]{0,24}", key in "[a-z]{1,3}", value in "[a-z]{0,3}") {
        if let Ok(sel) = Selector::parse(&text) {
            if sel.require_opt_in().is_ok() {
                prop_assert!(!sel.matches(None), "{text} selects an unlabeled ConfigMap");
                let labels: BTreeMap<String, String> = [(key, value)].into();
                if sel.matches(Some(&labels)) {
                    // The one label given must be an equality term of the selector.
                    prop_assert!(text.contains('='));
                }
            }
        }
    }

    /// Any flag value: a usage error (exit 2) or a value, never a panic;
    /// accepted durations are at least a second and at most a day.
    #[test]
    fn durations_parse_or_refuse(d in "\\PC{0,12}") {
        let r = Cli::try_parse_checked(["lock-janitor", "run", "--owner-gone-grace", d.as_str()]);
        match r {
            Ok(cli) => {
                let lock_janitor::cli::Command::Run(a) = cli.command else { unreachable!() };
                prop_assert!(a.owner_gone_grace <= std::time::Duration::from_secs(86400));
                prop_assert!(a.owner_gone_grace >= std::time::Duration::from_secs(1));
            }
            Err(e) => prop_assert_eq!(e.exit_code(), 2),
        }
    }

    /// Any holder identity: a host that is a pod name (a DNS subdomain, a
    /// DNS label when it came from `<hostname>_<uuid>`), or unmanageable;
    /// never a panic. A Lease whose identity names no pod is never stale.
    #[test]
    fn lease_identities_name_a_pod_or_nothing(
        id in prop_oneof![
            "\\PC{0,80}",
            "[a-z0-9.-]{1,70}(_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})?",
        ],
        phase in prop_oneof![Just("Failed"), Just("Running"), Just("Succeeded")],
    ) {
        use lock_janitor::lock::lease;
        match lease::host_of(&id) {
            Ok(host) => {
                prop_assert!(lock_janitor::dns_subdomain(&host), "{host:?}");
                prop_assert!(id == host || (id.starts_with(&host) && id.len() == host.len() + 37));
            }
            Err(why) => prop_assert!(matches!(why, Unmanageable::IdentityNotAPod(_))),
        }
        let l = k8s_openapi::api::coordination::v1::Lease {
            metadata: ObjectMeta {
                name: Some("l".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some(id.clone()),
                lease_duration_seconds: Some(3600),
                renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(60),
                )),
                ..Default::default()
            }),
        };
        if let Ok(parsed) = lease::parse(&l) {
            // A dead pod whose name is not the identity's host never
            // makes the Lease stale.
            let mut p = Pod {
                metadata: ObjectMeta {
                    name: Some("zz-not-it".into()),
                    ..Default::default()
                },
                status: Some(PodStatus {
                    phase: Some(phase.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            };
            if parsed.host.as_deref() == Some("zz-not-it") {
                p.metadata.name = Some("zz-other".into());
            }
            let v = verdict::judge_lease(
                &parsed,
                &[p],
                k8s_openapi::jiff::Timestamp::now(),
                &lock_janitor::verdict::Renewals::default(),
            );
            prop_assert!(!matches!(v, Verdict::Stale { .. }), "{v:?}");
        }
    }
}
