//! A namespace with a node, pods and Lease locks, for the Lease tests.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::time::{Duration, Instant};

use lock_janitor_testenv::audit::AuditEvent;
use lock_janitor_testenv::{fresh_namespace, kubelet, shared, ControlPlane};

use super::*;

pub struct Scenario {
    pub cp: &'static ControlPlane,
    pub client: Client,
    pub ns: String,
    pub node: String,
}

pub async fn scenario(prefix: &str) -> Scenario {
    let cp = shared().await;
    let client = cp.client().await.expect("admin client");
    grant_janitor(&client).await;
    let ns = fresh_namespace(&client, prefix).await;
    let node = format!("node-{ns}");
    kubelet::create_node(&client, &node).await.expect("node");
    Scenario {
        cp,
        client,
        ns,
        node,
    }
}

impl Scenario {
    pub async fn janitor(&self) -> Janitor {
        self.janitor_resyncing("2s").await
    }

    /// A janitor for this namespace's Leases, sweeping every `resync`.
    pub async fn janitor_resyncing(&self, resync: &str) -> Janitor {
        let kc = kubeconfig_as(self.cp, JANITOR_USER);
        Janitor::start(
            &kc,
            &[
                "--namespace",
                &self.ns,
                "--resync",
                resync,
                "--lock-kinds",
                "lease",
            ],
        )
        .await
    }

    pub async fn pod(&self, name: &str) -> Pod {
        running_pod(&self.client, &self.ns, name, &self.node).await
    }

    pub fn leases(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A Lease as client-go writes it, renewed `renewed_ago` ago, for an hour.
    pub async fn lease(
        &self,
        name: &str,
        identity: &str,
        renewed_ago: i64,
        labeled: bool,
    ) -> Lease {
        self.lease_lasting(name, identity, renewed_ago, 3600, labeled)
            .await
    }

    /// A Lease as client-go writes it, renewed `renewed_ago` ago, lasting
    /// `secs`. With no renewal observed, a dead holder's Lease is released
    /// half of that after the death (at least 5 s).
    pub async fn lease_lasting(
        &self,
        name: &str,
        identity: &str,
        renewed_ago: i64,
        secs: i32,
        labeled: bool,
    ) -> Lease {
        let labels = labeled.then(|| {
            [(WATCH_LABEL.0.to_string(), WATCH_LABEL.1.to_string())]
                .into_iter()
                .collect()
        });
        let at = MicroTime(Timestamp::now() - SignedDuration::from_secs(renewed_ago));
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels,
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.into()),
                lease_duration_seconds: Some(secs),
                acquire_time: Some(at.clone()),
                renew_time: Some(at),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        self.leases()
            .create(&PostParams::default(), &lease)
            .await
            .expect("create lease")
    }

    pub async fn label(&self, lease: &str) {
        let patch = serde_json::json!({"metadata": {"labels": {WATCH_LABEL.0: WATCH_LABEL.1}}});
        self.leases()
            .patch(lease, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("opt the lease in");
    }

    pub async fn identity(&self, lease: &str) -> String {
        self.leases()
            .get(lease)
            .await
            .expect("get lease")
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default()
    }

    /// The janitor's writes to Leases in this namespace.
    pub fn lease_writes(&self) -> Vec<AuditEvent> {
        lock_janitor_testenv::audit::read(self.cp.audit_log_path())
            .into_iter()
            .filter(|e| {
                self.janitors(e, "leases") && !matches!(e.verb.as_str(), "get" | "list" | "watch")
            })
            .collect()
    }

    /// Is this the janitor's request about `resource` in this namespace?
    pub fn janitors(&self, e: &AuditEvent, resource: &str) -> bool {
        e.effective_user() == JANITOR_USER
            && e.namespace.as_deref() == Some(self.ns.as_str())
            && e.resource.as_deref() == Some(resource)
    }

    /// How many of the janitor's requests `audit` holds with this verb
    /// about `resource` in this namespace.
    pub fn janitor_requests(&self, audit: &[AuditEvent], verb: &str, resource: &str) -> usize {
        audit
            .iter()
            .filter(|e| self.janitors(e, resource) && e.verb == verb)
            .count()
    }

    pub async fn renew_time(&self, lease: &str) -> Option<Timestamp> {
        self.leases()
            .get(lease)
            .await
            .ok()?
            .spec?
            .renew_time
            .map(|t| t.0)
    }

    /// Waits until the Lease has been renewed `n` more times (up to a retry
    /// period each); the last renew time seen.
    pub async fn renewed_times(&self, lease: &str, n: usize, timeout: Duration) -> Timestamp {
        let mut seen = self.renew_time(lease).await;
        let mut count = 0;
        let deadline = Instant::now() + timeout;
        loop {
            let now = self.renew_time(lease).await;
            if now != seen {
                seen = now;
                count += 1;
                if count >= n {
                    return seen.expect("renewed");
                }
            }
            assert!(
                Instant::now() < deadline,
                "{lease} renewed {count} of {n} times within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
