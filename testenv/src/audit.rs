//! Reading the kube-apiserver audit log (JSON lines, `audit.k8s.io/v1` events).

use std::path::Path;

use serde_json::Value;

/// The fields of an audit event that tests look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`, ...
    pub verb: String,
    /// `user.username`: the authenticated user (the impersonator when impersonating).
    pub user: String,
    /// `objectRef.resource` (e.g. `configmaps`, `pods`).
    pub resource: Option<String>,
    /// `objectRef.subresource` (e.g. `status`).
    pub subresource: Option<String>,
    /// `objectRef.apiGroup` (empty/None for core).
    pub api_group: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// `responseStatus.code`.
    pub code: Option<u16>,
    /// `RequestReceived`, `ResponseStarted`, `ResponseComplete`, `Panic`.
    pub stage: String,
    pub request_uri: String,
    /// `impersonatedUser.username`, when the request was impersonated.
    pub impersonated_user: Option<String>,
    /// `auditID`.
    pub audit_id: String,
    /// `userAgent`.
    pub user_agent: Option<String>,
    /// `requestReceivedTimestamp` (RFC 3339, microseconds).
    pub received: Option<String>,
    /// `stageTimestamp` (RFC 3339, microseconds): for `ResponseComplete`,
    /// when the API server finished the answer.
    pub completed: Option<String>,
    /// `requestObject`: the body, logged for Lease updates and deletes and
    /// for pod status writes (a release's fields and a delete's
    /// preconditions are checked against it).
    pub request_object: Option<Value>,
    /// `responseObject`: the object as the write left it, logged for pod
    /// status writes only. The kubelet writes status as a strategic merge
    /// patch (only what changed), so what a pod's status said after a write
    /// is read here, not in the request.
    pub response_object: Option<Value>,
}

impl AuditEvent {
    /// The user the request acted as: the impersonated user if any, else the authenticated one.
    pub fn effective_user(&self) -> &str {
        self.impersonated_user.as_deref().unwrap_or(&self.user)
    }

    /// `requestReceivedTimestamp` as a time; `None` if absent or not one.
    pub fn received_at(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.received.as_deref()?.parse().ok()
    }

    /// `stageTimestamp` as a time; `None` if absent or not one.
    pub fn completed_at(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.completed.as_deref()?.parse().ok()
    }

    /// Parses one line of the log; `None` if it is not an audit event.
    pub fn parse(line: &str) -> Option<AuditEvent> {
        let v: Value = serde_json::from_str(line).ok()?;
        let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
        Some(AuditEvent {
            verb: s("/verb")?,
            user: s("/user/username").unwrap_or_default(),
            resource: s("/objectRef/resource"),
            subresource: s("/objectRef/subresource"),
            api_group: s("/objectRef/apiGroup"),
            namespace: s("/objectRef/namespace"),
            name: s("/objectRef/name"),
            code: v
                .pointer("/responseStatus/code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok()),
            stage: s("/stage").unwrap_or_default(),
            request_uri: s("/requestURI").unwrap_or_default(),
            impersonated_user: s("/impersonatedUser/username"),
            audit_id: s("/auditID").unwrap_or_default(),
            user_agent: s("/userAgent"),
            received: s("/requestReceivedTimestamp"),
            completed: s("/stageTimestamp"),
            request_object: v.pointer("/requestObject").cloned(),
            response_object: v.pointer("/responseObject").cloned(),
        })
    }
}

/// Reads all events of an audit log. A missing file reads as empty; lines that
/// do not parse (e.g. a line being written) are skipped.
pub fn read(path: &Path) -> Vec<AuditEvent> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(AuditEvent::parse)
        .collect()
}

/// The audit policy given to kube-apiserver: writes (and reads of the
/// resources the janitor cares about) at Metadata level, other reads dropped.
pub(crate) const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  # Health checks, discovery and OpenAPI: noise.
  - level: None
    nonResourceURLs: ["/healthz*", "/readyz*", "/livez*", "/version", "/openapi/*", "/api", "/api/*", "/apis", "/apis/*", "/metrics"]
  # Reads of the objects the janitor works with: kept (tests check live GETs).
  - level: Metadata
    verbs: ["get", "list", "watch"]
    resources:
      - group: ""
        resources: ["configmaps", "pods", "pods/status", "nodes", "events"]
      - group: "coordination.k8s.io"
        resources: ["leases"]
      - group: "events.k8s.io"
        resources: ["events"]
  # Lease updates and deletes with their body: what a release writes, and
  # the preconditions a delete carries, are checked.
  - level: Request
    verbs: ["update", "delete"]
    resources:
      - group: "coordination.k8s.io"
        resources: ["leases"]
  # Pod status writes with their body and the pod they left: when the
  # kubelet first wrote a terminal phase, and what its containers said
  # then, is checked (the body is a patch; the response is the whole pod).
  - level: RequestResponse
    verbs: ["update", "patch"]
    resources:
      - group: ""
        resources: ["pods/status"]
  # Other reads: dropped to keep the log small.
  - level: None
    verbs: ["get", "list", "watch"]
  # Every write (create, update, patch, delete, deletecollection, ...).
  - level: Metadata
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_an_event() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/ns/configmaps/lock","verb":"delete","user":{"username":"lock-janitor-admin","groups":["system:masters","system:authenticated"]},"impersonatedUser":{"username":"system:serviceaccount:ns:sa"},"objectRef":{"resource":"configmaps","namespace":"ns","name":"lock","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":409}}"#;
        let e = AuditEvent::parse(line).unwrap();
        assert_eq!(e.verb, "delete");
        assert_eq!(e.user, "lock-janitor-admin");
        assert_eq!(e.resource.as_deref(), Some("configmaps"));
        assert_eq!(e.namespace.as_deref(), Some("ns"));
        assert_eq!(e.name.as_deref(), Some("lock"));
        assert_eq!(e.code, Some(409));
        assert_eq!(e.stage, "ResponseComplete");
        assert_eq!(e.effective_user(), "system:serviceaccount:ns:sa");
        assert!(AuditEvent::parse("not json").is_none());
    }
}
