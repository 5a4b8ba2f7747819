//! A Lease held for life in the shared freeing-write tests
//! (`fixtures::Case`): ops/op-lease, owned by op-1 and never renewed,
//! deleted with the uid and resourceVersion judged as preconditions.

use serde_json::Value;

use crate::fixtures::{guarded_delete, lease_for_life, to_json, Case, Expect};
use crate::lock::LockKey;

pub struct LeaseForLifeCase;

pub static CASES: [&dyn Case; 1] = [&LeaseForLifeCase];

impl Case for LeaseForLifeCase {
    fn name(&self) -> &'static str {
        "lease held for life"
    }

    fn key(&self) -> LockKey {
        LockKey::lease("ops", "op-lease")
    }

    fn live(&self) -> Value {
        to_json(&lease_for_life())
    }

    fn freeing_write(&self, uid: &str, resource_version: &str) -> Expect {
        guarded_delete(&self.key(), uid, resource_version)
    }

    fn after_write(&self, _resource_version: &str) -> Option<Value> {
        None
    }
}
