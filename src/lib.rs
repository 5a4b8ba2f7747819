//! lock-janitor: deletes leader-for-life locks whose holder pod can no longer
//! run, so that a waiting replica takes over. See docs/design.md for the contract.
#![forbid(unsafe_code)]

// One module a concern; dependencies run one way (top to bottom here):
// commands and the controller use observe/reclaim/takeover, which use
// memory/events/optin, which use verdict/lock/selector/metrics.
pub mod auto_opt_in;
pub mod cli;
pub mod client;
pub mod cmd;
pub mod controller;
pub mod decide;
pub mod election;
pub mod events;
#[cfg(test)]
mod fixtures;
pub mod http;
pub mod index;
pub mod kinds;
pub mod lock;
pub mod metrics;
pub mod observe;
pub mod optin;
pub mod preflight;
pub mod readiness;
pub mod reclaim;
pub mod selector;
pub mod shared;
pub mod streams;
pub mod sweep;
pub mod takeover;
pub mod verdict;
pub mod words;

use std::future::Future;
use std::time::Duration;

/// The field manager and Event reporter name.
pub const NAME: &str = "lock-janitor";
/// The default opt-in label selector.
pub const DEFAULT_SELECTOR: &str = "lock-janitor.io/watch=true";
/// Pods that can no longer run. A pod entering this set (Running -> Failed)
/// arrives at a watch as a new object; pods that never hold a lock are never
/// cached.
pub const TERMINAL_PODS: &str = "status.phase!=Pending,status.phase!=Running,status.phase!=Unknown";
/// Every API call the janitor makes is bounded by this.
pub const API_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action}: no answer within {after:?}")]
    Timeout { action: String, after: Duration },
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("the API server runs Kubernetes {found}; lock-janitor supports Kubernetes 1.{oldest} and later (docs/compatibility.md)")]
    Unsupported { found: String, oldest: u32 },
    /// Every scope refused its list or watch at start-up (one refused
    /// scope among others is served around, and retried).
    #[error("every scope refused the janitor's list or watch ({scopes}): does RBAC grant list and watch on configmaps, leases and pods there, and do the namespaces exist? The first answer: {answer}")]
    Refused { scopes: String, answer: String },
}

/// The bounded values of `lock_janitor_reconcile_errors_total{error}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// 403 from the API server: RBAC does not grant what the janitor needs.
    Forbidden,
    /// Any other API error (5xx, 429, 400, transport).
    Api,
    Timeout,
    /// An Event could not be written (the reclaim itself went through).
    Event,
    /// kube-runtime's Controller reported a failure of its own (its queue
    /// or a trigger), outside any reconcile.
    Controller,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 5] = [
        ErrorKind::Forbidden,
        ErrorKind::Api,
        ErrorKind::Timeout,
        ErrorKind::Event,
        ErrorKind::Controller,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Api => "api",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Event => "event",
            ErrorKind::Controller => "controller",
        }
    }
}

impl Error {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Kube {
                source: kube::Error::Api(status),
                ..
            } if status.code == 403 => ErrorKind::Forbidden,
            Error::Refused { .. } => ErrorKind::Forbidden,
            Error::Kube { .. } | Error::Metrics(_) | Error::Unsupported { .. } => ErrorKind::Api,
            Error::Timeout { .. } => ErrorKind::Timeout,
        }
    }
}

/// One scope a namespace, each once and in order; `[None]` (the whole
/// cluster) when none is named.
pub fn scopes(namespaces: &[String]) -> Vec<Option<String>> {
    let mut scopes: Vec<Option<String>> = namespaces.iter().cloned().map(Some).collect();
    scopes.sort();
    scopes.dedup();
    if scopes.is_empty() {
        scopes.push(None);
    }
    scopes
}

/// A mutex's guard, also after a panic while it was held: what it guards
/// is plain state, whole at every step.
pub(crate) fn locked<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The HTTP status of an API error, if the server answered.
pub fn api_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

/// An `Api` for one namespace, or for all of them.
pub fn scoped<K>(client: &kube::Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    }
}

/// An error and its causes, once each: kube's errors already print their
/// source, so a cause that the previous message contains is left out.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut last = out.clone();
    let mut src = e.source();
    while let Some(cause) = src {
        let msg = cause.to_string();
        if !last.contains(&msg) {
            out.push_str(": ");
            out.push_str(&msg);
        }
        last = msg;
        src = cause.source();
    }
    out
}

/// Runs one API call with the janitor's timeout, naming it in any error.
pub async fn call<T>(
    action: impl Into<String>,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(API_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(Error::Kube {
            action: action.into(),
            source,
        }),
        Err(_) => Err(Error::Timeout {
            action: action.into(),
            after: API_TIMEOUT,
        }),
    }
}

/// Is `s` a DNS-1123 label (a namespace, a hostname): lower-case
/// alphanumerics and `-`, starting and ending with an alphanumeric, at
/// most 63 characters?
pub fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Is `s` a DNS-1123 subdomain, as Kubernetes checks an object name such
/// as a pod's: at most 253 characters, labels of lower-case alphanumerics
/// and `-` joined by `.`, each starting and ending with an alphanumeric
/// (a label inside a name may be longer than 63).
pub fn dns_subdomain(s: &str) -> bool {
    let part = |l: &str| {
        let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        let b = l.as_bytes();
        !b.is_empty()
            && alnum(b[0])
            && alnum(b[b.len() - 1])
            && b.iter().all(|&c| alnum(c) || c == b'-')
    };
    !s.is_empty() && s.len() <= 253 && s.split('.').all(part)
}

/// Every object `api` lists, whole, in pages of 500 (`what` names the list
/// in errors).
pub async fn list_all<K>(api: &kube::Api<K>, what: &str) -> Result<Vec<K>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let all = kube::api::ListParams::default();
    let list = |lp: kube::api::ListParams| async move { api.list(&lp).await };
    for_each_page(what, &all, 500, list, |page| match page {
        Paged::Items(items) => out.extend(items),
        Paged::StartOver => out.clear(),
    })
    .await?;
    Ok(out)
}

/// What a paged list hands on: a page, or word that the list starts over
/// from its first page (what was handed before is handed again).
pub enum Paged<T> {
    Items(Vec<T>),
    StartOver,
}

/// How often a list starts over after its continue token expired.
const START_OVER_AT_MOST: u32 = 3;

/// The one pager: lists in pages of `limit` through `list` (given each
/// page's parameters, as `Api::list` or `Api::list_metadata` take them:
/// `params`' selectors, the pager's limit and continue token), handing each
/// page to `each` and keeping none: memory holds one page at a time. A
/// continue token expires (410 Gone) when paging outlasts etcd's
/// compaction: the list starts over, at most 3 times. Returns the requests
/// made.
pub async fn for_each_page<T, F>(
    what: &str,
    params: &kube::api::ListParams,
    limit: u32,
    list: impl Fn(kube::api::ListParams) -> F,
    mut each: impl FnMut(Paged<T>),
) -> Result<usize, Error>
where
    T: Clone,
    F: Future<Output = kube::Result<kube::core::ObjectList<T>>>,
{
    let mut token: Option<String> = None;
    let (mut requests, mut restarts) = (0, 0);
    loop {
        let mut lp = params.clone().limit(limit);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        requests += 1;
        let page = match call(what.to_owned(), list(lp)).await {
            Ok(page) => page,
            Err(Error::Kube {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 410 && token.is_some() && restarts < START_OVER_AT_MOST => {
                restarts += 1;
                tracing::debug!(%what, "continue token expired; listing again");
                token = None;
                each(Paged::StartOver);
                continue;
            }
            Err(e) => return Err(e),
        };
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        each(Paged::Items(page.items));
        if token.is_none() {
            return Ok(requests);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn scopes_are_each_namespace_once_in_order_or_the_whole_cluster() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(super::scopes(&[]), vec![None]);
        assert_eq!(
            super::scopes(&names(&["b", "a", "b"])),
            vec![Some("a".to_string()), Some("b".to_string())]
        );
    }
}
