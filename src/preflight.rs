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

/// Checks every scope (`namespaces` empty: the whole cluster), 32 at a
/// time, with the control client (outside the API budget: it runs once).
pub async fn preflight(
    client: &Client,
    selector: &Selector,
    namespaces: &[String],
    kinds: &[LockKind],
) -> Result<(), Error> {
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    futures::stream::iter(scopes)
        .map(|ns| check_scope(client, selector, ns, kinds))
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
    let cms: Api<ConfigMap> = scoped(client, ns);
    let (clp, cwp) = (
        ListParams::default().labels(selector.as_str()).limit(1),
        WatchParams::default().labels(selector.as_str()).timeout(1),
    );
    let pods: Api<Pod> = scoped(client, ns);
    let (plp, pwp) = (
        ListParams::default().fields(TERMINAL_PODS).limit(1),
        WatchParams::default().fields(TERMINAL_PODS).timeout(1),
    );
    let (cw, pw) = (
        format!("configmaps in {where_}"),
        format!("pods in {where_}"),
    );
    let leases: Api<Lease> = scoped(client, ns);
    let lw = format!("leases in {where_}");
    let configmaps = async {
        if kinds.contains(&LockKind::ConfigMap) {
            check_list_and_watch(&cms, &clp, &cwp, &cw).await
        } else {
            Ok(())
        }
    };
    let lease_locks = async {
        if kinds.contains(&LockKind::Lease) {
            check_list_and_watch(&leases, &clp, &cwp, &lw).await
        } else {
            Ok(())
        }
    };
    let (c, l, p) = futures::join!(
        configmaps,
        lease_locks,
        check_list_and_watch(&pods, &plp, &pwp, &pw),
    );
    c.and(l).and(p)
}

/// Lists (one item) and opens a one-second watch from the list's version;
/// an error status in the watch stream counts as a failure too.
async fn check_list_and_watch<K>(
    api: &Api<K>,
    lp: &ListParams,
    wp: &WatchParams,
    what: &str,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
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
