//! The start-up permission check: before any watch starts, the selector is
//! accepted and the janitor may list and watch locks and terminal pods in
//! every scope. A clear error at start-up beats a watcher that lists once
//! (and looks synced) and then retries a forbidden watch forever.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client};

use crate::lock::LockKind;
use crate::selector::Selector;
use crate::{call, scoped, Error, TERMINAL_PODS};

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

/// Checks the API server's version first: one older than `OLDEST_MINOR`
/// is refused with a clear error (what the janitor relies on, the Table
/// of ConfigMaps, ValidatingAdmissionPolicy v1 and the rest, is proven from
/// 1.31 on); one that does not say which minor it is gets a WARN line and
/// the start goes on. Then every scope (`namespaces` empty: the whole
/// cluster), 32 at a time, with the control client (outside the API budget:
/// it runs once).
pub async fn preflight(
    client: &Client,
    selector: &Selector,
    namespaces: &[String],
    kinds: &[LockKind],
) -> Result<(), Error> {
    let info = call(
        "reading the API server's version",
        client.apiserver_version(),
    )
    .await?;
    match minor_of(&info) {
        Some(minor) if minor < OLDEST_MINOR => {
            return Err(Error::Unsupported {
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
    futures::stream::iter(&scopes)
        .map(|ns| check_scope(client, selector, ns.as_deref(), kinds))
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

async fn check_scope(
    client: &Client,
    selector: &Selector,
    ns: Option<&str>,
    kinds: &[LockKind],
) -> Result<(), Error> {
    let where_ = ns.unwrap_or("all namespaces");
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
        check_list_and_watch(configmaps, &locks, format!("configmaps in {where_}")),
        check_list_and_watch(leases, &locks, format!("leases in {where_}")),
        check_list_and_watch(
            Some(scoped::<Pod>(client, ns)),
            &pods,
            format!("pods in {where_}")
        ),
    );
    c.and(l).and(p)
}

/// Lists (one item) and opens a one-second watch from the list's version;
/// an error status in the watch stream counts as a failure too. Nothing
/// to check without an `api` (a lock kind not watched).
async fn check_list_and_watch<K>(
    api: Option<Api<K>>,
    (lp, wp): &(ListParams, WatchParams),
    what: String,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let Some(api) = api else {
        return Ok(());
    };
    let list = call(format!("listing {what}"), api.list_metadata(lp)).await?;
    let rv = list.metadata.resource_version.unwrap_or_else(|| "0".into());
    let action = format!("watching {what}");
    let events = call(action.clone(), api.watch_metadata(wp, &rv)).await?;
    futures::pin_mut!(events);
    let first = call(action.clone(), async { Ok(events.next().await) }).await?;
    match first {
        Some(Err(source)) => Err(Error::Kube { action, source }),
        Some(Ok(WatchEvent::Error(status))) => Err(Error::Kube {
            action,
            source: kube::Error::Api(status),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::version::Info;

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
