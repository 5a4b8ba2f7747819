//! The `lock-janitor` binary: parse flags, set up logs, call the library.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use lock_janitor::auto_opt_in::{AutoOptIn, Settings as AutoSettings};
use lock_janitor::cli::{Cli, Command, LogFormat, LogLevel, RunArgs};
use lock_janitor::controller::{self, Context, Settings};
use lock_janitor::http;
use lock_janitor::shared::Shared;
use lock_janitor::verdict::Policy;

/// How long in-flight work may drain after the first signal.
const DRAIN_BOUND: Duration = Duration::from_secs(20);

/// Logs on stderr at `--log-level`; RUST_LOG, when set, wins.
fn init_logs(format: LogFormat, level: LogLevel) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level.filter()));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => logs.init(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

/// Sorted, each value once.
fn sorted_once<T: Ord>(mut v: Vec<T>) -> Vec<T> {
    v.sort();
    v.dedup();
    v
}

#[tokio::main]
async fn main() -> ExitCode {
    // Usage errors print a message and exit 2.
    // Installed (or linked) as kubectl-lock_janitor, it answers
    // `kubectl lock-janitor scan|label|check|version`, and says so in its usage.
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv
        .first()
        .is_some_and(|a| lock_janitor::cli::invoked_as_plugin(a))
    {
        argv[0] = "kubectl lock-janitor".into();
    }
    let cli = Cli::try_parse_checked(argv).unwrap_or_else(|e| e.exit());
    let is_run = matches!(cli.command, Command::Run(_));
    let level = cli.log_level;
    let result = match cli.command {
        Command::Run(args) => {
            init_logs(args.log_format, level);
            run(args).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Scan(args) => {
            init_logs(LogFormat::Plain, level);
            lock_janitor::cmd::scan::scan_command(args).await
        }
        Command::Label(args) => {
            init_logs(LogFormat::Plain, level);
            lock_janitor::cmd::label::label_command(args).await
        }
        Command::Check(args) => {
            init_logs(LogFormat::Plain, level);
            lock_janitor::cmd::check::check_command(args).await
        }
        Command::Version => {
            println!("lock-janitor {}", env!("CARGO_PKG_VERSION"));
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        // The controller reports through its logs (maybe JSON); the admin
        // commands print plainly.
        Err(e) if is_run => {
            error!("{}", lock_janitor::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("lock-janitor: {}", lock_janitor::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    // Signals first: a SIGTERM during start-up is a clean stop, not a kill.
    let shutdown = CancellationToken::new();
    let shared = Shared::new().context("registering metrics")?;
    tokio::spawn(watch_signals(shutdown.clone(), shared.clone()));

    let settings = settings_of(&args);
    info!(
        version = env!("CARGO_PKG_VERSION"),
        ?settings,
        "starting lock-janitor"
    );
    let (config, client, control) = connect(&args, &shared).await?;
    // The server outlives the controller: /readyz answers 503 (not a refused
    // connection) while in-flight work drains, and /metrics stays scrapable.
    let http_stop = CancellationToken::new();
    let server = start_http(&args, &shared, &http_stop).await?;

    // Scopes that refuse are served around and retried; only a refusal of
    // every scope stops here.
    let Some(refused) = check_start_up(&control, &settings, &shutdown).await? else {
        info!("stopped before start-up finished");
        return Ok(());
    };

    // The lease is renewed through the drain and released after it.
    let election_stop = CancellationToken::new();
    let (gate, election) = start_election(&args, &config, &shared, &election_stop)?;
    let auto_opt_in = start_auto_opt_in(&args, &settings, &client, &gate, &shared, &shutdown);
    let ctx = Context::with_clients(client, control.clone(), shared, settings, gate);
    drain(&ctx, refused, &shutdown).await;
    if let Some(task) = auto_opt_in {
        task.abort();
    }
    let waiting = ctx.takeovers.awaiting();
    if !waiting.is_empty() {
        let locks: Vec<String> = waiting.iter().map(|k| k.to_string()).collect();
        warn!(locks = ?locks, "stopping while these locks await a takeover: label the new locks with `lock-janitor label --apply`");
    }
    election_stop.cancel();
    release_lease(election).await;
    http_stop.cancel();
    stop_http(server).await;
    info!("stopped");
    Ok(())
}

/// The controller's settings from the flags.
fn settings_of(args: &RunArgs) -> Settings {
    Settings {
        selector: args.scope.selector.clone(),
        namespaces: sorted_once(args.scope.namespaces.clone()),
        dry_run: args.dry_run,
        delete_pod: args.delete_pod,
        policy: Policy {
            owner_gone_grace: args.owner_gone_grace,
        },
        resync: args.resync,
        takeover_timeout: args.takeover_timeout,
        kinds: sorted_once(args.lock_kinds.clone()),
    }
}

/// The cluster's config, the budgeted client and the control client.
async fn connect(
    args: &RunArgs,
    shared: &Shared,
) -> anyhow::Result<(kube::Config, kube::Client, kube::Client)> {
    let budget = lock_janitor::client::Budget {
        qps: args.api_qps,
        burst: args.api_burst,
    };
    let config = lock_janitor::client::config().await.context(
        "no Kubernetes cluster found: set KUBECONFIG, create ~/.kube/config, or run in a pod with a service account",
    )?;
    let client = lock_janitor::client::build(config.clone(), budget, &shared.metrics)
        .context("no Kubernetes cluster found: set KUBECONFIG, create ~/.kube/config, or run in a pod with a service account")?;
    let control = lock_janitor::client::control(config.clone(), &shared.metrics)
        .context("building the control client")?;
    Ok((config, client, control))
}

/// Binds --metrics-bind-address and serves /metrics, /healthz and /readyz
/// on it until `stop`.
async fn start_http(
    args: &RunArgs,
    shared: &Shared,
    stop: &CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<std::io::Result<()>>> {
    let listener = http::bind(args.metrics_bind_address)
        .await
        .with_context(|| {
            format!(
                "binding --metrics-bind-address {}",
                args.metrics_bind_address
            )
        })?;
    Ok(tokio::spawn(http::serve(
        listener,
        shared.clone(),
        stop.clone().cancelled_owned(),
    )))
}

/// The start-up checks: the scopes that refuse, an error when every one
/// does, or None when a signal came first.
async fn check_start_up(
    control: &kube::Client,
    settings: &Settings,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Vec<lock_janitor::preflight::Refusal>>> {
    tokio::select! {
        checked = lock_janitor::preflight::preflight(control, &settings.selector, &settings.namespaces, &settings.kinds) => checked.map(Some).map_err(|e| {
            let hint = match e {
                lock_janitor::Error::Unsupported { .. } | lock_janitor::Error::Refused { .. } => "start-up check failed",
                _ => "start-up check failed (is the selector valid, and does RBAC grant list and watch on configmaps and pods?)",
            };
            anyhow::Error::new(e).context(hint)
        }),
        _ = shutdown.cancelled() => Ok(None),
    }
}

/// With --leader-elect, the election's gate and task; without, a gate that
/// always lets through.
fn start_election(
    args: &RunArgs,
    config: &kube::Config,
    shared: &Shared,
    stop: &CancellationToken,
) -> anyhow::Result<(
    lock_janitor::election::Gate,
    Option<tokio::task::JoinHandle<()>>,
)> {
    if !args.leader_elect {
        shared.metrics.leader.set(1);
        return Ok((lock_janitor::election::Gate::always(), None));
    }
    let Some(namespace) = args.leader_elect_namespace.clone().or_else(|| {
        std::env::var("POD_NAMESPACE")
            .ok()
            .filter(|s| !s.is_empty())
    }) else {
        anyhow::bail!("--leader-elect needs --leader-elect-namespace or $POD_NAMESPACE");
    };
    let identity = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .context(
            "--leader-elect needs $POD_NAME (the chart sets it) or $HOSTNAME as its identity",
        )?;
    let election = lock_janitor::election::Election {
        lease: args.leader_elect_lease.clone(),
        namespace,
        identity,
        lease_duration: args.leader_elect_lease_duration,
    };
    info!(lease = %election.lease, namespace = %election.namespace, identity = %election.identity,
          "leader election on; writing only while holding the lease");
    // A client of its own: its renewals never share a connection with
    // the reads and writes of a mass eviction (the judgements' live
    // reads and writes, up to 16 at a time per scope and kind, and their
    // reports, up to 64, go on `control`).
    let elector = lock_janitor::client::control(config.clone(), &shared.metrics)
        .context("building the election client")?;
    let (gate, task) = lock_janitor::election::start(
        elector,
        election,
        shared.metrics.clone(),
        shared.readiness.clone(),
        stop.clone(),
    );
    Ok((gate, Some(task)))
}

/// With --auto-opt-in, its task: every replica finds and counts the
/// unprotected candidates; the leader labels them (docs/design.md, "Auto
/// opt-in").
fn start_auto_opt_in(
    args: &RunArgs,
    settings: &Settings,
    client: &kube::Client,
    gate: &lock_janitor::election::Gate,
    shared: &Shared,
    shutdown: &CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    args.auto_opt_in.then(|| {
        // `Cli::try_parse_checked` refuses --auto-opt-in without one.
        let (key, value) = settings.selector.opt_in_label().unwrap_or_default();
        let own_lease = args.leader_elect.then(|| {
            let ns = args
                .leader_elect_namespace
                .clone()
                .or_else(|| std::env::var("POD_NAMESPACE").ok())
                .unwrap_or_default();
            (ns, args.leader_elect_lease.clone())
        });
        let a = AutoOptIn::new(
            client.clone(),
            gate.clone(),
            shared.metrics.clone(),
            AutoSettings {
                key: key.to_owned(),
                value: value.to_owned(),
                namespaces: settings.namespaces.clone(),
                exclusions: args.scope.exclude_namespaces.clone(),
                kinds: settings.kinds.clone(),
                own_lease,
                retry: settings.resync,
                write: !settings.dry_run,
            },
        );
        info!(exclude_namespaces = %args.scope.exclude_namespaces,
              "auto opt-in on: labeling every unlabeled lock candidate in scope");
        tokio::spawn(a.run(shared.left.listen(), shutdown.clone()))
    })
}

/// Runs the controller until a signal, then lets in-flight work drain.
/// The drain after a signal is bounded: in-flight reclaims get DRAIN_BOUND
/// to finish (each API call is bounded too), then the process goes on
/// to release its lease and exit. The chart's grace period is above it.
async fn drain(
    ctx: &std::sync::Arc<Context>,
    refused: Vec<lock_janitor::preflight::Refusal>,
    shutdown: &CancellationToken,
) {
    let drained = controller::run_refused(ctx.clone(), refused, shutdown.clone());
    tokio::pin!(drained);
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(DRAIN_BOUND).await;
    };
    tokio::select! {
        () = &mut drained => {}
        () = deadline => warn!("in-flight work did not finish within {}s of the signal; stopping anyway", DRAIN_BOUND.as_secs()),
    }
}

/// Waits for the election task to release the lease, after the drain
/// (bounded by the API timeout).
async fn release_lease(election: Option<tokio::task::JoinHandle<()>>) {
    if let Some(task) = election {
        if tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .is_err()
        {
            warn!("the leader lease was not released within 20s; it expires by itself");
        }
    }
}

/// Waits for the HTTP server to stop (its stop token cancelled).
async fn stop_http(server: tokio::task::JoinHandle<std::io::Result<()>>) {
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => warn!(error = %e, "metrics server stopped with an error"),
        Ok(Err(e)) => warn!(error = %e, "metrics server task failed"),
        Err(_) => warn!("metrics server did not stop within 5s"),
    }
}

/// First SIGTERM/SIGINT: not ready, stop watching, let in-flight reclaims
/// finish. A second one: exit at once.
async fn watch_signals(shutdown: CancellationToken, shared: Shared) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot install signal handlers; stop with SIGKILL");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    info!("shutting down: finishing in-flight work (signal again to exit at once)");
    shared.readiness.shutting_down();
    shutdown.cancel();
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    warn!("second signal: exiting now");
    std::process::exit(130);
}
