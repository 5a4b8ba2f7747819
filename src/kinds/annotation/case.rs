//! A ConfigMap's leader record in the shared freeing-write tests
//! (`fixtures::Case`): ops/op-record, whose record names op-1, released by
//! a merge patch of that one annotation carrying the resourceVersion read.
//! Two dialects, each with its release written out: client-go's record
//! (also the Java and Python clients'), and fabric8's.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};

use super::record::{self, ANNOTATION};
use crate::fixtures::{labels, lock_meta, path_of, to_json, Answer, Case, Expect, HOLDER};
use crate::lock::LockKey;

/// One dialect of the record: as its client writes it when renewed at
/// `renewed`, and as the janitor must release it.
pub struct RecordCase {
    name: &'static str,
    written: fn(renewed: &str) -> String,
    released: fn(renewed: &str) -> String,
}

pub static CASES: [&dyn Case; 2] = [&CLIENT_GO, &FABRIC8];

/// client-go's ConfigMapLock (and the Java and Python clients'): released
/// with the holder null, one second, the rest as written.
static CLIENT_GO: RecordCase = RecordCase {
    name: "leader record",
    written: |t| {
        format!(
            r#"{{"holderIdentity":"{HOLDER}","leaseDurationSeconds":600,"acquireTime":"2026-01-01T00:00:00Z","renewTime":"{t}","leaderTransitions":3}}"#
        )
    },
    released: |t| {
        format!(
            r#"{{"holderIdentity":null,"leaseDurationSeconds":1,"acquireTime":"2026-01-01T00:00:00Z","renewTime":"{t}","leaderTransitions":3}}"#
        )
    },
};

/// fabric8's: an ISO 8601 `leaseDuration`; released with an empty holder
/// and no `leaseDurationSeconds` (a field its reader refuses).
static FABRIC8: RecordCase = RecordCase {
    name: "fabric8 leader record",
    written: |t| {
        format!(
            r#"{{"holderIdentity":"{HOLDER}","leaseDuration":"PT10M","acquireTime":"2026-01-01T00:00:00.000000Z","renewTime":"{t}","leaderTransitions":3}}"#
        )
    },
    released: |t| {
        format!(
            r#"{{"holderIdentity":"","leaseDuration":"PT10M","acquireTime":"2026-01-01T00:00:00.000000Z","renewTime":"{t}","leaderTransitions":3}}"#
        )
    },
};

impl Case for RecordCase {
    fn name(&self) -> &'static str {
        self.name
    }

    fn key(&self) -> LockKey {
        LockKey::configmap("ops", "op-record")
    }

    fn live(&self) -> Value {
        to_json(&record_lock((self.written)(&renewed())))
    }

    /// The annotation alone, to the released record; the resourceVersion
    /// read makes the patch conditional (409 if it changed since).
    fn freeing_write(&self, _uid: &str, resource_version: &str) -> Expect {
        let released = (self.released)(&renewed());
        Expect::patch(&path_of(&self.key()))
            .with("/metadata/resourceVersion", json!(resource_version))
            .with("/metadata/annotations", json!({ ANNOTATION: released }))
            .answer(Answer::Echo)
    }

    fn after_write(&self, resource_version: &str) -> Option<Value> {
        let mut cm = self.live();
        cm["metadata"]["resourceVersion"] = json!(resource_version);
        cm["metadata"]["annotations"][ANNOTATION] = json!((self.released)(&renewed()));
        Some(cm)
    }
}

/// When the record was last renewed: 570 s before the test process's first
/// call, the same at every call (a test expects its release exactly),
/// within its 600 s lease and past 5/6 of it.
fn renewed() -> String {
    static BASE: std::sync::OnceLock<Timestamp> = std::sync::OnceLock::new();
    (*BASE.get_or_init(Timestamp::now) - SignedDuration::from_secs(570)).to_string()
}

/// ConfigMap ops/op-record (uid `record-uid`), opted in, with this leader
/// record; no owner, no data, one other annotation.
fn record_lock(record: String) -> ConfigMap {
    let mut meta = lock_meta(vec![], &[("lock-janitor.io/watch", "true")]);
    meta.name = Some("op-record".into());
    meta.uid = Some("record-uid".into());
    meta.owner_references = None;
    meta.annotations = Some(labels(&[("team", "ops"), (ANNOTATION, &record)]));
    ConfigMap {
        metadata: meta,
        ..Default::default()
    }
}

/// Each release written out here is the janitor's own and one the delete
/// guard admits for the record it releases.
#[test]
fn each_release_is_the_janitors_and_the_guards() {
    for case in [&CLIENT_GO, &FABRIC8] {
        let (written, released) = ((case.written)(&renewed()), (case.released)(&renewed()));
        assert_eq!(
            record::released(&written).unwrap(),
            released,
            "{}",
            case.name
        );
        assert!(record::is_release_of(&written, &released), "{}", case.name);
    }
}
