//! A renewed Lease in the shared freeing-write tests (`fixtures::Case`):
//! ops/op-lease, released by a PUT of the whole Lease read, with its uid
//! and resourceVersion. Two forms of the release: client-go's empty holder,
//! and no holder at all for a Lease only the official Java client wrote.

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};

use crate::fixtures::{path_of, renewed_lease, to_json, Answer, Case, Expect};
use crate::lock::LockKey;

pub struct RenewedLeaseCase {
    name: &'static str,
    /// Its spec written by the official Java client alone (its
    /// managedFields say so), the janitor's label beside it.
    java: bool,
}

pub static CASES: [&dyn Case; 2] = [
    &RenewedLeaseCase {
        name: "renewed lease",
        java: false,
    },
    &RenewedLeaseCase {
        name: "renewed lease the Java client wrote",
        java: true,
    },
];

impl Case for RenewedLeaseCase {
    fn name(&self) -> &'static str {
        self.name
    }

    fn key(&self) -> LockKey {
        LockKey::lease("ops", "op-lease")
    }

    /// As client-go renews it; or with the managedFields of a Lease the
    /// Java client wrote, as the API server keeps them.
    fn live(&self) -> Value {
        let mut live = to_json(&renewed_lease(SignedDuration::from_secs(570)));
        if self.java {
            live["metadata"]["managedFields"] = json!([
                {"manager": "Kubernetes Java Client", "operation": "Update",
                 "apiVersion": "coordination.k8s.io/v1", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:holderIdentity": {}, "f:leaseDurationSeconds": {},
                              "f:renewTime": {}, "f:acquireTime": {}, "f:leaseTransitions": {}}}},
                {"manager": "lock-janitor", "operation": "Update",
                 "apiVersion": "coordination.k8s.io/v1", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {"f:lock-janitor.io/watch": {}}}}},
            ]);
        }
        live
    }

    /// The Lease as read with its uid and resourceVersion, its holder
    /// emptied (or, the Java client's, left out), a one-second lease, its
    /// transitions kept, and the rest of the object as read (its
    /// annotations too).
    fn freeing_write(&self, uid: &str, resource_version: &str) -> Expect {
        let put = Expect::put(&path_of(&self.key()))
            .with("/metadata/uid", json!(uid))
            .with("/metadata/resourceVersion", json!(resource_version))
            .with("/spec/leaseDurationSeconds", json!(1))
            .with("/spec/leaseTransitions", json!(3))
            .with("/metadata/annotations/team", json!("ops"));
        match self.java {
            false => put.with("/spec/holderIdentity", json!("")),
            true => put.without("/spec/holderIdentity"),
        }
        .answer(Answer::Echo)
    }

    fn after_write(&self, resource_version: &str) -> Option<Value> {
        let mut live = self.live();
        live["metadata"]["resourceVersion"] = json!(resource_version);
        let lease = serde_json::from_value(live).unwrap();
        let mut freed = to_json(&crate::lock::lease::released(lease, Timestamp::now()));
        if self.java {
            freed["spec"]
                .as_object_mut()
                .unwrap()
                .remove("holderIdentity");
        }
        Some(freed)
    }
}
