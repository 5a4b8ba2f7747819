//! `testenv`: a local control plane for the shell.
//!
//! ```text
//! testenv up [--no-gc] [--node-lifecycle] [--apiserver-arg=ARG]... [--controller-manager-arg=ARG]...
//!            [--node [--janitor-bin=PATH] [--memory-available=QTY]]
//! testenv down
//! testenv status
//! testenv env
//! ```
//!
//! `up` starts etcd, kube-apiserver and kube-controller-manager detached from
//! the shell (they outlive the command), records them in
//! `<cache>/testenv/run/state.json` and prints `export KUBECONFIG=...`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use lock_janitor_testenv::{
    node, pid_alive, start_time, terminate_pids, up_state_path, ControlPlane, Detached, Options,
};
use serde::{Deserialize, Serialize};

const USAGE: &str = "usage: testenv <command>

commands:
  up [--no-gc] [--node-lifecycle] [--apiserver-arg=ARG]... [--controller-manager-arg=ARG]...
     [--node [--janitor-bin=PATH] [--memory-available=QTY]]
          start a control plane that outlives this command; prints `export KUBECONFIG=...`
          --node: and a real node (containerd, runc, kubelet, kube-scheduler; root;
          built by testenv/build-node.sh), its images imported (pause, peers, hog,
          and lock-janitor.local/lock-janitor:dev from the static PATH)
  down    stop it and remove its files
  status  show whether it runs and answers
  env     print `export KUBECONFIG=...` for the running control plane

binaries: $LOCK_JANITOR_TESTENV_BIN, else the dir `testenv/build.sh --print` names
(build them with `make testenv-build`).";

#[derive(Debug, Serialize, Deserialize)]
struct State {
    #[serde(flatten)]
    plane: Detached,
    garbage_collector: bool,
    node_lifecycle: bool,
    /// The real node of `up --node`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<node::DetachedNode>,
}

fn state_path() -> PathBuf {
    up_state_path()
}

fn load_state() -> Result<Option<State>, String> {
    let path = state_path();
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            format!(
                "{} is not a testenv state file ({e}); remove it if no control plane runs",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

fn save_state(state: &State) -> Result<(), String> {
    let path = state_path();
    let dir = path.parent().expect("state path has a parent");
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(state).expect("state serializes");
    std::fs::write(&tmp, text).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Pids of the state that still run the process we started (not a reused pid).
fn live_pids(state: &State) -> Vec<(String, u32)> {
    state
        .plane
        .processes
        .iter()
        .chain(state.node.iter().flat_map(|n| n.processes.iter()))
        .filter(|p| pid_alive(p.pid))
        .filter(|p| p.start_time.is_none() || start_time(p.pid) == p.start_time)
        .map(|p| (p.name.clone(), p.pid))
        .collect()
}

/// Stops the processes (clients first: kube-controller-manager, kube-apiserver, etcd)
/// and removes the dir and the state file.
fn stop(state: &State) -> Result<(), String> {
    if let Some(n) = &state.node {
        node::stop_detached(n)?;
    }
    let live: Vec<(String, u32)> = live_pids(state)
        .into_iter()
        .filter(|(_, pid)| {
            !state
                .node
                .iter()
                .any(|n| n.processes.iter().any(|p| p.pid == *pid))
        })
        .collect();
    let mut stuck = Vec::new();
    for (name, pid) in live.iter().rev() {
        if !terminate_pids(&[*pid], Duration::from_secs(5)).is_empty() {
            stuck.push(format!("{name} (pid {pid})"));
        }
    }
    if !stuck.is_empty() {
        return Err(format!("could not stop {}", stuck.join(", ")));
    }
    if state.plane.dir.exists() {
        std::fs::remove_dir_all(&state.plane.dir)
            .map_err(|e| format!("removing {}: {e}", state.plane.dir.display()))?;
    }
    match std::fs::remove_file(state_path()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", state_path().display())),
    }
}

fn up(args: &[String]) -> Result<(), String> {
    let UpArgs {
        mut opts,
        with_node,
        janitor_bin,
        node_opts,
    } = up_args(args)?;
    clean_up_stale()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting a tokio runtime: {e}"))?;
    let started = std::time::Instant::now();
    let prep = if with_node {
        let p = node::Prepared::new().map_err(|e| e.to_string())?;
        p.add_to(&mut opts);
        Some(p)
    } else {
        None
    };
    let cp = match rt.block_on(ControlPlane::start_detached(opts.clone())) {
        Ok(cp) => cp,
        Err(e) => {
            // The node never started: its dir holds only the token file.
            if let Some(p) = &prep {
                let _ = std::fs::remove_dir_all(&p.dir);
            }
            return Err(e.to_string());
        }
    };
    let node = match &prep {
        None => None,
        Some(p) => {
            let n = rt
                .block_on(node::Node::start(
                    p,
                    cp.kubeconfig_path(),
                    cp.dir(),
                    node_opts,
                ))
                .map_err(|e| e.to_string())?;
            let images = n
                .import_images(janitor_bin.as_deref())
                .map_err(|e| e.to_string())?;
            eprintln!(
                "testenv: node {} Ready (dir {}); images: {}",
                node::NODE_NAME,
                n.dir().display(),
                images.join(", ")
            );
            Some(n.detach())
        }
    };
    let state = State {
        plane: cp.detach(),
        garbage_collector: opts.garbage_collector,
        node_lifecycle: opts.node_lifecycle,
        node,
    };
    if let Err(e) = save_state(&state) {
        let _ = stop(&state);
        return Err(e);
    }
    say_ready(&state, started);
    Ok(())
}

/// What `up` was asked for.
struct UpArgs {
    opts: Options,
    with_node: bool,
    janitor_bin: Option<PathBuf>,
    node_opts: node::NodeOptions,
}

fn up_args(args: &[String]) -> Result<UpArgs, String> {
    let mut opts = Options::default();
    let mut with_node = false;
    let mut janitor_bin: Option<PathBuf> = None;
    let mut node_opts = node::NodeOptions {
        detached: true,
        forwarder_exe: Some(
            std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?,
        ),
        ..node::NodeOptions::default()
    };
    for a in args {
        match a.as_str() {
            "--node" => with_node = true,
            _ if a.starts_with("--janitor-bin=") => {
                janitor_bin = Some(PathBuf::from(&a["--janitor-bin=".len()..]))
            }
            _ if a.starts_with("--memory-available=") => {
                node_opts.memory_available = a["--memory-available=".len()..].to_string()
            }
            "--no-gc" => opts.garbage_collector = false,
            "--node-lifecycle" => opts.node_lifecycle = true,
            _ if a.starts_with("--apiserver-arg=") => opts
                .extra_apiserver_args
                .push(a["--apiserver-arg=".len()..].to_string()),
            _ if a.starts_with("--controller-manager-arg=") => opts
                .extra_controller_manager_args
                .push(a["--controller-manager-arg=".len()..].to_string()),
            _ => return Err(format!("up: unknown argument {a:?}\n\n{USAGE}")),
        }
    }
    Ok(UpArgs {
        opts,
        with_node,
        janitor_bin,
        node_opts,
    })
}

/// Refuses when a control plane is running already; cleans up after one
/// that no longer runs.
fn clean_up_stale() -> Result<(), String> {
    if let Some(old) = load_state()? {
        let live = live_pids(&old);
        if !live.is_empty() {
            let pids: Vec<String> = live.iter().map(|(n, p)| format!("{n} {p}")).collect();
            return Err(format!(
                "a control plane is already running ({}; {}; state {}).\nUse it with: export KUBECONFIG={}\nor stop it first with: testenv down   (make testenv-down)",
                old.plane.server_url,
                pids.join(", "),
                state_path().display(),
                old.plane.kubeconfig.display()
            ));
        }
        eprintln!(
            "testenv: cleaning up a control plane that is no longer running ({})",
            old.plane.dir.display()
        );
        stop(&old)?;
    }
    Ok(())
}

/// Where the control plane is and how to use and stop it.
fn say_ready(state: &State, started: std::time::Instant) {
    eprintln!(
        "testenv: control plane ready in {:.1}s at {} (gc: {}, node lifecycle: {})",
        started.elapsed().as_secs_f64(),
        state.plane.server_url,
        if state.garbage_collector { "on" } else { "off" },
        if state.node_lifecycle { "on" } else { "off" },
    );
    eprintln!(
        "testenv: logs, certs and audit log in {}",
        state.plane.dir.display()
    );
    eprintln!("testenv: stop it with: testenv down   (make testenv-down)");
    println!("export KUBECONFIG={}", state.plane.kubeconfig.display());
}

fn down() -> Result<(), String> {
    let Some(state) = load_state()? else {
        eprintln!("testenv: nothing to stop (no {})", state_path().display());
        return Ok(());
    };
    let live = live_pids(&state);
    stop(&state)?;
    let pids: Vec<String> = live.iter().map(|(n, p)| format!("{n} {p}")).collect();
    eprintln!(
        "testenv: stopped [{}], removed {}",
        pids.join(", "),
        state.plane.dir.display()
    );
    Ok(())
}

async fn readyz(kubeconfig: &std::path::Path) -> Result<String, String> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
    let req = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client.request_text(req).await.map_err(|e| e.to_string())
}

fn status() -> Result<bool, String> {
    let Some(state) = load_state()? else {
        println!("testenv: not running (no {})", state_path().display());
        return Ok(false);
    };
    let live = live_pids(&state);
    println!("server:     {}", state.plane.server_url);
    println!("kubeconfig: {}", state.plane.kubeconfig.display());
    println!("audit log:  {}", state.plane.audit_log.display());
    println!("dir:        {}", state.plane.dir.display());
    println!(
        "controllers: garbage collector {}, node lifecycle {}",
        if state.garbage_collector { "on" } else { "off" },
        if state.node_lifecycle { "on" } else { "off" }
    );
    for p in &state.plane.processes {
        let up = live.iter().any(|(_, pid)| *pid == p.pid);
        println!(
            "{:<24} pid {:<8} {}",
            p.name,
            p.pid,
            if up { "running" } else { "NOT RUNNING" }
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting a tokio runtime: {e}"))?;
    let ready = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), readyz(&state.plane.kubeconfig))
            .await
            .unwrap_or_else(|_| Err("no answer within 5s".to_string()))
    });
    match &ready {
        Ok(_) => println!("apiserver /readyz: ok"),
        Err(e) => println!("apiserver /readyz: {e}"),
    }
    let all = state.plane.processes.len() + state.node.as_ref().map_or(0, |n| n.processes.len());
    if let Some(n) = &state.node {
        println!("node:       {} (dir {})", node::NODE_NAME, n.dir.display());
        for p in &n.processes {
            let up = live.iter().any(|(_, pid)| *pid == p.pid);
            println!(
                "{:<24} pid {:<8} {}",
                p.name,
                p.pid,
                if up { "running" } else { "NOT RUNNING" }
            );
        }
    }
    Ok(ready.is_ok() && live.len() == all)
}

fn env() -> Result<bool, String> {
    match load_state()? {
        Some(state) if !live_pids(&state).is_empty() => {
            println!("export KUBECONFIG={}", state.plane.kubeconfig.display());
            Ok(true)
        }
        _ => {
            eprintln!("testenv: not running; start it with: testenv up   (make testenv-up)");
            Ok(false)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("up") => up(&args[1..]).map(|()| true),
        Some("down") => down().map(|()| true),
        Some("status") => status(),
        Some("env") => env(),
        // The `kubernetes` Service of `up --node` (started by it, not for users).
        Some("node-forward") if args.len() == 3 => match (args[1].parse(), args[2].parse()) {
            (Ok(l), Ok(t)) => node::run_forwarder(l, t)
                .map(|()| true)
                .map_err(|e| format!("node-forward: {e}")),
            _ => Err("node-forward LISTEN TARGET: two socket addresses".to_string()),
        },
        // (`demo` goes here.)
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(true)
        }
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) if e.starts_with("testenv:") => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("testenv: {e}");
            ExitCode::FAILURE
        }
    }
}
