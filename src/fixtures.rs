//! Test fixtures shared by the unit tests: lock-shaped metadata, the
//! objects a reclaim reads, and a mocked API server behind `kube::Client`
//! that expects each request in order and answers it (as kube-rs's
//! controller-rs does in its `fixtures.rs`, with tower's own mock).

use std::collections::BTreeMap;
use std::fmt;

use http::{Method, Request, Response};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};

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

// --- the objects a reclaim reads ---------------------------------------------

/// The holder every lock below names: pod ops/op-1, uid `pod-uid`.
pub const HOLDER: &str = "op-1";
pub const HOLDER_UID: &str = "pod-uid";

/// ConfigMap ops/op-lock, opted in, held for life by op-1 (resourceVersion 7).
pub fn cm_lock() -> ConfigMap {
    ConfigMap {
        metadata: lock_meta(
            vec![pod_owner(HOLDER, HOLDER_UID)],
            &[("lock-janitor.io/watch", "true")],
        ),
        ..Default::default()
    }
}

/// Lease ops/op-lease held for life by op-1 (nais/elector's shape: one Pod
/// owner, no renewTime nor leaseDurationSeconds), resourceVersion 7.
pub fn lease_for_life() -> Lease {
    let mut meta = lock_meta(
        vec![pod_owner(HOLDER, HOLDER_UID)],
        &[("lock-janitor.io/watch", "true")],
    );
    meta.name = Some("op-lease".into());
    meta.uid = Some("lease-uid".into());
    Lease {
        metadata: meta,
        spec: Some(LeaseSpec {
            holder_identity: Some(HOLDER.into()),
            ..Default::default()
        }),
    }
}

/// Lease ops/op-lease as client-go renews it, held by op-1: renewed
/// `renewed_ago` before now, 600 s lease, 3 transitions, resourceVersion 7.
pub fn renewed_lease(renewed_ago: SignedDuration) -> Lease {
    let mut meta = lock_meta(vec![], &[("lock-janitor.io/watch", "true")]);
    meta.name = Some("op-lease".into());
    meta.uid = Some("lease-uid".into());
    meta.owner_references = None;
    meta.annotations = Some(labels(&[("team", "ops")]));
    let renewed = MicroTime(Timestamp::now() - renewed_ago);
    Lease {
        metadata: meta,
        spec: Some(LeaseSpec {
            holder_identity: Some(HOLDER.into()),
            lease_duration_seconds: Some(600),
            acquire_time: Some(MicroTime("2026-01-01T00:00:00Z".parse().unwrap())),
            renew_time: Some(renewed),
            lease_transitions: Some(3),
            ..Default::default()
        }),
    }
}

/// Pod ops/op-1 (uid `pod-uid`) in `phase` (with `reason`), its container
/// terminated `died_ago` before now when the phase is terminal, running
/// otherwise.
pub fn holder_pod(phase: &str, reason: Option<&str>, died_ago: SignedDuration) -> Pod {
    let terminal = matches!(phase, "Failed" | "Succeeded");
    let state = if terminal {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                finished_at: Some(Time(ago(died_ago))),
                ..Default::default()
            }),
            ..Default::default()
        }
    } else {
        ContainerState {
            running: Some(Default::default()),
            ..Default::default()
        }
    };
    Pod {
        metadata: ObjectMeta {
            namespace: Some("ops".into()),
            name: Some(HOLDER.into()),
            uid: Some(HOLDER_UID.into()),
            resource_version: Some("40".into()),
            ..Default::default()
        },
        spec: None,
        status: Some(PodStatus {
            phase: Some(phase.into()),
            reason: reason.map(Into::into),
            container_statuses: Some(vec![ContainerStatus {
                name: "operator".into(),
                state: Some(state),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// Now less `d`, in whole seconds (as a `Time` is written and read back).
pub fn ago(d: SignedDuration) -> Timestamp {
    Timestamp::from_second(Timestamp::now().as_second() - d.as_secs()).unwrap()
}

/// An evicted holder, dead for 560 s.
pub fn evicted_pod() -> Pod {
    holder_pod("Failed", Some("Evicted"), SignedDuration::from_secs(560))
}

/// Any object as the API server sends it.
pub fn to_json(o: &impl serde::Serialize) -> Value {
    serde_json::to_value(o).unwrap()
}

/// A list of `kind` (`PodList`, ...) as the API server sends it.
pub fn list_of(kind: &str, items: Vec<Value>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"resourceVersion": "50"},
        "items": items,
    })
}

// --- a mocked API server -------------------------------------------------------

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A `kube::Client` whose every request goes to `ApiServer::expect`.
pub fn mock_client() -> (Client, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), handle)
}

/// How the mock API server answers one request.
#[derive(Clone, Debug)]
pub enum Answer {
    /// 200 with this object.
    Ok(Value),
    /// 200 with the request's own body (an Event created, a Lease replaced).
    Echo,
    /// A `Status` failure with this code (404 NotFound, 409 Conflict, ...).
    Status(u16),
    /// No answer ever: the client's own timeout (`API_TIMEOUT`) runs out.
    Hang,
    /// The connection breaks before an answer comes: a transport error. For
    /// a write, the server may have made it (the answer lost after it).
    Broken,
}

/// One request the mock API server expects next, and its answer.
#[derive(Clone)]
pub struct Expect {
    method: Method,
    path: String,
    /// Pieces (`key=value`) the query must hold.
    query: Vec<String>,
    /// JSON pointers into the body and the values they must have.
    body: Vec<(String, Value)>,
    answer: Answer,
}

impl fmt::Debug for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if !self.query.is_empty() {
            write!(f, "?{}", self.query.join("&"))?;
        }
        for (p, v) in &self.body {
            write!(f, " {p}={v}")?;
        }
        write!(f, " -> {:?}", self.answer)
    }
}

impl Expect {
    fn new(method: Method, path: &str) -> Self {
        Expect {
            method,
            path: path.into(),
            query: vec![],
            body: vec![],
            answer: Answer::Status(500),
        }
    }
    pub fn get(path: &str) -> Self {
        Self::new(Method::GET, path)
    }
    pub fn post(path: &str) -> Self {
        Self::new(Method::POST, path)
    }
    pub fn put(path: &str) -> Self {
        Self::new(Method::PUT, path)
    }
    pub fn delete(path: &str) -> Self {
        Self::new(Method::DELETE, path)
    }
    pub fn patch(path: &str) -> Self {
        Self::new(Method::PATCH, path)
    }
    /// The query must hold `piece` (`key=value`, URL-encoded as sent).
    pub fn query(mut self, piece: &str) -> Self {
        self.query.push(piece.into());
        self
    }
    /// The body's value at the JSON `pointer` must be `value`.
    pub fn with(mut self, pointer: &str, value: Value) -> Self {
        self.body.push((pointer.into(), value));
        self
    }
    pub fn answer(mut self, answer: Answer) -> Self {
        self.answer = answer;
        self
    }
    /// Answered 200 with `object`.
    pub fn ok(self, object: &impl serde::Serialize) -> Self {
        self.answer(Answer::Ok(to_json(object)))
    }
    pub fn status(self, code: u16) -> Self {
        self.answer(Answer::Status(code))
    }
    /// An Event of `reason` about the lock, in its namespace, created.
    pub fn event(namespace: &str, reason: &str) -> Self {
        Self::post(&format!(
            "/apis/events.k8s.io/v1/namespaces/{namespace}/events"
        ))
        .with("/reason", json!(reason))
        .answer(Answer::Echo)
    }
}

/// A request as the mock API server received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: String,
    /// `Null` when the request had none.
    pub body: Value,
}

/// The mock API server: it expects `script`'s requests in that order and
/// answers each; a request out of order, or one more, fails the test (at
/// `finish`), as does an expected one that never came.
pub struct ApiServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Vec<Seen>>,
}

impl ApiServer {
    /// A client, and the server answering it from `script`.
    pub fn start(script: Vec<Expect>) -> (Client, ApiServer) {
        let (client, handle) = mock_client();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(serve(handle, script, stopped));
        let server = ApiServer {
            stop: Some(stop),
            task,
        };
        (client, server)
    }

    /// Every request of the script came, in order, and no other: what was
    /// received. Call it once the code under test is done.
    pub async fn finish(mut self) -> Vec<Seen> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(seen) => seen,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("the mock API server: {e}"),
        }
    }
}

async fn serve(
    mut handle: Handle,
    script: Vec<Expect>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) -> Vec<Seen> {
    let mut seen: Vec<Seen> = vec![];
    // Requests left unanswered (`Answer::Hang`), held until the end.
    let mut hanging = vec![];
    let expected = format!("{script:#?}");
    for (i, want) in script.into_iter().enumerate() {
        let next = tokio::select! {
            biased;
            next = handle.next_request() => next,
            _ = &mut stopped => None,
        };
        let Some((request, send)) = next else {
            panic!(
                "request {i} never came: expected {want:?}\nreceived: {:#?}\nthe script: {expected}",
                brief(&seen)
            );
        };
        let got = received(request).await;
        let line = format!("{} {}?{}", got.method, got.path, got.query);
        assert!(
            got.method == want.method && got.path == want.path,
            "request {i}: expected {want:?}, received {line}\nbefore it: {:#?}\nthe script: {expected}",
            brief(&seen)
        );
        for piece in &want.query {
            assert!(
                got.query.split('&').any(|q| q == piece),
                "request {i} ({line}): its query lacks {piece}"
            );
        }
        for (pointer, value) in &want.body {
            assert_eq!(
                got.body.pointer(pointer),
                Some(value),
                "request {i} ({line}): its body at {pointer}; the body: {}",
                got.body
            );
        }
        let ok = |v: &Value| Response::new(Body::from(serde_json::to_vec(v).unwrap()));
        match want.answer {
            Answer::Ok(v) => send.send_response(ok(&v)),
            Answer::Echo => send.send_response(ok(&got.body)),
            Answer::Status(code) => send.send_response(status(code)),
            Answer::Hang => hanging.push(send),
            Answer::Broken => send.send_error("connection reset by peer"),
        }
        seen.push(got);
    }
    let extra = tokio::select! {
        biased;
        next = handle.next_request() => next,
        _ = &mut stopped => None,
    };
    if let Some((request, _)) = extra {
        let got = received(request).await;
        panic!(
            "a request after the script: {} {}?{} {}\nthe script: {expected}",
            got.method, got.path, got.query, got.body
        );
    }
    drop(hanging);
    seen
}

fn brief(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .map(|s| format!("{} {}?{}", s.method, s.path, s.query))
        .collect()
}

async fn received(request: Request<Body>) -> Seen {
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    Seen {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or_default().to_owned(),
        body: if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        },
    }
}

/// A `Status` failure as the API server sends it.
fn status(code: u16) -> Response<Body> {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        403 => "Forbidden",
        _ => "InternalError",
    };
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("the mock API server answers {code}"),
        "reason": reason,
        "code": code,
    });
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap()
}
