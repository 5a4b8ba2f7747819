//! The start-up permission check: before any watch starts, the selector is
//! accepted and the janitor may list and watch locks and terminal pods in
//! each scope. A clear answer at start-up beats a watcher that lists once
//! (and looks synced) and then retries a forbidden watch forever. A scope
//! that refuses (403, or 404) is left out and said; the controller retries
//! it (`controller::run`). Only when every scope refuses does start-up fail.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client};

use crate::lock::LockKind;
use crate::selector::Selector;
use crate::{api_code, call, scoped, Error, TERMINAL_PODS};

/// Scopes checked at once: each check waits up to a second on its watch.
const CONCURRENCY: usize = 32;

/// The oldest Kubernetes minor (1.x) the janitor supports: the oldest one
/// its compatibility suite passes on (docs/compatibility.md).
pub const OLDEST_MINOR: u32 = 31;

/// The minor of a server's `/version` (`minor` may carry a `+`, as managed
/// services write it); `None` when it does not say one of 1.x.
pub fn minor_of(info: &k8s_openapi::apimachinery::pkg::version::Info) -> Option<u32> {
    if info.major.trim_end_matches('+') != "1" {
        return None;
    }
    let digits: String = info
        .minor
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// A scope that refused its list or watch: a 403 (no RoleBinding there,
/// or the namespace does not exist, which deletes the chart's Role in it)
/// or a 404.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The namespace, or None for the whole cluster.
    pub scope: Option<String>,
    /// What it may not do, as `verb resource`: "list configmaps".
    pub denied: Vec<String>,
    /// The first refusal as the API server worded it ("listing configmaps
    /// in b: ... forbidden ...").
    pub answer: String,
}

impl Refusal {
    /// The scope as `lock_janitor_scope_ready` labels it.
    pub fn scope_label(&self) -> &str {
        self.scope.as_deref().unwrap_or_default()
    }
    /// "list configmaps, watch pods".
    pub fn missing(&self) -> String {
        self.denied.join(", ")
    }
}

/// Checks the API server's version first: one older than `OLDEST_MINOR`
/// is refused with a clear error (what the janitor relies on, the Table
/// of ConfigMaps, ValidatingAdmissionPolicy v1 and the rest, is proven from
/// 1.31 on); one that does not say which minor it is gets a WARN line and
/// the start goes on. Then every scope (`namespaces` empty: the whole
/// cluster), 32 at a time, with the control client (outside the API budget:
/// it runs once). Returns the scopes that refused; an error when every one
/// did, or on any other failure (the API server unreachable, a 5xx, a bad
/// selector).
pub async fn preflight(
    client: &Client,
    selector: &Selector,
    namespaces: &[String],
    kinds: &[LockKind],
) -> Result<Vec<Refusal>, Error> {
    let info = call(
        "reading the API server's version",
        client.apiserver_version(),
    )
    .await?;
    match minor_of(&info) {
        Some(minor) if minor < OLDEST_MINOR => {
            return Err(Error::Unsupported {
                oldest: OLDEST_MINOR,
                found: info.git_version,
            })
        }
        Some(_) => {}
        None => {
            tracing::warn!(version = %info.git_version, major = %info.major, minor = %info.minor,
            "the API server does not say which Kubernetes 1.x minor it runs; going on")
        }
    }
    let scopes = crate::scopes(namespaces);
    let mut refused: Vec<Refusal> = futures::stream::iter(&scopes)
        .map(|ns| check_scope(client, selector, ns.as_deref(), kinds))
        .buffer_unordered(CONCURRENCY)
        .try_filter_map(|r| futures::future::ready(Ok(r)))
        .try_collect()
        .await?;
    refused.sort_by(|a, b| a.scope.cmp(&b.scope));
    if refused.len() == scopes.len() {
        let each: Vec<String> = refused
            .iter()
            .map(|r| {
                format!(
                    "{}: {}",
                    crate::readiness::scope_text(r.scope_label()),
                    r.missing()
                )
            })
            .collect();
        return Err(Error::Refused {
            scopes: each.join("; "),
            answer: refused[0].answer.clone(),
        });
    }
    Ok(refused)
}

/// Whether the janitor may list and watch what it needs in one scope:
/// `Some` refusal when the API server answered 403 or 404 to any of it; an
/// error for anything else.
pub async fn check_scope(
    client: &Client,
    selector: &Selector,
    ns: Option<&str>,
    kinds: &[LockKind],
) -> Result<Option<Refusal>, Error> {
    let locks = (
        ListParams::default().labels(selector.as_str()).limit(1),
        WatchParams::default().labels(selector.as_str()).timeout(1),
    );
    let pods = (
        ListParams::default().fields(TERMINAL_PODS).limit(1),
        WatchParams::default().fields(TERMINAL_PODS).timeout(1),
    );
    let configmaps = kinds
        .contains(&LockKind::ConfigMap)
        .then(|| scoped::<ConfigMap>(client, ns));
    let leases = kinds
        .contains(&LockKind::Lease)
        .then(|| scoped::<Lease>(client, ns));
    let (c, l, p) = futures::join!(
        check_list_and_watch(configmaps, &locks, "configmaps", ns),
        check_list_and_watch(leases, &locks, "leases", ns),
        check_list_and_watch(Some(scoped::<Pod>(client, ns)), &pods, "pods", ns),
    );
    let refusals: Vec<(String, String)> = [c?, l?, p?].into_iter().flatten().collect();
    let Some(answer) = refusals.first().map(|(_, answer)| answer.clone()) else {
        return Ok(None);
    };
    Ok(Some(Refusal {
        scope: ns.map(str::to_owned),
        denied: refusals.into_iter().map(|(denied, _)| denied).collect(),
        answer,
    }))
}

/// A 403 or a 404: RBAC does not grant it here, or there is no such
/// namespace.
fn refuses(e: &Error) -> bool {
    matches!(e, Error::Kube { source, .. } if matches!(api_code(source), Some(403 | 404)))
}

/// Lists (one item) and opens a one-second watch from the list's version;
/// an error status in the watch stream counts as a failure too. Nothing
/// to check without an `api` (a lock kind not watched). `Some(("list
/// configmaps", the answer))`: that request was refused.
async fn check_list_and_watch<K>(
    api: Option<Api<K>>,
    (lp, wp): &(ListParams, WatchParams),
    resource: &str,
    ns: Option<&str>,
) -> Result<Option<(String, String)>, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(api) = api else {
        return Ok(None);
    };
    let what = format!("{resource} in {}", ns.unwrap_or("all namespaces"));
    let refused = |verb: &str, r: Result<(), Error>| match r {
        Err(e) if refuses(&e) => Ok(Some((format!("{verb} {resource}"), e.to_string()))),
        Err(e) => Err(e),
        Ok(()) => Ok(None),
    };
    let list = match call(format!("listing {what}"), api.list_metadata(lp)).await {
        Ok(list) => list,
        Err(e) => return refused("list", Err(e)),
    };
    let rv = list.metadata.resource_version.unwrap_or_else(|| "0".into());
    let action = format!("watching {what}");
    let watched = async {
        let events = call(action.clone(), api.watch_metadata(wp, &rv)).await?;
        futures::pin_mut!(events);
        let first = call(action.clone(), async { Ok(events.next().await) }).await?;
        match first {
            Some(Err(source)) => Err(Error::Kube {
                action: action.clone(),
                source,
            }),
            Some(Ok(WatchEvent::Error(status))) => Err(Error::Kube {
                action: action.clone(),
                source: kube::Error::Api(status),
            }),
            _ => Ok(()),
        }
    };
    refused("watch", watched.await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::version::Info;

    #[test]
    fn a_403_or_a_404_refuses_a_scope_and_nothing_else_does() {
        let answered = |code: u16| Error::Kube {
            action: "listing configmaps in b".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("no", "Forbidden")
                    .with_code(code)
                    .boxed(),
            ),
        };
        assert!(refuses(&answered(403)));
        assert!(refuses(&answered(404)));
        assert!(!refuses(&answered(500)), "an API server in trouble");
        assert!(!refuses(&answered(429)));
        assert!(!refuses(&Error::Timeout {
            action: "listing".into(),
            after: std::time::Duration::from_secs(15),
        }));
    }

    #[test]
    fn the_minor_is_read_as_managed_services_write_it() {
        let info = |major: &str, minor: &str| Info {
            major: major.into(),
            minor: minor.into(),
            ..Default::default()
        };
        assert_eq!(minor_of(&info("1", "31")), Some(31));
        assert_eq!(minor_of(&info("1", "32+")), Some(32), "EKS, GKE");
        assert_eq!(minor_of(&info("1+", "30")), Some(30));
        assert_eq!(minor_of(&info("1", "")), None);
        assert_eq!(minor_of(&info("2", "0")), None);
    }
}
