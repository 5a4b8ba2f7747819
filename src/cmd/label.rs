//! `lock-janitor label`: add the opt-in label to unlabeled lock candidates.
//!
//! `label` lists the same way (no holder reads) and adds the selector's
//! `key=value` to each unlabeled candidate, with a merge patch carrying the
//! `metadata.resourceVersion` it read: a concurrent change makes the write fail
//! with 409 instead of overwriting it. A ConfigMap whose key already has
//! another value (e.g. `lock-janitor.io/watch=false`, a deliberate opt-out) is
//! skipped, never overwritten. Lease locks whose holder identity names
//! exactly one pod of their namespace are labeled the same way.
//!
//! It prints as `scan` does (docs/cli.md, `label`'s "Output"): a table
//! with a RESULT word per lock, or a `LockList` whose items carry what it
//! did or would do; notes and the summary on stderr.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::anyhow;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;

use super::label_report::{LabelCounts, LabelResult, LabelRow, LabelSummary};
use super::leases::LeaseListing;
use super::report::{kubectl_name, LockList};
use super::table::{render_label, Style};
use super::{
    connect, encode, explain, list_candidates, missing_note, print_stdout, scope_text, Cluster,
    Listing, CONCURRENCY,
};
use crate::cli::{LabelArgs, Output};
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
        // A usage error, as a bad flag value is (exit 2), said plainly.
        eprintln!(
            "lock-janitor: --selector {} has no single key=value term to write: label needs \
             exactly one, such as lock-janitor.io/watch=true (the one `lock-janitor run` is given)",
            args.admin.scope.selector
        );
        return Ok(ExitCode::from(super::EXIT_USAGE));
    };
    let started = std::time::Instant::now();
    let cluster = connect(&args.admin.cluster).await?;
    let needs = if args.apply {
        "list, get and patch on configmaps"
    } else {
        "list and get on configmaps"
    };
    let listing = list_candidates(&cluster, &args.admin.scope, needs).await?;

    // Lease locks too: those whose holder identity names exactly one pod.
    let leases = super::leases::lease_candidates_if_allowed(
        &cluster,
        &args.admin.scope,
        "list on leases and pods",
    )
    .await?;
    let in_excluded_namespaces = listing.excluded + leases.excluded;
    let (planned, excluded) = plan_selected(&args, &listing, &leases, key, value);
    let (rows, fatal) = label_planned(&args, &cluster, &planned, key, value).await;

    let summary = LabelSummary {
        dry_run: !args.apply,
        label: format!("{key}={value}"),
        total: rows.len(),
        results: LabelCounts::count(&rows),
        excluded,
        skipped_with_data: listing.skipped_with_data,
        configmaps_scanned: listing.scanned,
        leases_scanned: leases.scanned,
        namespaces: args.admin.scope.namespaces.clone(),
        selector: args.admin.scope.selector.to_string(),
        duration_seconds: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
    };
    let mut stderr = print_report(&args, &summary, &rows)?;
    if !stderr.is_empty() {
        stderr.push('\n');
    }
    stderr.push_str(&summary_line(
        &summary,
        planned.len() + excluded,
        &args.admin.scope,
        fatal.is_some(),
    ));
    stderr.push_str(&excluded_namespaces_note(
        in_excluded_namespaces,
        &args.admin.scope,
    ));
    // `-n typo` lists nothing: say so rather than only "0 scanned".
    stderr.push_str(&missing_note(&cluster, &listing.empty_namespaces).await);
    // The notes and summary go to stderr: stdout is the report alone.
    eprint!("{stderr}");
    if let Some(error) = fatal {
        return Err(anyhow!(error));
    }
    exit_status(&summary)
}

/// What to do with each candidate, ConfigMaps then Leases, those that
/// `--include`, `--exclude` and `--from-selector` select; and how many
/// they left out.
fn plan_selected<'a>(
    args: &LabelArgs,
    listing: &'a Listing,
    leases: &'a LeaseListing,
    key: &str,
    value: &str,
) -> (Vec<Planned<'a>>, usize) {
    let configmaps = listing.candidates.iter().filter_map(|c| {
        let owner = c.meta.owner_references.as_deref().and_then(|o| o.first());
        Some(Planned {
            kind: Kind::ConfigMap,
            meta: &c.meta,
            plan: plan_label(&c.meta, key, value)?,
            labeled: c.labeled,
            holder: owner.map(|o| o.name.clone()),
            holder_uid: owner.map(|o| o.uid.clone()).filter(|u| !u.is_empty()),
        })
    });
    let leases = leases.candidates.iter().map(|c| Planned {
        kind: Kind::Lease,
        meta: &c.lease.metadata,
        plan: plan_for(&c.lease.metadata, key, value),
        labeled: c.labeled,
        holder: crate::lock::lease::parse(&c.lease)
            .ok()
            .and_then(|l| l.host),
        holder_uid: None,
    });
    let (planned, left_out): (Vec<Planned>, Vec<Planned>) =
        configmaps.chain(leases).partition(|p| {
            let name = p.meta.name.as_deref().unwrap_or_default();
            let from = args
                .from_selector
                .as_ref()
                .is_none_or(|old| old.matches(p.meta.labels.as_ref()));
            from && name_selected(name, &args.include, &args.exclude)
        });
    (planned, left_out.len())
}

/// Writes the label where the plan adds it (with --apply), CONCURRENCY at
/// a time, and a row per lock in order; stops at the first forbidden write
/// (every other write would be refused the same way) and returns its error.
async fn label_planned(
    args: &LabelArgs,
    cluster: &Cluster,
    planned: &[Planned<'_>],
    key: &str,
    value: &str,
) -> (Vec<LabelRow>, Option<String>) {
    let mut results = futures::stream::iter(planned)
        .map(|p| async move {
            let ns = p.meta.namespace.as_deref().unwrap_or_default();
            let written = match (&p.plan, p.kind) {
                (Plan::Add, Kind::ConfigMap) if args.apply => {
                    let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), ns);
                    Some(write_label(&api, p.meta, key, value).await)
                }
                (Plan::Add, Kind::Lease) if args.apply => {
                    let api: Api<Lease> = Api::namespaced(cluster.client.clone(), ns);
                    Some(write_label(&api, p.meta, key, value).await)
                }
                _ => None,
            };
            (p, written)
        })
        .buffered(CONCURRENCY);

    let mut rows: Vec<LabelRow> = Vec::new();
    let mut fatal = None;
    while let Some((p, written)) = results.next().await {
        match row_of(p, written, cluster, key, value) {
            Ok(row) => rows.push(row),
            Err(error) => {
                fatal = Some(error);
                break;
            }
        }
    }
    drop(results);
    (rows, fatal)
}

/// A lock's row: its plan and what the write did; Err for a forbidden
/// write.
fn row_of(
    p: &Planned<'_>,
    written: Option<Written>,
    cluster: &Cluster,
    key: &str,
    value: &str,
) -> Result<LabelRow, String> {
    use LabelResult as R;
    let label = format!("{key}={value}");
    let (result, message) = match (&p.plan, written) {
        (Plan::Unchanged, _) => (R::Unchanged, format!("already has {label}")),
        (Plan::Conflicting(v), _) => (R::Skipped, format!("has {key}={v}; not overwriting it")),
        (Plan::Add, None) => (R::WouldLabel, format!("would add {label}")),
        (Plan::Add, Some(Written::Labeled)) => (R::Labeled, format!("added {label}")),
        (Plan::Add, Some(Written::Gone)) => (
            R::Gone,
            "deleted since it was read; nothing to label".to_owned(),
        ),
        (Plan::Add, Some(Written::Conflict)) => (
            R::Conflict,
            "changed since it was read (409); not labeled, run again".to_owned(),
        ),
        (Plan::Add, Some(Written::Failed(e))) => {
            let forbidden = e.kind() == ErrorKind::Forbidden;
            let error = format!(
                "{:#}",
                explain(e, cluster, "list and patch on configmaps and leases")
            );
            if forbidden {
                return Err(error);
            }
            (R::Failed, error)
        }
    };
    let meta = p.meta;
    Ok(LabelRow {
        kind: p.kind.as_str(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        created_at: meta.creation_timestamp.as_ref().map(|t| t.0.to_string()),
        labeled: p.labeled,
        holder: p.holder.clone(),
        holder_uid: p.holder_uid.clone(),
        result,
        current_value: meta.labels.as_ref().and_then(|l| l.get(key)).cloned(),
        message,
    })
}

/// Prints the report in `-o`'s format on stdout; returns what goes to
/// stderr with it (the table's notes).
fn print_report(
    args: &LabelArgs,
    summary: &LabelSummary,
    rows: &[LabelRow],
) -> anyhow::Result<String> {
    let mut stderr = String::new();
    let out = match args.output {
        Output::Json | Output::Yaml => encode(
            &LockList::new(summary, rows.iter().map(LabelRow::item).collect()),
            args.output == Output::Yaml,
        )?,
        Output::Name => rows
            .iter()
            .filter(|r| r.result.adds())
            .map(|r| kubectl_name(r.kind, &r.name) + "\n")
            .collect(),
        Output::Table | Output::Wide => {
            let style = Style::for_stdout(args.output == Output::Wide, args.no_headers);
            let rendered = render_label(rows, style);
            stderr = rendered.stderr;
            rendered.stdout
        }
    };
    print_stdout(&out)?;
    Ok(stderr)
}

/// The note on the candidates left out in --exclude-namespaces, if any.
fn excluded_namespaces_note(in_excluded_namespaces: usize, scope: &crate::cli::Scope) -> String {
    if in_excluded_namespaces == 0 {
        return String::new();
    }
    format!(
        "lock-janitor: {in_excluded_namespaces} unlabeled lock candidate{} (by owner or holder; \
         data not read) in namespaces of --exclude-namespaces ({}) left out; name a namespace \
         with -n to label there.\n",
        if in_excluded_namespaces == 1 { "" } else { "s" },
        scope.exclude_namespaces
    )
}

/// Fails when a write was tried and did not label.
fn exit_status(summary: &LabelSummary) -> anyhow::Result<ExitCode> {
    let c = &summary.results;
    let (unlabeled, tried) = (
        c.conflict + c.failed,
        c.labeled + c.conflict + c.failed + c.gone,
    );
    if unlabeled > 0 {
        anyhow::bail!(
            "{unlabeled} of {tried} locks were not labeled (see above); run again to retry"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A lock candidate and what to do with it.
struct Planned<'a> {
    kind: Kind,
    meta: &'a ObjectMeta,
    plan: Plan,
    labeled: bool,
    holder: Option<String>,
    holder_uid: Option<String>,
}

/// The summary on stderr: `dry run: 3 would be labeled, 1 unchanged, 1
/// skipped (5 lock candidates in namespace ops); run again with --apply to
/// write.`
fn summary_line(
    s: &LabelSummary,
    candidates: usize,
    scope: &crate::cli::Scope,
    stopped: bool,
) -> String {
    let c = &s.results;
    let mut line = if s.dry_run {
        format!(
            "dry run: {} would be labeled, {} unchanged, {} skipped",
            c.would_label, c.unchanged, c.skipped
        )
    } else {
        format!(
            "{} labeled, {} unchanged, {} skipped",
            c.labeled, c.unchanged, c.skipped
        )
    };
    if c.gone > 0 {
        let _ = write!(line, ", {} gone", c.gone);
    }
    if c.conflict > 0 {
        let plural = if c.conflict == 1 { "" } else { "s" };
        let _ = write!(line, ", {} conflict{plural}", c.conflict);
    }
    if c.failed > 0 {
        let _ = write!(line, ", {} failed", c.failed);
    }
    let plural = if candidates == 1 { "" } else { "s" };
    let _ = write!(
        line,
        " ({candidates} lock candidate{plural} in {}",
        scope_text(scope)
    );
    if s.excluded > 0 {
        let _ = write!(
            line,
            ", {} left out by --include/--exclude/--from-selector",
            s.excluded
        );
    }
    if s.skipped_with_data > 0 {
        let _ = write!(
            line,
            ", {} owned by one Pod but holding data, not lock-shaped, skipped",
            s.skipped_with_data
        );
    }
    line.push(')');
    if s.dry_run && c.would_label > 0 {
        line.push_str("; run again with --apply to write");
    }
    if stopped {
        line.push_str("; stopped at the first forbidden write");
    }
    line.push_str(".\n");
    line
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
