//! A Lease held for life in the shared freeing-write tests
//! (`fixtures::Case`): ops/op-lease, owned by op-1 and never renewed,
//! deleted with the uid and resourceVersion judged as preconditions.

use crate::fixtures::{lease_for_life, to_json, Case, DeletedCase};
use crate::lock::LockKind;

pub static CASES: [&dyn Case; 1] = [&DeletedCase {
    name: "lease held for life",
    resource: LockKind::Lease,
    object: "op-lease",
    live: || to_json(&lease_for_life()),
}];
