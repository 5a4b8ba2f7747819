//! Test fixtures shared by the unit tests: lock-shaped metadata; the objects
//! a reclaim reads and a mocked API server behind `kube::Client` (`api`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};

mod api;
mod case;
pub use api::*;
pub use case::*;

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A v1 Pod ownerReference.
pub fn pod_owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.into(),
        uid: uid.into(),
        ..Default::default()
    }
}

/// The metadata of ConfigMap ops/op-lock with these owners and labels.
pub fn lock_meta(owners: Vec<OwnerReference>, lbl: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        namespace: Some("ops".into()),
        name: Some("op-lock".into()),
        uid: Some("cm-uid".into()),
        resource_version: Some("7".into()),
        creation_timestamp: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
        owner_references: Some(owners),
        labels: Some(labels(lbl)),
        ..Default::default()
    }
}

/// One request a scripted API server expects, and its answer.
pub struct Exchange {
    pub method: &'static str,
    /// The request's path and query start with this.
    pub path: String,
    pub code: u16,
    pub body: serde_json::Value,
}

impl Exchange {
    pub fn new(method: &'static str, path: &str, code: u16, body: serde_json::Value) -> Self {
        Exchange {
            method,
            path: path.to_owned(),
            code,
            body,
        }
    }
}

/// A Kubernetes `Status` of a failure, as the API server answers one.
pub fn status(code: u16, reason: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": format!("{reason} (scripted)"), "reason": reason, "code": code,
    })
}

/// What a scripted API server received: method, path and query, JSON body.
pub type Received = std::sync::Arc<std::sync::Mutex<Vec<(String, String, serde_json::Value)>>>;

/// A client whose API server answers `script` in order, in-process (the
/// kube-rs controller's `ApiServerVerifier`, without a mock crate): a
/// request that is not the next one expected is answered 599 and recorded,
/// so the test sees it.
pub fn scripted(script: Vec<Exchange>) -> (kube::Client, Received) {
    let script = std::sync::Arc::new(std::sync::Mutex::new(
        script
            .into_iter()
            .collect::<std::collections::VecDeque<_>>(),
    ));
    let received: Received = Default::default();
    let seen = received.clone();
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (script, seen) = (script.clone(), seen.clone());
        async move {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            let method = parts.method.to_string();
            let uri = parts
                .uri
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            seen.lock()
                .unwrap()
                .push((method.clone(), uri.clone(), json));
            let next = script.lock().unwrap().pop_front();
            let (code, body) = match next {
                Some(e) if e.method == method && uri.starts_with(&e.path) => (e.code, e.body),
                _ => (599, status(599, "Unexpected")),
            };
            let resp = http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap();
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    (kube::Client::new(svc, "default"), received)
}
