//! The second lock kind: a `coordination.k8s.io/v1` Lease, as client-go's
//! leader election writes it. The holder is named by `spec.holderIdentity`:
//! controller-runtime writes `<hostname>_<uuid>`, many client-go users the
//! pod name. A pod's hostname is `spec.hostname`, else its name cut at 63
//! characters (trailing `-` and `.` dropped, as the kubelet does).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::Unmanageable;
use crate::{dns_label, dns_subdomain};

/// How far the janitor's clock may run ahead of a holder's before a Lease
/// it renews looks expired.
const CLOCK_SKEW: SignedDuration = SignedDuration::from_secs(10);

/// The longest hostname (a DNS label).
const HOSTNAME_MAX: usize = 63;

/// A Lease lock as it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseLock {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub created: Option<Timestamp>,
    /// `spec.holderIdentity`; `None` when released (empty or absent).
    pub identity: Option<String>,
    /// The hostname or pod name the identity names.
    pub host: Option<String>,
    /// When the holder last renewed, and for how long a renewal holds.
    pub renewed: Option<Timestamp>,
    pub duration: Option<SignedDuration>,
}

impl LeaseLock {
    /// The generic `Lock` that Events and `reclaim` use: the holder is the
    /// matching pod when there is exactly one, else the identity's host.
    pub fn as_lock(&self, pod: Option<&Pod>) -> super::Lock {
        super::Lock {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            resource_version: self.resource_version.clone(),
            created: self.created,
            holder: super::Holder {
                name: pod
                    .and_then(|p| p.metadata.name.clone())
                    .or_else(|| self.host.clone())
                    .unwrap_or_default(),
                uid: pod.and_then(|p| p.metadata.uid.clone()).unwrap_or_default(),
            },
            deleting: None,
        }
    }

    /// Whether the Lease has run out: its holder did not renew within
    /// `leaseDurationSeconds`, so any candidate may take it now.
    pub fn expired(&self, now: Timestamp) -> bool {
        match (self.renewed, self.duration) {
            // With a margin for the holder's clock running behind the
            // janitor's; a renew time that overflows never expires.
            (Some(renewed), Some(d)) => renewed
                .checked_add(d)
                .and_then(|t| t.checked_add(CLOCK_SKEW))
                .is_ok_and(|until| now > until),
            // client-go takes a Lease without a renew time as expired, but
            // some electors write neither field: without both, nothing
            // proves it ran out (`parse` calls a held one unmanageable).
            _ => false,
        }
    }
}

/// A UUID as `uuid.NewUUID()` prints it: 8-4-4-4-12 hex digits.
fn uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The hostname or pod name a holder identity names, or why it names none.
pub fn host_of(identity: &str) -> Result<String, Unmanageable> {
    // controller-runtime: <hostname>_<uuid>.
    if let Some((host, id)) = identity.rsplit_once('_') {
        if uuid(id) && dns_label(host) {
            return Ok(host.to_owned());
        }
    }
    // client-go with the pod name as identity.
    if dns_subdomain(identity) {
        return Ok(identity.to_owned());
    }
    Err(Unmanageable::IdentityNotAPod(truncate_for_message(
        identity,
    )))
}

fn truncate_for_message(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if s.chars().count() > 80 {
        out.push('…');
    }
    out
}

/// A pod's hostname, as the kubelet sets it.
pub fn hostname(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    if spec.is_some_and(|s| s.host_network == Some(true)) {
        // A host-network pod has its node's hostname (taken as the node's
        // name): every such pod of the node matches it, so a Lease held
        // under it is ambiguous, never released.
        return spec.and_then(|s| s.node_name.clone()).unwrap_or_default();
    }
    if let Some(h) = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
    {
        return h.to_owned();
    }
    host_of_name(&pod.name_any())
}

/// The hostname of a pod without `spec.hostname`: its name, cut at 63
/// characters, without trailing `-` or `.`.
pub fn host_of_name(name: &str) -> String {
    match name.get(..HOSTNAME_MAX) {
        Some(cut) if name.len() > HOSTNAME_MAX => cut.trim_end_matches(['-', '.']).to_owned(),
        _ => name.to_owned(),
    }
}

/// Whether `pod` is a pod the identity's `host` can name: by its name or by
/// its hostname.
pub fn names(host: &str, pod: &Pod) -> bool {
    pod.name_any() == host || hostname(pod) == host
}

/// The namespace of the kubelets' node heartbeats.
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// The label the API server puts on its identity Leases in kube-system.
const APISERVER_IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity";

/// Leases that are not leader locks of an application, whatever their
/// labels say: never written.
fn not_an_application_lock(lease: &Lease) -> Option<Unmanageable> {
    let meta = &lease.metadata;
    let spec = lease.spec.as_ref();
    if spec
        .and_then(|s| s.strategy.as_deref())
        .is_some_and(|s| !s.is_empty())
    {
        // The API server's leader-election controller picks its holder.
        return Some(Unmanageable::CoordinatedLeaderElection);
    }
    match meta.namespace.as_deref() {
        Some(NODE_LEASE_NAMESPACE) => return Some(Unmanageable::NodeHeartbeat),
        Some("kube-system")
            if meta
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(APISERVER_IDENTITY_LABEL))
                || meta
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("apiserver-")) =>
        {
            return Some(Unmanageable::ApiServerIdentity)
        }
        _ => {}
    }
    None
}

/// Whether a Lease is held for life (nais/elector's shape): exactly one v1
/// Pod ownerReference, and neither `renewTime` nor `leaseDurationSeconds`.
/// Its holder never renews it and its candidates only create it (one that
/// finds it there has lost), so a release frees nothing: it is judged like
/// a ConfigMap lock (the owner, by name and uid) and freed by a DELETE with
/// uid and resourceVersion preconditions. A Lease with a `renewTime` is
/// never one.
///
/// Its holder identity must be empty or the owner's own name (nais/elector
/// writes the pod's hostname, its name): a Lease owned by one pod that names
/// another as holder is not judged by its owner (that other pod may run),
/// and stays `NoRenewTime`. The delete guard asks the same.
pub fn held_for_life(lease: &Lease) -> bool {
    let spec = lease.spec.as_ref();
    let owner = match lease.metadata.owner_references.as_deref() {
        Some([one]) => one.name.as_str(),
        _ => return false,
    };
    let identity = spec
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or_default();
    super::looks_like_lock(&lease.metadata)
        && (identity.is_empty() || identity == owner)
        && spec.is_none_or(|s| s.renew_time.is_none() && s.lease_duration_seconds.is_none())
        && not_an_application_lock(lease).is_none()
}

/// Reads a Lease as a lock.
pub fn parse(lease: &Lease) -> Result<LeaseLock, Unmanageable> {
    let meta = &lease.metadata;
    let (namespace, name, uid, resource_version) = super::object_id(meta)?;
    if let Some(why) = not_an_application_lock(lease) {
        return Err(why);
    }
    let spec = lease.spec.as_ref();
    let identity = spec
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|i| !i.is_empty())
        .map(str::to_owned);
    let host = identity.as_deref().map(host_of).transpose()?;
    let renewed = spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0);
    let duration = spec
        .and_then(|s| s.lease_duration_seconds)
        .map(|s| SignedDuration::from_secs(i64::from(s)));
    if identity.is_some() && (renewed.is_none() || duration.is_none()) {
        // Held, but when it runs out and whether it was renewed after a
        // death cannot be told.
        return Err(Unmanageable::NoRenewTime);
    }
    Ok(LeaseLock {
        namespace,
        name,
        uid,
        resource_version,
        created: meta.creation_timestamp.as_ref().map(|t| t.0),
        identity,
        host,
        renewed,
        duration,
    })
}

/// How much of a Lease's annotations (keys and values, in bytes) its watch
/// keeps: a release replaces the Lease whole and must write them back as
/// they were; larger ones are dropped from the watched copy.
const WATCHED_ANNOTATIONS_MAX: usize = 2048;

/// What the Lease watch keeps of a Lease. No managedFields (an update that
/// leaves them out keeps them). Its annotations only when they are small:
/// larger ones are dropped, and the copy is marked as not whole with an
/// empty annotation map (which the API server never sends: it omits an
/// empty one), so that it never becomes the body of a release.
pub fn trim_for_watch(l: &mut Lease) {
    l.metadata.managed_fields = None;
    let size = l.metadata.annotations.as_ref().map_or(0, |a| {
        a.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
    });
    if size > WATCHED_ANNOTATIONS_MAX {
        l.metadata.annotations = Some(Default::default());
    }
}

/// Whether this copy of a Lease holds its metadata whole, as read (a copy
/// `trim_for_watch` dropped annotations from does not).
pub fn is_whole(l: &Lease) -> bool {
    l.metadata
        .annotations
        .as_ref()
        .is_none_or(|a| !a.is_empty())
}

/// The release client-go makes of its own Lease on a clean shutdown
/// (`ReleaseOnCancel`), whole: it rebuilds the spec from a record that
/// keeps only the transitions (`LeaderElectionRecordToLeaseSpec`), so the
/// spec is exactly: no holder, a one-second duration, renew and acquire
/// times now, the transitions kept; `preferredHolder` and `strategy` are
/// gone. Metadata stays as read: the update carries the judged
/// resourceVersion (a change means 409).
///
/// The holder is `""`, as client-go writes it, not left out: fabric8 before
/// 6.x cannot read a Lease without a holder (its record requires one), and
/// its follower would never lead. The Lease kind leaves it out only where
/// the official Java client wrote it (`kinds::lease::held_by_the_java_client`).
/// The times stay: fabric8 cannot read a Lease without them.
pub fn released(mut lease: Lease, now: Timestamp) -> Lease {
    let t = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now);
    let transitions = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0);
    lease.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        acquire_time: Some(t.clone()),
        renew_time: Some(t),
        lease_transitions: Some(transitions),
        preferred_holder: None,
        strategy: None,
    });
    lease
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    #[test]
    fn held_for_life_is_exactly_one_pod_owner_and_never_renewed() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let owner = |kind: &str, api_version: &str| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "op-a".into(),
            uid: "u1".into(),
            ..Default::default()
        };
        let lease = |owners: Vec<OwnerReference>, spec: LeaseSpec| Lease {
            metadata: ObjectMeta {
                namespace: Some("ops".into()),
                name: Some("op-lease".into()),
                owner_references: Some(owners),
                ..Default::default()
            },
            spec: Some(spec),
        };
        let nais = LeaseSpec {
            holder_identity: Some("op-a".into()),
            acquire_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        };
        let pod = || vec![owner("Pod", "v1")];
        assert!(held_for_life(&lease(pod(), nais.clone())));
        assert!(held_for_life(&lease(pod(), LeaseSpec::default())));
        let renewed = LeaseSpec {
            renew_time: Some(MicroTime(Timestamp::now())),
            ..nais.clone()
        };
        assert!(
            !held_for_life(&lease(pod(), renewed)),
            "renewed: never deleted"
        );
        let lasting = LeaseSpec {
            lease_duration_seconds: Some(15),
            ..nais.clone()
        };
        assert!(!held_for_life(&lease(pod(), lasting)));
        assert!(!held_for_life(&lease(vec![], nais.clone())), "no owner");
        let two = vec![owner("Pod", "v1"), owner("Pod", "v1")];
        assert!(!held_for_life(&lease(two, nais.clone())));
        assert!(!held_for_life(&lease(
            vec![owner("ReplicaSet", "apps/v1")],
            nais.clone()
        )));
        assert!(!held_for_life(&lease(
            vec![owner("Pod", "v2")],
            nais.clone()
        )));
        let mut heartbeat = lease(pod(), nais.clone());
        heartbeat.metadata.namespace = Some(NODE_LEASE_NAMESPACE.into());
        assert!(!held_for_life(&heartbeat), "never a node heartbeat");
        let cle = LeaseSpec {
            strategy: Some("OldestEmulationVersion".into()),
            ..nais
        };
        assert!(
            !held_for_life(&lease(pod(), cle)),
            "never one the API server elects"
        );
        let other = LeaseSpec {
            holder_identity: Some("op-b".into()),
            acquire_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        };
        assert!(
            !held_for_life(&lease(pod(), other)),
            "owned by op-a, held by op-b: op-b may run"
        );
    }

    #[test]
    fn the_watch_keeps_small_annotations_and_marks_a_copy_without_large_ones() {
        let with = |annotations: Option<Vec<(&str, String)>>| Lease {
            metadata: ObjectMeta {
                annotations: annotations
                    .map(|a| a.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
                managed_fields: Some(vec![Default::default()]),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut none = with(None);
        trim_for_watch(&mut none);
        assert!(none.metadata.managed_fields.is_none());
        assert!(none.metadata.annotations.is_none() && is_whole(&none));
        let mut small = with(Some(vec![("team", "platform".into())]));
        trim_for_watch(&mut small);
        assert_eq!(
            small.metadata.annotations.as_ref().unwrap()["team"],
            "platform"
        );
        assert!(is_whole(&small));
        let mut large = with(Some(vec![
            ("team", "platform".into()),
            (
                "kubectl.kubernetes.io/last-applied-configuration",
                "x".repeat(4096),
            ),
        ]));
        trim_for_watch(&mut large);
        assert!(!is_whole(&large), "{:?}", large.metadata.annotations);
        // A released copy keeps the mark: it is still not whole.
        assert!(!is_whole(&released(large, Timestamp::now())));
    }

    #[test]
    fn identities() {
        let cr = "operator-7d9c-x2x_0c3e5a12-4b1f-4a2e-9d7c-1f2e3d4c5b6a";
        assert_eq!(host_of(cr).unwrap(), "operator-7d9c-x2x");
        assert_eq!(host_of("operator-7d9c-x2x").unwrap(), "operator-7d9c-x2x");
        assert_eq!(host_of("web-0.web.ns").unwrap(), "web-0.web.ns");
        // An underscore without a UUID after it is not controller-runtime's.
        assert!(host_of("my_operator").is_err());
        for bad in [
            "10.0.0.1:8080",
            "Operator-A",
            "ns/pod",
            "-x",
            "a_b_c",
            &"x".repeat(254),
        ] {
            assert!(
                matches!(host_of(bad), Err(Unmanageable::IdentityNotAPod(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn hostnames_are_cut_at_63() {
        let long = format!("{}-{}", "a".repeat(62), "b".repeat(10));
        assert_eq!(host_of_name(&long), "a".repeat(62));
        assert_eq!(host_of_name("short"), "short");
    }

    #[test]
    fn expiry() {
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let mut l = LeaseLock {
            namespace: "ns".into(),
            name: "l".into(),
            uid: "u".into(),
            resource_version: "1".into(),
            created: None,
            identity: Some("p".into()),
            host: Some("p".into()),
            renewed: Some(now - SignedDuration::from_secs(10)),
            duration: Some(SignedDuration::from_secs(15)),
        };
        assert!(!l.expired(now));
        l.duration = Some(SignedDuration::from_secs(5));
        // 10 s ago + 5 s, within the 10 s margin for clock skew.
        assert!(!l.expired(now));
        l.renewed = Some(now - SignedDuration::from_secs(16));
        assert!(l.expired(now));
        l.renewed = Some(Timestamp::MAX);
        assert!(!l.expired(now), "an overflowing renew time never expires");
        l.renewed = None;
        assert!(!l.expired(now), "no renew time: never expired");
    }

    fn lease(ns: &str, name: &str, spec: LeaseSpec) -> Lease {
        Lease {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: Some("u".into()),
                resource_version: Some("1".into()),
                ..Default::default()
            },
            spec: Some(spec),
        }
    }

    fn held(identity: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(identity.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..Default::default()
        }
    }

    #[test]
    fn leases_that_are_not_application_locks() {
        let cle = LeaseSpec {
            strategy: Some("OldestEmulationVersion".into()),
            ..held("kube-controller-manager-0")
        };
        assert_eq!(
            parse(&lease("kube-system", "kube-controller-manager", cle)),
            Err(Unmanageable::CoordinatedLeaderElection)
        );
        assert_eq!(
            parse(&lease("kube-node-lease", "node-a", held("node-a"))),
            Err(Unmanageable::NodeHeartbeat)
        );
        assert_eq!(
            parse(&lease(
                "kube-system",
                "apiserver-x7k2",
                held("apiserver-x7k2_uid")
            )),
            Err(Unmanageable::ApiServerIdentity)
        );
        let mut identity = lease("kube-system", "kube-apiserver-a", held("a"));
        identity.metadata.labels = Some(
            [(
                APISERVER_IDENTITY_LABEL.to_string(),
                "kube-apiserver".to_string(),
            )]
            .into_iter()
            .collect(),
        );
        assert_eq!(parse(&identity), Err(Unmanageable::ApiServerIdentity));
        // An operator's own Lease in kube-system is a lock.
        assert!(parse(&lease("kube-system", "my-operator", held("op-a"))).is_ok());
        for spec in [
            LeaseSpec {
                renew_time: None,
                ..held("op-a")
            },
            LeaseSpec {
                lease_duration_seconds: None,
                ..held("op-a")
            },
        ] {
            assert_eq!(
                parse(&lease("ops", "op", spec)),
                Err(Unmanageable::NoRenewTime)
            );
        }
        // Released without times: free, nothing to judge.
        let free = parse(&lease("ops", "op", LeaseSpec::default())).unwrap();
        assert_eq!(free.host, None);
    }

    #[test]
    fn a_release_rebuilds_the_spec_as_client_go_does() {
        let now = Timestamp::now();
        let before = LeaseSpec {
            preferred_holder: Some("op-b".into()),
            lease_transitions: Some(4),
            acquire_time: Some(MicroTime(now - SignedDuration::from_secs(60))),
            ..held("op-a")
        };
        let mut l = lease("ops", "op", before);
        l.metadata.labels = Some([("k".to_string(), "v".to_string())].into_iter().collect());
        let out = released(l.clone(), now);
        assert_eq!(out.metadata, l.metadata, "metadata as read");
        assert_eq!(
            out.spec,
            Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(4),
                preferred_holder: None,
                strategy: None,
            })
        );
    }
}
