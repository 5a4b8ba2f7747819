//! The admin commands (`scan`, `label`, `check`) and what they share: connecting as
//! kubectl does, explaining API errors, paged listing of lock candidates,
//! printing.

pub mod check;
pub mod label;
pub mod label_report;
pub mod leases;
pub mod report;
pub mod scan;
pub mod table;

use anyhow::{anyhow, Context as _};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cli::Scope;
use crate::kinds;
use crate::lock::{holds_data, looks_like_lock};
use crate::{call, Error, Paged};

/// Objects per page of a list.
const PAGE_SIZE: u32 = 500;
/// API calls in flight at once for holder reads and label writes.
pub const CONCURRENCY: usize = 16;
/// Exit code for usage errors, as clap's.
pub const EXIT_USAGE: u8 = 2;

/// A client and the configuration it was built from.
pub struct Cluster {
    pub client: Client,
    /// The command narrows its scope with `-n` (scan, label): a forbidden
    /// list of all namespaces suggests it. `check` reads the install's own
    /// scope, so it does not.
    pub takes_namespaces: bool,
    /// What the client was built from: where it points, for error
    /// messages (`check` also impersonates with it).
    pub config: kube::Config,
}

/// kube's reason for an error response whose body is no Kubernetes
/// `Status` (a proxy, a web server, a path the server does not have).
const NOT_A_STATUS: &str = "Failed to parse error data";
/// At most this many characters of such an answer's body in a message.
const SHOWN_BODY: usize = 100;

/// Connects as kubectl would: `--kubeconfig` (else $KUBECONFIG, then
/// ~/.kube/config, then the in-cluster service account) and `--context`.
pub async fn connect(flags: &crate::cli::Cluster) -> anyhow::Result<Cluster> {
    let options = kube::config::KubeConfigOptions {
        context: flags.context.clone(),
        ..Default::default()
    };
    let config = match (&flags.kubeconfig, &flags.context) {
        (Some(path), _) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options).await.map_err(|e| {
                anyhow!("cannot use the kubeconfig {}: {e}", path.display())
            })?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| anyhow!("cannot use the kubeconfig with that context: {e}"))?,
        (None, None) => kube::Config::infer().await.map_err(|e| {
            anyhow!(
                "no Kubernetes cluster configured: set KUBECONFIG, create ~/.kube/config, or run in a pod \
                 with a service account ({e})"
            )
        })?,
    };
    let client = Client::try_from(config.clone()).with_context(|| {
        format!(
            "cannot build a client for the cluster at {}",
            config.cluster_url
        )
    })?;
    Ok(Cluster {
        client,
        takes_namespaces: true,
        config,
    })
}

/// An answer that is no Kubernetes `Status`: its HTTP status, the server,
/// what it said (if anything), and where to look.
fn not_kubernetes(action: &str, url: &str, code: u16, body: &str) -> String {
    let reason = http::StatusCode::from_u16(code)
        .ok()
        .and_then(|c| c.canonical_reason())
        .unwrap_or("");
    // One line, short: a web server's 404 is often a page of HTML.
    let words: Vec<&str> = body.split_whitespace().collect();
    let line = words.join(" ");
    let mut said: String = line.chars().take(SHOWN_BODY).collect();
    if said.len() < line.len() {
        said.push('…');
    }
    let said = if said.is_empty() {
        "an empty body".to_owned()
    } else {
        format!("\"{said}\"")
    };
    format!(
        "{action}: {url} answered HTTP {code} {reason} with {said}, not a Kubernetes API error: \
         is {url} a Kubernetes API server? Check the server of your kubeconfig's context \
         (kubectl config view --minify)"
    )
}

/// Turns an API error into a message that says what failed and what to do.
pub fn explain(err: Error, cluster: &Cluster, needs: &str) -> anyhow::Error {
    let url = cluster.config.cluster_url.to_string();
    match err {
        Error::Kube {
            action,
            source: kube::Error::Api(status),
        } => match status.code {
            _ if status.reason == NOT_A_STATUS => {
                anyhow!(not_kubernetes(&action, &url, status.code, &status.message))
            }
            403 => {
                let mut msg = format!(
                    "{action} was forbidden: {}. This command needs {needs}.",
                    status.message
                );
                let cluster_wide = action.contains("in all namespaces")
                    || status.message.contains("at the cluster scope");
                if cluster.takes_namespaces && cluster_wide {
                    msg.push_str(
                        " If you may read only some namespaces, name them: -n NAMESPACE (repeatable).",
                    );
                }
                anyhow!(msg)
            }
            401 => anyhow!(
                "{action}: the API server at {url} rejected the credentials (401 Unauthorized): {}. \
                 Check the user in your kubeconfig.",
                status.message
            ),
            code => anyhow!(
                "{action}: the API server answered {code} {}: {}",
                status.reason,
                status.message
            ),
        },
        Error::Kube { action, source } => anyhow!(
            "{action}: cannot reach the Kubernetes API server at {url}: {}",
            crate::error_chain(&source)
        ),
        Error::Timeout { action, after } => anyhow!(
            "{action}: no answer from the Kubernetes API server at {url} within {after:?}"
        ),
        other => anyhow!(other),
    }
}

/// A ConfigMap scan reports: labeled, or unlabeled but shaped like a lock.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub meta: ObjectMeta,
    pub labeled: bool,
    /// It holds data (read whole): labeled, it is unmanageable; unlabeled,
    /// it is no candidate at all.
    pub holds_data: bool,
}

/// What the ConfigMap lists found.
#[derive(Default)]
pub struct Listing {
    pub candidates: Vec<Candidate>,
    /// ConfigMaps read, candidates or not.
    pub scanned: usize,
    /// Unlabeled ConfigMaps owned by exactly one Pod that hold data: not
    /// lock-shaped (operator-lib's locks are empty), so never candidates.
    pub skipped_with_data: usize,
    /// Unlabeled ConfigMaps owned by one Pod in the namespaces of
    /// `--exclude-namespaces` (not named with -n): left out.
    pub excluded: usize,
    /// Namespaces named in the scope whose list held no ConfigMap at all:
    /// maybe a typo ([`missing_note`] tells).
    pub empty_namespaces: Vec<String>,
}

/// A stderr note on each of `empty` (named namespaces where nothing was
/// listed) that does not exist. Every real namespace holds a ConfigMap
/// (kube-root-ca.crt), so only the empty ones are looked up. One that may
/// not be read, or whose read fails, is not called missing.
pub async fn missing_note(cluster: &Cluster, empty: &[String]) -> String {
    let api: Api<Namespace> = Api::all(cluster.client.clone());
    let mut note = String::new();
    for ns in empty {
        if let Ok(None) = call(format!("reading namespace {ns}"), api.get_opt(ns)).await {
            note.push_str(&format!(
                "lock-janitor: namespace {ns} does not exist (a typo? kubectl get namespaces lists them)\n"
            ));
        }
    }
    note
}

pub fn scope_text(scope: &Scope) -> String {
    if scope.namespaces.is_empty() {
        "all namespaces".to_owned()
    } else {
        let n = &scope.namespaces;
        format!(
            "namespace{} {}",
            if n.len() == 1 { "" } else { "s" },
            n.join(", ")
        )
    }
}

/// `-o json|yaml`: `value` pretty-printed, ending with a newline.
pub fn encode(value: &impl serde::Serialize, yaml: bool) -> anyhow::Result<String> {
    Ok(if yaml {
        serde_saphyr::to_string(value).context("encoding the report")?
    } else {
        serde_json::to_string_pretty(value).context("encoding the report")? + "\n"
    })
}

/// Lists every ConfigMap in scope (paged, metadata only) and keeps the
/// candidates (those matching the scope's selector, or lock-shaped outside
/// the excluded namespaces: `Scope::leaves_out`).
pub async fn list_candidates(
    cluster: &Cluster,
    scope: &Scope,
    needs: &str,
) -> anyhow::Result<Listing> {
    let mut listing = Listing::default();
    for ns in crate::scopes(&scope.namespaces) {
        list_namespace(cluster, ns.as_deref(), scope, &mut listing)
            .await
            .map_err(|e| explain(e, cluster, needs))?;
    }
    keep_lock_shaped(cluster, &mut listing)
        .await
        .map_err(|e| explain(e, cluster, needs))?;
    listing
        .candidates
        .sort_by(|a, b| (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name)));
    Ok(listing)
}

/// The metadata list cannot show data: read each candidate whole (16 at a
/// time). An unlabeled one is kept only if it is lock-shaped; a labeled one
/// that holds data is kept and judged unmanageable, as the controller does.
/// Metadata is replaced by that read's, so a later guarded write is guarded
/// by the version that was seen.
async fn keep_lock_shaped(cluster: &Cluster, listing: &mut Listing) -> Result<(), Error> {
    let candidates = std::mem::take(&mut listing.candidates);
    let read: Vec<(bool, Option<ConfigMap>)> = futures::stream::iter(candidates)
        .map(|c| async move {
            let ns = c.meta.namespace.clone().unwrap_or_default();
            let name = c.meta.name.clone().unwrap_or_default();
            let api: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &ns);
            let cm = call(format!("reading configmap {ns}/{name}"), api.get_opt(&name)).await?;
            Ok::<_, Error>((c.labeled, cm))
        })
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
    for (labeled, cm) in read {
        // Gone since the list: nothing to report.
        let Some(cm) = cm else { continue };
        let holds_data = holds_data(&cm);
        let shaped = kinds::configmap_candidate(&cm).is_some();
        if !labeled && !shaped {
            if holds_data && looks_like_lock(&cm.metadata) {
                listing.skipped_with_data += 1;
            }
            continue;
        }
        let mut meta = cm.metadata;
        meta.managed_fields = None;
        // Re-read: it may have been labeled (or lost its owner) meanwhile.
        {
            listing.candidates.push(Candidate {
                meta,
                labeled,
                holds_data,
            });
        }
    }
    Ok(())
}

async fn list_namespace(
    cluster: &Cluster,
    ns: Option<&str>,
    scope: &Scope,
    out: &mut Listing,
) -> Result<(), Error> {
    let api: Api<ConfigMap> = crate::scoped(&cluster.client, ns);
    let what = match ns {
        Some(ns) => format!("listing configmaps in namespace {ns}"),
        None => "listing configmaps in all namespaces".to_owned(),
    };
    let (mut found, mut scanned, mut excluded) = (Vec::new(), 0, 0);
    let api = &api;
    let list = |lp: ListParams| async move { api.list_metadata(&lp).await };
    crate::for_each_page(&what, &ListParams::default(), PAGE_SIZE, list, |page| {
        let Paged::Items(items) = page else {
            (found, scanned, excluded) = (Vec::new(), 0, 0);
            return;
        };
        scanned += items.len();
        for item in items {
            let mut meta = item.metadata;
            // Not needed, and the largest part of the metadata.
            meta.managed_fields = None;
            let labeled = scope.selector.matches(meta.labels.as_ref());
            let left_out = || scope.leaves_out(meta.namespace.as_deref().unwrap_or_default());
            let shaped = kinds::candidate(kinds::Object::ConfigMapMeta(&meta)).is_some();
            if !labeled && shaped && left_out() {
                excluded += 1;
                continue;
            }
            if labeled || shaped {
                found.push(Candidate {
                    meta,
                    labeled,
                    holds_data: false,
                });
            }
        }
    })
    .await?;
    if scanned == 0 {
        if let Some(ns) = ns {
            out.empty_namespaces.push(ns.to_owned());
        }
    }
    out.candidates.extend(found);
    out.scanned += scanned;
    out.excluded += excluded;
    Ok(())
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
pub fn print_stdout(s: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}
