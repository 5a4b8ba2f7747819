//! `lock-janitor check`: did my install work? One named check a line, each
//! `ok`, `warn` or `fail`, and for the ones not ok what to do. Exit 0 when
//! no check fails (warnings allowed), 1 when one does, 2 for usage errors
//! (among them: several installs found and none named).
//!
//! The install is the janitor's Deployment (labeled
//! `app.kubernetes.io/part-of=lock-janitor`, which `nameOverride` leaves
//! alone, or `app.kubernetes.io/name=lock-janitor`); everything else is read
//! from it: its ServiceAccount, and its container's `run` flags (scope,
//! selector, lock kinds, dry run, leader election) from its args and its
//! `LOCK_JANITOR_*` variables, parsed with `run`'s own parser. The checks
//! read only, except one server-side dry-run DELETE (`dryRun=All`, nothing
//! stored) that the delete guard must deny.

mod access;
mod install;
mod locks;
mod selectors;

use std::fmt::Write as _;
use std::process::ExitCode;

use std::collections::BTreeMap;

use clap::parser::ValueSource;
use clap::{CommandFactory as _, FromArgMatches as _};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use serde::Serialize;

use super::report::API_VERSION;
use super::{print_stdout, Cluster, EXIT_USAGE};
use crate::call;
use crate::cli::{CheckArgs, CheckOutput, Cli, Command, RunArgs};

/// The label every object of the chart carries, whatever its
/// `nameOverride` or `fullnameOverride`.
pub const PART_OF_LABEL: &str = "app.kubernetes.io/part-of=lock-janitor";
/// The chart's name label: `nameOverride` changes it. Still looked for, so
/// a Deployment labeled only so (not installed by the chart) is found too.
pub const NAME_LABEL: &str = "app.kubernetes.io/name=lock-janitor";
/// The label with the chart's name and version (`lock-janitor-0.1.0`).
pub const CHART_LABEL: &str = "helm.sh/chart";
/// Where a hint needs the chart: the release does not record where it was
/// installed from (an OCI or repository reference, a directory).
pub const CHART_REFERENCE: &str = "<your chart reference>";
/// The Helm release label.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    /// What to do; none when ok.
    pub hint: Option<String>,
}

impl Check {
    pub fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Ok,
            detail: detail.into(),
            hint: None,
        }
    }
    pub fn warn(name: &'static str, detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            status: Status::Warn,
            hint: Some(hint.into()),
            ..Check::ok(name, detail)
        }
    }
    pub fn fail(name: &'static str, detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            status: Status::Fail,
            ..Check::warn(name, detail, hint)
        }
    }
    /// A check that could not read what it needs fails, saying why.
    fn or_failed(name: &'static str, r: anyhow::Result<Check>, needs: &str) -> Check {
        r.unwrap_or_else(|e| {
            Check::fail(
                name,
                format!("could not check: {}", crate::error_chain(e.as_ref())),
                format!("this check needs {needs}; run it with a user that may do so"),
            )
        })
    }
}

/// `-o json`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport<'a> {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub checks: &'a [Check],
}

/// The install under check: its Deployment, its pods and its flags.
pub struct Install {
    pub namespace: String,
    /// The Deployment's name: the chart's fullname.
    pub name: String,
    pub release: Option<String>,
    pub deployment: Deployment,
    /// The pods its selector selects.
    pub pods: Vec<Pod>,
    pub service_account: String,
    /// Its container's flags, as `run` parses them.
    pub run: RunArgs,
    /// Why the flags could not be parsed (the defaults are used).
    pub args_error: Option<String>,
    /// The container's `LOCK_JANITOR_*` variables that set a flag its args
    /// leave unset (read, as `run` reads them).
    pub from_env: Vec<String>,
    /// Its `LOCK_JANITOR_*` variables set through `valueFrom` (a ConfigMap,
    /// a Secret, a field): not read, their flags taken as the args say.
    pub unread_env: Vec<String>,
    pub client: Client,
    pub config: kube::Config,
}

impl Install {
    /// `system:serviceaccount:<ns>:<sa>`.
    pub fn user(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account
        )
    }
    /// The groups a token of the ServiceAccount carries.
    pub fn groups(&self) -> Vec<String> {
        vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{}", self.namespace),
            "system:authenticated".into(),
        ]
    }
    /// The label selector of its pods (`k=v,...`).
    pub fn pod_selector(&self) -> String {
        let labels = self
            .deployment
            .spec
            .as_ref()
            .and_then(|s| s.selector.match_labels.clone())
            .unwrap_or_default();
        labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }
    /// `helm upgrade` of this install, for hints: the chart version it runs
    /// pinned (from its `helm.sh/chart` label; without `--version` helm
    /// would take the newest chart), and the new chart's defaults under the
    /// install's own values (`--reuse-values` alone would keep the old
    /// chart's defaults). The chart reference is the admin's: the release
    /// does not record where its chart came from.
    pub fn helm_upgrade(&self, set: &str) -> String {
        let labels = self.deployment.metadata.labels.as_ref();
        let (version, from) = match labels.and_then(|l| chart_of(l.get(CHART_LABEL)?)) {
            Some((name, version)) => (
                version.clone(),
                format!("{CHART_REFERENCE}: where you installed chart {name} {version} from"),
            ),
            None => (
                "<installed chart version>".to_owned(),
                format!(
                    "{CHART_REFERENCE}: where you installed the chart from; the Deployment has no {CHART_LABEL} label to tell its version"
                ),
            ),
        };
        let set = if set.is_empty() {
            String::new()
        } else {
            format!(" {set}")
        };
        format!(
            "helm upgrade {} {CHART_REFERENCE} --version {version} -n {} --reset-then-reuse-values{set} ({from})",
            self.release.as_deref().unwrap_or("<release>"),
            self.namespace
        )
    }
    pub fn scope_text(&self) -> String {
        super::scope_text(&self.run.scope)
    }
}

/// `<name>-<version>` of a `helm.sh/chart` label: the version starts at
/// the first `-` followed by a digit (helm writes a `+` in it as `_`).
fn chart_of(label: &str) -> Option<(String, String)> {
    let at = label
        .match_indices('-')
        .map(|(i, _)| i)
        .find(|&i| label[i + 1..].starts_with(|c: char| c.is_ascii_digit()))?;
    let (name, version) = (&label[..at], &label[at + 1..]);
    (!name.is_empty()).then(|| (name.to_owned(), version.replace('_', "+")))
}

/// `label`, narrowed to the Helm release `release` if one is named.
fn release_selector(label: &str, release: Option<&str>) -> String {
    match release {
        Some(r) => format!("{label},{INSTANCE_LABEL}={r}"),
        None => label.to_owned(),
    }
}

/// The Deployments labeled as the janitor's, in `-n` or everywhere: those
/// of the chart (part-of, whatever their nameOverride) and those named
/// lock-janitor, each once.
async fn find_installs(cluster: &Cluster, args: &CheckArgs) -> anyhow::Result<Vec<Deployment>> {
    let api: Api<Deployment> = crate::scoped(&cluster.client, args.namespace.as_deref());
    let mut found: Vec<Deployment> = Vec::new();
    for label in [PART_OF_LABEL, NAME_LABEL] {
        let selector = release_selector(label, args.release.as_deref());
        let list = call(
            "listing deployments",
            api.list(&ListParams::default().labels(&selector)),
        )
        .await
        .map_err(|e| super::explain(e, cluster, "list on deployments"))?;
        for d in list.items {
            if !found.iter().any(|f| f.metadata.uid == d.metadata.uid) {
                found.push(d);
            }
        }
    }
    found.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    Ok(found)
}

/// `lock-janitor run` as the pod's parser is, without the environment
/// `check` runs in: the variables read are the container's.
fn run_command() -> clap::Command {
    let no_env = |a: clap::Arg| a.env(None);
    Cli::command()
        .mut_args(no_env)
        .mut_subcommand("run", |run| run.mut_args(no_env))
}

/// The janitor container's `run` flags, as `run` in its pod parses them.
struct Flags {
    run: RunArgs,
    error: Option<String>,
    from_env: Vec<String>,
    unread_env: Vec<String>,
}

/// The first line of a clap error: what is wrong, without the usage.
fn first_line(e: clap::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_owned()
}

fn parse_run(argv: Vec<String>) -> Result<RunArgs, String> {
    let mut matches = run_command()
        .try_get_matches_from(argv)
        .map_err(first_line)?;
    match Cli::from_arg_matches_mut(&mut matches).map_err(first_line)? {
        Cli {
            command: Command::Run(r),
            ..
        } => Ok(r),
        _ => Err("not the run command".to_owned()),
    }
}

/// The flags of the Deployment's janitor container: its args, and for each
/// flag they leave unset the container's `LOCK_JANITOR_*` variable of that
/// flag (args win where both are set, as clap's do in the pod). A variable
/// set through `valueFrom` cannot be read here: it is named, unread.
fn run_flags(d: &Deployment) -> Flags {
    let pod = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    let containers = pod.map(|p| p.containers.as_slice()).unwrap_or_default();
    let container = containers
        .iter()
        .find(|c| c.name == crate::NAME)
        .or(containers.first());
    let args = container.and_then(|c| c.args.clone()).unwrap_or_default();
    // The pod's environment: a later entry of a name wins, as the kubelet
    // sets them. None: from valueFrom.
    let mut env: BTreeMap<String, Option<String>> = BTreeMap::new();
    for e in container.and_then(|c| c.env.as_deref()).unwrap_or_default() {
        if e.name.starts_with("LOCK_JANITOR_") {
            let value = match e.value_from {
                Some(_) => None,
                None => Some(e.value.clone().unwrap_or_default()),
            };
            env.insert(e.name.clone(), value);
        }
    }
    let argv = |extra: &[String]| -> Vec<String> {
        ["lock-janitor", "run"]
            .into_iter()
            .map(String::from)
            .chain(args.iter().cloned())
            .chain(extra.iter().cloned())
            .collect()
    };
    // Every flag of `run` has a valid default, and no environment is read.
    let defaults = || parse_run(argv(&[])[..2].to_vec()).expect("run parses without flags");
    let fail = |error: String| Flags {
        run: defaults(),
        error: Some(error),
        from_env: Vec::new(),
        unread_env: Vec::new(),
    };
    // Which flags the args set.
    let set_by_args: Vec<String> = match run_command().try_get_matches_from(argv(&[])) {
        Ok(m) => match m.subcommand() {
            Some(("run", sub)) => sub
                .ids()
                .filter(|id| sub.value_source(id.as_str()) == Some(ValueSource::CommandLine))
                .map(|id| id.as_str().to_owned())
                .collect(),
            _ => return fail("not the run command".to_owned()),
        },
        Err(e) => return fail(first_line(e)),
    };
    let (mut extra, mut from_env, mut unread_env) = (Vec::new(), Vec::new(), Vec::new());
    let run_cmd = Cli::command();
    let run_cmd = run_cmd.find_subcommand("run").expect("the run command");
    for arg in run_cmd.get_arguments() {
        let (Some(name), Some(long)) = (arg.get_env().and_then(|n| n.to_str()), arg.get_long())
        else {
            continue;
        };
        let Some(value) = env.get(name) else { continue };
        if set_by_args.iter().any(|id| id == arg.get_id().as_str()) {
            continue;
        }
        let Some(value) = value else {
            unread_env.push(name.to_owned());
            continue;
        };
        if arg.get_action().takes_values() {
            extra.push(format!("--{long}={value}"));
        } else {
            // A switch: clap reads its variable as `true` or `false` (its
            // BoolValueParser), nothing else.
            match value.as_str() {
                "true" => extra.push(format!("--{long}")),
                "false" => {}
                _ => {
                    return fail(format!(
                        "{name}={value:?} is neither true nor false (as `run` reads {name})"
                    ))
                }
            }
        }
        from_env.push(name.to_owned());
    }
    match parse_run(argv(&extra)) {
        Ok(run) => Flags {
            run,
            error: None,
            from_env,
            unread_env,
        },
        Err(e) if from_env.is_empty() => fail(e),
        Err(e) => fail(format!("{e} (with {} from the env)", from_env.join(", "))),
    }
}

async fn load(cluster: &Cluster, d: Deployment) -> anyhow::Result<Install> {
    let namespace = d.metadata.namespace.clone().unwrap_or_default();
    let name = d.metadata.name.clone().unwrap_or_default();
    let release = d
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(INSTANCE_LABEL).cloned());
    let service_account = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.service_account_name.clone())
        .unwrap_or_else(|| "default".to_owned());
    let flags = run_flags(&d);
    let mut install = Install {
        namespace,
        name,
        release,
        deployment: d,
        pods: Vec::new(),
        service_account,
        run: flags.run,
        args_error: flags.error,
        from_env: flags.from_env,
        unread_env: flags.unread_env,
        client: cluster.client.clone(),
        config: cluster.config.clone(),
    };
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), &install.namespace);
    let selector = install.pod_selector();
    if !selector.is_empty() {
        install.pods = call(
            format!("listing the pods of {}", install.name),
            api.list(&ListParams::default().labels(&selector)),
        )
        .await?
        .items;
    }
    Ok(install)
}

/// Runs every check of one install, in order.
pub async fn run_checks(cluster: &Cluster, install: &Install) -> Vec<Check> {
    let mut checks = vec![
        install::install_found(install),
        install::leader(install).await,
    ];
    checks.push(access::rbac(install).await);
    checks.push(access::delete_guard(install).await);
    checks.push(install::auto_opt_in(install));
    checks.extend(locks::locks(cluster, install).await);
    checks.push(install::monitoring(install).await);
    checks
}

/// The table: `<status>  <name>  <detail>`, and `hint:` under a check not ok.
pub fn render_table(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for c in checks {
        let _ = writeln!(
            out,
            "{:<4}  {:<width$}  {}",
            c.status.as_str(),
            c.name,
            c.detail
        );
        if let Some(h) = &c.hint {
            let _ = writeln!(out, "{:<4}  {:<width$}  hint: {h}", "", "");
        }
    }
    out
}

/// No install found: how to install one, the version pinned (this
/// binary's: the chart's version is its app version).
fn no_install(args: &CheckArgs, where_: &str) -> Check {
    let release = args.release.as_deref().unwrap_or("lock-janitor");
    let namespace = args.namespace.as_deref().unwrap_or("lock-janitor");
    Check::fail(
        "install-found",
        format!(
            "no Deployment labeled {PART_OF_LABEL} or {NAME_LABEL}{} in {where_}",
            args.release
                .as_ref()
                .map(|r| format!(" (and {INSTANCE_LABEL}={r})"))
                .unwrap_or_default()
        ),
        format!(
            "install it: helm install {release} {CHART_REFERENCE} --version {v} -n {namespace} --create-namespace \
             ({CHART_REFERENCE}: the lock-janitor chart {v} you pushed to your registry, or ./charts/lock-janitor \
             in a checkout of v{v}; docs/install.md); or name its namespace with -n and its release with --release",
            v = env!("CARGO_PKG_VERSION"),
        ),
    )
}

/// The summary line on stderr. An install in dry-run mode is said to be
/// one, not to work: it frees nothing.
pub fn summary(checks: &[Check], dry_run: bool) -> String {
    let count = |s| checks.iter().filter(|c| c.status == s).count();
    let (ok, warn, fail) = (count(Status::Ok), count(Status::Warn), count(Status::Fail));
    let verdict = if fail > 0 {
        "the install needs attention: see the hints of the failed checks"
    } else if dry_run {
        "the install runs in dry-run mode: it reports stale locks and frees none; see the hints"
    } else if warn > 0 {
        "the install works; see the hints of the warnings"
    } else {
        "the install works"
    };
    format!(
        "lock-janitor: {} checks: {ok} ok, {warn} warn, {fail} fail; {verdict}\n",
        checks.len()
    )
}

/// `lock-janitor check`.
pub async fn check_command(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let cluster = Cluster {
        takes_namespaces: false,
        ..super::connect(&args.cluster).await?
    };
    let found = find_installs(&cluster, &args).await?;
    let where_ = match &args.namespace {
        Some(ns) => format!("namespace {ns}"),
        None => "any namespace".to_owned(),
    };
    let mut dry_run = false;
    let checks = match found.len() {
        0 => vec![no_install(&args, &where_)],
        1 => {
            let d = found.into_iter().next().expect("one");
            let install = load(&cluster, d).await?;
            dry_run = install.run.dry_run;
            run_checks(&cluster, &install).await
        }
        n => {
            let names: Vec<String> = found
                .iter()
                .map(|d| {
                    format!(
                        "{}/{}",
                        d.metadata.namespace.as_deref().unwrap_or_default(),
                        d.metadata.name.as_deref().unwrap_or_default()
                    )
                })
                .collect();
            eprintln!(
                "lock-janitor: {n} installs found ({}); name one with -n <namespace> (and --release <name>)",
                names.join(", ")
            );
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let out = match args.output {
        CheckOutput::Json => super::encode(
            &CheckReport {
                api_version: API_VERSION,
                kind: "CheckReport",
                checks: &checks,
            },
            false,
        )?,
        CheckOutput::Table => render_table(&checks),
    };
    print_stdout(&out)?;
    eprint!("{}", summary(&checks, dry_run));
    Ok(if checks.iter().any(|c| c.status == Status::Fail) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests;
