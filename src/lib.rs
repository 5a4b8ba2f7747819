//! lock-janitor: deletes leader-for-life locks whose holder pod can no longer
//! run, so that a waiting replica takes over. See DESIGN.md for the contract.
#![forbid(unsafe_code)]

pub mod cli;
pub mod controller;
pub mod http;
pub mod lock;
pub mod metrics;
pub mod reclaim;
pub mod scan;
pub mod selector;
pub mod verdict;

use std::future::Future;
use std::time::Duration;

/// The field manager and Event reporter name.
pub const NAME: &str = "lock-janitor";
/// The default opt-in label selector.
pub const DEFAULT_SELECTOR: &str = "lock-janitor.io/watch=true";
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
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 4] = [
        ErrorKind::Forbidden,
        ErrorKind::Api,
        ErrorKind::Timeout,
        ErrorKind::Event,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::Api => "api",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Event => "event",
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
            Error::Kube { .. } | Error::Metrics(_) => ErrorKind::Api,
            Error::Timeout { .. } => ErrorKind::Timeout,
        }
    }
}

/// The HTTP status of an API error, if the server answered.
pub fn api_code(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
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
