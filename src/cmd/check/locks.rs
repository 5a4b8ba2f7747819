//! The locks in the janitor's scope: opted in, opted out on purpose, or not
//! opted in (found as `label` finds them); and those stale now (judged as
//! `scan` judges them).

use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::Api;

use super::{Check, Install};
use crate::cli::{AdminScope, Output, ScanArgs};
use crate::cmd::report::Row;
use crate::cmd::{list_candidates, Cluster};
use crate::lock::LockKind;
use crate::optin::{plan_for, Plan};
use crate::{call, DEFAULT_SELECTOR};

/// At most this many names in a detail line.
const SHOWN: usize = 8;

fn names(items: &[String]) -> String {
    let mut s = items
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        s.push_str(&format!(" and {} more", items.len() - SHOWN));
    }
    s
}

fn selector_flag(i: &Install) -> String {
    let s = i.run.scope.selector.to_string();
    if s == DEFAULT_SELECTOR {
        String::new()
    } else {
        format!(" --selector {s}")
    }
}

/// 6 and 7.
pub async fn locks(cluster: &Cluster, i: &Install) -> Vec<Check> {
    vec![
        Check::or_failed(
            "locks",
            opt_ins(cluster, i).await,
            "list and get on configmaps, list on leases and pods",
        ),
        Check::or_failed(
            "stale-now",
            stale(cluster, i).await,
            "list and get on configmaps and pods, list on leases",
        ),
    ]
}

/// Check 6: every lock-shaped ConfigMap and Lease in scope is opted in, opted out
/// on purpose, or listed.
async fn opt_ins(cluster: &Cluster, i: &Install) -> anyhow::Result<Check> {
    const NAME: &str = "locks";
    let scope = &i.run.scope;
    let selector = &scope.selector;
    let Some((key, value)) = selector.opt_in_label() else {
        return Ok(Check::warn(
            NAME,
            format!("the selector {selector} has no single key=value: cannot tell opted-in locks"),
            "give the janitor a selector like lock-janitor.io/watch=true",
        ));
    };
    let metas = lock_metas(cluster, i).await?;
    let Tally {
        opted_in,
        opted_out,
        not_in,
        excluded,
        label_namespaces,
    } = tally(&metas, key, value, scope);
    let mut detail = format!(
        "{} lock{} in {}: {opted_in} opted in, {} opted out on purpose",
        metas.len(),
        if metas.len() == 1 { "" } else { "s" },
        i.scope_text(),
        opted_out.len()
    );
    if !opted_out.is_empty() {
        detail.push_str(&format!(" ({})", names(&opted_out)));
    }
    if excluded > 0 {
        detail.push_str(&format!(
            ", {excluded} not opted in in namespaces excluded by --exclude-namespaces ({})",
            scope.exclude_namespaces
        ));
    }
    let mut hints = Vec::new();
    if !not_in.is_empty() {
        detail.push_str(&format!(
            ", {} not opted in: {}",
            not_in.len(),
            names(&not_in)
        ));
        hints.push(label_hint(i, &label_namespaces, key));
    }
    match outside(cluster, i).await {
        Outside::Unknown(why) => detail.push_str(&format!(
            "; opted-in locks outside the watched namespaces not looked for ({why})"
        )),
        Outside::Found(found) if found.is_empty() => {}
        Outside::Found(found) => {
            let ids: Vec<String> = found
                .iter()
                .map(|(kind, ns, name)| format!("{kind}{ns}/{name}"))
                .collect();
            detail.push_str(&format!(
                "; {} opted in outside the watched namespaces, never freed: {}",
                found.len(),
                names(&ids)
            ));
            hints.push(outside_hint(i, &found, key));
        }
    }
    if hints.is_empty() {
        return Ok(Check::ok(NAME, detail));
    }
    Ok(Check::warn(NAME, detail, hints.join("; ")))
}

/// The lock candidates of the install's kinds in its scope: (kind prefix as
/// in the details, metadata, labeled).
async fn lock_metas(
    cluster: &Cluster,
    i: &Install,
) -> anyhow::Result<Vec<(&'static str, ObjectMeta, bool)>> {
    let scope = &i.run.scope;
    let kinds = &i.run.lock_kinds;
    let mut metas = Vec::new();
    if kinds.contains(&LockKind::ConfigMap) {
        let listing = list_candidates(cluster, scope, "list and get on configmaps").await?;
        metas.extend(
            listing
                .candidates
                .into_iter()
                .map(|c| ("", c.meta, c.labeled)),
        );
    }
    if kinds.contains(&LockKind::Lease) {
        let found = crate::cmd::leases::list_lease_candidates(cluster, scope).await?;
        metas.extend(
            found
                .candidates
                .into_iter()
                .map(|c| ("lease ", c.lease.metadata, c.labeled)),
        );
    }
    Ok(metas)
}

/// The locks counted by their opt-in.
struct Tally {
    opted_in: usize,
    /// `kind ns/name (key=value)`.
    opted_out: Vec<String>,
    /// Not opted in, in a namespace not excluded: `kind ns/name`.
    not_in: Vec<String>,
    /// Not opted in, in a namespace of --exclude-namespaces.
    excluded: usize,
    /// The namespaces of `not_in`.
    label_namespaces: BTreeSet<String>,
}

fn tally(
    metas: &[(&'static str, ObjectMeta, bool)],
    key: &str,
    value: &str,
    scope: &crate::cli::Scope,
) -> Tally {
    let (mut opted_in, mut opted_out, mut not_in) = (0, Vec::new(), Vec::new());
    let mut excluded = 0;
    let mut label_namespaces = BTreeSet::new();
    for (kind, meta, labeled) in metas {
        let ns = meta.namespace.clone().unwrap_or_default();
        let id = format!("{kind}{ns}/{}", meta.name.as_deref().unwrap_or_default());
        if *labeled {
            opted_in += 1;
            continue;
        }
        match plan_for(meta, key, value) {
            Plan::Unchanged => opted_in += 1,
            Plan::Conflicting(v) => opted_out.push(format!("{id} ({key}={v})")),
            // Never auto-opted in, not counted as unprotected.
            Plan::Add if scope.exclude_namespaces.excludes(&ns) => excluded += 1,
            Plan::Add => {
                not_in.push(id);
                label_namespaces.insert(ns);
            }
        }
    }
    Tally {
        opted_in,
        opted_out,
        not_in,
        excluded,
        label_namespaces,
    }
}

/// How to opt in the locks not opted in: the `label` command per namespace.
fn label_hint(i: &Install, label_namespaces: &BTreeSet<String>, key: &str) -> String {
    let sel = selector_flag(i);
    let commands: Vec<String> = label_namespaces
        .iter()
        .map(|ns| format!("lock-janitor label -n {ns}{sel} --apply"))
        .collect();
    let auto = if i.run.auto_opt_in {
        "the janitor runs with --auto-opt-in: its leader labels these within seconds, and when \
         they stay unlabeled its log says why (a 403 names the missing permission; docs/runbooks.md, \
         LockJanitorUnprotectedLocks); to label them now: "
    } else {
        "the janitor frees only opted-in locks: "
    };
    format!(
        "{auto}{} (without --apply it shows what it would label); \
         to keep one out on purpose, label it {key}=false",
        names(&commands)
    )
}

/// What to do about opted-in locks outside the watched namespaces: watch
/// their namespaces too, or take the label off.
fn outside_hint(i: &Install, found: &[(&'static str, String, String)], key: &str) -> String {
    let mut watched: BTreeSet<&str> = i.run.scope.namespaces.iter().map(String::as_str).collect();
    watched.extend(found.iter().map(|(_, ns, _)| ns.as_str()));
    let list: Vec<&str> = watched.into_iter().collect();
    format!(
        "the janitor watches only {}: add the namespaces of those locks to watchNamespaces ({}), \
         or take the label off them (kubectl label -n <namespace> configmap/<name> {key}-; lease/<name> for a Lease)",
        i.scope_text(),
        i.helm_upgrade(&format!("--set watchNamespaces={{{}}}", list.join(",")))
    )
}

/// Opted-in locks outside a namespaced install's watched namespaces.
enum Outside {
    /// Could not look (you may not list cluster-wide): why.
    Unknown(String),
    /// (kind prefix as in the details, namespace, name); none when the
    /// install watches every namespace.
    Found(Vec<(&'static str, String, String)>),
}

/// A namespaced install never frees a lock labeled in a namespace it does
/// not watch, and says nothing of it: look for such locks cluster-wide,
/// where the caller may list so.
async fn outside(cluster: &Cluster, i: &Install) -> Outside {
    let watched = &i.run.scope.namespaces;
    if watched.is_empty() {
        return Outside::Found(Vec::new());
    }
    let lp = ListParams::default().labels(i.run.scope.selector.as_str());
    let mut found = Vec::new();
    let mut keep = |kind: &'static str, meta: ObjectMeta| {
        let ns = meta.namespace.unwrap_or_default();
        if !watched.contains(&ns) {
            found.push((kind, ns, meta.name.unwrap_or_default()));
        }
    };
    let why = |e: crate::Error| match e {
        crate::Error::Kube {
            source: kube::Error::Api(s),
            ..
        } if s.code == 403 => "you may not list them in all namespaces".to_owned(),
        e => crate::error_chain(&e),
    };
    if i.run.lock_kinds.contains(&LockKind::ConfigMap) {
        let api: Api<ConfigMap> = Api::all(cluster.client.clone());
        match call(
            "listing opted-in configmaps in all namespaces",
            api.list_metadata(&lp),
        )
        .await
        {
            Ok(list) => list.items.into_iter().for_each(|o| keep("", o.metadata)),
            Err(e) => return Outside::Unknown(why(e)),
        }
    }
    if i.run.lock_kinds.contains(&LockKind::Lease) {
        let api: Api<Lease> = Api::all(cluster.client.clone());
        match call(
            "listing opted-in leases in all namespaces",
            api.list_metadata(&lp),
        )
        .await
        {
            Ok(list) => list
                .items
                .into_iter()
                .for_each(|o| keep("lease ", o.metadata)),
            Err(e) => return Outside::Unknown(why(e)),
        }
    }
    found.sort();
    Outside::Found(found)
}

/// Check 7: no lock in scope is stale now.
async fn stale(cluster: &Cluster, i: &Install) -> anyhow::Result<Check> {
    const NAME: &str = "stale-now";
    let args = ScanArgs {
        admin: AdminScope {
            scope: i.run.scope.clone(),
            all_namespaces: false,
            cluster: Default::default(),
        },
        output: Output::Json,
        no_headers: false,
        owner_gone_grace: i.run.owner_gone_grace,
    };
    let report = crate::cmd::scan::build_report(cluster, &args).await?;
    let kinds: Vec<&str> = i.run.lock_kinds.iter().map(|k| k.as_str()).collect();
    let rows: Vec<_> = report
        .locks
        .iter()
        .filter(|r| kinds.contains(&r.kind.as_str()))
        .collect();
    let stale: Vec<_> = rows.iter().filter(|r| r.state == "stale").collect();
    if stale.is_empty() {
        let count = |s: &str| rows.iter().filter(|r| r.state == s).count();
        return Ok(Check::ok(
            NAME,
            format!(
                "no lock is stale ({} judged: {} held, {} ambiguous, {} unmanageable)",
                rows.len(),
                count("held"),
                count("ambiguous"),
                count("unmanageable")
            ),
        ));
    }
    let id = |r: &&Row| format!("{} {}/{} ({})", r.kind, r.namespace, r.name, r.verdict);
    let (opted_in, not_in): (Vec<&Row>, Vec<&Row>) =
        stale.iter().map(|r| **r).partition(|r| r.labeled);
    let mut hint = Vec::new();
    if !opted_in.is_empty() {
        if i.run.dry_run {
            hint.push(format!(
                "the janitor runs in dry-run mode: it never frees a lock (see install-found; {})",
                i.helm_upgrade("--set dryRun=false")
            ));
        } else {
            hint.push(format!(
                "the janitor frees an opted-in stale lock within seconds; if it stays, read its logs: kubectl -n {} logs -l {} --prefix",
                i.namespace,
                i.pod_selector()
            ));
        }
    }
    // Not opted in: the cluster's to decide, not the install's failure.
    let namespaces: BTreeSet<&str> = not_in.iter().map(|r| r.namespace.as_str()).collect();
    for ns in namespaces {
        hint.push(format!(
            "to let the janitor free those of {ns}: lock-janitor label -n {ns}{} --apply",
            selector_flag(i)
        ));
    }
    hint.push("`lock-janitor scan` explains each verdict".to_owned());
    let mut detail = Vec::new();
    if !opted_in.is_empty() {
        let ids: Vec<String> = opted_in.iter().map(id).collect();
        detail.push(format!(
            "opted in and stale now, its holder dead and a replica waiting: {}",
            names(&ids)
        ));
    }
    if !not_in.is_empty() {
        let ids: Vec<String> = not_in.iter().map(id).collect();
        detail.push(format!(
            "stale now but not opted in (the janitor leaves them alone): {}",
            names(&ids)
        ));
    }
    let detail = detail.join("; ");
    Ok(if opted_in.is_empty() {
        Check::warn(NAME, detail, hint.join("; "))
    } else {
        Check::fail(NAME, detail, hint.join("; "))
    })
}
