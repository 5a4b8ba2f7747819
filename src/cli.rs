//! Command-line interface. Every `run` flag also reads `LOCK_JANITOR_<FLAG>`.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::lock::candidate::{Exclusions, DEFAULT_EXCLUSIONS};
use crate::lock::LockKind;
use crate::selector::Selector;
use crate::DEFAULT_SELECTOR;

#[derive(Debug, Parser)]
#[command(
    name = "lock-janitor",
    version,
    about = "Frees leader-election locks (operator-lib ConfigMaps and Leases) whose holder pod can no longer run, so a waiting replica takes over.",
    long_about = "Frees leader-election locks whose holder pod is Failed, Succeeded or gone, so a waiting \
                  replica takes over: it deletes operator-sdk / operator-lib ConfigMaps owned by the leader Pod \
                  (and Leases held for life the same way), and releases client-go / controller-runtime Leases.\n\n\
                  Only locks carrying the opt-in label (default lock-janitor.io/watch=true) are watched: \
                  ConfigMaps and Leases by default (--lock-kinds). \
                  A lock whose holder might still run is never freed.\n\n\
                  The cluster is found as kubectl finds it: $KUBECONFIG, ~/.kube/config, then the in-cluster service account."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log level: error, warn, info, debug or trace. RUST_LOG, when set, wins
    /// (it takes per-module directives such as `info,lock_janitor=debug`).
    #[arg(long, global = true, env = "LOCK_JANITOR_LOG_LEVEL", value_enum, default_value_t = LogLevel::Info)]
    pub log_level: LogLevel,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    /// The log filter of this level: kube's own chatter stays at warn
    /// unless debug or trace is asked for.
    pub fn filter(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info,kube=warn",
            LogLevel::Debug => "debug,kube=info,hyper=info,tower=info",
            LogLevel::Trace => "trace",
        }
    }
}

impl Cli {
    /// Parses the command line; checks that clap's grammar cannot express
    /// end as usage errors (exit 2) too.
    pub fn try_parse_checked<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let cli = Cli::try_parse_from(args)?;
        if let Command::Run(run) = &cli.command {
            if let Err(msg) = run.scope.selector.require_opt_in() {
                use clap::CommandFactory;
                return Err(Cli::command().error(clap::error::ErrorKind::ValueValidation, msg));
            }
            if run.auto_opt_in && run.scope.selector.opt_in_label().is_none() {
                use clap::CommandFactory;
                let msg = format!(
                    "--auto-opt-in writes the opt-in label, and --selector {} is not one key=value term \
                     (such as lock-janitor.io/watch=true)",
                    run.scope.selector
                );
                return Err(Cli::command().error(clap::error::ErrorKind::ValueValidation, msg));
            }
        }
        Ok(cli)
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller: watch opted-in locks and reclaim stale ones.
    Run(RunArgs),
    /// Report every lock candidate and its verdict (exit 3 if any is stale).
    Scan(ScanArgs),
    /// Add the opt-in label to unlabeled lock candidates (dry run unless --apply).
    Label(LabelArgs),
    /// Check an install: pods ready and leading, RBAC, the delete guard,
    /// locks opted in and none stale, monitoring (exit 1 if a check fails).
    Check(CheckArgs),
    /// Print the version.
    Version,
}

/// The name the binary answers to as a kubectl plugin (`kubectl
/// lock-janitor ...`): kubectl runs `kubectl-lock_janitor` from PATH.
pub const PLUGIN_NAME: &str = "kubectl-lock_janitor";

/// Whether the binary was invoked as the kubectl plugin (by its file name).
pub fn invoked_as_plugin(argv0: &std::ffi::OsStr) -> bool {
    std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n == PLUGIN_NAME || n.starts_with("kubectl-lock_janitor."))
}

/// Where the admin commands find the cluster, with kubectl's flags.
#[derive(Clone, Debug, Default, Args)]
pub struct Cluster {
    /// Path of the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Plain,
    Json,
}

#[derive(Clone, Debug, Args)]
pub struct Scope {
    /// Label selector of the locks to manage (opt-in label).
    #[arg(long, env = "LOCK_JANITOR_SELECTOR", default_value = DEFAULT_SELECTOR, value_parser = Selector::parse)]
    pub selector: Selector,
    /// Namespace to watch; repeat for several (or comma-separate in the env var). Default: all namespaces.
    #[arg(long = "namespace", short = 'n', env = "LOCK_JANITOR_NAMESPACE", value_delimiter = ',', value_parser = parse_namespace)]
    pub namespaces: Vec<String>,
    /// Namespaces (comma-separated globs) whose locks are never opted in by
    /// `run --auto-opt-in`, not counted as unprotected, and left out of
    /// `label` and `scan` without -n. A lock labeled there by hand is watched.
    #[arg(long, env = "LOCK_JANITOR_EXCLUDE_NAMESPACES", default_value = DEFAULT_EXCLUSIONS, value_parser = Exclusions::parse)]
    pub exclude_namespaces: Exclusions,
}

impl Scope {
    /// Whether an unlabeled candidate in `namespace` is left out of `scan`
    /// and `label`: in an excluded namespace that was not named with -n.
    pub fn leaves_out(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() && self.exclude_namespaces.excludes(namespace)
    }
}

/// The scope of an admin command, with kubectl's `-A`.
#[derive(Clone, Debug, Args)]
pub struct AdminScope {
    #[command(flatten)]
    pub scope: Scope,
    /// All namespaces (the default without --namespace; as kubectl's -A).
    #[arg(long = "all-namespaces", short = 'A', conflicts_with = "namespaces")]
    pub all_namespaces: bool,
    #[command(flatten)]
    pub cluster: Cluster,
}

#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub scope: Scope,
    /// Judge and report (Events, logs, metrics) but never delete anything.
    #[arg(long, env = "LOCK_JANITOR_DRY_RUN")]
    pub dry_run: bool,
    /// Also delete the dead holder pod (only when Failed or Succeeded, guarded by its uid).
    #[arg(long, env = "LOCK_JANITOR_DELETE_POD")]
    pub delete_pod: bool,
    /// How long a holder pod must be missing before its lock is reclaimed
    /// (e.g. 30s, 2m; at least 1s: a force-deleted pod's containers may
    /// still be stopping).
    #[arg(long, env = "LOCK_JANITOR_OWNER_GONE_GRACE", default_value = "30s", value_parser = parse_at_least_a_second)]
    pub owner_gone_grace: Duration,
    /// Re-judge every lock at least this often (catches holders that
    /// vanished; at least 1s).
    #[arg(long, env = "LOCK_JANITOR_RESYNC", default_value = "5m", value_parser = parse_at_least_a_second)]
    pub resync: Duration,
    /// Address of the /metrics, /healthz and /readyz endpoints.
    #[arg(
        long,
        env = "LOCK_JANITOR_METRICS_BIND_ADDRESS",
        default_value = "0.0.0.0:8080"
    )]
    pub metrics_bind_address: SocketAddr,
    /// Log format.
    #[arg(long, env = "LOCK_JANITOR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// Requests per second the janitor may send to the API server, on average.
    #[arg(long, env = "LOCK_JANITOR_API_QPS", default_value = "20", value_parser = parse_qps)]
    pub api_qps: f64,
    /// After a watched lock is deleted, how long to wait for a new holder to
    /// create it again before saying NoTakeover.
    #[arg(long, env = "LOCK_JANITOR_TAKEOVER_TIMEOUT", default_value = "5m", value_parser = parse_positive_duration)]
    pub takeover_timeout: Duration,
    /// Elect a leader on a Lease: every replica watches and judges, only the
    /// holder writes (hot standby). The chart turns it on with replicas > 1.
    #[arg(long, env = "LOCK_JANITOR_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(long, env = "LOCK_JANITOR_LEADER_ELECT_LEASE", default_value = "lock-janitor", value_parser = parse_name)]
    pub leader_elect_lease: String,
    /// Namespace of the leader-election Lease (default: $POD_NAMESPACE).
    #[arg(long, env = "LOCK_JANITOR_LEADER_ELECT_NAMESPACE", value_parser = parse_namespace)]
    pub leader_elect_namespace: Option<String>,
    /// How long a leader's lease lasts without renewal (it stops writing after two thirds of it).
    #[arg(long, env = "LOCK_JANITOR_LEADER_ELECT_LEASE_DURATION", default_value = "15s", value_parser = parse_lease_duration)]
    pub leader_elect_lease_duration: Duration,
    /// Which kinds of lock to watch: `configmap` (operator-lib's
    /// leader-for-life), `lease` (client-go's leader election), or both.
    #[arg(long, env = "LOCK_JANITOR_LOCK_KINDS", value_delimiter = ',', default_value = "configmap,lease", value_parser = parse_kind)]
    pub lock_kinds: Vec<LockKind>,
    /// Label every unlabeled lock candidate in scope (outside
    /// --exclude-namespaces) with the opt-in label, as it appears; only the
    /// leader writes. A lock that carries the label's key with another
    /// value (an opt-out) is never touched.
    #[arg(long, env = "LOCK_JANITOR_AUTO_OPT_IN")]
    pub auto_opt_in: bool,
    /// Requests the janitor may send at once above --api-qps.
    #[arg(long, env = "LOCK_JANITOR_API_BURST", default_value = "40", value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub api_burst: u32,
}

/// `-o`, as kubectl's: a table fitted to the terminal (never cut when
/// stdout is not one), a wide table never cut, a `LockList` document, or
/// one `kind/name` a line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Wide,
    Json,
    Yaml,
    Name,
}

#[derive(Clone, Debug, Args)]
pub struct ScanArgs {
    #[command(flatten)]
    pub admin: AdminScope,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Print tables without their header line.
    #[arg(long)]
    pub no_headers: bool,
    /// Grace for a missing holder before it counts as stale (as in `run`).
    #[arg(long, env = "LOCK_JANITOR_OWNER_GONE_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub owner_gone_grace: Duration,
}

#[derive(Clone, Debug, Args)]
pub struct LabelArgs {
    #[command(flatten)]
    pub admin: AdminScope,
    /// Write the labels (without it, only print what would change).
    #[arg(long)]
    pub apply: bool,
    /// Only locks whose name matches this glob (repeatable).
    #[arg(long, value_parser = parse_glob)]
    pub include: Vec<glob::Pattern>,
    /// Skip locks whose name matches this glob (repeatable).
    #[arg(long, value_parser = parse_glob)]
    pub exclude: Vec<glob::Pattern>,
    /// Only locks that this other selector opts in: after a change of the
    /// selector (the chart's `selector`), moves the opt-in of every lock
    /// the old one named to the new one (`--selector`). The old label is
    /// kept.
    #[arg(long, value_parser = Selector::parse)]
    pub from_selector: Option<Selector>,
    /// Output format: `name` prints only the locks labeled (or that would
    /// be); `json` and `yaml` a `LockList` of what label did or would do.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Print tables without their header line.
    #[arg(long)]
    pub no_headers: bool,
}

#[derive(Clone, Debug, Args)]
pub struct CheckArgs {
    /// Namespace of the install (default: find the janitor's Deployment,
    /// labeled app.kubernetes.io/part-of=lock-janitor or
    /// app.kubernetes.io/name=lock-janitor, in all namespaces).
    #[arg(long = "namespace", short = 'n', value_parser = parse_namespace)]
    pub namespace: Option<String>,
    /// Helm release name of the install (its app.kubernetes.io/instance label).
    #[arg(long)]
    pub release: Option<String>,
    /// Output format: a line per check, or a `CheckReport` document.
    #[arg(long, short = 'o', value_enum, default_value_t = CheckOutput::Table)]
    pub output: CheckOutput,
    #[command(flatten)]
    pub cluster: Cluster,
}

/// `check -o`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum CheckOutput {
    #[default]
    Table,
    Json,
}

/// Longest accepted duration: a day. Longer waits are mistakes, and bounded
/// values keep every deadline computable.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

fn parse_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        Ok(_) => Err("must be at most 24h".into()),
        Err(e) => Err(format!("{e} (use a duration like 30s, 2m, 1h)")),
    }
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("must be greater than zero".into()),
        d => Ok(d),
    }
}

/// The floor of `run --owner-gone-grace` and `--resync`: below it the
/// grace no longer covers a force-deleted pod's stopping containers, and
/// the resync spins.
const AT_LEAST: Duration = Duration::from_secs(1);

fn parse_at_least_a_second(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d < AT_LEAST => Err("must be at least 1s".into()),
        d => Ok(d),
    }
}

fn parse_lease_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d < Duration::from_secs(3) => Err("must be at least 3s".into()),
        d if d > Duration::from_secs(600) => Err("must be at most 10m".into()),
        d => Ok(d),
    }
}

fn parse_kind(s: &str) -> Result<LockKind, String> {
    LockKind::parse(s.trim())
        .ok_or_else(|| format!("{s:?} is not a lock kind (configmap or lease)"))
}

/// An object name: a DNS-1123 subdomain.
fn parse_name(s: &str) -> Result<String, String> {
    crate::dns_subdomain(s)
        .then(|| s.to_owned())
        .ok_or_else(|| {
            format!("{s:?} is not an object name (lowercase letters, digits, '-' and '.')")
        })
}

fn parse_qps(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(q) if q.is_finite() && q > 0.0 && q <= 10000.0 => Ok(q),
        Ok(_) => Err("must be greater than 0 and at most 10000".into()),
        Err(_) => Err(format!(
            "{s:?} is not a number (requests per second, like 20 or 0.5)"
        )),
    }
}

fn parse_glob(s: &str) -> Result<glob::Pattern, String> {
    glob::Pattern::new(s).map_err(|e| format!("invalid glob {s:?}: {e}"))
}

/// A namespace is a DNS-1123 label.
fn parse_namespace(s: &str) -> Result<String, String> {
    crate::dns_label(s).then(|| s.to_owned()).ok_or_else(|| {
        format!("{s:?} is not a namespace name (lowercase letters, digits and '-', at most 63)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces() {
        assert!(parse_namespace("kube-system").is_ok());
        for bad in ["", "Kube", "-a", "a-", "a_b", &"a".repeat(64)] {
            assert!(parse_namespace(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn run_defaults_match_the_design() {
        let cli = Cli::try_parse_from(["lock-janitor", "run"]).unwrap();
        let Command::Run(a) = cli.command else {
            panic!("not run")
        };
        assert_eq!(a.scope.selector.as_str(), "lock-janitor.io/watch=true");
        assert!(a.scope.namespaces.is_empty());
        assert_eq!(a.owner_gone_grace, Duration::from_secs(30));
        assert_eq!(a.resync, Duration::from_secs(300));
        assert_eq!(a.metrics_bind_address.to_string(), "0.0.0.0:8080");
        assert!(!a.dry_run && !a.delete_pod);
        assert_eq!(a.log_format, LogFormat::Plain);
        assert_eq!(a.api_qps, 20.0);
        assert!(!a.leader_elect);
        assert_eq!(a.takeover_timeout, Duration::from_secs(300));
        assert_eq!(a.leader_elect_lease, "lock-janitor");
        assert_eq!(a.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(a.api_burst, 40);
        assert!(!a.auto_opt_in);
        assert_eq!(
            a.scope.exclude_namespaces.to_string(),
            "kube-system,kube-public,kube-node-lease,openshift-*"
        );
    }

    #[test]
    fn exclusions_apply_to_scan_and_label_only_without_namespaces() {
        let scope = |args: &[&str]| {
            let mut argv = vec!["lock-janitor", "scan"];
            argv.extend(args);
            let Command::Scan(s) = Cli::try_parse_from(argv).unwrap().command else {
                panic!("not scan")
            };
            s.admin.scope
        };
        assert!(scope(&["-A"]).leaves_out("kube-system"));
        assert!(!scope(&["-A"]).leaves_out("ops"));
        assert!(!scope(&["-n", "kube-system"]).leaves_out("kube-system"));
        assert!(scope(&["--exclude-namespaces", "team-*"]).leaves_out("team-a"));
        assert!(!scope(&["--exclude-namespaces", ""]).leaves_out("kube-system"));
    }

    #[test]
    fn scan_may_use_any_selector() {
        assert!(Cli::try_parse_checked(["lock-janitor", "scan", "--selector", "!foo"]).is_ok());
        assert!(Cli::try_parse_checked([
            "lock-janitor",
            "run",
            "--selector",
            "lock-janitor.io/watch=true,!legacy"
        ])
        .is_ok());
    }

    /// `run`'s grace and resync floors: 1 s is taken (tests use 2 s and
    /// 3 s), anything below is a usage error.
    #[test]
    fn grace_and_resync_take_a_second_at_least() {
        for flag in ["--owner-gone-grace", "--resync"] {
            for ok in ["1s", "1000ms", "2s", "3s", "0.5s 500ms"] {
                let cli = Cli::try_parse_checked(["lock-janitor", "run", flag, ok]);
                assert!(cli.is_ok(), "{flag} {ok}");
            }
            for low in ["0s", "1ms", "999ms", "0.9s"] {
                let err = Cli::try_parse_checked(["lock-janitor", "run", flag, low]).unwrap_err();
                assert_eq!(err.exit_code(), 2, "{flag} {low}");
                assert!(
                    err.to_string().contains("at least 1s"),
                    "{flag} {low}: {err}"
                );
            }
        }
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        for args in [
            vec!["lock-janitor", "run", "--resync", "0s"],
            vec!["lock-janitor", "run", "--resync", "1ms"],
            vec!["lock-janitor", "run", "--resync", "999ms"],
            vec!["lock-janitor", "run", "--owner-gone-grace", "0s"],
            vec!["lock-janitor", "run", "--owner-gone-grace", "0.5s"],
            vec!["lock-janitor", "run", "--owner-gone-grace", "soon"],
            vec!["lock-janitor", "run", "--owner-gone-grace", "100000000000d"],
            vec!["lock-janitor", "run", "--resync", "25h"],
            vec!["lock-janitor", "run", "--namespace", "Bad_NS"],
            vec!["lock-janitor", "run", "--log-format", "xml"],
            vec!["lock-janitor", "run", "--metrics-bind-address", "8080"],
            vec!["lock-janitor", "run", "--selector", ""],
            vec!["lock-janitor", "run", "--selector", "lock-janitor.io/watch"],
            vec!["lock-janitor", "run", "--selector", "!foo"],
            vec![
                "lock-janitor",
                "run",
                "--selector",
                "lock-janitor.io/watch!=false",
            ],
            vec!["lock-janitor", "run", "--bogus"],
            vec!["lock-janitor", "run", "--api-qps", "0"],
            vec!["lock-janitor", "run", "--api-qps", "fast"],
            vec!["lock-janitor", "run", "--api-qps", "NaN"],
            vec!["lock-janitor", "run", "--api-burst", "0"],
            vec!["lock-janitor", "run", "--leader-elect-lease-duration", "1s"],
            vec!["lock-janitor", "run", "--leader-elect-lease", "Bad_Name"],
            vec!["lock-janitor", "run", "--leader-elect-namespace", "Bad_NS"],
            vec!["lock-janitor", "run", "--log-level", "loud"],
            vec!["lock-janitor", "run", "--exclude-namespaces", "a,["],
            vec!["lock-janitor", "run", "--exclude-namespaces", "Kube-System"],
            vec![
                "lock-janitor",
                "run",
                "--auto-opt-in",
                "--selector",
                "lock-janitor.io/watch=true,!legacy",
            ],
            vec!["lock-janitor", "scan", "-o", "xml"],
            vec!["lock-janitor", "label", "-o", "xml"],
            vec!["lock-janitor", "check", "-o", "yaml"],
            vec!["lock-janitor", "check", "-n", "Bad_NS"],
        ] {
            let err = Cli::try_parse_checked(&args).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{args:?}");
        }
    }
}
