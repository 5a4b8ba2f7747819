//! The locks in the janitor's scope: opted in, opted out on purpose, or not
//! opted in (found as `label` finds them); and those stale now (judged as
//! `scan` judges them).

use std::collections::BTreeSet;

use super::{Check, Install};
use crate::cli::{AdminScope, Output, ScanArgs, Scope};
use crate::cmd::{list_candidates, Cluster};
use crate::lock::LockKind;
use crate::optin::{plan_for, Plan};
use crate::DEFAULT_SELECTOR;

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

fn scope(i: &Install) -> Scope {
    Scope {
        selector: i.run.scope.selector.clone(),
        namespaces: i.run.scope.namespaces.clone(),
    }
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
    let scope = scope(i);
    let selector = &scope.selector;
    let Some((key, value)) = selector.opt_in_label() else {
        return Ok(Check::warn(
            NAME,
            format!("the selector {selector} has no single key=value: cannot tell opted-in locks"),
            "give the janitor a selector like lock-janitor.io/watch=true",
        ));
    };
    let kinds = &i.run.lock_kinds;
    let mut metas = Vec::new();
    if kinds.contains(&LockKind::ConfigMap) {
        let listing =
            list_candidates(cluster, &scope, selector, "list and get on configmaps").await?;
        metas.extend(
            listing
                .candidates
                .into_iter()
                .map(|c| ("", c.meta, c.labeled)),
        );
    }
    if kinds.contains(&LockKind::Lease) {
        let observer = crate::observe::Observer::new(
            cluster.client.clone(),
            selector.clone(),
            scope.namespaces.clone(),
            crate::verdict::Policy {
                owner_gone_grace: i.run.owner_gone_grace,
            },
        );
        let found =
            crate::cmd::leases::list_lease_candidates(cluster, &observer, &scope, selector).await?;
        metas.extend(
            found
                .candidates
                .into_iter()
                .map(|c| ("lease ", c.lease.metadata, c.labeled)),
        );
    }
    let (mut opted_in, mut opted_out, mut not_in) = (0, Vec::new(), Vec::new());
    let mut label_namespaces = BTreeSet::new();
    for (kind, meta, labeled) in &metas {
        let ns = meta.namespace.clone().unwrap_or_default();
        let id = format!("{kind}{ns}/{}", meta.name.as_deref().unwrap_or_default());
        if *labeled {
            opted_in += 1;
            continue;
        }
        match plan_for(meta, key, value) {
            Plan::Unchanged => opted_in += 1,
            Plan::Conflicting(v) => opted_out.push(format!("{id} ({key}={v})")),
            Plan::Add => {
                not_in.push(id);
                label_namespaces.insert(ns);
            }
        }
    }
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
    if not_in.is_empty() {
        return Ok(Check::ok(NAME, detail));
    }
    detail.push_str(&format!(
        ", {} not opted in: {}",
        not_in.len(),
        names(&not_in)
    ));
    let sel = selector_flag(i);
    let commands: Vec<String> = label_namespaces
        .iter()
        .map(|ns| format!("lock-janitor label -n {ns}{sel} --apply"))
        .collect();
    Ok(Check::warn(
        NAME,
        detail,
        format!(
            "the janitor frees only opted-in locks: {} (without --apply it shows what it would label); \
             to keep one out on purpose, label it {key}=false",
            names(&commands)
        ),
    ))
}

/// Check 7: no lock in scope is stale now.
async fn stale(cluster: &Cluster, i: &Install) -> anyhow::Result<Check> {
    const NAME: &str = "stale-now";
    let args = ScanArgs {
        admin: AdminScope {
            scope: scope(i),
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
    let ids: Vec<String> = stale
        .iter()
        .map(|r| {
            format!(
                "{} {}/{} ({}{})",
                r.kind,
                r.namespace,
                r.name,
                r.verdict,
                if r.labeled { "" } else { ", not opted in" }
            )
        })
        .collect();
    let mut hint = Vec::new();
    if stale.iter().any(|r| r.labeled) {
        if i.run.dry_run {
            hint.push("the janitor runs with --dry-run: it never frees a lock (helm upgrade ... --set dryRun=false)".to_owned());
        } else {
            hint.push(format!(
                "the janitor frees an opted-in stale lock within seconds; if it stays, read its logs: kubectl -n {} logs -l {} --prefix",
                i.namespace,
                i.pod_selector()
            ));
        }
    }
    let unlabeled: BTreeSet<&str> = stale
        .iter()
        .filter(|r| !r.labeled)
        .map(|r| r.namespace.as_str())
        .collect();
    for ns in unlabeled {
        hint.push(format!(
            "opt it in: lock-janitor label -n {ns}{} --apply",
            selector_flag(i)
        ));
    }
    hint.push("`lock-janitor scan` explains each verdict".to_owned());
    Ok(Check::fail(
        NAME,
        format!(
            "stale now, its holder dead and a replica waiting: {}",
            names(&ids)
        ),
        hint.join("; "),
    ))
}
