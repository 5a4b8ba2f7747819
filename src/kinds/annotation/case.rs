//! A ConfigMap's leader record in the shared freeing-write tests
//! (`fixtures::Case`): ops/op-record, whose record names op-1, released by
//! a merge patch of that one annotation carrying the resourceVersion read.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{json, Value};

use super::record::{self, ANNOTATION};
use crate::fixtures::{labels, lock_meta, path_of, to_json, Answer, Case, Expect, HOLDER};
use crate::lock::LockKey;

pub struct RecordCase;

impl Case for RecordCase {
    fn name(&self) -> &'static str {
        "leader record"
    }

    fn key(&self) -> LockKey {
        LockKey::configmap("ops", "op-record")
    }

    fn live(&self) -> Value {
        to_json(&record_lock(SignedDuration::from_secs(570)))
    }

    /// The annotation alone, to the released record; the resourceVersion
    /// read makes the patch conditional (409 if it changed since).
    fn freeing_write(&self, _uid: &str, resource_version: &str) -> Expect {
        Expect::patch(&path_of(&self.key()))
            .with("/metadata/resourceVersion", json!(resource_version))
            .with("/metadata/annotations", json!({ ANNOTATION: released() }))
            .answer(Answer::Echo)
    }

    fn after_write(&self, resource_version: &str) -> Option<Value> {
        let mut cm = self.live();
        cm["metadata"]["resourceVersion"] = json!(resource_version);
        cm["metadata"]["annotations"][ANNOTATION] = json!(released());
        Some(cm)
    }
}

/// The record of `live`, released.
fn released() -> String {
    let live = RecordCase.live();
    let judged = live["metadata"]["annotations"][ANNOTATION]
        .as_str()
        .unwrap();
    record::released(judged).unwrap()
}

/// ConfigMap ops/op-record (uid `record-uid`), opted in, whose leader
/// record annotation (as client-go's ConfigMapLock writes it) names op-1,
/// last renewed `renewed_ago` before the test process's first call (the
/// same record at every call: a test expects its release exactly), with a
/// 600 s lease; no owner, no data, one other annotation.
pub fn record_lock(renewed_ago: SignedDuration) -> ConfigMap {
    static BASE: std::sync::OnceLock<Timestamp> = std::sync::OnceLock::new();
    let mut meta = lock_meta(vec![], &[("lock-janitor.io/watch", "true")]);
    meta.name = Some("op-record".into());
    meta.uid = Some("record-uid".into());
    meta.owner_references = None;
    let renewed = *BASE.get_or_init(Timestamp::now) - renewed_ago;
    let record = format!(
        r#"{{"holderIdentity":"{HOLDER}","leaseDurationSeconds":600,"acquireTime":"2026-01-01T00:00:00Z","renewTime":"{renewed}","leaderTransitions":3}}"#
    );
    meta.annotations = Some(labels(&[("team", "ops"), (ANNOTATION, &record)]));
    ConfigMap {
        metadata: meta,
        ..Default::default()
    }
}
