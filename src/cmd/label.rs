//! `lock-janitor label`: add the opt-in label to unlabeled lock candidates.
//!
//! `label` lists the same way (no holder reads) and adds the selector's
//! `key=value` to each unlabeled candidate, with a merge patch carrying the
//! `metadata.resourceVersion` it read: a concurrent change makes the write fail
//! with 409 instead of overwriting it. A ConfigMap whose key already has
//! another value (e.g. `lock-janitor.io/watch=false`, a deliberate opt-out) is
//! skipped, never overwritten. Lease locks whose holder identity names
//! exactly one pod of their namespace are labeled the same way.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::anyhow;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;

use super::{connect, explain, list_candidates, print_stdout, scope_text, CONCURRENCY};
use crate::cli::{LabelArgs, LabelOutput};
use crate::lock::LockKind as Kind;
use crate::optin::{plan_for, plan_label, write_label, Plan, Written};
use crate::ErrorKind;

/// `--include` (any; empty: all) and `--exclude` (none) on the lock name.
pub fn name_selected(name: &str, include: &[glob::Pattern], exclude: &[glob::Pattern]) -> bool {
    (include.is_empty() || include.iter().any(|p| p.matches(name)))
        && !exclude.iter().any(|p| p.matches(name))
}

/// `lock-janitor label`: adds the opt-in label to unlabeled lock candidates.
pub async fn label_command(args: LabelArgs) -> anyhow::Result<ExitCode> {
    let Some((key, value)) = args.admin.scope.selector.opt_in_label() else {
        anyhow::bail!(
            "--selector {:?} has no single key=value term to write; label needs a selector like \
             lock-janitor.io/watch=true (the one `lock-janitor run` is given)",
            args.admin.scope.selector
        );
    };
    let selector = &args.admin.scope.selector;
    let cluster = connect(&args.admin.cluster).await?;
    let needs = if args.apply {
        "list, get and patch on configmaps"
    } else {
        "list and get on configmaps"
    };
    let listing = list_candidates(&cluster, &args.admin.scope, selector, needs).await?;

    // Lease locks too: those whose holder identity names exactly one pod.
    // A janitor installed for ConfigMaps only may not list Leases: said.
    let observer = crate::observe::Observer::new(
        cluster.client.clone(),
        selector.clone(),
        args.admin.scope.namespaces.clone(),
        crate::verdict::Policy {
            owner_gone_grace: std::time::Duration::ZERO,
        },
    );
    let leases = match super::leases::list_lease_candidates(
        &cluster,
        &observer,
        &args.admin.scope,
        selector,
    )
    .await
    {
        Ok(found) => found.candidates,
        Err(e) if e.kind() == ErrorKind::Forbidden => {
            eprintln!(
                "lock-janitor: Lease locks left out (list on leases and pods is not allowed): {e}"
            );
            Vec::new()
        }
        Err(e) => return Err(explain(e, &cluster, "list on leases and pods")),
    };

    let mut excluded = 0;
    let mut planned: Vec<(Kind, &ObjectMeta, Plan)> = Vec::new();
    let plans = listing
        .candidates
        .iter()
        .filter_map(|c| Some((Kind::ConfigMap, &c.meta, plan_label(&c.meta, key, value)?)))
        .chain(leases.iter().map(|c| {
            (
                Kind::Lease,
                &c.lease.metadata,
                plan_for(&c.lease.metadata, key, value),
            )
        }));
    for (kind, meta, plan) in plans {
        if name_selected(
            meta.name.as_deref().unwrap_or_default(),
            &args.include,
            &args.exclude,
        ) {
            planned.push((kind, meta, plan));
        } else {
            excluded += 1;
        }
    }

    // Writes run CONCURRENCY at a time; lines are printed in order as their
    // results come in.
    let mut results = futures::stream::iter(&planned)
        .map(|(kind, meta, plan)| {
            let cluster = &cluster;
            async move {
                let ns = meta.namespace.as_deref().unwrap_or_default();
                let written = match (plan, kind) {
                    (Plan::Add, Kind::ConfigMap) if args.apply => {
                        let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), ns);
                        Some(write_label(&api, meta, key, value).await)
                    }
                    (Plan::Add, Kind::Lease) if args.apply => {
                        let api: Api<Lease> = Api::namespaced(cluster.client.clone(), ns);
                        Some(write_label(&api, meta, key, value).await)
                    }
                    _ => None,
                };
                (*kind, *meta, plan, written)
            }
        })
        .buffered(CONCURRENCY);

    let label = format!("{key}={value}");
    let (mut added, mut unchanged, mut skipped, mut gone, mut conflicts, mut failed) =
        (0, 0, 0, 0, 0, 0);
    let mut fatal = None;
    while let Some((kind, meta, plan, written)) = results.next().await {
        let id = format!(
            "{}{}/{}",
            if kind == Kind::Lease { "lease " } else { "" },
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        );
        let holder = match kind {
            Kind::ConfigMap => meta
                .owner_references
                .as_deref()
                .and_then(|o| o.first())
                .map(|o| o.name.clone())
                .unwrap_or_default(),
            Kind::Lease => leases
                .iter()
                .find(|c| {
                    c.lease.metadata.name == meta.name
                        && c.lease.metadata.namespace == meta.namespace
                })
                .and_then(|c| crate::lock::lease::parse(&c.lease).ok()?.host)
                .unwrap_or_default(),
        };
        let line = match (plan, written) {
            (Plan::Unchanged, _) => {
                unchanged += 1;
                format!("unchanged    {id}: already has {label}")
            }
            (Plan::Conflicting(v), _) => {
                skipped += 1;
                format!("skipped      {id}: has {key}={v}; not overwriting it")
            }
            (Plan::Add, None) => {
                added += 1;
                format!("would label  {id} (holder {holder}): add {label}")
            }
            (Plan::Add, Some(Written::Labeled)) => {
                added += 1;
                format!("labeled      {id} (holder {holder}): added {label}")
            }
            (Plan::Add, Some(Written::Gone)) => {
                gone += 1;
                format!("gone         {id}: deleted since it was read; nothing to label")
            }
            (Plan::Add, Some(Written::Conflict)) => {
                conflicts += 1;
                format!(
                    "conflict     {id}: changed since it was read (409); not labeled, run again"
                )
            }
            (Plan::Add, Some(Written::Failed(e))) => {
                failed += 1;
                let forbidden = e.kind() == ErrorKind::Forbidden;
                let error = format!(
                    "{:#}",
                    explain(e, &cluster, "list and patch on configmaps and leases")
                );
                if forbidden {
                    // Every other write would be refused the same way.
                    fatal = Some(error);
                    break;
                }
                format!("failed       {id}: {error}")
            }
        };
        let name_only = args.output == LabelOutput::Name;
        if !name_only {
            print_stdout(&format!("{line}\n"))?;
        } else if matches!(line.split(' ').next(), Some("would" | "labeled")) {
            let kind = match kind {
                Kind::Lease => "lease.coordination.k8s.io",
                Kind::ConfigMap => "configmap",
            };
            let name = meta.name.as_deref().unwrap_or_default();
            print_stdout(&format!("{kind}/{name}\n"))?;
        }
    }
    drop(results);
    let mut summary = if args.apply {
        format!("{added} labeled, {unchanged} unchanged, {skipped} skipped")
    } else {
        format!("dry run: {added} would be labeled, {unchanged} unchanged, {skipped} skipped")
    };
    if gone > 0 {
        let _ = write!(summary, ", {gone} gone");
    }
    if conflicts > 0 {
        let _ = write!(
            summary,
            ", {conflicts} conflict{}",
            if conflicts == 1 { "" } else { "s" }
        );
    }
    if failed > 0 {
        let _ = write!(summary, ", {failed} failed");
    }
    let _ = write!(
        summary,
        " ({} lock candidate{} in {}",
        planned.len() + excluded,
        if planned.len() + excluded == 1 {
            ""
        } else {
            "s"
        },
        scope_text(&args.admin.scope)
    );
    if excluded > 0 {
        let _ = write!(summary, ", {excluded} left out by --include/--exclude");
    }
    if listing.skipped_with_data > 0 {
        let _ = write!(
            summary,
            ", {} owned by one Pod but holding data, not lock-shaped, skipped",
            listing.skipped_with_data
        );
    }
    summary.push(')');
    if !args.apply && added > 0 {
        summary.push_str("; run again with --apply to write");
    }
    if fatal.is_some() {
        summary.push_str("; stopped at the first forbidden write");
    }
    summary.push_str(".\n");
    // The summary and hints go to stderr: stdout is the report alone.
    eprint!("{summary}");
    if let Some(error) = fatal {
        return Err(anyhow!(error));
    }
    if conflicts + failed > 0 {
        anyhow::bail!(
            "{} of {} locks were not labeled (see above); run again to retry",
            conflicts + failed,
            added + conflicts + failed + gone
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_and_exclude() {
        let p = |s: &str| glob::Pattern::new(s).unwrap();
        assert!(name_selected("a-lock", &[], &[]));
        assert!(name_selected("a-lock", &[p("a-*"), p("z")], &[]));
        assert!(!name_selected("b-lock", &[p("a-*")], &[]));
        assert!(!name_selected("a-lock", &[], &[p("*-lock")]));
        assert!(!name_selected("a-lock", &[p("a-*")], &[p("a-lock")]));
    }
}
