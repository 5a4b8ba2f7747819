//! `lock-janitor check`: did my install work? One named check a line, each
//! `ok`, `warn` or `fail`, and for the ones not ok what to do. Exit 0 when
//! no check fails (warnings allowed), 1 when one does, 2 for usage errors
//! (among them: several installs found and none named).
//!
//! The install is the janitor's Deployment (labeled
//! `app.kubernetes.io/name=lock-janitor`); everything else is read from it:
//! its ServiceAccount, and its container's `run` flags (scope, selector,
//! lock kinds, leader election), parsed with `run`'s own parser. The checks
//! read only, except one server-side dry-run DELETE (`dryRun=All`, nothing
//! stored) that the delete guard must deny.

mod access;
mod install;
mod locks;

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client};
use serde::Serialize;

use super::report::API_VERSION;
use super::{print_stdout, Cluster, EXIT_USAGE};
use crate::call;
use crate::cli::{CheckArgs, CheckOutput, Cli, Command, RunArgs};

/// The label every install's Deployment carries (the chart's name).
pub const NAME_LABEL: &str = "app.kubernetes.io/name=lock-janitor";
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
            name,
            status: Status::Warn,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }
    pub fn fail(name: &'static str, detail: impl Into<String>, hint: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Fail,
            detail: detail.into(),
            hint: Some(hint.into()),
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
    /// pinned (from its `helm.sh/chart` label), and the new chart's
    /// defaults under the install's own values (`--reuse-values` alone
    /// would keep the old chart's defaults, and without `--version` helm
    /// would take the newest chart).
    pub fn helm_upgrade(&self, set: &str) -> String {
        let version = self
            .deployment
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("helm.sh/chart"))
            .and_then(|c| c.strip_prefix("lock-janitor-"))
            .unwrap_or("<installed version>");
        format!(
            "helm upgrade {} oci://ghcr.io/lock-janitor/charts/lock-janitor --version {version} -n {} --reset-then-reuse-values {set}",
            self.release.as_deref().unwrap_or("<release>"),
            self.namespace
        )
    }
    pub fn scope_text(&self) -> String {
        super::scope_text(&self.run.scope)
    }
}

/// The Deployments labeled as the janitor's, in `-n` or everywhere.
async fn find_installs(client: &Client, args: &CheckArgs) -> anyhow::Result<Vec<Deployment>> {
    let api: Api<Deployment> = crate::scoped(client, args.namespace.as_deref());
    let mut selector = NAME_LABEL.to_owned();
    if let Some(r) = &args.release {
        let _ = write!(selector, ",{INSTANCE_LABEL}={r}");
    }
    let list = call(
        "listing deployments",
        api.list(&ListParams::default().labels(&selector)),
    )
    .await?;
    Ok(list.items)
}

/// The `run` flags of the Deployment's janitor container.
fn run_args(d: &Deployment) -> (RunArgs, Option<String>) {
    let pod = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
    let containers = pod.map(|p| p.containers.as_slice()).unwrap_or_default();
    let container = containers
        .iter()
        .find(|c| c.name == crate::NAME)
        .or(containers.first());
    let args = container.and_then(|c| c.args.clone()).unwrap_or_default();
    let parse = |a: &[String]| {
        let argv = ["lock-janitor", "run"]
            .into_iter()
            .map(String::from)
            .chain(a.iter().cloned());
        match Cli::try_parse_from(argv) {
            Ok(Cli {
                command: Command::Run(r),
                ..
            }) => Ok(r),
            Ok(_) => Err("not the run command".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    };
    match parse(&args) {
        Ok(r) => (r, None),
        Err(e) => (
            parse(&[]).expect("run parses without flags"),
            Some(e.lines().next().unwrap_or_default().to_owned()),
        ),
    }
}

async fn load(cluster: &Cluster, config: &kube::Config, d: Deployment) -> anyhow::Result<Install> {
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
    let (run, args_error) = run_args(&d);
    let mut install = Install {
        namespace,
        name,
        release,
        deployment: d,
        pods: Vec::new(),
        service_account,
        run,
        args_error,
        client: cluster.client.clone(),
        config: config.clone(),
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
    checks.push(install::auto_opt_in(install).await);
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

/// The summary line on stderr.
pub fn summary(checks: &[Check]) -> String {
    let count = |s| checks.iter().filter(|c| c.status == s).count();
    let (ok, warn, fail) = (count(Status::Ok), count(Status::Warn), count(Status::Fail));
    let verdict = if fail > 0 {
        "the install needs attention: see the hints of the failed checks"
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
    let config = super::config(&args.cluster).await?;
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config.clone())
        .with_context(|| format!("cannot build a client for the cluster at {url}"))?;
    let cluster = Cluster {
        client,
        url,
        takes_namespaces: false,
    };
    let found = find_installs(&cluster.client, &args)
        .await
        .map_err(|e| anyhow::anyhow!("{e}. check needs list on deployments"))?;
    let where_ = match &args.namespace {
        Some(ns) => format!("namespace {ns}"),
        None => "any namespace".to_owned(),
    };
    let checks = match found.len() {
        0 => vec![Check::fail(
            "install-found",
            format!(
                "no Deployment labeled {NAME_LABEL}{} in {where_}",
                args.release
                    .as_ref()
                    .map(|r| format!(",{INSTANCE_LABEL}={r}"))
                    .unwrap_or_default()
            ),
            "install it (helm install lock-janitor oci://ghcr.io/lock-janitor/charts/lock-janitor -n lock-janitor \
             --create-namespace), or name its namespace with -n and its release with --release",
        )],
        1 => {
            let d = found.into_iter().next().expect("one");
            let install = load(&cluster, &config, d).await?;
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
        CheckOutput::Json => {
            let report = CheckReport {
                api_version: API_VERSION,
                kind: "CheckReport",
                checks: &checks,
            };
            let mut s = serde_json::to_string_pretty(&report).context("encoding the report")?;
            s.push('\n');
            s
        }
        CheckOutput::Table => render_table(&checks),
    };
    print_stdout(&out)?;
    eprint!("{}", summary(&checks));
    Ok(if checks.iter().any(|c| c.status == Status::Fail) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_summary() {
        let checks = vec![
            Check::ok("leader", "pod a leads"),
            Check::warn("install-found", "one replica", "scale it"),
            Check::fail("stale-now", "ns/x", "label it"),
        ];
        let t = render_table(&checks);
        assert_eq!(
            t,
            "ok    leader         pod a leads\n\
             warn  install-found  one replica\n\
             \x20                    hint: scale it\n\
             fail  stale-now      ns/x\n\
             \x20                    hint: label it\n"
        );
        assert!(summary(&checks).contains("3 checks: 1 ok, 1 warn, 1 fail"));
    }

    #[test]
    fn deployment_args_are_run_flags() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"spec": {"containers": [
                {"name": "lock-janitor", "args": ["--namespace=x", "--leader-elect", "--leader-elect-lease=lj"]}
            ]}}}
        }))
        .unwrap();
        let (r, err) = run_args(&d);
        assert!(err.is_none());
        assert_eq!(r.scope.namespaces, ["x"]);
        assert!(r.leader_elect);
        assert_eq!(r.leader_elect_lease, "lj");
        let mut bad = d.clone();
        bad.spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap()
            .containers[0]
            .args = Some(vec!["--bogus".into()]);
        let (r, err) = run_args(&bad);
        assert!(err.is_some());
        assert!(r.scope.namespaces.is_empty());
    }
}
