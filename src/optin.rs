//! The opt-in label: whether a lock-shaped ConfigMap gets it, and the one
//! guarded write that adds it. Shared by `lock-janitor label` and the label
//! carry-over after a takeover.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::Api;

use crate::lock::looks_like_lock;
use crate::{api_code, call, Error};

/// What to do with one lock-shaped ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Add `key=value`.
    Add,
    /// It already has `key=value`.
    Unchanged,
    /// It has `key` with another value (a deliberate opt-out?): never overwritten.
    Conflicting(String),
}

/// Decides what to do with a ConfigMap; `None`: not a candidate, never touched.
pub fn plan_label(meta: &ObjectMeta, key: &str, value: &str) -> Option<Plan> {
    looks_like_lock(meta).then(|| plan_for(meta, key, value))
}

/// What to do with an object already known to be a lock candidate.
pub fn plan_for(meta: &ObjectMeta, key: &str, value: &str) -> Plan {
    match meta.labels.as_ref().and_then(|l| l.get(key)) {
        Some(v) if v == value => Plan::Unchanged,
        Some(v) => Plan::Conflicting(v.clone()),
        None => Plan::Add,
    }
}

/// The merge patch: the label, and the resourceVersion that was read, which
/// makes the patch conditional (409 if the ConfigMap changed since).
pub fn label_patch(meta: &ObjectMeta, key: &str, value: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "resourceVersion": meta.resource_version,
            "labels": { key: value },
        }
    })
}

/// The result of one label write.
#[derive(Debug)]
pub enum Written {
    Labeled,
    /// 404: deleted since it was read.
    Gone,
    /// 409: changed since it was read; nothing was overwritten.
    Conflict,
    Failed(Error),
}

/// Adds `key=value` to the lock (a ConfigMap or a Lease) read as `meta`,
/// guarded by its resourceVersion, as field manager `lock-janitor`.
pub async fn write_label<K>(api: &Api<K>, meta: &ObjectMeta, key: &str, value: &str) -> Written
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let ns = meta.namespace.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    if meta.resource_version.as_deref().is_none_or(str::is_empty) {
        // Without it the patch would be unconditional: read it again.
        return Written::Conflict;
    }
    let pp = PatchParams {
        field_manager: Some(crate::NAME.to_owned()),
        ..Default::default()
    };
    let patch = Patch::Merge(label_patch(meta, key, value));
    match call(
        format!("labeling {} {ns}/{name}", K::kind(&()).to_lowercase()),
        api.patch_metadata(name, &pp, &patch),
    )
    .await
    {
        Ok(_) => Written::Labeled,
        Err(Error::Kube { source, .. }) if api_code(&source) == Some(404) => Written::Gone,
        Err(Error::Kube { source, .. }) if api_code(&source) == Some(409) => Written::Conflict,
        Err(e) => Written::Failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{lock_meta, pod_owner};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn label_plans() {
        let k = "lock-janitor.io/watch";
        let m = lock_meta(vec![pod_owner("op-1", "u")], &[]);
        assert_eq!(plan_label(&m, k, "true"), Some(Plan::Add));
        let m = lock_meta(vec![pod_owner("op-1", "u")], &[(k, "true")]);
        assert_eq!(plan_label(&m, k, "true"), Some(Plan::Unchanged));
        let m = lock_meta(vec![pod_owner("op-1", "u")], &[(k, "false")]);
        assert_eq!(
            plan_label(&m, k, "true"),
            Some(Plan::Conflicting("false".into()))
        );
        let two = lock_meta(vec![pod_owner("a", "1"), pod_owner("b", "2")], &[]);
        assert_eq!(plan_label(&two, k, "true"), None);
        let deploy = lock_meta(
            vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                ..pod_owner("d", "1")
            }],
            &[],
        );
        assert_eq!(plan_label(&deploy, k, "true"), None);
        assert_eq!(plan_label(&lock_meta(vec![], &[]), k, "true"), None);
    }

    fn answer(code: u16) -> serde_json::Value {
        match code {
            200 => serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "op-lock", "namespace": "ops", "resourceVersion": "8",
                             "labels": {"lock-janitor.io/watch": "true"}}}),
            409 => crate::fixtures::status(409, "Conflict"),
            404 => crate::fixtures::status(404, "NotFound"),
            _ => crate::fixtures::status(code, "Forbidden"),
        }
    }

    /// The label write's branches, against a scripted API server: the one
    /// request is a merge patch of the label and the resourceVersion read,
    /// as field manager lock-janitor; 200 labeled, 404 gone, 409 conflict
    /// (nothing overwritten), 403 a failure the caller reports.
    #[tokio::test]
    async fn the_label_write_answers_200_404_409_and_403() {
        use crate::fixtures::{scripted, Exchange};
        use k8s_openapi::api::core::v1::ConfigMap;
        let meta = lock_meta(vec![pod_owner("op-1", "u")], &[]);
        let path = "/api/v1/namespaces/ops/configmaps/op-lock?";
        for code in [200, 404, 409, 403] {
            let (client, received) =
                scripted(vec![Exchange::new("PATCH", path, code, answer(code))]);
            let api: Api<ConfigMap> = Api::namespaced(client, "ops");
            let written = write_label(&api, &meta, "lock-janitor.io/watch", "true").await;
            match (code, &written) {
                (200, Written::Labeled) | (404, Written::Gone) | (409, Written::Conflict) => {}
                (403, Written::Failed(e)) => assert_eq!(e.kind(), crate::ErrorKind::Forbidden),
                _ => panic!("{code}: {written:?}"),
            }
            let received = received.lock().unwrap().clone();
            assert_eq!(received.len(), 1, "{code}: {received:?}");
            let (method, uri, body) = &received[0];
            assert_eq!(method, "PATCH");
            assert!(uri.contains("fieldManager=lock-janitor"), "{uri}");
            assert_eq!(
                body,
                &serde_json::json!({"metadata": {"resourceVersion": "7",
                    "labels": {"lock-janitor.io/watch": "true"}}})
            );
        }
        // Without a resourceVersion the patch would be unconditional: not sent.
        let (client, received) = scripted(vec![]);
        let api: Api<ConfigMap> = Api::namespaced(client, "ops");
        let mut bare = meta.clone();
        bare.resource_version = None;
        assert!(matches!(
            write_label(&api, &bare, "lock-janitor.io/watch", "true").await,
            Written::Conflict
        ));
        assert!(received.lock().unwrap().is_empty());
    }
}
