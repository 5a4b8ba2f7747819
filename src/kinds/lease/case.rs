//! A renewed Lease in the shared freeing-write tests (`fixtures::Case`):
//! ops/op-lease as client-go renews it, released by a PUT of the whole
//! Lease read, with its uid and resourceVersion.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};

use crate::fixtures::{path_of, renewed_lease, to_json, Answer, Case, Expect};
use crate::lock::LockKey;

pub struct RenewedLeaseCase;

impl Case for RenewedLeaseCase {
    fn name(&self) -> &'static str {
        "renewed lease"
    }

    fn key(&self) -> LockKey {
        LockKey::lease("ops", "op-lease")
    }

    fn live(&self) -> Value {
        to_json(&renewed_lease(SignedDuration::from_secs(570)))
    }

    /// The Lease as read with its uid and resourceVersion, its holder
    /// emptied, a one-second lease, its transitions kept, and the rest of
    /// the object as read (its annotations too).
    fn freeing_write(&self, uid: &str, resource_version: &str) -> Expect {
        Expect::put(&path_of(&self.key()))
            .with("/metadata/uid", json!(uid))
            .with("/metadata/resourceVersion", json!(resource_version))
            .with("/spec/holderIdentity", json!(""))
            .with("/spec/leaseDurationSeconds", json!(1))
            .with("/spec/leaseTransitions", json!(3))
            .with("/metadata/annotations/team", json!("ops"))
            .answer(Answer::Echo)
    }

    fn after_write(&self, resource_version: &str) -> Option<Value> {
        let mut live = self.live();
        live["metadata"]["resourceVersion"] = json!(resource_version);
        let lease = serde_json::from_value(live).unwrap();
        Some(to_json(&crate::lock::lease::released(
            lease,
            Timestamp::now(),
        )))
    }
}
