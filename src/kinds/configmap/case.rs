//! A ConfigMap held for life in the shared freeing-write tests
//! (`fixtures::Case`): ops/op-lock, owned by op-1, deleted with the uid and
//! resourceVersion judged as preconditions.

use serde_json::Value;

use crate::fixtures::{cm_lock, guarded_delete, to_json, Case, Expect};
use crate::lock::LockKey;

pub struct ConfigMapLockCase;

pub static CASES: [&dyn Case; 1] = [&ConfigMapLockCase];

impl Case for ConfigMapLockCase {
    fn name(&self) -> &'static str {
        "configmap held for life"
    }

    fn key(&self) -> LockKey {
        LockKey::configmap("ops", "op-lock")
    }

    fn live(&self) -> Value {
        to_json(&cm_lock())
    }

    fn freeing_write(&self, uid: &str, resource_version: &str) -> Expect {
        guarded_delete(&self.key(), uid, resource_version)
    }

    fn after_write(&self, _resource_version: &str) -> Option<Value> {
        None
    }
}
