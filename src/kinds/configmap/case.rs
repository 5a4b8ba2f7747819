//! A ConfigMap held for life in the shared freeing-write tests
//! (`fixtures::Case`): ops/op-lock, owned by op-1, deleted with the uid and
//! resourceVersion judged as preconditions.

use crate::fixtures::{cm_lock, to_json, Case, DeletedCase};
use crate::lock::LockKind;

pub static CASES: [&dyn Case; 1] = [&DeletedCase {
    name: "configmap held for life",
    resource: LockKind::ConfigMap,
    object: "op-lock",
    live: || to_json(&cm_lock()),
}];
